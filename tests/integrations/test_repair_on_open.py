"""The integrations repair on open: ``Recorder(repair=True)`` (or ``FLIGHTLOG_REPAIR=1``
for the default recorder) opens each session with ``client.session(..., repair=True)``;
a pydantic-ai agent (TestModel) recording into a file a crashed agent left with a tool
call cut finds it repaired, once, before its own run."""

from __future__ import annotations

import signal

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from flightlog.integrations import Recorder
from flightlog.integrations.pydantic_ai import Flightlog
from support import DaemonProcess, communicate, run_python

from .helpers import finish, of_type, records

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


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["argument", "environment"])
async def test_the_recorder_repairs_a_session_as_it_opens_it(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    proc = run_python(CUT, daemon.socket, "agent.jsonl")
    communicate(proc, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    if how == "environment":
        monkeypatch.setenv("FLIGHTLOG_REPAIR", "1")
        recorder = Recorder(socket=daemon.socket)
    else:
        recorder = Recorder(socket=daemon.socket, repair=True)
    assert recorder.repair
    agent = Agent(TestModel(), capabilities=[Flightlog(path="agent.jsonl", recorder=recorder)])
    await agent.run("hello")
    await agent.run("again")  # the session is open already: nothing more to repair
    await finish(recorder)
    found = records(daemon.root / "agent.jsonl")
    repaired = [
        r for r in of_type(found, "tool_exec_end") if r["data"]["disposition"] == "repaired"
    ]
    assert len(repaired) == 1
    assert [r["type"] for r in found[2:6]] == [
        "tool_exec_start",
        "run_resume",
        "tool_exec_end",
        "run_close",
    ]
    assert len(of_type(found, "agent_end")) == 2


def test_without_it_nothing_is_repaired(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLIGHTLOG_REPAIR", raising=False)
    assert not Recorder().repair
