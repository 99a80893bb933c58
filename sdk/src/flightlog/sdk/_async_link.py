"""How a client's runs, sessions and tails reach the daemon: :class:`AsyncLink`.

The sync link is generated from the async one by ``tests/sdk/unasync.py``, as the sync
client is from the async one.  A link owns the transport and the
:class:`flightlog.protocol.wire.ClientConnection`, and moves bytes between them; the client,
its sessions, runs and tails hold the same link and use nothing else of each other:
they build requests with :attr:`AsyncLink.conn` and send them with
:meth:`~AsyncLink.call` or :meth:`~AsyncLink.send_records`, wait with
:meth:`~AsyncLink.receive_until`, and take in pushes with :meth:`~AsyncLink.poll`.

One link may be shared by several tasks: frames are sent whole under a lock, and the
task that holds the receive lock feeds whatever arrives to the connection, so each task
finds its own reply there.

When the connection breaks, the first task to notice reconnects while holding both
locks (every other task waits for it), for up to the reconnect grace period: it opens
each session again, continues each open run and sends again what the daemon had not
acknowledged; then every waiting request is sent again (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from functools import partial
from time import monotonic, monotonic_ns
from types import TracebackType
from typing import Any, Self, TypeVar

from flightlog.protocol import (
    ErrorCode,
    FlightlogError,
)
from flightlog.protocol.wire import (
    ClientConnection,
    Pending,
)

from ._exceptions import ConnectError, ConnectionLost, DaemonError
from ._synchronization import AsyncLock, asleep, async_wait_blocks_loop
from ._transport import AsyncSocketTransport, AsyncTransport

__all__ = ["AsyncLink", "AsyncResource"]

T = TypeVar("T")

logger = logging.getLogger("flightlog.sdk")

#: How long record() may go without looking for pushed errors: a poll is a syscall, and
#: a burst of records needs one per millisecond, not one per record.
_POLL_INTERVAL_NS = 1_000_000
#: The first wait between attempts to reconnect, doubled up to the last (seconds).
_FIRST_RETRY = 0.02
_LAST_RETRY = 1.0
#: Refusals of a reopen that a moment may cure: the old connection not yet released,
#: the daemon shutting down or full.
_TRANSIENT = frozenset({ErrorCode.SESSION_BUSY, ErrorCode.SHUTTING_DOWN, ErrorCode.TOO_MANY})


class AsyncLink:
    """The transport and the protocol state of one client, and how bytes move between
    them; ``reconnect_grace`` and ``best_effort`` are :func:`aconnect`'s."""

    def __init__(
        self,
        transport: AsyncTransport,
        conn: ClientConnection,
        *,
        reconnect_grace: float,
        best_effort: bool,
    ) -> None:
        self.transport = transport
        self.conn = conn
        self._send_lock = AsyncLock()
        self._receive_lock = AsyncLock()
        self.closed = False
        #: :meth:`poll` is due once this monotonic_ns() is reached.
        self.poll_due = 0
        self._grace = reconnect_grace
        #: One more for every reconnect: a task that saw the old connection break knows
        #: whether someone else has reconnected since.
        self.generation = 0
        #: How many times the link reconnected.
        self.reconnects = 0
        #: Whether record() never raises (see :func:`aconnect`).
        self.best_effort = best_effort
        #: Best effort: the events record() did not record, per error code.
        self.dropped: dict[str, int] = {}
        #: Best effort, after a grace ran out: the monotonic() of the next attempt.
        self._retry_due = 0.0
        # Tails ride through a reconnect too (only a link that reconnects makes one).
        conn.tails.resume = reconnect_grace > 0 and self.path is not None
        #: Uids trusted as the daemon's beside the defaults, at every reconnect (see
        #: :func:`~flightlog.sdk.aio.aconnect`).
        self.trusted: frozenset[int] = frozenset()

    @property
    def path(self) -> str | None:
        """The daemon's socket path (None for a transport without one)."""
        path = getattr(self.transport, "path", None)
        return path if isinstance(path, str) else None

    async def hello(self) -> None:
        """The handshake, on a new link."""
        self.conn.ring = self.transport.wants_ring
        welcome = await self.call(self.conn.hello())
        self.transport.welcomed(welcome.ring)

    async def aclose(self) -> None:
        """Close the connection; safe to call again."""
        if not self.closed:
            self.closed = True
            self.conn.connection_lost(ConnectionLost("the client is closed"))
            await self.transport.aclose()

    # --------------------------------------------------------------- requests

    async def call(self, pending: Pending[T]) -> T:
        """Send ``pending`` and wait for its result; sent again after a reconnect."""
        while True:
            generation = self.generation
            try:
                await self.send(pending.data, pending)
                await self.receive_until(partial(self.conn.answered, pending))
                return self.conn.result(pending)
            except ConnectionLost:
                if not self.reconnecting():
                    raise
            except FlightlogError as exc:
                self.conn.forget(pending)
                instead = self.conn.open_instead(pending, exc)
                if instead is None:
                    raise
                pending = instead
                continue
            except BaseException:
                self.conn.forget(pending)
                raise
            await self.recover(generation)
            pending = self.conn.retry(pending)
            if pending.settled is not None:
                return pending.settled[0]

    async def call_unless_loop(self, pending: Pending[None]) -> None:
        """:meth:`call` for a request whose reply only confirms durability (closing a
        run or a session): on a thread that runs an event loop, it is sent and the
        daemon answers to no one, rather than stall the loop for an fsync."""
        if async_wait_blocks_loop():
            self.conn.forget(pending)
            await self.send(pending.data)
            return
        await self.call(pending)

    async def send(self, data: bytes, request: Pending[Any] | None = None) -> None:
        """Send ``data`` (the frame of ``request``) behind the frames queued."""
        async with self._send_lock:
            queued = self.conn.take_outbox()
            if request is not None:
                self.conn.replay_log.sending(request)
            try:
                await self.transport.send(queued + data if queued else data)
            except ConnectionLost as exc:
                self.conn.connection_lost(exc)
                raise

    async def flush(self) -> None:
        """Send the frames queued without a caller (a tail's next file to read)."""
        if self.conn.has_outbox:
            await self.send(b"")

    async def send_records(self, session_id: str, frames: Sequence[bytes]) -> None:
        """Send record ``frames``, kept until acknowledged; waits while the session
        keeps more than ``max_unacked``."""
        conn = self.conn
        generation = self.generation
        try:
            async with self._send_lock:
                # Kept before they are sent (a broken connection's failure is raised
                # once they are): the reconnect sends them.
                await self.transport.send(conn.send_records(session_id, frames))
        except ConnectionLost as exc:
            conn.connection_lost(exc)
            if not self.reconnecting():
                raise
            await self.recover(generation)
        replay = conn.replay_log
        if replay.filled and replay.full(session_id):
            # keep() asked for the acknowledgement this waits for.
            await self.receive_until(lambda: not replay.full(session_id))

    def count_dropped(self, exc: FlightlogError, count: int) -> None:
        """Best effort: ``count`` events were not recorded for ``exc``."""
        first = exc.code not in self.dropped
        self.dropped[exc.code] = self.dropped.get(exc.code, 0) + count
        if first:
            logger.warning(
                "flightlog dropped an event (%s); the agent goes on, this kind of problem "
                "is logged once and counted in client.dropped and in the run's run_close",
                exc,
            )

    # --------------------------------------------------------------- receiving

    async def receive_until(self, done: Callable[[], bool]) -> None:
        """Feed what arrives to the connection until ``done()`` (or it fails)."""
        while not done():
            async with self._receive_lock:
                if done():
                    return
                try:
                    data = await self.transport.receive()
                except ConnectionLost as exc:
                    self.conn.connection_lost(exc)
                    return
                self.conn.receive_data(data)

    def poll(self) -> None:
        """Take in what has arrived (pushed errors) without waiting; when someone else
        is receiving, they take it in."""
        self.poll_due = monotonic_ns() + _POLL_INTERVAL_NS
        if not self._receive_lock.try_acquire():
            return
        try:
            data = self.transport.receive_nowait()
            if data is not None:
                self.conn.receive_data(data)
        except ConnectionLost as exc:
            self.conn.connection_lost(exc)
        finally:
            self._receive_lock.release()

    # --------------------------------------------------------------- reconnecting

    def reconnecting(self) -> bool:
        """Whether a broken connection is to be made again (now)."""
        failure = self.conn.failure
        if (
            self.closed
            or self._grace <= 0
            or self.path is None
            or not isinstance(failure, ConnectionLost)
        ):
            return False
        if failure.code == ErrorCode.CONNECTION_LOST:
            return True
        return (
            self.best_effort
            and failure.code == ErrorCode.DAEMON_UNREACHABLE
            and monotonic() >= self._retry_due
        )

    async def ready(self) -> None:
        """Reconnect first when the connection broke (and is to be made again)."""
        if self.conn.failure is not None and self.reconnecting():
            await self.recover(self.generation)

    async def recover(self, generation: int) -> None:
        """Reconnect, unless another task did since ``generation``; raises the final
        :class:`ConnectionLost` once the grace period is over."""
        async with self._send_lock:
            if self.generation != generation or not self.reconnecting():
                return
            async with self._receive_lock:
                await self._reconnect()

    async def _reconnect(self) -> None:
        path = self.path
        assert path is not None
        last: FlightlogError | None = self.conn.failure
        # After a grace ran out (best effort), one attempt at a time.
        grace = self._grace if last is None or last.code == ErrorCode.CONNECTION_LOST else 0
        deadline = monotonic() + grace
        delay = _FIRST_RETRY
        await self.transport.aclose()
        while True:
            try:
                transport = await AsyncSocketTransport.connect(path, self.trusted)
            except ConnectError as exc:
                last = exc
            else:
                try:
                    await self._replay(transport)
                except (ConnectionLost, DaemonError) as exc:
                    last = exc
                    await transport.aclose()
                else:
                    self.transport = transport
                    self.generation += 1
                    self.reconnects += 1
                    return
            logger.debug("reconnecting to %s failed: %s", path, last)
            left = deadline - monotonic()
            if left <= 0:
                self.generation += 1
                self._retry_due = monotonic() + _LAST_RETRY
                raise self.conn.give_up(path, self._grace, last, keep=self.best_effort)
            await asleep(min(delay, left))
            delay = min(delay * 2, _LAST_RETRY)

    async def _replay(self, transport: AsyncTransport) -> None:
        """On a new connection: hello, then each session opened again, its run
        continued and its unacknowledged records sent again; then each tail
        subscribed again where it was."""
        conn = self.conn
        conn.reset()
        conn.ring = transport.wants_ring
        transport.welcomed((await self._exchange(transport, conn.hello())).ring)
        for session_id in conn.replay_log.writing():
            try:
                opened = await self._exchange(transport, conn.reopen(session_id))
            except DaemonError as exc:
                if exc.code in _TRANSIENT:
                    raise
                conn.forget_session(session_id, exc)
                continue
            resume = conn.resume(session_id, opened)
            if resume is not None:
                await self._exchange(transport, resume)
                data = conn.replay_log.replay(session_id)
                if data:
                    await transport.send(data)
        for subscription in conn.tails.to_resubscribe():
            try:
                await self._exchange(transport, conn.tails.resubscribe(subscription))
            except DaemonError as exc:
                if exc.code in _TRANSIENT:
                    raise
                conn.tails.end(subscription, exc)
                continue
            catch_up = conn.tails.catch_up(subscription)
            if catch_up is not None:
                await self._exchange(transport, catch_up)
        data = conn.take_outbox()
        if data:
            await transport.send(data)

    async def _exchange(self, transport: AsyncTransport, pending: Pending[T]) -> T:
        await transport.send(pending.data)
        while not self.conn.answered(pending):
            self.conn.receive_data(await transport.receive())
        return self.conn.result(pending)


class AsyncResource:
    """Closed on leaving ``async with``.

    When an exception is on its way out, it is the one to see: an error from closing
    is dropped (a run's ``run_close`` records the exception's text).
    """

    async def aclose(self) -> None:
        raise NotImplementedError

    async def _close_for(self, exc: BaseException) -> None:
        await self.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.aclose()
            return
        with contextlib.suppress(FlightlogError):
            await self._close_for(exc)
