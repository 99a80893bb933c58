# Generated from _async.py by tests/sdk/unasync.py: edit that file, then run this.
"""The sync client: :class:`Client`, :class:`Session`, :class:`Run`, over a plain socket.

Generated from ``_async.py``, the one source of truth of both clients.  Every protocol
rule lives in :class:`ClientConnection`; the classes here only move bytes between it
and the transport.

One client may be shared by several threads: frames are sent whole under a lock, and
the thread that holds the receive lock feeds whatever arrives to the connection, so
each thread finds its own reply there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from functools import partial
from time import monotonic, monotonic_ns
from types import TracebackType
from typing import Any, Final, Generic, Self, TypeVar

from flightlog.protocol import (
    Codec,
    ErrorCode,
    Event,
    Execution,
    FlightlogError,
    Record,
    RecordingError,
    RunStarted,
    SessionOpened,
    StatusReply,
    TailEnd,
    Welcome,
    default_codec,
    default_socket_path,
)

from ._connection import DEFAULT_MAX_UNACKED, ClientConnection, Pending, sticky_of
from ._cursor import CursorTail
from ._exceptions import ConnectError, ConnectionLost, DaemonError
from ._models import CallRef
from ._resume import Resumption, open_calls, repair_event
from ._synchronization import Lock, sleep, wait_blocks_loop
from ._transport import SocketTransport, Transport

__all__ = ["Client", "Run", "Session", "Tail", "connect"]

T = TypeVar("T")

logger = logging.getLogger("flightlog.sdk")

#: How long record() may go without looking for pushed errors: a poll is a syscall, and
#: a burst of records needs one per millisecond, not one per record.
_POLL_INTERVAL_NS = 1_000_000
#: Errors of one event (it cannot be encoded, or sent whole), not of the run: a batch
#: recorded in best effort goes on past them.
_ONE_EVENT_ERRORS: Final = frozenset(
    {ErrorCode.CODEC_ERROR, ErrorCode.BAD_EVENT, ErrorCode.FRAME_TOO_LARGE}
)

#: How long a client goes on reconnecting before its calls raise (seconds).
DEFAULT_RECONNECT_GRACE = 30.0
#: The first wait between attempts to reconnect, doubled up to the last (seconds).
_FIRST_RETRY = 0.02
_LAST_RETRY = 1.0
#: Refusals of a reopen that a moment may cure: the old connection not yet released,
#: the daemon shutting down or full.
_TRANSIENT = frozenset({ErrorCode.SESSION_BUSY, ErrorCode.SHUTTING_DOWN, ErrorCode.TOO_MANY})


def connect(
    path: str | None = None,
    *,
    client_name: str | None = None,
    codec: Codec | None = None,
    transport: Transport | None = None,
    reconnect_grace: float = DEFAULT_RECONNECT_GRACE,
    max_unacked: int = DEFAULT_MAX_UNACKED,
    best_effort: bool = False,
) -> Client:
    """Connect to the daemon and say hello: ``with connect() as client``.

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
    :attr:`Client.dropped` and the run's ``dropped``, logged once per error code
    on the ``flightlog.sdk`` logger, and named in the run's ``run_close``.  Past the
    grace, the records not yet acknowledged are kept (within ``max_unacked``) while
    new ones are dropped, and one attempt to reconnect is made at most once per
    second: once the daemon is back, the runs go on, and what is missing from them is
    exactly what was dropped.

    Raises :class:`DaemonNotRunning` when nothing listens on the socket,
    :class:`ConnectError` when it cannot be connected to, and :class:`DaemonError`
    when the daemon refuses the hello (a protocol version it does not speak).
    """
    connecting = Client._connect(
        path, client_name, codec, transport, reconnect_grace, max_unacked, best_effort
    )
    return connecting


def _program_name() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Resource:
    """Closed on leaving ``with``.

    When an exception is on its way out, it is the one to see: an error from closing
    is dropped (a run's ``run_close`` records the exception's text).
    """

    def close(self) -> None:
        raise NotImplementedError

    def _close_for(self, exc: BaseException) -> None:
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(FlightlogError):
            self._close_for(exc)


class Client(_Resource):
    """A connection to flightlogd; make one with :func:`connect`.

    Sessions created or opened through a client are written by it alone until they are
    closed or the client disconnects.  Closing the client leaves its open sessions to
    the daemon, which writes what it received, syncs and releases them; their open runs
    stay without ``run_close``.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        client_name: str | None = None,
        codec: Codec | None = None,
        reconnect_grace: float = DEFAULT_RECONNECT_GRACE,
        max_unacked: int = DEFAULT_MAX_UNACKED,
        best_effort: bool = False,
    ) -> None:
        self._transport = transport
        self._conn = ClientConnection(
            codec=codec or default_codec,
            client_name=client_name or _program_name(),
            pid=os.getpid(),
            max_unacked=max_unacked,
        )
        self._send_lock = Lock()
        self._receive_lock = Lock()
        self._closed = False
        #: record() looks for pushed errors once this monotonic_ns() is reached.
        self._poll_due = 0
        self._grace = reconnect_grace
        #: One more for every reconnect: a task that saw the old connection break knows
        #: whether someone else has reconnected since.
        self._generation = 0
        #: How many times the client reconnected.
        self.reconnects = 0
        #: Whether record() never raises (see :func:`connect`).
        self.best_effort = best_effort
        #: Best effort: the events record() did not record, per error code.
        self.dropped: dict[str, int] = {}
        #: Best effort, after a grace ran out: the monotonic() of the next attempt.
        self._retry_due = 0.0
        # Tails ride through a reconnect too (only a client that reconnects makes one).
        self._conn.tails_resume = reconnect_grace > 0 and self.path is not None

    @classmethod
    def _connect(
        cls,
        path: str | None,
        client_name: str | None,
        codec: Codec | None,
        transport: Transport | None,
        reconnect_grace: float = DEFAULT_RECONNECT_GRACE,
        max_unacked: int = DEFAULT_MAX_UNACKED,
        best_effort: bool = False,
    ) -> Client:
        if transport is None:
            path = path or default_socket_path(os.environ, os.getuid())
            transport = SocketTransport.connect(path)
        client = cls(
            transport,
            client_name=client_name,
            codec=codec,
            reconnect_grace=reconnect_grace,
            max_unacked=max_unacked,
            best_effort=best_effort,
        )
        try:
            client._conn.ring = transport.wants_ring
            welcome = client._call(client._conn.hello())
            client._transport.welcomed(welcome.ring)
        except BaseException:
            client.close()
            raise
        return client

    @property
    def path(self) -> str | None:
        """The daemon's socket path (None for a transport without one)."""
        path = getattr(self._transport, "path", None)
        return path if isinstance(path, str) else None

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
        return self._closed

    @property
    def failure(self) -> FlightlogError | None:
        """Why the connection broke (every later request raises it), or None while sound."""
        return self._conn.failure

    def create(self, path: str, *, meta: Mapping[str, Any] | None = None) -> Session:
        """Create a session file at ``path`` and become its writer.

        ``meta`` is the application's small dict for ``session_start``.  Relative paths
        resolve under the daemon's data root.  Raises :class:`DaemonError` with code
        ``session_exists``, ``path_refused`` or ``session_busy``.
        """
        opening = self._open_session(partial(self._conn.create, path, meta or {}))
        return opening

    def open(self, path: str) -> Session:
        """Open an existing session file and become its writer.

        An unfinished tail left by a crash is truncated away (``truncated_bytes``).
        Raises :class:`DaemonError` with code ``session_not_found``, ``session_busy``
        (another writer holds it), ``session_corrupt`` or ``path_refused``.
        """
        opening = self._open_session(partial(self._conn.open, path))
        return opening

    def session(
        self, path: str, *, meta: Mapping[str, Any] | None = None, repair: bool = False
    ) -> Session:
        """Open the session file at ``path``, or create it when there is none.

        ``meta`` goes into ``session_start`` when the file is created; an existing file
        keeps its own (``session.meta``).  Two clients racing to create the same path
        both end up opening it, one after the other.  With ``repair``, an opened file is
        repaired at once (:meth:`Session.resume` with ``repair=True``; what it
        found is ``session.resumption``).  Raises :class:`DaemonError` with code
        ``session_busy`` (another writer holds it), ``session_corrupt`` or
        ``path_refused``.
        """
        make = self._open_repaired if repair else self._create_or_open
        opening = make(path, meta or {})
        return opening

    def _open_repaired(self, path: str, meta: Mapping[str, Any]) -> Session:
        session = self._create_or_open(path, meta)
        session.resumption = session.resume(repair=True)
        return session

    def _create_or_open(self, path: str, meta: Mapping[str, Any]) -> Session:
        try:
            return self._open_session(partial(self._conn.open, path))
        except DaemonError as exc:
            if exc.code != ErrorCode.SESSION_NOT_FOUND:
                raise
        try:
            return self._open_session(partial(self._conn.create, path, meta))
        except DaemonError as exc:
            if exc.code != ErrorCode.SESSION_EXISTS:
                raise
        return self._open_session(partial(self._conn.open, path))

    def _open_session(self, make: Callable[[], Pending[SessionOpened]]) -> Session:
        self._ready()
        return Session(self, self._call(make()))

    def tail(
        self,
        path: str,
        *,
        after: int = 0,
        follow: bool = False,
        types: list[str] | None = None,
        run_id: str | None = None,
    ) -> Tail[Record]:
        """The records of the session at ``path`` with ``seq > after``, in order.

        Without ``follow`` the iteration ends at the current end of the file; with it,
        it goes on until the writer closes the session (or :meth:`Tail.close`),
        and a session that does not exist yet is waited for, then read from its start
        (like ``tail -F``).  ``types`` and ``run_id`` filter the records.  The
        subscription starts at the first iteration or at ``with``.  A daemon
        restart does not end it: once the client has reconnected, it goes on after the
        last record it delivered.  Raises :class:`DaemonError` (for instance
        ``session_not_found`` without ``follow``, or a subscription refused after a
        reconnect) and, past the reconnect grace, :class:`ConnectionLost`
        (``daemon_unreachable``) while iterating.
        """
        return Tail(
            self,
            lambda: self._conn.subscribe(
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
    ) -> Tail[tuple[str, Record]] | CursorTail:
        """Every session's records: ``(path, record)``.

        With a cursor as ``after`` (``"SESSION_ID:SEQ,..."`` as ``flightlog tail --all``
        prints it, or a dict; ``""`` or ``{}``: every session from its start), or
        without ``follow``: an :class:`CursorTail`, which replays every session
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
            return CursorTail(
                live,
                {} if isinstance(after, int) else after,
                types=types,
                run_id=run_id,
            )
        return Tail(
            self,
            lambda: self._conn.subscribe(
                None, after=after, follow=follow, types=types, run_id=run_id
            ),
            _with_path,
        )

    def status(self) -> StatusReply:
        """What the daemon holds: sessions, subscribers, rates, errors."""
        self._ready()
        return self._call(self._conn.status())

    def close(self) -> None:
        """Close the connection; safe to call again."""
        if not self._closed:
            self._closed = True
            self._conn.connection_lost(ConnectionLost("the client is closed"))
            self._transport.close()

    # --------------------------------------------------------------- moving bytes

    def _call(self, pending: Pending[T]) -> T:
        while True:
            generation = self._generation
            try:
                self._send(pending.data, pending)
                self._receive_until(partial(self._conn.answered, pending))
                return self._conn.result(pending)
            except ConnectionLost:
                if not self._reconnecting():
                    raise
            except FlightlogError as exc:
                self._conn.forget(pending)
                instead = self._conn.open_instead(pending, exc)
                if instead is None:
                    raise
                pending = instead
                continue
            except BaseException:
                self._conn.forget(pending)
                raise
            self._recover(generation)
            pending = self._conn.retry(pending)
            if pending.settled is not None:
                return pending.settled[0]

    def _call_unless_loop(self, pending: Pending[None]) -> None:
        # A request whose reply only confirms durability (closing a run or a session):
        # on a thread that runs an event loop, send it and let the daemon answer to no
        # one rather than stall the loop for an fsync.
        if wait_blocks_loop():
            self._conn.forget(pending)
            self._send(pending.data)
            return
        self._call(pending)

    def _send(self, data: bytes, request: Pending[Any] | None = None) -> None:
        with self._send_lock:
            queued = self._conn.take_outbox()
            if request is not None:
                self._conn.sending(request)
            try:
                self._transport.send(queued + data if queued else data)
            except ConnectionLost as exc:
                self._conn.connection_lost(exc)
                raise

    def _flush(self) -> None:
        """Send the frames queued without a caller (a tail's next file to read)."""
        if self._conn.has_outbox:
            self._send(b"")

    def _send_records(self, session_id: str, frames: Sequence[bytes]) -> None:
        conn = self._conn
        generation = self._generation
        try:
            with self._send_lock:
                # Kept before they are sent (keep raises a broken connection's failure):
                # the reconnect sends them.
                if len(frames) == 1:
                    data = conn.keep(session_id, frames[0])
                else:
                    data = conn.keep_all(session_id, frames)
                queued = conn.take_outbox()
                self._transport.send(queued + data if queued else data)
        except ConnectionLost as exc:
            conn.connection_lost(exc)
            if not self._reconnecting():
                raise
            self._recover(generation)
        if conn.full(session_id):
            # keep() asked for the acknowledgement this waits for.
            self._receive_until(lambda: not conn.full(session_id))

    def _reconnecting(self) -> bool:
        """Whether a broken connection is to be made again (now)."""
        failure = self._conn.failure
        if (
            self._closed
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

    def _dropped(self, exc: FlightlogError, count: int) -> None:
        first = exc.code not in self.dropped
        self.dropped[exc.code] = self.dropped.get(exc.code, 0) + count
        if first:
            logger.warning(
                "flightlog dropped an event (%s); the agent goes on, this kind of problem "
                "is logged once and counted in client.dropped and in the run's run_close",
                exc,
            )

    def _ready(self) -> None:
        """Reconnect first when the connection broke (and is to be made again)."""
        if self._conn.failure is not None and self._reconnecting():
            self._recover(self._generation)

    def _recover(self, generation: int) -> None:
        """Reconnect, unless another task did since ``generation``; raises the final
        :class:`ConnectionLost` once the grace period is over."""
        with self._send_lock:
            if self._generation != generation or not self._reconnecting():
                return
            with self._receive_lock:
                self._reconnect()

    def _reconnect(self) -> None:
        path = self.path
        assert path is not None
        last: FlightlogError | None = self._conn.failure
        # After a grace ran out (best effort), one attempt at a time.
        grace = self._grace if last is None or last.code == ErrorCode.CONNECTION_LOST else 0
        deadline = monotonic() + grace
        delay = _FIRST_RETRY
        self._transport.close()
        while True:
            try:
                transport = SocketTransport.connect(path)
            except ConnectError as exc:
                last = exc
            else:
                try:
                    self._replay(transport)
                except (ConnectionLost, DaemonError) as exc:
                    last = exc
                    transport.close()
                else:
                    self._transport = transport
                    self._generation += 1
                    self.reconnects += 1
                    return
            left = deadline - monotonic()
            if left <= 0:
                self._generation += 1
                self._retry_due = monotonic() + _LAST_RETRY
                raise self._conn.give_up(path, self._grace, last, keep=self.best_effort)
            sleep(min(delay, left))
            delay = min(delay * 2, _LAST_RETRY)

    def _replay(self, transport: Transport) -> None:
        """On a new connection: hello, then each session opened again, its run
        continued and its unacknowledged records sent again; then each tail
        subscribed again where it was."""
        conn = self._conn
        conn.reset()
        conn.ring = transport.wants_ring
        transport.welcomed((self._exchange(transport, conn.hello())).ring)
        for session_id in conn.writing():
            try:
                opened = self._exchange(transport, conn.reopen(session_id))
            except DaemonError as exc:
                if exc.code in _TRANSIENT:
                    raise
                conn.forget_session(session_id, exc)
                continue
            resume = conn.resume(session_id, opened)
            if resume is not None:
                self._exchange(transport, resume)
                data = conn.replay(session_id)
                if data:
                    transport.send(data)
        for subscription in conn.tails():
            try:
                self._exchange(transport, conn.resubscribe(subscription))
            except DaemonError as exc:
                if exc.code in _TRANSIENT:
                    raise
                conn.end_tail(subscription, exc)
                continue
            catch_up = conn.catch_up(subscription)
            if catch_up is not None:
                self._exchange(transport, catch_up)
        data = conn.take_outbox()
        if data:
            transport.send(data)

    def _exchange(self, transport: Transport, pending: Pending[T]) -> T:
        transport.send(pending.data)
        while not self._conn.answered(pending):
            self._conn.receive_data(transport.receive())
        return self._conn.result(pending)

    def _receive_until(self, done: Callable[[], bool]) -> None:
        while not done():
            with self._receive_lock:
                if done():
                    return
                try:
                    data = self._transport.receive()
                except ConnectionLost as exc:
                    self._conn.connection_lost(exc)
                    return
                self._conn.receive_data(data)

    def _poll(self) -> None:
        # Take in what has arrived (pushed errors) without waiting; when someone else
        # is receiving, they take it in.
        self._poll_due = monotonic_ns() + _POLL_INTERVAL_NS
        if not self._receive_lock.acquire(blocking=False):
            return
        try:
            data = self._transport.receive_nowait()
            if data is not None:
                self._conn.receive_data(data)
        except ConnectionLost as exc:
            self._conn.connection_lost(exc)
        finally:
            self._receive_lock.release()


def _record_only(path: str | None, record: Record) -> Record:
    return record


def _with_path(path: str | None, record: Record) -> tuple[str, Record]:
    return (path or "", record)


class Session(_Resource):
    """A session this client writes; make one with :meth:`Client.create` or ``open``.

    Attributes from the daemon's answer: ``session_id``, ``path`` (resolved, absolute),
    ``meta``, ``last_seq`` (when it was opened), ``interrupted_runs`` (runs without
    ``run_close``) and ``truncated_bytes`` (an unfinished tail opening removed).
    """

    def __init__(self, client: Client, opened: SessionOpened) -> None:
        self.client = client
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

    def begin_run(self) -> Run:
        """Start a run with a fresh ``run_id``: ``with session.begin_run() as run``.

        Raises :class:`LocalProtocolError` (``run_open``) while another run is open,
        and the session's sticky :class:`RecordingError` after a write failed.
        """
        self.client._poll()
        starting = self._begin_run()
        return starting

    def _begin_run(self) -> Run:
        self.client._ready()
        pending = self.client._conn.begin_run(self.session_id)
        return Run(self, self.client._call(pending))

    def sync(self) -> int:
        """Wait until everything sent so far is durable; returns the last seq written."""
        self.client._ready()
        return self.client._call(self.client._conn.sync(self.session_id))

    def load_checkpoint(self) -> Any:
        """The snapshot of the latest checkpoint, decoded by the codec, or None."""
        self.client._ready()
        return self.client._call(self.client._conn.load_checkpoint(self.session_id))

    def resume(self, *, repair: bool = False) -> Resumption:
        """What a restarted agent needs, in one call: the latest checkpoint, the runs
        that were cut (no ``run_close``) and the calls left without an end.

        With ``repair``, each tool call of the file's last run, when it was cut, gets a
        ``tool_exec_end`` marked as a repair (``disposition`` ``repaired``, an error, not
        a genuine result): the run is continued after a ``run_resume``, the repairs
        recorded, and the run closed; so a history rebuilt from the file pairs every
        tool call.  Calling it again repairs nothing new.  Open calls of earlier cut
        runs, and model calls, are listed, not repaired.
        """
        checkpoint = self.load_checkpoint()
        records = [record for record in self.client.tail(self.path)]
        cut_runs, calls = open_calls(records)
        last = self.last_run
        tools = [c for c in calls if c.run_id == last and c.execution.kind == "tool"]
        if not repair or last is None or not tools:
            return Resumption(checkpoint, cut_runs, calls)
        self.client._ready()
        pending = self.client._conn.continue_run(self.session_id, last)
        run = Run(self, self.client._call(pending))
        run.record_many([repair_event(call) for call in tools])
        run.close(
            error=f"cut; resume(repair=True) answered {len(tools)} tool call(s) left "
            "without a result"
        )
        self.last_run = None
        return Resumption(checkpoint, cut_runs, calls, tools)

    def close(self) -> None:
        """Sync and release the session; safe to call again.

        An open run stays without ``run_close``, as after a crash: close runs first.
        Raises the session's :class:`RecordingError` when a write had failed.  The sync
        client called on a thread that runs an event loop does not wait: it sends the
        request and returns (the daemon still syncs and releases the session).
        """
        self.client._ready()
        pending = self.client._conn.close_session(self.session_id)
        if pending is not None:
            self.client._call_unless_loop(pending)


class Run(_Resource):
    """One loop invocation inside a session; make one with :meth:`Session.begin_run`.

    ``run_id`` is fresh for every run; ``seq`` is the seq of its ``run_start``.
    """

    def __init__(self, session: Session, started: RunStarted) -> None:
        self.session = session
        self.session_id = session.session_id
        self.run_id = started.run_id
        self.seq = started.seq
        self._client = session.client
        self._conn = session.client._conn
        #: The session's sticky errors, kept after the session is closed.
        self._state = self._conn.session_state(self.session_id)
        self._unencodable: RecordingError | None = None
        #: Best effort: the events not recorded, and why the first was not.
        self.dropped = 0
        self._drop_reason: str | None = None

    @property
    def error(self) -> RecordingError | None:
        """The run's sticky error, or None.

        The error the daemon pushed for this run (or its session), or the first event
        the codec could not encode (strict), else the first checkpoint it could not
        encode.  ``run_close`` keeps it, and so does the run once its session is closed.
        """
        return sticky_of(self._state, self.run_id) or self._unencodable

    @property
    def diagnosed(self) -> int:
        """How many of the run's events were written with a marker in place of a value,
        or as the stub of an event too large to send; ``run_close`` names them."""
        return self._conn.diagnosed(self.run_id)

    def record(
        self, event: Event, *, time: datetime | str | None = None, event_id: str | None = None
    ) -> None:
        """Record ``event``; returns once it is sent, without waiting for the daemon.

        The event is encoded here.  A value the codec cannot encode is written as a
        marker in its place, and an event larger than the daemon's maximum frame size
        as its stub; ``run_close`` names both, and nothing is raised.  A codec error
        is raised here (:class:`RecordingError`: the event is not recorded; code
        ``codec_error`` becomes the run's sticky :attr:`error`, raised by every later
        write of the run and written into ``run_close``, so the file shows that an
        event is missing; best effort drops the event instead, and goes on); events
        that are never written (token deltas, stream chunks, progress) are skipped.
        ``time`` overrides the event's own time (any RFC 3339 offset; written in UTC).
        ``event_id`` (a string of 1 to 256 bytes, the caller's) makes the record
        idempotent: the session holds it once however often it is recorded, also by a
        later process or after a daemon restart (a repeat is dropped and counted in
        ``run_close``); an invalid one raises :class:`LocalProtocolError` here.
        Raises the run's sticky :class:`RecordingError` once the daemon pushed one, and
        :class:`LocalProtocolError` for a closed run.

        Pushed errors are looked for at most once a millisecond (a syscall each time),
        so during a burst one surfaces from a record() up to a millisecond later.
        Requests (``save_checkpoint``, ``sync``, ``close`` …) take in every push that
        arrived before their answer.
        """
        client = self._client
        if monotonic_ns() >= client._poll_due:
            client._poll()
        try:
            try:
                data = self._conn.record(self.session_id, self.run_id, event, time, event_id)
            except ConnectionLost:
                if not client._reconnecting():
                    raise
                client._ready()
                data = self._conn.record(self.session_id, self.run_id, event, time, event_id)
        except FlightlogError as exc:
            if client.best_effort:
                self._drop(exc, 1)
                return
            self._refused(exc)
            raise
        if data is not None:
            try:
                client._send_records(self.session_id, (data,))
            except FlightlogError:
                # Sent or kept: a reconnect sends it again, a give-up counts it lost.
                if not client.best_effort:
                    raise

    def _refused(self, exc: FlightlogError) -> None:
        """Strict: an event the codec refused makes the run's error sticky."""
        if isinstance(exc, RecordingError) and exc.code == ErrorCode.CODEC_ERROR:
            self._conn.refuse_run(self.session_id, self.run_id, exc)

    def _drop(self, exc: FlightlogError, count: int) -> None:
        """Best effort: ``count`` events are not recorded; counted, kept for run_close."""
        self.dropped += count
        if self._drop_reason is None:
            self._drop_reason = f"{exc.code}: {exc.message}"
        self._client._dropped(exc, count)

    def record_many(self, events: Iterable[Event]) -> None:
        """Record ``events`` in order, as :meth:`record` does each, with one send.

        An event the codec cannot encode raises after the events before it were sent
        (sticky, as from :meth:`record`); the ones after it are not recorded.  Best
        effort drops that event alone (counted, as :meth:`record` does) and records the
        rest.
        """
        client = self._client
        if monotonic_ns() >= client._poll_due:
            client._poll()
        events = list(events)
        frames: list[bytes] = []
        done = 0
        try:
            client._ready()
            for event in events:
                try:
                    data = self._conn.record(self.session_id, self.run_id, event, None)
                except FlightlogError as exc:
                    if not (client.best_effort and exc.code in _ONE_EVENT_ERRORS):
                        raise
                    self._drop(exc, 1)
                    data = None
                if data is not None:
                    frames.append(data)
                done += 1
        except FlightlogError as exc:
            if client.best_effort:
                self._drop(exc, len(events) - done)
            else:
                self._refused(exc)
                raise
        finally:
            if frames:
                try:
                    client._send_records(self.session_id, frames)
                except FlightlogError:
                    if not client.best_effort:
                        raise

    def ref(self, execution: Execution) -> CallRef:
        """The :class:`CallRef` naming ``execution``'s call in this run."""
        return CallRef(self.session_id, self.run_id, execution.id, execution.attempt)

    def save_checkpoint(self, snapshot: Any) -> int:
        """Append a checkpoint of ``snapshot`` (codec-encoded) and wait until it is durable.

        Returns its seq.  Raises the codec's :class:`RecordingError` (kept like one
        from :meth:`record`) and the run's sticky error.
        """
        self.session.client._poll()
        self._client._ready()
        try:
            pending = self._conn.save_checkpoint(self.session_id, self.run_id, snapshot)
        except RecordingError as exc:
            if exc.code == ErrorCode.CODEC_ERROR and self._unencodable is None:
                self._unencodable = exc
            raise
        return self.session.client._call(pending)

    def close(self, error: str | None = None) -> None:
        """Write ``run_close`` and wait until it is durable; safe to call again.

        ``run_close`` carries the run's sticky error text, else ``error``, and the
        codec's error for a value it could not encode.  Raises the sticky
        :class:`RecordingError` after writing it: a run whose records failed does not
        close quietly.  The sync client called on a thread that runs an event loop does
        not wait for durability: it sends ``run_close`` and returns.
        """
        self.session.client._poll()
        self._client._ready()
        if self._unencodable is not None:
            lost = f"{self._unencodable.code}: {self._unencodable.message}"
            error = lost if error is None else f"{error}; {lost}"
        if self.dropped:
            lost = f"{self.dropped} events not recorded, the first for {self._drop_reason}"
            error = lost if error is None else f"{error}; {lost}"
        pending = self._conn.close_run(self.session_id, self.run_id, error)
        if pending is not None:
            self.session.client._call_unless_loop(pending)

    def _close_for(self, exc: BaseException) -> None:
        self.close(error=_error_text(exc))


class Tail(_Resource, Generic[T]):
    """The records of a subscription: ``for record in client.tail(path)``.

    Use it in ``with`` (or call :meth:`close`) to unsubscribe from a follow
    before its end; an abandoned tail is unsubscribed with the client's next request.
    """

    def __init__(
        self,
        client: Client,
        subscribe: Callable[[], Pending[int]],
        convert: Callable[[str | None, Record], T],
    ) -> None:
        self._client = client
        self._conn = client._conn
        self._subscribe = subscribe
        self._convert = convert
        self._subscription: int | None = None
        self._buffer: deque[T] = deque()
        self._done = False
        #: How the daemon ended the subscription, once it has: ``end.reason`` is
        #: ``end_of_file``, ``session_closed``, ``unsubscribed`` or ``shutting_down``.
        self.end: TailEnd | None = None

    @property
    def end_reason(self) -> str | None:
        """``end.reason``, or None while the subscription goes on."""
        return self.end.reason if self.end is not None else None

    def _start(self) -> int:
        if self._subscription is None:
            self._subscription = self._client._call(self._subscribe())
        return self._subscription

    def __iter__(self) -> Tail[T]:
        return self

    def __next__(self) -> T:
        client = self._client
        while not self._buffer:
            if self._done:
                raise StopIteration
            generation = client._generation
            try:
                subscription = self._start()
                client._flush()
                client._receive_until(partial(self._conn.tail_ready, subscription))
                try:
                    batch = self._conn.next_tail(subscription)
                finally:
                    self.end = self.end or self._conn.pop_tail_end(subscription)
            except ConnectionLost as exc:
                # The client reconnects and subscribes again where the tail was; past
                # the grace its error ends the tail.
                if exc.code != ErrorCode.CONNECTION_LOST or not client._reconnecting():
                    self._give_up()
                    raise
                try:
                    client._recover(generation)
                except BaseException:
                    self._give_up()
                    raise
                continue
            if batch is None:
                self._done = True
            else:
                self._buffer.extend(self._convert(path, record) for path, record in batch)
        return self._buffer.popleft()

    def _give_up(self) -> None:
        self._done = True
        if self._subscription is not None:
            self._conn.abandon_tail(self._subscription)

    def close(self) -> None:
        """Unsubscribe (when the daemon has not ended the subscription); safe to call again."""
        if self._done:
            return
        self._done = True
        subscription = self._subscription
        if subscription is None or self._conn.tail_ended(subscription):
            return
        if self._conn.failure is not None:
            self._conn.abandon_tail(subscription)
            return
        pending = self._conn.unsubscribe(subscription)
        if pending is not None:
            self._client._call(pending)

    def __enter__(self) -> Self:
        self._start()
        return self

    def __del__(self) -> None:
        if self._subscription is not None and not self._done:
            self._conn.abandon_tail(self._subscription)
