"""A uid's work takes its uid's turns, whoever does it (issue 27, 3): its sessions'
batches and its subscriptions' pushes run one per round of the event loop, as its
connections' turns do, and its jobs in a root's disk threads are bounded, so that a
uid opening sessions in a loop cannot take every thread another uid's sync waits for.

The daemon runs in this process (its loop's rounds are counted by a callback that
queues itself again each round, and its fsync can be held); its clients are children
forked from the test that take throwaway uids.  What is asserted is the order and the
count of what ran, never a time.
"""

from __future__ import annotations

import threading
from asyncio import AbstractEventLoop
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faults.harness import DiskFaults, InProcessDaemon

from flightlog.daemon import _connection
from flightlog.daemon._actor import SessionActor
from flightlog.daemon._fairness import DISK_JOBS_PER_UID
from flightlog.daemon._peers import LARGE_PAYLOAD
from flightlog.daemon._primitives import DISK_THREADS
from flightlog.daemon._tail import Subscription
from flightlog.protocol.wire import (
    Ack,
    Create,
    SessionOpened,
    Subscribe,
    Subscribed,
    Sync,
    TailBatch,
    encode_frame,
)
from support import RawClient, wait_for
from support.daemon import (
    AsUid,
    Signal,
    as_uid,
    begin,
    checkpoint,
    create,
    fact,
    needs_root,
    synced_seq,
)

pytestmark = needs_root

FLOODER = 43001
VICTIM = 43002
#: The flooder's sessions, subscriptions: more than one turn's worth at once.
_MANY = 8


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[InProcessDaemon]:
    """flightlogd in this process, with a socket every uid may connect to."""
    short_tmp.chmod(0o755)
    (short_tmp / "run").mkdir(mode=0o755)
    with InProcessDaemon(short_tmp, socket_mode=0o666) as proc:
        yield proc


class _Rounds:
    """Counts the rounds of the daemon's event loop while it runs (a callback that
    queues itself again: each round runs it once)."""

    def __init__(self, loop: AbstractEventLoop) -> None:
        self.count = 0
        self._loop = loop
        self._on = True
        loop.call_soon_threadsafe(self._tick)

    def _tick(self) -> None:
        self.count += 1
        if self._on:
            self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._on = False


def _counted(
    daemon: InProcessDaemon, child: AsUid, ready: Signal, go: Signal, rounds: list[_Rounds]
) -> Any:
    """What ``child`` returns, the daemon's rounds counted from when it was ready
    until it is done (go: what it does then is counted)."""
    ready.wait()
    assert daemon.daemon is not None
    rounds.append(_Rounds(daemon.daemon.poller._loop))
    go.set()
    try:
        return child.result()
    finally:
        rounds[0].stop()


def _victim(socket: str) -> int:
    """As another uid: a session created, a record and a checkpoint; the checkpoint's
    seq (after the session's start, the run's and the record's: 4)."""
    with RawClient(socket, client="victim") as client:
        opened = create(client, "mine.jsonl")
        run = begin(client, opened.session_id)
        client.send(fact(opened.session_id, run.run_id))
        return checkpoint(client, opened.session_id, run.run_id, b"{}").seq


def _served_meanwhile(
    daemon: InProcessDaemon,
    flood: Callable[[], Any],
    sent: Signal,
    done: Signal,
    gate: threading.Event,
    jobs: Callable[[], int],
) -> Any:
    """What ``flood`` returns, run as the flooder, whose jobs wait at ``gate`` once it
    has ``sent``: while they wait (``jobs`` of them, their most at once), another uid
    is served, and the flooder's jobs are its bound, the rest waiting their turn."""
    flooder = AsUid(FLOODER, flood)
    try:
        sent.wait()
        wait_for(lambda: jobs() >= DISK_JOBS_PER_UID, timeout=60)
        # Another uid creates, records and syncs meanwhile.
        assert as_uid(VICTIM, lambda: _victim(daemon.socket)) == 4
        assert jobs() == DISK_JOBS_PER_UID
    finally:
        gate.set()
        done.set()
    return flooder.result()


def _one_a_round(seen: list[tuple[int, int | None]]) -> None:
    """The flooder's work seen, each in a round of the loop of its own.

    The count a piece of work sees is its round's, or the one before (the counting
    callback runs before or after it within the round), so two pieces in consecutive
    rounds may see the same count, and no more than two: at least half as many counts
    as pieces. All in one round (before) shows one count, or two."""
    assert [uid for _, uid in seen] == [FLOODER] * _MANY
    assert len({round_ for round_, _ in seen}) >= _MANY // 2, seen


def test_a_uids_session_batches_take_one_turn_a_round(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: one read of records for eight sessions woke eight actors, whose
    batches all ran in the next round."""
    rounds: list[_Rounds] = []
    batches: list[tuple[int, int | None]] = []
    process = SessionActor._process

    async def counted(self: SessionActor, items: list[Any]) -> bool:
        if rounds and any(isinstance(message, list) for _, message in items):
            batches.append((rounds[0].count, self.writer.uid if self.writer else None))
        return await process(self, items)

    monkeypatch.setattr(SessionActor, "_process", counted)
    ready, go = Signal(), Signal()

    def flood() -> None:
        with RawClient(daemon.socket, client="flooder") as client:
            sessions = []
            for n in range(_MANY):
                opened = create(client, f"s{n}.jsonl")
                sessions.append((opened.session_id, begin(client, opened.session_id).run_id))
            ready.set()
            go.wait()
            # One write: every session's record read at once, in one turn.
            client.send_bytes(b"".join(encode_frame(fact(sid, rid)) for sid, rid in sessions))
            for sid, _ in sessions:
                assert isinstance(client.request(Sync(id=client.next_id(), session_id=sid)), Ack)

    _counted(daemon, AsUid(FLOODER, flood), ready, go, rounds)
    _one_a_round(batches)


def test_a_uids_subscription_pushes_take_one_turn_a_round(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: one record written to a session with eight subscribers woke eight
    subscriptions, whose pushes all ran in the next round."""
    rounds: list[_Rounds] = []
    pushes: list[tuple[int, int | None]] = []
    send = Subscription._send

    async def counted(self: Subscription, lines: list[bytes], path: str | None) -> None:
        if rounds and lines:
            pushes.append((rounds[0].count, self.peer.uid))
        await send(self, lines, path)

    monkeypatch.setattr(Subscription, "_send", counted)
    ready, go = Signal(), Signal()

    def flood() -> int:
        with RawClient(daemon.socket, client="flooder") as writer:
            opened = create(writer, "followed.jsonl")
            run = begin(writer, opened.session_id)
            followers = [RawClient(daemon.socket, client="follower") for _ in range(_MANY)]
            for follower in followers:
                subscribed = follower.request(
                    Subscribe(id=follower.next_id(), path="followed.jsonl", follow=True)
                )
                assert isinstance(subscribed, Subscribed), subscribed
                caught_up = follower.receive()  # the lines written so far
                assert isinstance(caught_up, TailBatch), caught_up
            ready.set()
            go.wait()
            writer.send(fact(opened.session_id, run.run_id))
            for follower in followers:
                pushed = follower.receive()
                assert isinstance(pushed, TailBatch), pushed
                follower.close()
            return len(followers)

    assert _counted(daemon, AsUid(FLOODER, flood), ready, go, rounds) == _MANY
    _one_a_round(pushes)


def test_a_uid_opening_sessions_holds_at_most_its_share_of_the_disk_threads(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: creates on as many connections as a root has disk threads took every
    one of them, and another uid's create and checkpoint waited behind them."""
    faults = DiskFaults(monkeypatch)
    held = faults.on(daemon.root / "uid" / str(FLOODER) / "held")
    # Its creates reach the disk, and wait there (the disk hangs).
    held.fsync_gate = gate = threading.Event()
    sent, done = Signal(), Signal()
    creates = DISK_THREADS + 4

    def flood() -> list[Any]:
        clients = [RawClient(daemon.socket, client="flooder") for _ in range(creates)]
        for n, client in enumerate(clients):
            client.send(Create(id=client.next_id(), path=f"held/{n}.jsonl", meta={}))
        sent.set()
        done.wait(120)
        replies = [client.receive(timeout=60) for client in clients]
        for client in clients:
            client.close()
        return replies

    replies = _served_meanwhile(daemon, flood, sent, done, gate, lambda: held.fsyncs)
    assert all(isinstance(reply, SessionOpened) for reply in replies), replies
    assert len(replies) == creates


def test_a_uids_large_payloads_are_checked_at_most_its_share_at_once(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every connection of a uid had one large record checked in a worker
    thread at once (Python's JSON checks, under the interpreter lock the loop needs),
    up to all 40 of anyio's threads."""
    gate = threading.Event()
    lock = threading.Lock()
    running = [0, 0]  # now, at most
    check = _connection.check_json

    def held(data: bytes, what: str) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        gate.wait(60)
        with lock:
            running[0] -= 1
        check(data, what)

    monkeypatch.setattr(_connection, "check_json", held)
    sent, done = Signal(), Signal()
    connections = 3 * DISK_JOBS_PER_UID
    large = b'{"turn_index":0,"note":"%s"}' % (b"x" * LARGE_PAYLOAD)

    def flood() -> list[int]:
        clients = [RawClient(daemon.socket, client="flooder") for _ in range(connections)]
        sessions = []
        for n, client in enumerate(clients):
            opened = create(client, f"large/{n}.jsonl")
            sessions.append((opened.session_id, begin(client, opened.session_id).run_id))
        for client, (sid, rid) in zip(clients, sessions, strict=True):
            client.send(fact(sid, rid, data=large))
        sent.set()
        done.wait(120)
        seqs = [synced_seq(client, sid) for client, (sid, _) in zip(clients, sessions, strict=True)]
        for client in clients:
            client.close()
        return seqs

    seqs = _served_meanwhile(daemon, flood, sent, done, gate, lambda: running[1])
    assert seqs == [3] * connections  # each large record written
