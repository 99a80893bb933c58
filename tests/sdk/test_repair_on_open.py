"""``client.session(path, repair=True)``: a file an agent left with a tool call cut is
repaired as it is opened, the repair marked, and written once: by agents that are real
processes killed with SIGKILL, one of them in the middle of a repair."""

from __future__ import annotations

import signal
from pathlib import Path

from flightlog.sdk import connect, read
from support import DaemonProcess, communicate, run_python

#: Starts a tool call and dies before it returns.
CUT = """
import os, signal, sys
from flightlog.protocol import events
from flightlog.sdk import connect

with connect(sys.argv[1]) as client:
    session = client.session(sys.argv[2])
    run = session.begin_run()
    t = events.Execution(id="t1", kind="tool")
    run.record(events.ToolExecStart(execution=t, tool_call_id="c1", name="slow"))
    session.sync()
    os.kill(os.getpid(), signal.SIGKILL)
"""

#: Begins a repair (the run continued after its run_resume) and dies before it records.
CUT_IN_THE_REPAIR = """
import os, signal, sys
from flightlog.sdk import connect

with connect(sys.argv[1]) as client:
    session = client.open(sys.argv[2])
    client._link.call(client._conn.continue_run(session.session_id, session.last_run))
    session.sync()
    os.kill(os.getpid(), signal.SIGKILL)
"""

#: Opens with repair=True and prints how many tool calls it repaired.
REPAIR = """
import sys
from flightlog.sdk import connect

with connect(sys.argv[1]) as client:
    with client.session(sys.argv[2], repair=True) as session:
        print(len(session.resumption.repaired), flush=True)
"""


def run(code: str, daemon: DaemonProcess, path: str) -> tuple[int, str]:
    proc = run_python(code, daemon.socket, path)
    out, err = communicate(proc, timeout=60)
    assert proc.returncode in (0, -signal.SIGKILL), err.decode()
    return proc.returncode, out.decode().strip()


def repairs(path: Path) -> list[int]:
    return [
        r.seq
        for r in read(path)
        if r.type == "tool_exec_end" and r.decode_data()["disposition"] == "repaired"
    ]


def test_a_cut_tool_call_is_repaired_on_open_once(daemon: DaemonProcess) -> None:
    path = daemon.root / "repair.jsonl"
    assert run(CUT, daemon, "repair.jsonl")[0] == -signal.SIGKILL
    assert run(REPAIR, daemon, "repair.jsonl") == (0, "1")
    assert run(REPAIR, daemon, "repair.jsonl") == (0, "0")  # twice: nothing new
    types = [r.type for r in read(path)]
    assert types == [
        "session_start",
        "run_start",
        "tool_exec_start",
        "run_resume",
        "tool_exec_end",
        "run_close",
    ]
    assert len(repairs(path)) == 1


def test_a_repair_cut_in_the_middle_is_done_once_by_the_next(daemon: DaemonProcess) -> None:
    path = daemon.root / "cut-repair.jsonl"
    assert run(CUT, daemon, "cut-repair.jsonl")[0] == -signal.SIGKILL
    # The repair began (its run_resume is written) and its process died.
    assert run(CUT_IN_THE_REPAIR, daemon, "cut-repair.jsonl")[0] == -signal.SIGKILL
    assert [r.type for r in read(path)][-1] == "run_resume"
    assert run(REPAIR, daemon, "cut-repair.jsonl") == (0, "1")
    assert run(REPAIR, daemon, "cut-repair.jsonl") == (0, "0")
    types = [r.type for r in read(path)]
    assert types[3:] == ["run_resume", "run_resume", "tool_exec_end", "run_close"]
    assert len(repairs(path)) == 1


def test_a_new_file_is_created_and_nothing_repaired(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client, client.session("new.jsonl", repair=True) as session:
        assert session.resumption is not None
        assert session.resumption.repaired == []
        assert session.resumption.cut_runs == []
