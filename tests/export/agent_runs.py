"""An agent process for the follow tests: records RUNS runs into PATH through the SDK,
each a model call and a tool call, with a pause between records; when the daemon goes
away it waits for it to come back, opens the session again (the run in progress stays
interrupted) and goes on.  Prints ``done`` when every run is recorded.

    python agent_runs.py SOCKET PATH RUNS PAUSE
"""

from __future__ import annotations

import sys
import time

from flightlog.protocol import (
    Execution,
)
from flightlog.protocol.events import (
    AgentEnd,
    AgentStart,
    CallConfig,
    ModelExecEnd,
    ModelRequest,
    ToolExecEnd,
    ToolExecStart,
    Usage,
)
from flightlog.sdk import DaemonError, ErrorCode, FlightlogError, connect


def record_run(session: object, index: int, pause: float) -> None:
    from flightlog.sdk import Session

    assert isinstance(session, Session)
    with session.begin_run() as run:
        events = [
            AgentStart(agent="looper"),
            ModelRequest(
                execution=Execution(id=f"m{index}", kind="model"),
                config=CallConfig(model="m-loop"),
            ),
            ModelExecEnd(
                execution=Execution(id=f"m{index}", kind="model"),
                usage=Usage(input_tokens=10 + index, output_tokens=5),
            ),
            ToolExecStart(
                execution=Execution(id=f"t{index}", kind="tool"),
                tool_call_id=f"call_{index}",
                name="step",
            ),
            ToolExecEnd(
                execution=Execution(id=f"t{index}", kind="tool"),
                tool_call_id=f"call_{index}",
                name="step",
            ),
            AgentEnd(ok=True, reason="completed", turns=1),
        ]
        for event in events:
            run.record(event)
            time.sleep(pause)


def main() -> None:
    socket_path, path, runs, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    done = 0
    created = False
    while done < runs:
        try:
            with connect(socket_path, client_name="agent-runs") as client:
                session = client.open(path) if created else client.create(path)
                created = True
                while done < runs:
                    record_run(session, done, pause)
                    done += 1
                session.close()
        except DaemonError as exc:
            # Created just before the daemon died, or still held by the dead connection.
            created = created or exc.code == ErrorCode.SESSION_EXISTS
            time.sleep(0.1)
        except FlightlogError:
            time.sleep(0.1)  # the daemon is gone, or restarting
    sys.stdout.write("done\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
