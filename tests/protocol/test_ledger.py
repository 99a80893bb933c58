"""The run ledger alone: fed requests, then fed the records they wrote, it says the same.

The three-way comparison through the daemon and ``MemoryDaemon`` is
``tests/daemon/test_run_ledger.py``.
"""

from __future__ import annotations

import msgspec
import pytest

from flightlog.protocol import (
    RUN_CLOSE,
    RUN_RESUME,
    RUN_START,
    ErrorCode,
    LocalProtocolError,
    RunResumeData,
    RunStartData,
)
from flightlog.protocol.format import (
    RunLedger,
)
from flightlog.protocol.wire import (
    BeginRun,
    CloseRun,
    SaveCheckpoint,
    StartRun,
)

A, B = "a" * 32, "b" * 32
TIME = "2026-11-29T20:00:00.000000Z"


def begin(
    ledger: RunLedger, run_id: str, *, resume: bool = False, repair: bool = False
) -> tuple[str, bytes]:
    resume = resume or repair
    request = BeginRun(
        id=1,
        session_id="s" * 32,
        time=TIME,
        client="x" * 300,
        pid=7,
        run_id=None if resume else run_id,
        resume=run_id if resume else None,
        repair=repair,
    )
    entry = ledger.begin_run(StartRun(request, run_id), peer_pid=8, uid=9, gid=10)
    return entry.type, entry.data


def test_a_run_start_says_who_and_keeps_a_bounded_client_name() -> None:
    ledger = RunLedger()
    kind, data = begin(ledger, A)
    assert kind == RUN_START
    started = msgspec.json.decode(data, type=RunStartData)
    assert (started.pid, started.peer_pid, started.uid, started.gid) == (7, 8, 9, 10)
    assert started.client == "x" * 200
    assert ledger.interrupted_runs == [] and ledger.last_run is None


def test_a_released_run_is_interrupted_and_resumed_after_its_items() -> None:
    ledger = RunLedger()
    begin(ledger, A)
    ledger.wrote(3)
    ledger.checkpoint(SaveCheckpoint(id=2, session_id="s", run_id=A, time=TIME, snapshot=b"{}"))
    ledger.release()
    assert (ledger.interrupted_runs, ledger.last_run, ledger.last_run_items) == ([A], A, 4)
    kind, data = begin(ledger, A, resume=True)
    assert kind == RUN_RESUME
    assert msgspec.json.decode(data, type=RunResumeData).items == 4
    assert ledger.interrupted_runs == [] and ledger.last_run is None
    entry = ledger.close_run(CloseRun(id=3, session_id="s", run_id=A, time=TIME))
    assert entry.type == RUN_CLOSE and entry.reply(9).seq == 9  # type: ignore[attr-defined]
    assert (ledger.interrupted_runs, ledger.last_run, ledger.last_run_items) == ([], None, 0)


def test_begin_run_applies_the_files_rule() -> None:
    ledger = RunLedger()
    begin(ledger, A)
    ledger.close_run(CloseRun(id=3, session_id="s", run_id=A, time=TIME))
    with pytest.raises(LocalProtocolError) as fresh:
        begin(ledger, A)
    assert fresh.value.code == ErrorCode.BAD_MESSAGE
    with pytest.raises(LocalProtocolError) as resumed:
        begin(ledger, A, resume=True)
    assert resumed.value.code == ErrorCode.RUN_NOT_OPEN


def test_a_repair_continues_an_earlier_cut_run_and_closes_it_as_repaired() -> None:
    ledger = RunLedger()
    begin(ledger, A)
    ledger.wrote(2)
    ledger.release()
    begin(ledger, B)
    ledger.wrote(3)
    ledger.release()
    # A plain resume continues only the last run; a repair any cut run.
    with pytest.raises(LocalProtocolError) as refused:
        begin(ledger, A, resume=True)
    assert refused.value.code == ErrorCode.RUN_NOT_OPEN
    kind, data = begin(ledger, A, repair=True)
    resumed = msgspec.json.decode(data, type=RunResumeData)
    assert kind == RUN_RESUME and resumed.repair is True and resumed.items == 2
    assert ledger.interrupted_runs == [B]
    ledger.wrote(1)  # a repair's end: an item of A, not of the last run B
    entry = ledger.close_run(CloseRun(id=3, session_id="s", run_id=A, time=TIME))
    assert msgspec.json.decode(entry.data) == {"error": None, "repaired": True}
    assert (ledger.interrupted_runs, ledger.last_run, ledger.last_run_items) == ([B], B, 3)
    with pytest.raises(LocalProtocolError) as closed:
        begin(ledger, A, repair=True)  # closed now: nothing to repair
    assert closed.value.code == ErrorCode.RUN_NOT_OPEN
    # The last run resumed after its own items; a plain run_close is not marked.
    assert msgspec.json.decode(begin(ledger, B, resume=True)[1], type=RunResumeData).items == 3
    entry = ledger.close_run(CloseRun(id=4, session_id="s", run_id=B, time=TIME))
    assert msgspec.json.decode(entry.data) == {"error": None}


@pytest.mark.parametrize(
    "script",
    [
        [
            "begin A",
            "write 2",
            "release",
            "begin B",
            "write 3",
            "release",
            "repair A",
            "write 1",
            "close A",
        ],
        [
            "begin A",
            "release",
            "begin B",
            "write 1",
            "release",
            "repair A",
            "close A",
            "repair B",
            "write 1",
            "release",
        ],
        ["begin A", "write 2", "release", "begin B", "write 1", "release"],
        ["begin A", "write 2", "release", "resume A", "write 3", "release"],
        ["begin A", "write 2", "close A", "begin B", "checkpoint", "release"],
        ["begin A", "release", "resume A", "close A"],
    ],
)
def test_records_and_requests_give_the_same_ledger(script: list[str]) -> None:
    by_requests = RunLedger()
    written: list[tuple[str, str | None]] = []
    run = ""
    for step in script:
        op, _, arg = step.partition(" ")
        name = {"A": A, "B": B}.get(arg, "")
        if op in ("begin", "resume", "repair"):
            kind, _ = begin(by_requests, name, resume=op == "resume", repair=op == "repair")
            written.append((kind, name))
            run = name
        elif op == "write":
            by_requests.wrote(int(arg))
            written += [("turn_start", run)] * int(arg)
        elif op == "checkpoint":
            by_requests.checkpoint(
                SaveCheckpoint(id=2, session_id="s", run_id=run, time=TIME, snapshot=b"{}")
            )
            written.append(("checkpoint", run))
        elif op == "close":
            by_requests.close_run(CloseRun(id=3, session_id="s", run_id=name, time=TIME))
            written.append((RUN_CLOSE, name))
        else:
            by_requests.release()
    by_records = RunLedger()
    by_records.add("session_start", None)
    for kind, run_id in written:
        by_records.add(kind, run_id)
    assert (by_records.interrupted_runs, by_records.last_run, by_records.last_run_items) == (
        by_requests.interrupted_runs,
        by_requests.last_run,
        by_requests.last_run_items,
    )
    assert by_records.runs == by_requests.runs
