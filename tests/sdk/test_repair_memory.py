"""Repair of every cut run, on the memory daemon (the fast tier): the same run ledger
and rules as flightlogd's (tests/faults/test_repair_every_run.py holds the daemon to
it with agents killed by SIGKILL)."""

from __future__ import annotations

import io

import pytest

from flightlog.protocol import ErrorCode, check, events
from flightlog.sdk import DaemonError, MemoryDaemon, MockTransport, connect


def cut(memory: MemoryDaemon, stop: str) -> None:
    """A run left without run_close: cut in a tool call, in a model call, or between
    turns (``stop``)."""
    with connect(transport=MockTransport(memory)) as client:
        session = client.session("repair.jsonl")
        run = session.begin_run()
        model = events.Execution(id="m0", kind="model")
        run.record(events.ModelExecStart(execution=model, model="x"))
        if stop != "model":
            run.record(events.ModelExecEnd(execution=model))
            tool = events.Execution(id="t0", kind="tool")
            run.record(events.ToolExecStart(execution=tool, tool_call_id="c0", name="ls"))
            if stop == "turn":
                run.record(events.ToolExecEnd(execution=tool, tool_call_id="c0", name="ls"))
        session.close()  # as a crash would: no run_close


def test_every_cut_run_is_repaired_in_its_own_run_and_closed_as_repaired() -> None:
    memory = MemoryDaemon()
    for stop in ("tool", "model", "turn"):
        cut(memory, stop)
    with connect(transport=MockTransport(memory)) as client:
        with client.session("repair.jsonl", repair=True) as session:
            found = session.resumption
            assert found is not None
            runs = found.cut_runs
            assert found.repaired_runs == runs and len(runs) == 3
            assert [(c.run_id, c.execution.id) for c in found.repaired] == [
                (runs[0], "t0"),
                (runs[1], "m0"),
            ]
        with client.session("repair.jsonl", repair=True) as session:
            assert session.resumption is not None
            assert session.resumption.repaired == []
            assert session.resumption.repaired_runs == []
    stored = memory.session("repair.jsonl")
    tail = [(r.type, r.run_id) for r in stored.records()][12:]
    assert tail == [
        ("run_resume", runs[0]),
        ("tool_exec_end", runs[0]),
        ("run_close", runs[0]),
        ("run_resume", runs[1]),
        ("model_exec_end", runs[1]),
        ("run_close", runs[1]),
        ("run_resume", runs[2]),
        ("run_close", runs[2]),
    ]
    closes = [r.decode_data() for r in stored.records() if r.type == "run_close"]
    assert all(close["repaired"] is True for close in closes)
    report = check(io.BytesIO(b"".join(line + b"\n" for line in stored.lines)))
    assert report.sound and report.open_runs == [] and report.warnings == []


def test_a_plain_resume_of_an_earlier_cut_run_is_refused() -> None:
    memory = MemoryDaemon()
    cut(memory, "tool")
    cut(memory, "turn")
    with connect(transport=MockTransport(memory)) as client:
        session = client.open("repair.jsonl")
        first = session.interrupted_runs[0]
        with pytest.raises(DaemonError) as refused:
            client._link.call(client._conn.continue_run(session.session_id, first))
        assert refused.value.code == ErrorCode.RUN_NOT_OPEN
        session.close()
