"""Per-uid limits: what one uid may take of a daemon that several uids share.

Four limits, each per uid, over all of that uid's connections together: connections
served at once, sessions written at once, bytes per second read from its sockets and
rings (pokes included), and the share of the event loop's time its frames take
(:data:`LOOP_SHARE`: what the daemon spends on a frame is not its size; a refused
record costs far more than an accepted one).
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

    def __init__(self, uid: int, limits: PerUidLimits | None) -> None:
        self.uid = uid
        self.limits = limits
        self.connections: set[Writer] = set()
        #: Creates and opens under way: counted as sessions until they are answered.
        self.claims = 0
        #: What its connections make the daemon hold (``_budget``).
        self.memory = UidMemory(limited=limits is not None)
        rate = limits.bytes_per_second if limits else 0
        self._tokens = float(rate)
        #: Seconds of the event loop the uid may still take now.
        self._loop = LOOP_BURST
        self._stamp = time.monotonic()

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

    async def pace(self, nbytes: int, seconds: float = 0.0) -> None:
        """Count ``nbytes`` read from one of the uid's sockets and ``seconds`` of the
        event loop spent on what they said; wait (reading none of them meanwhile, as
        each of its connections waits here) while the uid is over its rate of bytes
        or its share of the loop (:data:`LOOP_SHARE`)."""
        if self.limits is None or not (nbytes or seconds):
            return
        rate = self.limits.bytes_per_second
        moment = time.monotonic()
        elapsed, self._stamp = moment - self._stamp, moment
        self._tokens = min(float(rate), self._tokens + elapsed * rate) - nbytes
        self._loop = min(LOOP_BURST, self._loop + elapsed * LOOP_SHARE) - seconds
        wait = max(-self._tokens / rate, -self._loop / LOOP_SHARE)
        if wait > 0:
            await anyio.sleep(wait)

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
        if limits is not None and len(share.connections) >= limits.connections:
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
