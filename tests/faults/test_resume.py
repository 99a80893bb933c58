"""Resume after kill -9 of the agent in the middle of a tool call, and repair.

An agent process records a finished tool call, a checkpoint, then a model call and a
tool call that it never ends: it is SIGKILLed inside the tool.  A restarted agent's
``session.resume()`` names the checkpoint, the cut run and the two open calls; with
``repair=True`` the tool call gets one ``tool_exec_end`` marked as a repair, and a
second resume repairs nothing new.  ``show`` and ``inspect`` tell the repair apart.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from flightlog.sdk import Client, DaemonError, Session, connect
from support import DaemonProcess, read_lines, run_python

AGENT = textwrap.dedent(
    """
    import sys, time
    from flightlog.protocol.events import (
        Execution, ModelRequest, TextPart, ToolExecEnd, ToolExecStart, ToolQueued,
    )
    from flightlog.sdk import connect

    with connect(sys.argv[1]) as client:
        session = client.create("resume.jsonl")
        run = session.begin_run()
        done = Execution(id="t0", kind="tool")
        run.record(ToolQueued(execution=done, tool_call_id="c0", name="ls", arguments={}))
        run.record(ToolExecStart(execution=done, tool_call_id="c0", name="ls", arguments={}))
        run.record(ToolExecEnd(
            execution=done, tool_call_id="c0", name="ls", content=[TextPart(text="a b")]
        ))
        run.save_checkpoint({"messages": 3})
        run.record(ModelRequest(execution=Execution(id="m1", kind="model"), messages=[]))
        cut = Execution(id="t1", kind="tool")
        run.record(ToolQueued(execution=cut, tool_call_id="c1", name="rm", arguments={}))
        run.record(ToolExecStart(execution=cut, tool_call_id="c1", name="rm", arguments={}))
        run.session.sync()
        print("in the tool", flush=True)
        time.sleep(60)
    """
)


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", *args], capture_output=True, text=True, check=False
    )
    return done.stdout


def open_when_released(client_socket: str, path: str) -> tuple[Client, Session]:
    client = connect(client_socket)
    deadline = time.monotonic() + 30
    while True:
        try:
            return client, client.open(path)
        except DaemonError as exc:
            assert exc.code == "session_busy" and time.monotonic() < deadline, exc
            time.sleep(0.01)


def test_resume_after_kill_9_in_a_tool_call_repairs_it_once(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    try:
        agent = run_python(AGENT, daemon.socket)
        assert agent.stdout is not None
        assert agent.stdout.readline() == b"in the tool\n"
        agent.kill()
        agent.communicate()
        path = str(daemon.root / "resume.jsonl")
        client, session = open_when_released(daemon.socket, path)
        with client:
            found = session.resume()
            assert found.checkpoint == {"messages": 3}
            assert len(found.cut_runs) == 1
            run_id = found.cut_runs[0]
            assert [(c.execution.id, c.execution.kind) for c in found.open_calls] == [
                ("m1", "model"),
                ("t1", "tool"),
            ]
            assert found.repaired == []
            repaired = session.resume(repair=True)
            assert [(c.run_id, c.execution.id) for c in repaired.repaired] == [
                (run_id, "m1"),
                (run_id, "t1"),
            ]
            assert repaired.repaired_runs == [run_id]
            again = session.resume(repair=True)
            assert again.repaired == [] and again.cut_runs == []
            # The model call is answered too, as cancelled: no call is left open.
            assert again.open_calls == []
            session.close()
    finally:
        daemon.stop()
    lines = read_lines(path)
    ends = [line for line in lines if line["type"] == "tool_exec_end"]
    assert [end["data"]["tool_call_id"] for end in ends] == ["c0", "c1"]
    repair = ends[1]["data"]
    assert repair["disposition"] == "repaired" and repair["is_error"] is True
    assert repair["execution"]["id"] == "t1"
    # Every tool call of the run is paired, within the run, after its run_resume.
    assert [line["type"] for line in lines[-4:]] == [
        "run_resume",
        "model_exec_end",
        "tool_exec_end",
        "run_close",
    ]
    assert lines[-4]["data"]["repair"] is True and lines[-1]["data"]["repaired"] is True
    model = lines[-3]["data"]
    assert model["disposition"] == "cancelled" and "repair" in model["error"]
    assert {line["run_id"] for line in lines[1:]} == {run_id}
    assert "closed by flightlog's repair" in lines[-1]["data"]["error"]
    # show prints the disposition, inspect names the repair apart from failures.
    assert "repaired" in cli("show", path)
    inspected = cli("inspect", path)
    assert "(0 failed, 1 repaired)" in inspected and "  repaired tool" in inspected, inspected
