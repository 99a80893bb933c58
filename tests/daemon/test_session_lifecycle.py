"""Sessions through a real daemon, spoken to frame by frame."""

from __future__ import annotations

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    Open,
    RecordEvent,
    RecordFailed,
    RunStarted,
    SaveCheckpoint,
    SessionOpened,
    Sync,
    encode_frame,
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
    from flightlog.protocol import check as check_file
    from flightlog.protocol.wire import (
        RecordFailed,
    )

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


def test_records_of_two_sessions_in_one_burst_land_in_order_around_requests(
    daemon: DaemonProcess,
) -> None:
    # A connection hands the records of one session taken in a row to its actor as one
    # item: a record of the other session, a request, a large record (checked in a
    # worker thread) or a refused record each end such a run, and none may reorder.
    big = b'{"big":"%s"}' % (b"x" * 70_000)
    with RawClient(daemon.socket) as client:
        sessions = []
        for path in ("one.jsonl", "two.jsonl"):
            opened = client.request(Create(id=client.next_id(), path=path))
            assert isinstance(opened, SessionOpened)
            run = client.request(
                BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
            )
            assert isinstance(run, RunStarted)
            sessions.append((opened.session_id, run.run_id))
        (one, one_run), (two, two_run) = sessions
        checkpoint_id = client.next_id()
        bad = RecordEvent(
            session_id=one, run_id=one_run, event_type="turn_start", time="not a time", data=b"{}"
        )
        frames = [
            _record(one, one_run, 0),
            _record(one, one_run, 1),
            _record(two, two_run, 0),
            _record(one, one_run, 2),
            SaveCheckpoint(
                id=checkpoint_id, session_id=one, run_id=one_run, time=now(), snapshot=b"{}"
            ),
            _record(one, one_run, 3),
            RecordEvent(
                session_id=one, run_id=one_run, event_type="turn_start", time=now(), data=big
            ),
            _record(one, one_run, 4),
            _record(two, two_run, 1),
            bad,  # refused, alone
            _record(two, two_run, 2),
        ]
        client.send_bytes(b"".join(encode_frame(frame) for frame in frames))
        # The refusal leaves at once, the acknowledgement after the fsync: either first.
        replies = [client.receive(), client.receive()]
        assert Ack(id=checkpoint_id, seq=6) in replies, replies
        [failed] = [reply for reply in replies if isinstance(reply, RecordFailed)]
        assert failed.code == "bad_event" and failed.session_id == one, failed
        for session_id in (one, two):
            assert isinstance(client.request(Sync(id=client.next_id(), session_id=session_id)), Ack)
    one_lines = read_lines(daemon.root / "one.jsonl")
    assert [line["type"] for line in one_lines[2:]] == ["turn_start"] * 3 + ["checkpoint"] + [
        "turn_start"
    ] * 3
    assert [line["seq"] for line in one_lines] == list(range(1, 10))
    assert [line["data"].get("turn_index") for line in one_lines[2:]] == [0, 1, 2, None, 3, None, 4]
    assert one_lines[7]["data"] == {"big": "x" * 70_000}
    two_lines = read_lines(daemon.root / "two.jsonl")
    assert [line["data"]["turn_index"] for line in two_lines[2:]] == [0, 1, 2]
