"""An agent that records through daemon restarts, as an agent does.

    python restart_agent.py SOCKET AGENT STOP_FILE [GRACE [best_effort]]

It creates ``restart/agent-AGENT.jsonl`` and records tool events numbered 0, 1, 2 …
in runs of 200, with a checkpoint every 50 events and a run close at the end of each
run, until STOP_FILE exists; then it closes its run and its session.  Whatever the
daemon does meanwhile, it expects no exception.  It prints one JSON line: how many
events ``record()`` returned for, the acknowledged checkpoints' seqs, its reconnects,
the events its client dropped (best effort) and the exception it met (None when it
met none).

With ``best_effort`` the client is made with it, and the agent only records, in one
run (requests raise in either mode); it creates STOP_FILE.dropping once its client
dropped an event.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from flightlog.protocol import (
    Execution,
    FlightlogError,
)
from flightlog.protocol.events import (
    ToolExecStart,
)
from flightlog.sdk import connect

RUN_EVENTS = 200
CHECKPOINT_EVERY = 50


def main(
    socket_path: str, agent: int, stop_file: str, grace: float, best_effort: bool
) -> dict[str, Any]:
    recorded = 0
    checkpoints: list[int] = []
    reconnects = 0
    dropped: dict[str, int] = {}
    error: str | None = None
    try:
        with connect(
            socket_path,
            client_name=f"restart-{agent}",
            reconnect_grace=grace,
            best_effort=best_effort,
        ) as client:
            session = client.create(f"restart/agent-{agent}.jsonl", meta={"agent": agent})
            run = session.begin_run()
            while not os.path.exists(stop_file):
                execution = Execution(id=f"t{recorded}", kind="tool")
                run.record(
                    ToolExecStart(
                        execution=execution,
                        tool_call_id=f"c{recorded}",
                        name="echo",
                        arguments={"agent": agent, "i": recorded},
                    )
                )
                recorded += 1
                if best_effort:
                    if client.dropped and not dropped:
                        dropped = client.dropped
                        open(stop_file + ".dropping", "w").close()
                    continue
                if recorded % CHECKPOINT_EVERY == 0:
                    checkpoints.append(run.save_checkpoint({"i": recorded}))
                if recorded % RUN_EVENTS == 0:
                    run.close()
                    run = session.begin_run()
            run.close()
            session.close()
            reconnects = client.reconnects
            dropped = client.dropped
    except FlightlogError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {
        "agent": agent,
        "recorded": recorded,
        "checkpoints": checkpoints,
        "reconnects": reconnects,
        "dropped": dropped,
        "error": error,
    }


if __name__ == "__main__":
    grace = float(sys.argv[4]) if len(sys.argv) > 4 else 30.0
    best_effort = len(sys.argv) > 5 and sys.argv[5] == "best_effort"
    report = main(sys.argv[1], int(sys.argv[2]), sys.argv[3], grace, best_effort)
    sys.stdout.write(json.dumps(report) + "\n")
