"""Sessions through a real daemon, spoken to frame by frame."""

from __future__ import annotations

from flightlog.protocol import (
    Ack,
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    Open,
    RecordEvent,
    RunStarted,
    SessionOpened,
    now,
)
from support import DaemonProcess, RawClient, read_lines


def _record(session_id: str, run_id: str, n: int) -> RecordEvent:
    return RecordEvent(
        session_id=session_id,
        run_id=run_id,
        event_type="turn_start",
        time=now(),
        data=b'{"turn_index":%d}' % n,
    )


def test_create_record_close_writes_contiguous_lines(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        opened = client.request(Create(id=client.next_id(), path="a/b.jsonl", meta={"k": "v"}))
        assert isinstance(opened, SessionOpened)
        assert opened.last_seq == 1
        run = client.request(
            BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
        )
        assert isinstance(run, RunStarted)
        for n in range(100):
            client.send(_record(opened.session_id, run.run_id, n))
        closed = client.request(
            CloseRun(
                id=client.next_id(), session_id=opened.session_id, run_id=run.run_id, time=now()
            )
        )
        assert closed == Ack(id=closed.id, seq=103)
        done = client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
        assert isinstance(done, Ack)
    lines = read_lines(daemon.root / "a" / "b.jsonl")
    assert [line["seq"] for line in lines] == list(range(1, 104))
    assert lines[0]["data"] == {"format_version": 1, "meta": {"k": "v"}}
    assert [line["data"]["turn_index"] for line in lines[2:102]] == list(range(100))
    assert lines[-1]["type"] == "run_close"


def test_second_writer_is_refused_with_the_holders_pid(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as first, RawClient(daemon.socket) as second:
        first.request(Create(id=first.next_id(), path="busy.jsonl"))
        refused = second.request(Open(id=second.next_id(), path="busy.jsonl"))
        assert isinstance(refused, ErrorReply)
        assert refused.code == "session_busy"
        import os

        assert f"pid {os.getpid()}" in refused.message


def test_disconnect_releases_the_session_and_keeps_the_run_open(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        opened = client.request(Create(id=client.next_id(), path="gone.jsonl"))
        run = client.request(
            BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
        )
        for n in range(10):
            client.send(_record(opened.session_id, run.run_id, n))
    with RawClient(daemon.socket) as again:
        reopened = again.request(Open(id=again.next_id(), path="gone.jsonl"))
        assert isinstance(reopened, SessionOpened), reopened
        assert reopened.last_seq == 12
        assert reopened.interrupted_runs == [run.run_id]
        second = again.request(
            BeginRun(id=again.next_id(), session_id=reopened.session_id, time=now())
        )
        assert isinstance(second, RunStarted)
        assert second.seq == 13


def test_deeply_nested_data_is_refused_not_written(daemon: DaemonProcess) -> None:
    from flightlog.protocol import RecordFailed
    from flightlog.protocol import check as check_file

    with RawClient(daemon.socket) as client:
        opened = client.request(Create(id=client.next_id(), path="deep.jsonl"))
        run = client.request(
            BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
        )
        # Valid JSON on its own at every depth, but at 997 levels the line that would
        # carry it nests one deeper than a reader can parse.
        for depth in (997, 5000):
            client.send(
                RecordEvent(
                    session_id=opened.session_id,
                    run_id=run.run_id,
                    event_type="turn_start",
                    time=now(),
                    data=b'{"a":' + b"[" * depth + b"]" * depth + b"}",
                )
            )
            pushed = client.receive()
            assert isinstance(pushed, RecordFailed)
            assert pushed.code == "bad_event"
            run = client.request(
                CloseRun(
                    id=client.next_id(), session_id=opened.session_id, run_id=run.run_id, time=now()
                )
            )
            run = client.request(
                BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
            )
        client.send(_record(opened.session_id, run.run_id, 1))
        client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
    with (daemon.root / "deep.jsonl").open("rb") as fileobj:
        report = check_file(fileobj)
    assert report.sound, report
    assert report.records == 7
