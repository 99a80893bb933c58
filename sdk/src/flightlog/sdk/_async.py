"""The async client: :class:`AsyncClient`, :class:`AsyncSession`, :class:`AsyncRun`
(whose writes are :class:`~._async_run.AsyncRunBase`'s).

This module is the one source of truth for both clients: ``_sync.py`` is generated
from it by ``tests/sdk/unasync.py`` (run ``uv run python tests/sdk/unasync.py`` after
editing; a test fails when the two drift apart).  Every protocol rule lives in
:class:`flightlog.protocol.wire.ClientConnection`, and the bytes move through the client's
:class:`~._async_link.AsyncLink`: the client hands it to each session, run and tail it
makes, and none of them uses anything else of another.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from time import monotonic
from typing import Any, TypeVar

from flightlog.protocol import (
    Codec,
    ErrorCode,
    FlightlogError,
    Origin,
    Record,
    default_codec,
)
from flightlog.protocol.wire import (
    DEFAULT_MAX_UNACKED,
    ClientConnection,
    Pending,
    RunStarted,
    SessionOpened,
    StatusReply,
    Welcome,
    default_socket_path,
)

from ._async_link import AsyncLink, AsyncResource
from ._async_run import AsyncRunBase
from ._async_tail import AsyncTail
from ._cursor import AsyncCursorTail
from ._exceptions import DaemonError
from ._resume import (
    OpenCall,
    Resumption,
    open_calls,
    repair_event,
    repair_id,
    repair_note,
    reply_calls,
)
from ._synchronization import AwaitableContext
from ._transport import AsyncSocketTransport, AsyncTransport

__all__ = ["AsyncClient", "AsyncRun", "AsyncSession", "AsyncTail", "aconnect"]

T = TypeVar("T")


#: How long a client goes on reconnecting before its calls raise (seconds).
DEFAULT_RECONNECT_GRACE = 30.0


def aconnect(
    path: str | None = None,
    *,
    client_name: str | None = None,
    codec: Codec | None = None,
    transport: AsyncTransport | None = None,
    reconnect_grace: float = DEFAULT_RECONNECT_GRACE,
    max_unacked: int = DEFAULT_MAX_UNACKED,
    best_effort: bool = False,
    trusted_uids: Iterable[int] = (),
) -> AwaitableContext[AsyncClient]:
    """Connect to the daemon and say hello: ``async with aconnect() as client``.

    ``path`` defaults to ``$FLIGHTLOG_SOCKET``, else the default socket.
    ``client_name`` (default: the program's name) is announced to the daemon and
    written in every ``run_start``.  ``codec`` (default: ``default_codec``) encodes
    events and checkpoints.  ``transport`` replaces the socket (a mock, in tests; it
    does not reconnect).

    When the connection breaks, the client reconnects on its own for up to
    ``reconnect_grace`` seconds (0: never), meanwhile calls wait; each run goes on
    where it was cut and every record is written exactly once.  Past the grace, calls
    raise :class:`ConnectionLost` naming what was not written.  ``max_unacked`` bounds
    the bytes of records each session keeps until the daemon acknowledges them;
    ``record()`` waits while they are more.

    ``best_effort`` (for integrations, where recording must never break the agent):
    ``record()`` never raises.  An event it cannot record (a codec error, a sticky
    error, the daemon out of reach past the grace) is dropped, counted in
    :attr:`AsyncClient.dropped` and the run's ``dropped``, logged once per error code
    on the ``flightlog.sdk`` logger, and named in the run's ``run_close``.  Past the
    grace, the records not yet acknowledged are kept (within ``max_unacked``) while
    new ones are dropped, and one attempt to reconnect is made at most once per
    second: once the daemon is back, the runs go on, and what is missing from them is
    exactly what was dropped.

    The socket's directory and the process that answers must belong to the caller,
    root, a user ``$FLIGHTLOG_DAEMON_USER`` names, or one of ``trusted_uids`` (a
    shared daemon's user), at every connect and reconnect.

    Raises :class:`DaemonNotRunning` when nothing listens on the socket,
    :class:`UntrustedDaemon` when the socket is not a trusted daemon's,
    :class:`ConnectError` when it cannot be connected to, and :class:`DaemonError`
    when the daemon refuses the hello (a protocol version it does not speak).
    """
    connecting = AsyncClient._connect(
        path,
        client_name,
        codec,
        transport,
        reconnect_grace,
        max_unacked,
        best_effort,
        frozenset(trusted_uids),
    )
    return AwaitableContext(connecting)


def _program_name() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


class AsyncClient(AsyncResource):
    """A connection to flightlogd; make one with :func:`aconnect`.

    Sessions created or opened through a client are written by it alone until they are
    closed or the client disconnects.  Closing the client leaves its open sessions to
    the daemon, which writes what it received, syncs and releases them; their open runs
    stay without ``run_close``.
    """

    def __init__(
        self,
        transport: AsyncTransport,
        *,
        client_name: str | None = None,
        codec: Codec | None = None,
        reconnect_grace: float = DEFAULT_RECONNECT_GRACE,
        max_unacked: int = DEFAULT_MAX_UNACKED,
        best_effort: bool = False,
    ) -> None:
        self._conn = ClientConnection(
            codec=codec or default_codec,
            client_name=client_name or _program_name(),
            pid=os.getpid(),
            clock=monotonic,
            max_unacked=max_unacked,
        )
        self._link = AsyncLink(
            transport, self._conn, reconnect_grace=reconnect_grace, best_effort=best_effort
        )

    @classmethod
    async def _connect(
        cls,
        path: str | None,
        client_name: str | None,
        codec: Codec | None,
        transport: AsyncTransport | None,
        reconnect_grace: float = DEFAULT_RECONNECT_GRACE,
        max_unacked: int = DEFAULT_MAX_UNACKED,
        best_effort: bool = False,
        trusted: frozenset[int] = frozenset(),
    ) -> AsyncClient:
        if transport is None:
            path = path or default_socket_path(os.environ, os.getuid())
            transport = await AsyncSocketTransport.connect(path, trusted)
        client = cls(
            transport,
            client_name=client_name,
            codec=codec,
            reconnect_grace=reconnect_grace,
            max_unacked=max_unacked,
            best_effort=best_effort,
        )
        client._link.trusted = trusted
        try:
            await client._link.hello()
        except BaseException:
            await client.aclose()
            raise
        return client

    @property
    def path(self) -> str | None:
        """The daemon's socket path (None for a transport without one)."""
        return self._link.path

    @property
    def welcome(self) -> Welcome:
        """The daemon's answer to the hello: its pid, version and maximum frame size."""
        assert self._conn.welcome is not None
        return self._conn.welcome

    @property
    def client_name(self) -> str:
        return self._conn.client_name

    @property
    def closed(self) -> bool:
        return self._link.closed

    @property
    def reconnects(self) -> int:
        """How many times the client reconnected."""
        return self._link.reconnects

    @property
    def best_effort(self) -> bool:
        """Whether record() never raises (see :func:`aconnect`)."""
        return self._link.best_effort

    @property
    def dropped(self) -> dict[str, int]:
        """Best effort: the events record() did not record, per error code."""
        return self._link.dropped

    @property
    def failure(self) -> FlightlogError | None:
        """Why the connection broke (every later request raises it), or None while sound."""
        return self._conn.failure

    def create(
        self, path: str, *, meta: Mapping[str, Any] | None = None, origin: Origin | None = None
    ) -> AwaitableContext[AsyncSession]:
        """Create a session file at ``path`` and become its writer.

        ``meta`` is the application's small dict for ``session_start``; ``origin``, for
        a fork, the session and point it is forked from (written into ``session_start``).
        Relative paths resolve under the daemon's data root.  Raises :class:`DaemonError`
        with code ``session_exists``, ``path_refused`` or ``session_busy``.
        """
        opening = self._open_session(partial(self._conn.create, path, meta or {}, origin))
        return AwaitableContext(opening)

    def open(self, path: str) -> AwaitableContext[AsyncSession]:
        """Open an existing session file and become its writer.

        An unfinished tail left by a crash is truncated away (``truncated_bytes``).
        Raises :class:`DaemonError` with code ``session_not_found``, ``session_busy``
        (another writer holds it), ``session_corrupt`` or ``path_refused``.
        """
        opening = self._open_session(partial(self._conn.open, path))
        return AwaitableContext(opening)

    def session(
        self, path: str, *, meta: Mapping[str, Any] | None = None, repair: bool = False
    ) -> AwaitableContext[AsyncSession]:
        """Open the session file at ``path``, or create it when there is none.

        ``meta`` goes into ``session_start`` when the file is created; an existing file
        keeps its own (``session.meta``).  Two clients racing to create the same path
        both end up opening it, one after the other.  With ``repair``, an opened file is
        repaired at once (:meth:`AsyncSession.resume` with ``repair=True``; what it
        found is ``session.resumption``).  Raises :class:`DaemonError` with code
        ``session_busy`` (another writer holds it), ``session_corrupt`` or
        ``path_refused``.
        """
        make = self._open_repaired if repair else self._create_or_open
        opening = make(path, meta or {})
        return AwaitableContext(opening)

    async def _open_repaired(self, path: str, meta: Mapping[str, Any]) -> AsyncSession:
        session = await self._create_or_open(path, meta)
        session.resumption = await session.resume(repair=True)
        return session

    async def _create_or_open(self, path: str, meta: Mapping[str, Any]) -> AsyncSession:
        try:
            return await self._open_session(partial(self._conn.open, path))
        except DaemonError as exc:
            if exc.code != ErrorCode.SESSION_NOT_FOUND:
                raise
        try:
            return await self._open_session(partial(self._conn.create, path, meta))
        except DaemonError as exc:
            if exc.code != ErrorCode.SESSION_EXISTS:
                raise
        return await self._open_session(partial(self._conn.open, path))

    async def _open_session(self, make: Callable[[], Pending[SessionOpened]]) -> AsyncSession:
        await self._link.ready()
        return AsyncSession(self, self._link, await self._link.call(make()))

    def tail(
        self,
        path: str,
        *,
        after: int = 0,
        follow: bool = False,
        types: list[str] | None = None,
        run_id: str | None = None,
    ) -> AsyncTail[Record]:
        """The records of the session at ``path`` with ``seq > after``, in order.

        Without ``follow`` the iteration ends at the current end of the file; with it,
        it goes on until the writer closes the session (or :meth:`AsyncTail.aclose`),
        and a session that does not exist yet is waited for, then read from its start
        (like ``tail -F``).  ``types`` and ``run_id`` filter the records.  The
        subscription starts at the first iteration or at ``async with``.  A daemon
        restart does not end it: once the client has reconnected, it goes on after the
        last record it delivered.  Raises :class:`DaemonError` (for instance
        ``session_not_found`` without ``follow``, or a subscription refused after a
        reconnect) and, past the reconnect grace, :class:`ConnectionLost`
        (``daemon_unreachable``) while iterating.
        """
        return AsyncTail(
            self._link,
            lambda: self._conn.tails.subscribe(
                path, after=after, follow=follow, types=types, run_id=run_id
            ),
            _record_only,
        )

    def tail_all(
        self,
        *,
        after: int | Mapping[str, int] | str = 0,
        follow: bool = False,
        types: list[str] | None = None,
        run_id: str | None = None,
    ) -> AsyncTail[tuple[str, Record]] | AsyncCursorTail:
        """Every session's records: ``(path, record)``.

        With a cursor as ``after`` (``"SESSION_ID:SEQ,..."`` as ``flightlog tail --all``
        prints it, or a dict; ``""`` or ``{}``: every session from its start), or
        without ``follow``: an :class:`AsyncCursorTail`, which replays every session
        file under the data root the caller may read from the cursor, then with
        ``follow`` goes on live; without, it ends at the present.  Its ``cursor`` says
        where it got to.  With ``follow`` and no cursor (``after`` 0): the sessions'
        records written from now on; after a reconnect, what was written while the
        client was away is read from the files, each session after the last record
        delivered (docs/protocol.md).  Raises :class:`ValueError` for a cursor that is
        not one, or another number as ``after``.
        """
        if not isinstance(after, int) or not follow:
            if isinstance(after, int) and after != 0:
                raise ValueError("tail_all() takes a cursor as after, or 0")
            live = self.tail_all(follow=True) if follow else None
            return AsyncCursorTail(
                live,
                {} if isinstance(after, int) else after,
                types=types,
                run_id=run_id,
            )
        return AsyncTail(
            self._link,
            lambda: self._conn.tails.subscribe(
                None, after=after, follow=follow, types=types, run_id=run_id
            ),
            _with_path,
        )

    async def status(self) -> StatusReply:
        """What the daemon holds: sessions, subscribers, rates, errors."""
        await self._link.ready()
        return await self._link.call(self._conn.status())

    async def aclose(self) -> None:
        """Close the connection; safe to call again."""
        await self._link.aclose()


def _record_only(path: str | None, record: Record) -> Record:
    return record


def _with_path(path: str | None, record: Record) -> tuple[str, Record]:
    return (path or "", record)


class AsyncSession(AsyncResource):
    """A session this client writes; make one with :meth:`AsyncClient.create` or ``open``.

    Attributes from the daemon's answer: ``session_id``, ``path`` (resolved, absolute),
    ``meta``, ``last_seq`` (when it was opened), ``interrupted_runs`` (runs without
    ``run_close``) and ``truncated_bytes`` (an unfinished tail opening removed).
    """

    def __init__(self, client: AsyncClient, link: AsyncLink, opened: SessionOpened) -> None:
        self.client = client
        self._link = link
        self._conn = link.conn
        self.session_id = opened.session_id
        self.path = opened.path
        self.meta = opened.meta
        self.last_seq = opened.last_seq
        self.interrupted_runs = opened.interrupted_runs
        #: The file's last run when it was opened, if it has no run_close.
        self.last_run = opened.last_run
        self.truncated_bytes = opened.truncated_bytes
        #: What the repair of ``client.session(..., repair=True)`` found and did.
        self.resumption: Resumption | None = None

    def begin_run(self) -> AwaitableContext[AsyncRun]:
        """Start a run with a fresh ``run_id``: ``async with session.begin_run() as run``.

        Raises :class:`LocalProtocolError` (``run_open``) while another run is open,
        and the session's sticky :class:`RecordingError` after a write failed.
        """
        self._link.poll()
        starting = self._begin_run()
        return AwaitableContext(starting)

    async def _begin_run(self) -> AsyncRun:
        await self._link.ready()
        pending = self._conn.begin_run(self.session_id)
        return AsyncRun(self, self._link, await self._link.call(pending))

    async def sync(self) -> int:
        """Wait until everything sent so far is durable; returns the last seq written."""
        await self._link.ready()
        return await self._link.call(self._conn.sync(self.session_id))

    async def load_checkpoint(self) -> Any:
        """The snapshot of the latest checkpoint, decoded by the codec, or None."""
        await self._link.ready()
        return await self._link.call(self._conn.load_checkpoint(self.session_id))

    async def resume(self, *, repair: bool = False) -> Resumption:
        """What a restarted agent needs, in one call: the latest checkpoint, the runs
        that were cut (no ``run_close``) and the calls left without an end.

        With ``repair``, every run the file left without ``run_close`` when the session
        was opened is mended, in the order they started: it is continued after a
        ``run_resume`` marked ``repair`` (any cut run, not only the last), each call it
        left open gets an end marked as a repair (:func:`repair_event`: a tool call a
        ``tool_exec_end`` with ``disposition`` ``repaired``, a model call a
        ``model_exec_end`` with ``disposition`` ``cancelled``; errors, never genuine
        results), recorded with an event id, and the run is closed (its ``run_close``
        says ``repaired``).  So a history rebuilt from the file pairs every call, and
        ``check`` finds no open run.  Calling it again writes nothing; a repair cut
        short (its process killed) and called again writes each end once.  Raises the
        daemon's error (``run_not_open`` from a daemon that repairs only the last run).

        The daemon gathers the cut runs and open calls while it checks the file at
        open, and catches up with what was written since: nothing is read twice.
        """
        await self._link.ready()
        checkpoint, reply = await self._link.call(self._conn.load_resumption(self.session_id))
        found = reply_calls(reply)
        if found is None:  # a daemon that does not gather them: read the whole file
            found = open_calls([record async for record in self.client.tail(self.path)])
        cut_runs, calls = found
        cut_at_open = set(self.interrupted_runs)
        mend = [run_id for run_id in cut_runs if run_id in cut_at_open]
        if not repair or not mend:
            return Resumption(checkpoint, cut_runs, calls)
        repaired: list[OpenCall] = []
        for run_id in mend:
            answered = [call for call in calls if call.run_id == run_id]
            pending = self._conn.continue_run(self.session_id, run_id, repair=True)
            run = AsyncRun(self, self._link, await self._link.call(pending))
            await run.record_many(
                [repair_event(call) for call in answered],
                event_ids=[repair_id(call) for call in answered],
            )
            await run.aclose(error=repair_note(answered))
            repaired += answered
        self.last_run = None
        return Resumption(checkpoint, cut_runs, calls, repaired, mend)

    async def aclose(self) -> None:
        """Sync and release the session; safe to call again.

        An open run stays without ``run_close``, as after a crash: close runs first.
        Raises the session's :class:`RecordingError` when a write had failed.  The sync
        client called on a thread that runs an event loop does not wait: it sends the
        request and returns (the daemon still syncs and releases the session).
        """
        await self._link.ready()
        pending = self._conn.close_session(self.session_id)
        if pending is not None:
            await self._link.call_unless_loop(pending)


class AsyncRun(AsyncRunBase):
    """One loop invocation inside a session; make one with :meth:`AsyncSession.begin_run`.

    ``run_id`` is fresh for every run; ``seq`` is the seq of its ``run_start``;
    ``session`` is the session it belongs to.  Its methods are :class:`AsyncRunBase`'s
    (``_async_run.py``).
    """

    def __init__(self, session: AsyncSession, link: AsyncLink, started: RunStarted) -> None:
        super().__init__(session.session_id, link, started)
        self.session = session
