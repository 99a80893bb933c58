"""A ``begin_run`` the session refuses opens nothing, on the daemon's side too.

Whether a run id is fresh, or a run may be resumed, only the session's file knows, so
those refusals come from the session, after the connection's rules let the request
through.  The connection must then forget the run it was about to open: the writer can
begin or resume another, and records that named the refused run (sent right behind it,
before its answer) are refused, never written.
"""

from __future__ import annotations

from pathlib import Path

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    BeginRun,
    CloseSession,
    Create,
    ErrorReply,
    Open,
    RecordEvent,
    RecordFailed,
    RunStarted,
    Sync,
)
from support import DaemonProcess, RawClient, read_lines

CUT = "c" * 32
OTHER = "d" * 32


def _cut_run(daemon: DaemonProcess) -> str:
    """A session whose run CUT was left without run_close; its path."""
    with RawClient(daemon.socket) as writer:
        opened = writer.request(Create(id=writer.next_id(), path="cut.jsonl"))
        sid = opened.session_id
        started = writer.request(
            BeginRun(id=writer.next_id(), session_id=sid, time=now(), run_id=CUT)
        )
        assert isinstance(started, RunStarted)
        writer.request(CloseSession(id=writer.next_id(), session_id=sid))
    return str(opened.path)


def test_a_refused_begin_run_leaves_the_writer_free_to_begin_another(
    daemon: DaemonProcess,
) -> None:
    path = _cut_run(daemon)
    with RawClient(daemon.socket) as writer:
        sid = writer.request(Open(id=writer.next_id(), path="cut.jsonl")).session_id
        stale = writer.request(
            BeginRun(id=writer.next_id(), session_id=sid, time=now(), run_id=CUT)
        )
        assert isinstance(stale, ErrorReply) and stale.code == "bad_message"
        wrong = writer.request(
            BeginRun(id=writer.next_id(), session_id=sid, time=now(), resume=OTHER)
        )
        assert isinstance(wrong, ErrorReply) and wrong.code == "run_not_open"
        resumed = writer.request(
            BeginRun(id=writer.next_id(), session_id=sid, time=now(), resume=CUT)
        )
        assert isinstance(resumed, RunStarted) and resumed.run_id == CUT
    types = [(line["type"], line["run_id"]) for line in read_lines(Path(path))]
    assert types == [("session_start", None), ("run_start", CUT), ("run_resume", CUT)]


def test_records_behind_a_refused_begin_run_are_refused_not_written(
    daemon: DaemonProcess,
) -> None:
    path = _cut_run(daemon)
    with RawClient(daemon.socket) as writer:
        sid = writer.request(Open(id=writer.next_id(), path="cut.jsonl")).session_id
        # Sent in one go: the records are past the connection's rules before the
        # session refuses the run they name.
        begin = BeginRun(id=writer.next_id(), session_id=sid, time=now(), resume=OTHER)
        writer.send(begin)
        for _ in range(3):
            writer.send(
                RecordEvent(
                    session_id=sid, run_id=OTHER, event_type="turn_start", time=now(), data=b"{}"
                )
            )
        synced = writer.request(Sync(id=writer.next_id(), session_id=sid))
        received = [*writer.pending, synced]
        refused = [m for m in received if isinstance(m, ErrorReply) and m.id == begin.id]
        assert [m.code for m in refused] == ["run_not_open"]
        pushed = [m for m in received if isinstance(m, RecordFailed)]
        assert [(m.run_id, m.code) for m in pushed] == [(OTHER, "run_not_open")]
    assert all(line["run_id"] != OTHER for line in read_lines(Path(path)))
