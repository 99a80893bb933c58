"""``status`` shows a uid only its own figures (issue 27, 7), with several real uids.

A uid that does not read every session sees its own sessions, counters and closed
sessions, and nothing of another uid's; the sessions closed lately are kept per uid,
so that a uid closing sessions in a loop cannot push another's out of the list (a
tail of every session back from away reads those it missed from it).  Root sees them
all.  Each client runs in a child forked from the test that takes a throwaway uid.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.daemon._owners import CLOSED_PER_UID
from flightlog.protocol.wire import (
    Ack,
    CloseSession,
    Create,
    SessionOpened,
    Status,
    StatusReply,
)
from support import DaemonProcess, RawClient
from support.daemon import (
    AsUid,
    Signal,
    as_uid,
    begin,
    create,
    fact,
    needs_root,
    shared_daemon,
    synced_seq,
)

pytestmark = needs_root

QUIET = 42001
BUSY = 42002
#: Creates (then closes) sent at once, within the default sessions per uid.
_WAVE = 256


@pytest.fixture
def shared() -> Iterator[DaemonProcess]:
    with shared_daemon() as proc:
        yield proc


def _status(socket: str) -> StatusReply:
    with RawClient(socket) as client:
        reply = client.request(Status(id=client.next_id(), closed=True))
    assert isinstance(reply, StatusReply), reply
    return reply


def _quiet(socket: str) -> str:
    """As QUIET: one session created and closed; its path."""
    with RawClient(socket, client="quiet") as client:
        closed = create(client, "closed.jsonl")
        done = client.request(CloseSession(id=client.next_id(), session_id=closed.session_id))
        assert isinstance(done, Ack), done
    return closed.path


def _churn(socket: str, sessions: int) -> list[str]:
    """As BUSY: create and close ``sessions`` sessions, a wave of them at a time; the
    paths, in the order closed."""
    paths: list[str] = []
    with RawClient(socket, client="busy") as client:
        for start in range(0, sessions, _WAVE):
            names = [f"churn/{n}.jsonl" for n in range(start, min(start + _WAVE, sessions))]
            for name in names:
                client.send(Create(id=client.next_id(), path=name, meta={}))
            opened = [client.receive(timeout=60) for _ in names]
            assert all(isinstance(reply, SessionOpened) for reply in opened), opened[:3]
            for reply in opened:
                client.send(CloseSession(id=client.next_id(), session_id=reply.session_id))
            closes = [client.receive(timeout=60) for _ in names]
            assert all(isinstance(reply, Ack) for reply in closes), closes[:3]
            paths += [reply.path for reply in opened]
    return paths


def test_a_uid_keeps_its_closed_sessions_through_another_uids_churn(
    shared: DaemonProcess,
) -> None:
    """Before: the closed list was the daemon's last 1,024 in all, so BUSY closing
    more than that pushed QUIET's out of it."""
    closed = as_uid(QUIET, lambda: _quiet(shared.socket))
    # Every close is answered once its session is finished, listed closed by then.
    churned = as_uid(BUSY, lambda: _churn(shared.socket, CLOSED_PER_UID + 8))
    quiet = as_uid(QUIET, lambda: _status(shared.socket))
    busy = as_uid(BUSY, lambda: _status(shared.socket))
    everything = _status(shared.socket)

    # QUIET: its closed session is still listed, and nothing of BUSY's.
    assert [status.path for status in quiet.closed] == [closed]
    # BUSY: its own latest, its share of the list, the latest last.
    assert [status.path for status in busy.closed] == churned[-CLOSED_PER_UID:]
    # Root: both uids', the latest last.
    assert [status.path for status in everything.closed] == [
        closed,
        *churned[-CLOSED_PER_UID:],
    ]


def _hold(
    socket: str, name: str, records: int, mine: Signal, theirs: Signal
) -> tuple[StatusReply, str]:
    """As a uid: a session open with ``records`` records in it; its status once the
    other uid's session is open too, and its path."""
    with RawClient(socket, client=name) as client:
        opened = create(client, f"{name}.jsonl")
        run = begin(client, opened.session_id)
        for _ in range(records):
            client.send(fact(opened.session_id, run.run_id))
        synced_seq(client, opened.session_id)
        mine.set()
        theirs.wait()
        reply = client.request(Status(id=client.next_id(), closed=True))
        assert isinstance(reply, StatusReply), reply
        # Held until the other has asked too.
        mine.set()
        theirs.wait()
    return reply, opened.path


def test_status_shows_a_uid_only_its_own_open_sessions_and_counters(
    shared: DaemonProcess,
) -> None:
    quiet_ready, busy_ready = Signal(), Signal()
    quiet_child = AsUid(QUIET, lambda: _hold(shared.socket, "quiet", 3, quiet_ready, busy_ready))
    busy_child = AsUid(BUSY, lambda: _hold(shared.socket, "busy", 30, busy_ready, quiet_ready))
    quiet, quiet_path = quiet_child.result()
    busy, busy_path = busy_child.result()
    for reply, path, uid in ((quiet, quiet_path, QUIET), (busy, busy_path, BUSY)):
        written = (shared.root / "uid" / str(uid) / Path(path).name).read_bytes()
        assert [status.path for status in reply.sessions] == [path]
        assert (reply.records_written, reply.bytes_written) == (
            written.count(b"\n"),
            len(written),
        )
        assert (reply.connections, reply.subscribers, reply.errors) == (1, 0, 0)
        assert reply.closed == []
