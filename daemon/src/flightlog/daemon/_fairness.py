"""Per-uid limits: what one uid may take of a daemon that several uids share.

Four limits, each per uid, over all of that uid's connections together: connections
served at once, sessions written at once, bytes per second read from its sockets and
rings (pokes included), and the share of the event loop's time its frames take
(:data:`LOOP_SHARE`: what the daemon spends on a frame is not its size; a refused
record costs far more than an accepted one).  And a uid's connections take their
turns on the loop one after another (:meth:`UidShare.take_turn`): the next begins
only once everything that was ready to run when the last one began has run, so a
uid's many connections make others wait one bounded turn, not one turn of each.
Its sessions' actors take the same turns for their batches, and its subscriptions
for their pushes: a uid's work, whoever does it for it, waits its turn.  And a uid
has at most :data:`DISK_JOBS_PER_UID` jobs in the disk threads at once (creates,
opens, writes, syncs, tails' reads), whose time counts against its share of the
loop too (the threads and the loop share one interpreter lock): a uid opening
sessions in a loop cannot take every thread of a root, nor the loop's time through
them.  Its connections themselves are work of its own: each is set up in one of its
turns once the uid is within its share (accepted at once, then queued in
:attr:`UidShare.arrivals`, counted as a connection), and what accepting, refusing,
setting up and closing it takes of the loop is charged to the uid
(:meth:`UidShare.spent`): a uid opening connections in a loop gets them set up at
the rate its share pays for.
They keep one runaway uid (a loop that connects, creates or sends without end) from
starving the agents of the others: past the first two it gets ``too_many``; past the
last two its sockets are left unread until it is back under the limit, so the
runaway slows down and loses nothing it sent, and the event loop's time goes to the
others meanwhile.

The daemon's own uid has no per-uid limits: the per-user daemon, whose only client is
its user, is bounded by its global limits alone (``--max-connections``, the
connection and subscriber budgets), as before.  Those global and per-connection
limits hold for every uid besides these.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import time
from collections.abc import Sized
from dataclasses import dataclass
from typing import Protocol

import anyio

from flightlog.protocol import (
    ErrorCode,
    LocalProtocolError,
)
from flightlog.protocol.wire import (
    UidLimits,
)

from ._budget import UidMemory

__all__ = [
    "DEFAULT_BYTES_PER_SECOND_PER_UID",
    "DEFAULT_CONNECTIONS_PER_UID",
    "DEFAULT_SESSIONS_PER_UID",
    "DISK_JOBS_PER_UID",
    "Fairness",
    "PerUidLimits",
    "UidShare",
]

#: Connections one uid may have served at once.
DEFAULT_CONNECTIONS_PER_UID = 256
#: Sessions one uid's connections may write at once.
DEFAULT_SESSIONS_PER_UID = 1024
#: Bytes per second read from one uid's sockets at most (a second's worth may come
#: at once).
DEFAULT_BYTES_PER_SECOND_PER_UID = 32 * 1024 * 1024
#: Seconds of the event loop per second that one uid's turns may take (decoding,
#: checking and refusing its frames, routing them, answering its requests): whatever
#: a uid sends, the others keep the rest.
LOOP_SHARE = 0.25
#: Seconds of the event loop one uid may take at once, above its share.
LOOP_BURST = 0.05
#: Jobs of one uid's in a root's disk threads at once (of ``_primitives.DISK_THREADS``).
DISK_JOBS_PER_UID = 4
#: Seconds of the disk threads' time one uid may take at once above its share (of
#: :data:`LOOP_SHARE`, counted apart from the loop's): a close's index of a big file
#: (tens of ms) is not paced for, a flood of opens is.
DISK_BURST = 0.25


@dataclass(frozen=True, kw_only=True)
class PerUidLimits:
    """The per-uid limits (``--max-connections-per-uid`` and its siblings)."""

    connections: int = DEFAULT_CONNECTIONS_PER_UID
    sessions: int = DEFAULT_SESSIONS_PER_UID
    bytes_per_second: int = DEFAULT_BYTES_PER_SECOND_PER_UID


class Writer(Protocol):
    """A connection as its uid's share counts it: the sessions it writes."""

    @property
    def sessions(self) -> Sized: ...


class UidShare:
    """One uid's share of the daemon: its connections and the bytes it may send.
    ``limits`` None: unlimited (the daemon's own uid)."""

    def __init__(
        self, uid: int, limits: PerUidLimits | None, loop_share: float = LOOP_SHARE
    ) -> None:
        self.uid = uid
        #: Seconds of the event loop per second its work may take.
        self._loop_share = loop_share
        self.limits = limits
        self.connections: set[Writer] = set()
        #: Creates and opens under way: counted as sessions until they are answered.
        self.claims = 0
        #: Its connections accepted and not yet set up (each set up in one of its
        #: turns, within its share: ``_server``): counted as connections.
        self.arrivals: collections.deque[socket.socket] = collections.deque()
        #: What its connections make the daemon hold (``_budget``).
        self.memory = UidMemory(limited=limits is not None)
        rate = limits.bytes_per_second if limits else 0
        self._tokens = float(rate)
        #: Seconds of the event loop, and of the disk threads, the uid may still take now.
        self._loop = LOOP_BURST
        self._disk = DISK_BURST
        self._stamp = time.monotonic()
        #: Whether one of its connections may begin a turn now (take_turn), and
        #: those waiting to, first come first served.
        self._turn_free = True
        self._turn_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        #: Its jobs in the disk threads at once (``_primitives.Disk.run``); None:
        #: unbounded (the daemon's own uid).
        self.disk_jobs = anyio.CapacityLimiter(DISK_JOBS_PER_UID) if limits else None

    @property
    def sessions(self) -> int:
        """Sessions this uid's connections write now."""
        return sum(len(conn.sessions) for conn in self.connections)

    def claim_session(self) -> None:
        """Take a place for a session about to be created or opened, before anything
        is awaited (give it back with :meth:`claimed` once it is answered, opened or
        not), so that creates at once on many connections cannot all pass.  Raises
        :class:`LocalProtocolError` (``too_many``) when the uid writes, or is about
        to, as many sessions as it may."""
        if self.limits is not None and self.sessions + self.claims >= self.limits.sessions:
            raise LocalProtocolError(
                f"uid {self.uid} writes {self.limits.sessions} sessions, the most one uid "
                "may (flightlogd --max-sessions-per-uid); close one first",
                code=ErrorCode.TOO_MANY,
            )
        self.claims += 1

    def claimed(self) -> None:
        """A claim is answered: the session is the connection's now, or was refused."""
        self.claims -= 1

    async def take_turn(self) -> None:
        """Wait until one of the uid's connections may begin a turn on the loop.  A
        turn taken closes the way until everything that was ready to run on the loop
        then has run (a callback queued now runs after all of it, on the loop's next
        round); then the connection waiting longest goes next.  So each round of the
        loop runs at most one turn of a uid's, however many connections it has, and
        every other uid's connection that was ready runs before its next.  A turn
        that waits (for a disk, for room) holds nobody up: the way opens on the next
        round all the same.  The daemon's own uid does not wait."""
        if self.limits is None:
            return
        if self._turn_free and not self._turn_waiters:
            self._turn_taken()
            return
        waiter = asyncio.get_running_loop().create_future()
        self._turn_waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # The way was handed to this one, which goes no further: pass it on.
                self._next_turn()
            else:
                with contextlib.suppress(ValueError):  # unless passed over already
                    self._turn_waiters.remove(waiter)
            raise
        self._turn_taken()

    def _turn_taken(self) -> None:
        self._turn_free = False
        asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A round of the loop went by since a turn began: the next may begin."""
        waiters = self._turn_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the way stays closed: that one's
                return
        self._turn_free = True

    async def pace(self, nbytes: int, seconds: float = 0.0) -> None:
        """Count ``nbytes`` read from one of the uid's sockets and ``seconds`` of the
        event loop spent on what they said (or on the uid's batches, pushes); wait
        (reading none of them meanwhile, as each of its connections waits here)
        while the uid is over its rate of bytes or its share of the loop
        (:data:`LOOP_SHARE`)."""
        wait = self._count(nbytes, seconds)
        if wait > 0:
            await anyio.sleep(wait)

    def spent(self, seconds: float) -> float:
        """Count ``seconds`` of the event loop spent for the uid outside its turns
        (accepting, setting up, refusing and closing its connections): its next
        setup (:meth:`within`) and its connections' next :meth:`pace` wait for them.
        Returns the seconds before it is back within its share (0 or less: none)."""
        return self._count(0, seconds)

    async def within(self) -> None:
        """Wait while the uid is over its rate of bytes or its shares."""
        wait = self._count(0, 0.0)
        if wait > 0:
            await anyio.sleep(wait)

    def charge(self, seconds: float) -> None:
        """Count ``seconds`` of a disk thread's time spent for the uid (its Python
        work holds the interpreter lock the loop needs too): past
        :data:`DISK_BURST`, its connections wait for them at their next :meth:`pace`."""
        self._count(0, 0.0, seconds)

    def _count(self, nbytes: int, seconds: float, disk: float = 0.0) -> float:
        """Count bytes and seconds; the seconds to wait before the uid is back within
        its rate and its shares (0 or less: none)."""
        if self.limits is None:
            return 0.0
        rate = self.limits.bytes_per_second
        moment = time.monotonic()
        elapsed, self._stamp = moment - self._stamp, moment
        self._tokens = min(float(rate), self._tokens + elapsed * rate) - nbytes
        share = self._loop_share
        self._loop = min(LOOP_BURST, self._loop + elapsed * share) - seconds
        self._disk = min(DISK_BURST, self._disk + elapsed * LOOP_SHARE) - disk
        return max(-self._tokens / rate, -self._loop / share, -self._disk / LOOP_SHARE)

    def status(self) -> UidLimits:
        limits = self.limits
        return UidLimits(
            uid=self.uid,
            connections=len(self.connections),
            sessions=self.sessions,
            max_connections=limits.connections if limits else None,
            max_sessions=limits.sessions if limits else None,
            max_bytes_per_second=limits.bytes_per_second if limits else None,
        )


class Fairness:
    """Every uid's share; the daemon's own uid is unlimited."""

    def __init__(self, limits: PerUidLimits, *, daemon_uid: int) -> None:
        self.limits = limits
        self.daemon_uid = daemon_uid
        self._shares: dict[int, UidShare] = {}

    def share(self, uid: int) -> UidShare:
        """The share of ``uid`` (made on its first connection)."""
        share = self._shares.get(uid)
        if share is None:
            limits = None if uid == self.daemon_uid else self.limits
            share = self._shares[uid] = UidShare(uid, limits)
        return share

    def admit(self, uid: int) -> UidShare:
        """The share a new connection of ``uid`` joins (with :meth:`join`).  Raises
        :class:`LocalProtocolError` (``too_many``) when the uid has as many
        connections as it may."""
        share = self.share(uid)
        limits = share.limits
        if (
            limits is not None
            and len(share.connections) + len(share.arrivals) >= limits.connections
        ):
            raise LocalProtocolError(
                f"uid {uid} has {limits.connections} connections, the most one uid may "
                "(flightlogd --max-connections-per-uid); try again later",
                code=ErrorCode.TOO_MANY,
            )
        return share

    def join(self, share: UidShare, conn: Writer) -> None:
        share.connections.add(conn)

    def leave(self, share: UidShare, conn: Writer) -> None:
        # The share stays (a few numbers per uid ever seen): a uid that reconnects
        # finds its rate where it left it, not a fresh second's worth.
        share.connections.discard(conn)
