"""An agent process for the load test: records through the SDK, as an agent does.

    python load_agent.py SOCKET AGENT SESSIONS EVENTS

It creates SESSIONS sessions (``load/agent-AGENT-N.jsonl``) and records EVENTS tool
events in each, interleaved between them: a checkpoint every 500 events, and halfway
through each run is closed, the session closed and reopened, and a second run begun.
Prints ``ok`` when every session is closed.
"""

from __future__ import annotations

import sys

from flightlog.protocol import (
    Execution,
)
from flightlog.protocol.events import (
    ToolExecStart,
)
from flightlog.sdk import connect

CHECKPOINT_EVERY = 500


def main(socket_path: str, agent: int, sessions: int, events: int) -> None:
    with connect(socket_path, client_name=f"load-{agent}") as client:
        paths = [f"load/agent-{agent}-{n}.jsonl" for n in range(sessions)]
        opened = [client.create(path, meta={"agent": agent}) for path in paths]
        runs = [session.begin_run() for session in opened]
        for i in range(events):
            if i == events // 2:
                for n, (session, run) in enumerate(zip(opened, runs, strict=True)):
                    run.close()
                    session.close()
                    opened[n] = client.open(paths[n])
                    runs[n] = opened[n].begin_run()
            for n, run in enumerate(runs):
                execution = Execution(id=f"t{i}", kind="tool", turn_index=i // 10)
                run.record(
                    ToolExecStart(
                        execution=execution,
                        tool_call_id=f"c{i}",
                        name="echo",
                        arguments={"agent": agent, "session": n, "i": i},
                    )
                )
                if i % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1:
                    run.save_checkpoint({"i": i})
        for run in runs:
            run.close()
        for session in opened:
            session.close()
    sys.stdout.write("ok\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
