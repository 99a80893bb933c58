"""``status`` through a real daemon: what it counts for a session is what its file holds."""

from __future__ import annotations

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    CloseRun,
    CloseSession,
    Open,
    SessionOpened,
    SessionStatus,
    Status,
    StatusReply,
    Sync,
)
from support import DaemonProcess, RawClient, wait_for
from support.daemon import begin, create, fact


def _status(client: RawClient, path: str) -> tuple[int, int, int]:
    reply = client.request(Status(id=client.next_id()))
    assert isinstance(reply, StatusReply)
    (session,) = [s for s in reply.sessions if s.path == path]
    return session.records, session.bytes, session.last_seq


def test_a_new_session_counts_every_line_of_its_file(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        opened = create(client, "counted.jsonl", agent="demo")
        assert _status(client, opened.path) == (
            1,
            (daemon.root / "counted.jsonl").stat().st_size,
            1,
        )
        run = begin(client, opened.session_id)
        for n in range(44):
            client.send(fact(opened.session_id, run.run_id, n))
        client.request(
            CloseRun(
                id=client.next_id(), session_id=opened.session_id, run_id=run.run_id, time=now()
            )
        )
        data = (daemon.root / "counted.jsonl").read_bytes()
        # session_start, run_start, 44 facts, run_close: 47 lines, all counted.
        assert _status(client, opened.path) == (data.count(b"\n"), len(data), 47)
        assert data.count(b"\n") == 47


def test_a_reopened_session_counts_the_lines_written_since(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        opened = create(client, "again.jsonl")
        client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
    before = (daemon.root / "again.jsonl").stat().st_size
    with RawClient(daemon.socket) as client:
        reopened = client.request(Open(id=client.next_id(), path="again.jsonl"))
        assert isinstance(reopened, SessionOpened)
        assert _status(client, reopened.path) == (0, 0, 1)
        run = begin(client, reopened.session_id)
        client.send(fact(reopened.session_id, run.run_id))
        synced = client.request(Sync(id=client.next_id(), session_id=reopened.session_id))
        assert synced == Ack(id=synced.id, seq=3)
        size = (daemon.root / "again.jsonl").stat().st_size
        assert _status(client, reopened.path) == (2, size - before, 3)


def _closed(client: RawClient) -> list[SessionStatus]:
    reply = client.request(Status(id=client.next_id(), closed=True))
    assert isinstance(reply, StatusReply)
    return reply.closed


def test_status_lists_the_sessions_closed_when_asked(daemon: DaemonProcess) -> None:
    path = str(daemon.root / "closed.jsonl")
    with RawClient(daemon.socket) as client:
        opened = create(client, "closed.jsonl")
        client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
        wait_for(lambda: bool(_closed(client)))
        reopened = client.request(Open(id=client.next_id(), path="closed.jsonl"))
        assert isinstance(reopened, SessionOpened)
        run = begin(client, reopened.session_id)
        client.send(fact(reopened.session_id, run.run_id))
        client.request(CloseSession(id=client.next_id(), session_id=reopened.session_id))
        # Listed once, counting the lines written over both openings.
        wait_for(lambda: [s.last_seq for s in _closed(client)] == [3])
        (closed,) = _closed(client)
        size = (daemon.root / "closed.jsonl").stat().st_size
        assert (closed.path, closed.session_id) == (path, opened.session_id)
        assert (closed.records, closed.bytes, closed.file_open) == (3, size, False)
        plain = client.request(Status(id=client.next_id()))
        assert isinstance(plain, StatusReply)
        assert (plain.sessions, plain.closed) == ([], [])
