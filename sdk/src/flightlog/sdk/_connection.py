"""The client side of the wire protocol, sans I/O: one state machine for both clients.

Theory of operation
-------------------

:class:`ClientConnection` builds every frame the client sends and digests every byte
it receives; it never touches a socket.  The sync and async clients only move bytes:

* A request method (``create``, ``begin_run``, ``close_run``, …) checks the session
  rules locally (each session it writes has a
  :class:`flightlog.protocol.SessionMachine`, the daemon's rules, so a mistake is
  refused before it reaches the daemon) and returns a :class:`Pending` request: a fresh id and
  the frame to send.  The caller sends ``request.data``, feeds what it receives to
  :meth:`ClientConnection.receive_data` until :meth:`~ClientConnection.answered`, then
  takes :meth:`~ClientConnection.result`: the reply turned into a value, or an
  :class:`ErrorReply` turned into an exception.  Replies are matched by id, so replies
  for requests that were given up (a cancelled wait) are dropped.
* :meth:`ClientConnection.record` returns the frame of one ``record`` (no reply), or
  None for an event the codec never writes.  An event holding a value the codec cannot
  encode is framed with a marker in its place, and one too large for a frame as its
  stub; the run keeps an account of them for its ``run_close``
  (:mod:`._diagnostics`).  A codec error (not an event, a field of the wrong type) and
  a sticky error are raised from it, before anything is sent; a strict client makes a
  codec error the run's sticky error (:meth:`~ClientConnection.refuse_run`).
* Pushes are kept: :class:`RecordFailed` becomes a sticky :class:`RecordingError`:
  the run's, which every later write of that run raises, or the session's failure
  (``write_failed``, or no run named), which every later write of the session raises;
  :class:`TailBatch` and :class:`TailEnd` queue up per tail until the subscriber
  takes them (see below).
* End of stream, a transport failure or a frame that breaks the protocol leaves the
  connection failed: every answer not yet received and every later request raises
  that failure, until :meth:`ClientConnection.reset` starts a new connection.

Riding through a daemon restart
-------------------------------

Each session the client writes has a :class:`_Writer`: its path, its open run, and the
frames of that run's records the daemon has not acknowledged yet, numbered from 1 with
the run's checkpoints (the run's *items*).  :meth:`~ClientConnection.keep` numbers a
record as it is sent (:meth:`~ClientConnection.keep_all` several sent at once); the
replies to ``sync``, ``save_checkpoint`` and ``close_run`` acknowledge every item sent
before them.  Once the kept frames pass half of ``max_unacked`` bytes, a ``sync`` that
does not fsync (``durable`` false) goes out behind the record to acknowledge them,
unless an acknowledgement is on its way already.  The caller that sent a record waits
while the kept frames pass ``max_unacked`` (:meth:`~ClientConnection.full`), until the
connection fails.

The invariant that makes every such wait end: *while a session's kept frames pass
``max_unacked``, a request on the connection asks the daemon to acknowledge every item
sent.*  The frames only pass the bound in :meth:`~ClientConnection.keep`, which then
sends a ``sync`` behind them unless a request already covers the last item; each
later record kept while they are past it does the same; and after a reconnect
:meth:`~ClientConnection.replay` sends one behind the frames it sends again.  So
however large one record is, however many were held back and sent together, and
whatever acknowledgement was on its way when they crossed the bound, the reply that
brings the kept frames back under it is coming.

After a reconnect (:meth:`~ClientConnection.reset`), :meth:`~ClientConnection.reopen`
opens each session again, and :meth:`~ClientConnection.resume` continues its run: the
file says how many of the run's items it holds (``SessionOpened.last_run_items``), so
only the frames after them are sent again, and each item is in the file exactly once.
A request that was waiting for its reply is sent again through
:meth:`~ClientConnection.retry`.

Tails ride through as well
--------------------------

A tail is known to the subscriber by a number of the client's own (a
:class:`_Tail`), which outlives the daemon's subscriptions: each daemon subscription
that feeds it is a *route* (the daemon numbers them anew on every connection).  A
tail remembers how far it got: the seq of the last record received, for a tail of one
session; the last ``(session_id, seq)`` of each path, for a tail of every session.

After a reconnect, :meth:`~ClientConnection.resubscribe` subscribes again with the
same filters.  A tail of one session goes on with ``after`` its last seq: the daemon
reads the file from there, then follows, so nothing is lost and nothing repeated.  A
tail of every session only gets what is written from its new subscription on, so
:meth:`~ClientConnection.catch_up` asks ``status`` and reads the rest from the files,
one ``subscribe`` without ``follow`` per path: each path it delivered from, after its
position, and each session the new daemon holds that it never delivered from, after
the lines the old daemon wrote (``last_seq - records``: what the new daemon wrote was
written while the tail was away, a session created since included).  ``status`` also
lists the sessions the daemon closed lately: a daemon up for less time than since the
tail last caught up closed them all while the tail was away, so those it never
delivered from are read the same way (one created and closed meanwhile included); on
the daemon it was on, some were closed before it subscribed, so none.  While a path is
read so, its live records are held, then released past what the read delivered: each
session's records come once and in order.  A daemon that ends the subscription with
``shutting_down`` (SIGTERM) is going away: the tail waits for the reconnect too.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from time import monotonic
from typing import Any, Generic, TypeVar, cast

import msgspec

from flightlog.protocol import (
    PROTOCOL_VERSION,
    Ack,
    BeginRun,
    CheckpointLoaded,
    CloseRun,
    CloseSession,
    Codec,
    Create,
    EncodedEvent,
    ErrorCode,
    ErrorReply,
    Event,
    FlightlogError,
    FrameEncoder,
    Hello,
    LoadCheckpoint,
    LocalProtocolError,
    Message,
    Open,
    Record,
    RecordFailed,
    RecordingError,
    RemoteProtocolError,
    RunStarted,
    SaveCheckpoint,
    SessionMachine,
    SessionOp,
    SessionOpened,
    SessionState,
    Status,
    StatusReply,
    Subscribe,
    Subscribed,
    Sync,
    TailBatch,
    TailEnd,
    Unsubscribe,
    Welcome,
    client_decoder,
    format_time,
    new_id,
    now,
    utc_time,
)

from ._diagnostics import RunDiagnostics, joined
from ._exceptions import ConnectionLost, DaemonError
from ._identified import identified

__all__ = ["DEFAULT_MAX_UNACKED", "ClientConnection", "Pending", "sticky_of"]

#: Bytes of records a session keeps until the daemon acknowledges them.
DEFAULT_MAX_UNACKED = 8 * 1024 * 1024

T = TypeVar("T")
_ReplyT = TypeVar("_ReplyT", bound=Message)


class Pending(Generic[T]):
    """One request on its way: its id, its frame, and how its reply becomes a result."""

    __slots__ = (
        "_finish",
        "_rebuild",
        "_refused",
        "acks",
        "data",
        "id",
        "item",
        "kind",
        "path",
        "run_id",
        "session_id",
        "settled",
    )

    def __init__(
        self,
        id: int,
        data: bytes,
        finish: Callable[[Message], T],
        session_id: str | None = None,
        refused: Callable[[ErrorReply], T] | None = None,
        rebuild: Callable[[], Pending[T]] | None = None,
    ) -> None:
        self.id = id
        self.data = data
        self.session_id = session_id
        self._finish = finish
        #: Turns a refusal into a result, or raises it (None: always raised).
        self._refused = refused
        #: The same request with a fresh id, for a new connection.
        self._rebuild = rebuild
        #: Whether its reply acknowledges the session's items sent before it.
        self.acks = False
        #: What a reconnect must know of it: ``begin``, ``close`` (of ``run_id``),
        #: ``checkpoint`` (the run's ``item``, once sent), ``recreate`` (a ``create``
        #: sent again), or None.
        self.kind: str | None = None
        self.run_id: str | None = None
        #: The path of a ``create``: opened instead when sent again and the file exists.
        self.path: str | None = None
        self.item = 0
        #: Its result when a reconnect found it done already (a checkpoint in the file).
        self.settled: tuple[T] | None = None


class _Writer:
    """What a reconnect needs of a session this client writes (see the module docstring)."""

    __slots__ = (
        "acked",
        "asked",
        "checkpoint_seq",
        "frames",
        "last_run",
        "path",
        "resumed_items",
        "run_id",
        "sent",
        "size",
    )

    def __init__(self, path: str) -> None:
        self.path = path
        #: The run whose items are numbered, until its run_close is acknowledged.
        self.run_id: str | None = None
        #: (item, frame) of the records sent and not acknowledged, in order.
        self.frames: deque[tuple[int, bytes]] = deque()
        #: The last item sent; the last item a request on this connection asks the
        #: daemon to acknowledge; the last item it acknowledged.  ``asked > acked``:
        #: an acknowledgement is on its way.
        self.sent = self.asked = self.acked = 0
        self.size = 0
        #: What the last reopen found in the file.
        self.last_run: str | None = None
        self.resumed_items = 0
        self.checkpoint_seq: int | None = None

    def start(self, run_id: str | None, items: int = 0) -> None:
        """Number the items of ``run_id`` after ``items`` the file holds already."""
        self.run_id = run_id
        self.frames.clear()
        self.sent = self.asked = self.acked = items
        self.size = 0

    def acknowledged(self, item: int) -> None:
        if item > self.acked:
            self.acked = item
        frames = self.frames
        while frames and frames[0][0] <= item:
            self.size -= len(frames.popleft()[1])


class _Tail:
    """One tail as its subscriber sees it, across the daemon subscriptions that feed it
    (see the module docstring)."""

    __slots__ = (
        "after",
        "ended",
        "follow",
        "held",
        "holding",
        "items",
        "number",
        "path",
        "positions",
        "queued",
        "route",
        "run_id",
        "since",
        "types",
    )

    def __init__(
        self,
        number: int,
        path: str | None,
        after: int,
        follow: bool,
        types: list[str] | None,
        run_id: str | None,
    ) -> None:
        self.number = number
        self.path = path
        #: A tail of one session: the seq of the last record received.
        self.after = after
        self.follow = follow
        self.types = types
        self.run_id = run_id
        self.items: deque[list[tuple[str | None, Record]] | TailEnd] = deque()
        self.ended = False
        #: The daemon's subscription that follows, while there is one.
        self.route: int | None = None
        #: A tail of every session: the last (session_id, seq) received, per path.
        self.positions: dict[str, tuple[str, int]] = {}
        #: Paths read from the file after a reconnect: their live records, held.
        self.held: dict[str, list[Record]] = {}
        #: Subscribed again, not yet told what to read from the files: every live
        #: record is held.
        self.holding = False
        #: Paths still to read from the file, and after which seq.
        self.queued: deque[tuple[str, int]] = deque()
        #: A tail of every session: when (monotonic) it was last subscribed and caught
        #: up; a daemon up for less time than since then is not the one it was on.
        self.since: float | None = None

    def advance(self, path: str, record: Record) -> bool:
        """Whether ``record`` is new to a tail of every session (it moves the path's
        position), or was received already."""
        position = self.positions.get(path)
        if position is not None and position[0] == record.session_id and record.seq <= position[1]:
            return False
        self.positions[path] = (record.session_id, record.seq)
        return True


#: Paths a tail of every session reads from the files at once after a reconnect.
_CATCH_UPS = 16


_record_decoder = msgspec.json.Decoder(Record)


class ClientConnection:
    """The client's protocol state: request ids, pending replies, sticky errors, tails.

    ``codec`` encodes events, checkpoints and decodes loaded checkpoints;
    ``client_name`` and ``pid`` are announced in the hello and in every ``run_start``;
    ``max_unacked`` bounds the bytes of records kept per session until acknowledged.
    """

    def __init__(
        self,
        *,
        codec: Codec,
        client_name: str,
        pid: int,
        max_unacked: int = DEFAULT_MAX_UNACKED,
    ) -> None:
        self.codec = codec
        self.client_name = client_name
        self.pid = pid
        self.max_unacked = max_unacked
        self._writers: dict[str, _Writer] = {}
        #: Records sent and never written: dropped when the daemon stayed out of reach.
        self.lost = 0
        #: Request id -> (session, item, background): the items its reply acknowledges.
        self._marks: dict[int, tuple[str, int, bool]] = {}
        #: The daemon's Welcome, once the handshake is done.
        self.welcome: Welcome | None = None
        #: Whether the hello asks for a ring (the transport's to say).
        self.ring = False
        self._ids = itertools.count(1)
        self._encoder = FrameEncoder()
        self._decoder = client_decoder()
        self._waiting: set[int] = set()
        self._replies: dict[int, Message] = {}
        self._failure: FlightlogError | None = None
        self._sessions: dict[str, SessionMachine[RecordingError]] = {}
        #: Whether tails are subscribed again after a reconnect (the client reconnects);
        #: else a break ends them with ``connection_lost``.
        self.tails_resume = False
        self._tails: dict[int, _Tail] = {}
        self._tail_numbers = itertools.count(1)
        #: The daemon's subscription -> the tail it feeds, and the path it reads from
        #: the file after a reconnect (None: the tail's own subscription).
        self._routes: dict[int, tuple[_Tail, str | None]] = {}
        #: Subscribe requests on their way, the same way.
        self._subscribing: dict[int, tuple[_Tail, str | None]] = {}
        #: Status requests a tail of every session that fell behind asked, by id.
        self._planning: dict[int, _Tail] = {}
        self._tail_ends: dict[int, TailEnd] = {}
        self._outbox = bytearray()
        #: Run id -> the events it recorded with markers or as stubs, for its run_close.
        self._diagnostics: dict[str, RunDiagnostics] = {}

    # ------------------------------------------------------------------ receiving

    @property
    def failure(self) -> FlightlogError | None:
        """Why the connection cannot be used any more, or None while it can."""
        return self._failure

    def receive_data(self, data: bytes) -> None:
        """Digest bytes received from the daemon; ``b""`` means it closed the connection."""
        if self._failure is not None:
            return
        if not data:
            self.connection_lost(ConnectionLost("the daemon closed the connection"))
            return
        self._decoder.feed(data)
        try:
            for message in self._decoder:
                self._dispatch(message)
        except RemoteProtocolError as exc:
            # A reply we cannot read would leave its caller waiting forever: give up.
            self.connection_lost(exc)

    def connection_lost(self, error: FlightlogError) -> None:
        """Fail the connection: every wait and every later request raises ``error``."""
        if self._failure is None:
            self._failure = error

    def answered(self, request: Pending[Any]) -> bool:
        """Whether ``request`` has its reply, or will never get one."""
        return request.id in self._replies or self._failure is not None

    def result(self, request: Pending[T]) -> T:
        """The result of an answered ``request``.

        Raises :class:`DaemonError` (or :class:`RecordingError` for ``write_failed``)
        when the daemon refused it, :class:`RemoteProtocolError` for a reply of the
        wrong kind, and the connection's failure when it broke first.
        """
        self._waiting.discard(request.id)
        reply = self._replies.pop(request.id, None)
        if reply is None:
            if self._failure is not None:
                raise self._failure
            raise LocalProtocolError(f"request {request.id} has no reply yet")
        if isinstance(reply, ErrorReply):
            if request._refused is not None:
                return request._refused(reply)
            raise self._refusal(reply, request.session_id)
        return request._finish(reply)

    def forget(self, request: Pending[Any]) -> None:
        """Give up waiting for ``request``: its reply will be dropped when it comes."""
        self._waiting.discard(request.id)
        self._replies.pop(request.id, None)

    def take_outbox(self) -> bytes:
        """Frames queued without a caller (unsubscribes of abandoned tails); send them first."""
        if not self._outbox:
            return b""
        data = bytes(self._outbox)
        self._outbox.clear()
        return data

    def _dispatch(self, message: Message) -> None:
        if self._marks:
            mark = self._marks.pop(getattr(message, "id", 0), None)
            if mark is not None:
                self._acknowledged(mark[0], mark[1])
                if mark[2]:
                    return  # a sync of keep's: nobody waits for its reply
        match message:
            case RecordFailed(session_id=session_id, run_id=run_id, code=code):
                self._stick(session_id, run_id, RecordingError(message.message, code=code))
            case TailBatch(subscription=sub) | TailEnd(subscription=sub):
                route = self._routes.get(sub)
                if route is not None:
                    self._pushed(sub, *route, message)
            case ErrorReply(id=0, session_id=str(session_id), code=code):
                # An error about no request, but about a session: a record it refused.
                self._stick(session_id, None, RecordingError(message.message, code=code))
            case ErrorReply(id=0):
                self.connection_lost(
                    DaemonError(message.message, code=message.code, session_id=None)
                )
            case Subscribed(id=subscribe_id) | ErrorReply(id=subscribe_id) if (
                subscribe_id in self._subscribing
            ):
                self._subscribed(message)
                if subscribe_id in self._waiting:
                    self._replies[subscribe_id] = message
            case StatusReply(id=status_id) if status_id in self._planning:
                self._plan(self._planning.pop(status_id), message)
            case _:
                request_id = getattr(message, "id", None)
                # Replies to requests given up on are dropped, never mismatched.
                if isinstance(request_id, int) and request_id in self._waiting:
                    self._replies[request_id] = message

    def _refusal(self, reply: ErrorReply, session_id: str | None) -> FlightlogError:
        session_id = reply.session_id or session_id
        if reply.code == ErrorCode.WRITE_FAILED:
            error = RecordingError(reply.message, code=reply.code)
            if session_id is not None:
                self._stick(session_id, None, error)
                # The first failure explains the rest (the daemon pushed it before this).
                return self.sticky_error(session_id, None) or error
            return error
        return DaemonError(reply.message, code=reply.code, session_id=session_id)

    def _stick(self, session_id: str, run_id: str | None, error: RecordingError) -> None:
        session = self._sessions.get(session_id)
        if session is None:
            return  # not a session this client writes (any more)
        # The first error is the one that explains the rest: later ones do not replace it.
        if run_id is None or error.code == ErrorCode.WRITE_FAILED:
            session.fail(error)
        else:
            session.run_failed(run_id, error)

    def refuse_run(self, session_id: str, run_id: str, error: RecordingError) -> None:
        """An event of the run was refused here (the codec could not encode it): the
        run's error is sticky, as one the daemon pushed: every later write of the run
        raises it, and ``run_close`` carries it."""
        self._stick(session_id, run_id, error)

    # ------------------------------------------------------------------ requests

    def _request(
        self,
        build: Callable[[int], Message],
        finish: Callable[[_ReplyT], T],
        reply_type: type[_ReplyT],
        session_id: str | None = None,
        refused: Callable[[ErrorReply], T] | None = None,
    ) -> Pending[T]:
        if self._failure is not None:
            raise self._failure
        request_id = next(self._ids)
        data = self._encoder.encode(build(request_id))
        self._waiting.add(request_id)

        def rebuild() -> Pending[T]:
            return self._request(build, finish, reply_type, session_id, refused)

        def checked(reply: Message) -> T:
            if not isinstance(reply, reply_type):
                raise RemoteProtocolError(
                    f"the daemon answered request {request_id} with "
                    f"{type(reply).__name__}, not {reply_type.__name__}",
                    code=ErrorCode.BAD_MESSAGE,
                )
            return finish(reply)

        return Pending(request_id, data, checked, session_id, refused, rebuild)

    def hello(self) -> Pending[Welcome]:
        """The handshake; its result is the daemon's Welcome."""

        def welcome(reply: Welcome) -> Welcome:
            self.welcome = reply
            self._encoder.max_frame_size = reply.max_frame_size
            return reply

        return self._request(
            lambda id: Hello(
                id=id,
                version=PROTOCOL_VERSION,
                client=self.client_name,
                pid=self.pid,
                ring=self.ring,
            ),
            welcome,
            Welcome,
        )

    def create(self, path: str, meta: Mapping[str, Any]) -> Pending[SessionOpened]:
        """Create a session file and become its writer."""
        pending = self._request(
            lambda id: Create(id=id, path=path, meta=dict(meta)), self._opened, SessionOpened
        )
        pending.path = path
        return pending

    def open(self, path: str) -> Pending[SessionOpened]:
        """Open an existing session file and become its writer."""
        return self._request(lambda id: Open(id=id, path=path), self._opened, SessionOpened)

    def _opened(self, reply: SessionOpened) -> SessionOpened:
        self._sessions[reply.session_id] = SessionMachine()
        writer = self._writers[reply.session_id] = _Writer(reply.path)
        writer.last_run, writer.resumed_items = reply.last_run, reply.last_run_items
        return reply

    def _begin(
        self,
        session_id: str,
        finish: Callable[[RunStarted], RunStarted],
        *,
        run_id: str | None = None,
        resume: str | None = None,
    ) -> Pending[RunStarted]:
        """A ``begin_run``: of the new run ``run_id``, or continuing ``resume``."""
        pending = self._request(
            lambda id: BeginRun(
                id=id,
                session_id=session_id,
                time=now(),
                client=self.client_name,
                pid=self.pid,
                run_id=run_id,
                resume=resume,
            ),
            finish,
            RunStarted,
            session_id,
        )
        pending.kind, pending.run_id = "begin", run_id or resume
        return pending

    def continue_run(self, session_id: str, run_id: str) -> Pending[RunStarted]:
        """Continue the session's last run, cut without ``run_close`` when it was
        opened (``SessionOpened.last_run``): ``begin_run`` with ``resume``."""
        self._check(session_id, None, SessionOp.BEGIN_RUN)
        writer = self._writers[session_id]

        def continued(reply: RunStarted) -> RunStarted:
            session = self._sessions.get(session_id)
            if session is not None:
                session.begin_run(reply.run_id)
                writer.start(reply.run_id, writer.resumed_items)
            return reply

        return self._begin(session_id, continued, resume=run_id)

    def begin_run(self, session_id: str) -> Pending[RunStarted]:
        """Start a run; raises the session's sticky error or a local refusal."""
        self._check(session_id, None, SessionOp.BEGIN_RUN)
        run_id = new_id()

        def started(reply: RunStarted) -> RunStarted:
            session = self._sessions.get(session_id)
            if session is not None:  # else closed meanwhile
                session.begin_run(reply.run_id)
                self._writers[session_id].start(reply.run_id)
            return reply

        return self._begin(session_id, started, run_id=run_id)

    def record(
        self,
        session_id: str,
        run_id: str,
        event: Event,
        time: datetime | str | None = None,
        event_id: str | None = None,
    ) -> bytes | None:
        """The frame recording ``event`` in the run, or None when it is never written.

        A value the codec cannot encode is written as a marker, and an event larger
        than the daemon accepts as its stub (``Codec.oversized``); either is named in
        the run's ``run_close``.  Raises the run's sticky :class:`RecordingError`, the
        codec's error for something that is not an event or a field of the wrong type,
        and :class:`LocalProtocolError` for a closed run, a bad ``time`` or ``event_id``.
        With ``event_id`` the frame carries it (:func:`._identified.identified`).
        """
        # The hot path of every agent: the common case (the run open, no sticky error
        # anywhere, the connection sound) is told apart with plain attribute tests;
        # anything else takes the full check, which raises the right error.
        session = self._sessions.get(session_id)
        if (
            self._failure is not None
            or session is None
            or session.state is not SessionState.RUN_OPEN
            or session.run_id != run_id
            or session.failed_run == run_id
        ):
            self._check(session_id, run_id, SessionOp.RECORD)
        encoded = self.codec.encode_event(event)
        if encoded is None:
            return None
        when = encoded.time if time is None else _event_time(encoded, time)
        encode: Callable[[str, str, str, str, bytes], bytes] = self._encoder.encode_record
        if event_id is not None:
            encode = identified(self._encoder, event_id)
        try:
            frame = encode(session_id, run_id, encoded.type, when, encoded.data)
        except LocalProtocolError as exc:
            if exc.code != ErrorCode.FRAME_TOO_LARGE:
                raise
            # Too large to send: its stub is written instead, and run_close names it.
            encoded = self.codec.oversized(encoded, limit=self._encoder.max_frame_size)
            try:
                frame = encode(session_id, run_id, encoded.type, when, encoded.data)
            except LocalProtocolError:
                raise exc from None
        if encoded.markers:
            execution = getattr(event, "execution", None)
            notes = self._diagnostics.get(run_id)
            if notes is None:
                notes = self._diagnostics[run_id] = RunDiagnostics()
            notes.add(encoded.type, getattr(execution, "id", None), encoded.markers)
        return frame

    def diagnosed(self, run_id: str) -> int:
        """How many events of the open run ``run_id`` were written with markers or as
        stubs (its ``run_close`` names them)."""
        notes = self._diagnostics.get(run_id)
        return 0 if notes is None else notes.events

    def save_checkpoint(self, session_id: str, run_id: str, snapshot: Any) -> Pending[int]:
        """Append a codec-encoded checkpoint; the result is its seq, once durable."""
        self._check(session_id, run_id, SessionOp.SAVE_CHECKPOINT)
        data = self.codec.encode_value(snapshot)
        pending = self._request(
            lambda id: SaveCheckpoint(
                id=id, session_id=session_id, run_id=run_id, time=now(), snapshot=data
            ),
            _ack_seq,
            Ack,
            session_id,
        )
        pending.acks = True
        pending.kind = "checkpoint"
        return pending

    def close_run(self, session_id: str, run_id: str, error: str | None) -> Pending[None] | None:
        """Close the run: ``run_close`` carries its sticky error text, else ``error``.

        None when the run is closed already.  The request's result raises the run's
        sticky error once the daemon has written ``run_close``; when the daemon cannot
        write it any more (the session failed) the sticky error is raised right here.
        """
        session = self._sessions.get(session_id)
        if session is None or session.run_id != run_id:
            return None
        sticky = self.sticky_error(session_id, run_id)
        notes = self._diagnostics.pop(run_id, None)
        if session.state is SessionState.FAILED:
            # The daemon takes no more writes: the run stays without run_close.
            session.release()
            if sticky is not None:
                raise sticky
            session.check(SessionOp.CLOSE_RUN)
        session.close_run(run_id)
        text = sticky.message if sticky is not None else error
        if notes is not None:
            text = joined(text, notes.text())

        def closed(reply: Ack) -> None:
            writer = self._writers.get(session_id)
            if writer is not None and writer.run_id == run_id:
                writer.start(None)
            if (late := self.sticky_error(session_id, run_id)) is not None:
                raise late

        pending = self._request(
            lambda id: CloseRun(
                id=id, session_id=session_id, run_id=run_id, time=now(), error=text
            ),
            closed,
            Ack,
            session_id,
        )
        pending.acks = True
        pending.kind, pending.run_id = "close", run_id
        return pending

    def sync(self, session_id: str) -> Pending[int]:
        """Make everything sent so far durable; the result is the last seq written."""
        self._check(session_id, None, SessionOp.SYNC)
        pending = self._request(
            lambda id: Sync(id=id, session_id=session_id), _ack_seq, Ack, session_id
        )
        pending.acks = True
        return pending

    def load_checkpoint(self, session_id: str) -> Pending[Any]:
        """The latest checkpoint's snapshot, decoded by the codec, or None."""
        self._check(session_id, None, SessionOp.LOAD_CHECKPOINT)

        def loaded(reply: CheckpointLoaded) -> Any:
            return None if reply.snapshot is None else self.codec.decode_value(reply.snapshot)

        return self._request(
            lambda id: LoadCheckpoint(id=id, session_id=session_id),
            loaded,
            CheckpointLoaded,
            session_id,
        )

    def close_session(self, session_id: str) -> Pending[None] | None:
        """Sync and release the session; None when it is closed already.

        An open run stays without ``run_close``, exactly as after a disconnect.
        """
        session = self._sessions.pop(session_id, None)
        if session is None:
            return None
        session.close()

        def closed(reply: Ack) -> None:
            self._writers.pop(session_id, None)

        pending = self._request(
            lambda id: CloseSession(id=id, session_id=session_id), closed, Ack, session_id
        )
        pending.acks = True
        return pending

    def subscribe(
        self,
        path: str | None,
        *,
        after: int = 0,
        follow: bool = False,
        types: list[str] | None = None,
        run_id: str | None = None,
    ) -> Pending[int]:
        """Tail ``path`` (every session when None); the result is the tail's number."""
        tail = _Tail(next(self._tail_numbers), path, after, follow, types, run_id)
        return self._subscribe(tail)

    def _subscribe(self, tail: _Tail) -> Pending[int]:
        pending = self._request(
            lambda id: Subscribe(
                id=id,
                path=tail.path,
                after=tail.after,
                follow=tail.follow,
                types=tail.types,
                run_id=tail.run_id,
            ),
            lambda reply: tail.number,
            Subscribed,
        )
        self._subscribing[pending.id] = (tail, None)
        pending.kind, pending.item = "subscribe", tail.number
        pending._rebuild = partial(self._subscribe, tail)
        return pending

    def unsubscribe(self, subscription: int) -> Pending[None] | None:
        """End the tail ``subscription``; pushes still in flight for it are dropped.
        None when no subscription of the daemon feeds it now.

        One the daemon ended meanwhile (its TailEnd crossed the unsubscribe on the way,
        say when the writer closed the session) is over all the same: no error.
        """
        tail = self._tails.pop(subscription, None)
        if tail is None or tail.route is None:
            return None
        route = tail.route

        def over(reply: ErrorReply) -> None:
            if reply.code != ErrorCode.SUBSCRIPTION_NOT_FOUND:
                raise self._refusal(reply, None)

        pending = self._request(
            lambda id: Unsubscribe(id=id, subscription=route), _ack_none, Ack, None, over
        )
        pending.kind = "unsubscribe"
        return pending

    def status(self) -> Pending[StatusReply]:
        """What the daemon holds."""
        return self._request(lambda id: Status(id=id), _same, StatusReply)

    # ------------------------------------------------------------ delivery

    def keep(self, session_id: str, data: bytes) -> bytes:
        """Number the record frame ``data`` as sent and keep it until acknowledged.

        Returns the frames to send: ``data``, followed by a ``sync`` that does not
        fsync when one is due (see :meth:`_ask`).  Raises the connection's failure
        (the frame kept: a reconnect sends it).  The caller then waits while
        :meth:`full`.
        """
        writer = self._writers.get(session_id)
        if writer is None:
            return data
        writer.sent += 1
        writer.frames.append((writer.sent, data))
        writer.size += len(data)
        if self._failure is not None:
            raise self._failure
        if writer.size * 2 < self.max_unacked:
            return data
        return data + self._ask(session_id, writer)

    def keep_all(self, session_id: str, frames: Sequence[bytes]) -> bytes:
        """:meth:`keep` for several record frames sent at once: one ``sync`` at most,
        behind the last of them."""
        writer = self._writers.get(session_id)
        if writer is None:
            return b"".join(frames)
        for frame in frames:
            writer.sent += 1
            writer.frames.append((writer.sent, frame))
            writer.size += len(frame)
        if self._failure is not None:
            raise self._failure
        data = b"".join(frames)
        if writer.size * 2 < self.max_unacked:
            return data
        return data + self._ask(session_id, writer)

    def _ask(self, session_id: str, writer: _Writer) -> bytes:
        """The ``sync`` (no fsync) asking the daemon to acknowledge every item sent, or
        ``b""`` when none is due.

        Past half of ``max_unacked``, one is asked for unless one is on its way.  Past
        all of it the caller is about to wait (:meth:`full`), so one is asked for
        unless one on its way covers every item sent: a wait always has the
        acknowledgement it waits for coming (the invariant of the module docstring),
        whatever the size of the frames and however many were held back and sent at
        once.
        """
        if writer.asked >= writer.sent or (
            writer.asked > writer.acked and writer.size <= self.max_unacked
        ):
            return b""
        writer.asked = writer.sent
        request_id = next(self._ids)
        self._marks[request_id] = (session_id, writer.sent, True)
        return self._encoder.encode(Sync(id=request_id, session_id=session_id, durable=False))

    def sending(self, request: Pending[Any]) -> None:
        """``request`` goes out now: note the items its reply will acknowledge."""
        writer = self._writers.get(request.session_id or "")
        if not request.acks or writer is None:
            return
        if request.kind == "checkpoint" and not request.item:  # an item of the run
            writer.sent += 1
            request.item = writer.sent
        writer.asked = writer.sent
        self._marks[request.id] = (request.session_id or "", writer.sent, False)

    def full(self, session_id: str) -> bool:
        """Whether the session's unacknowledged records pass ``max_unacked``: the
        caller that sent them waits until they do not (an acknowledgement of them is
        on its way), or the connection fails."""
        writer = self._writers.get(session_id)
        return writer is not None and writer.size > self.max_unacked and self._failure is None

    def unacknowledged_bytes(self) -> dict[str, int]:
        """The bytes of records sent and not acknowledged, per session path."""
        return {w.path: w.size for w in self._writers.values() if w.frames}

    def give_up(
        self, path: str, grace: float, last: FlightlogError | None, *, keep: bool = False
    ) -> ConnectionLost:
        """The reconnect grace is over: fail the connection with one error naming the
        records never acknowledged, and drop them (:attr:`lost` counts them: the file
        holds a prefix of them, perhaps none), unless ``keep``: then a later
        :meth:`reset` and :meth:`replay` still send them."""
        lost = [
            f"{len(w.frames)} records of run {w.run_id} in {w.path}"
            for w in self._writers.values()
            if w.frames
        ]
        why = f" (last: {last.message})" if last is not None else ""
        error = ConnectionLost(
            f"the daemon at {path} could not be reached again within {grace:g} s{why}; "
            + (
                "sent but never acknowledged, so the file may lack them: " + "; ".join(lost)
                if lost
                else "every record sent was acknowledged"
            ),
            code=ErrorCode.DAEMON_UNREACHABLE,
        )
        self._failure = error
        if keep:
            return error
        for writer in self._writers.values():
            self.lost += len(writer.frames)
            writer.frames.clear()
            writer.size = 0
        return error

    def _acknowledged(self, session_id: str, item: int) -> None:
        writer = self._writers.get(session_id)
        if writer is not None:
            writer.acknowledged(item)

    def reset(self) -> None:
        """Start over on a new connection: the sessions and their runs are kept.

        Replies still awaited will never come: their callers :meth:`retry` them.  Tails
        are subscribed again (:meth:`resubscribe`), unless :attr:`tails_resume` is false:
        then they end with a ``connection_lost`` error.
        """
        self._failure = None
        self.welcome = None
        self._decoder = client_decoder()
        self._waiting.clear()
        self._replies.clear()
        self._marks.clear()
        self._outbox.clear()
        for writer in self._writers.values():
            writer.asked = writer.acked  # the requests on their way went with it
        self._routes.clear()
        self._subscribing.clear()
        self._planning.clear()
        for tail in self._tails.values():
            tail.route = None
            # Held records are read again from the file, after the tail's positions.
            tail.held.clear()
            tail.queued.clear()
            if not self.tails_resume and not tail.ended:
                self.end_tail(
                    tail.number,
                    ConnectionLost("the connection to the daemon broke; the subscription ended"),
                )

    def writing(self) -> list[str]:
        """The sessions to open again after a reconnect, in the order they were opened."""
        return list(self._writers)

    def reopen(self, session_id: str) -> Pending[SessionOpened]:
        """Open a session this client writes again, on a new connection."""
        path = self._writers[session_id].path
        return self._request(lambda id: Open(id=id, path=path), _same_opened, SessionOpened)

    def resume(self, session_id: str, opened: SessionOpened) -> Pending[RunStarted] | None:
        """Continue the session's run after :meth:`reopen`; None when there is none.

        Drops the kept frames the file already holds; :meth:`replay` gives the rest.
        A run the file closed meanwhile (its ``close_run`` was written) is over; a run
        that cannot be continued any more fails, sticky.
        """
        writer = self._writers[session_id]
        writer.last_run = opened.last_run
        writer.resumed_items = opened.last_run_items
        writer.checkpoint_seq = opened.checkpoint_seq
        run_id = writer.run_id
        if run_id is None:
            return None
        if opened.last_run != run_id:
            writer.start(None)
            session = self._sessions.get(session_id)
            if session is not None and session.run_id == run_id:
                session.run_failed(
                    run_id,
                    RecordingError(
                        f"run {run_id} was cut by a daemon restart and cannot be continued",
                        code=ErrorCode.CONNECTION_LOST,
                    ),
                )
            return None
        writer.acknowledged(opened.last_run_items)
        return self._begin(session_id, _same_started, resume=run_id)

    def replay(self, session_id: str) -> bytes:
        """The kept frames of the session's run the file does not hold, to send again,
        followed by a ``sync`` (no fsync) that acknowledges them: a caller that waited
        for them on the old connection waits for it."""
        writer = self._writers[session_id]
        if not writer.frames:
            return b""
        data = b"".join(frame for _, frame in writer.frames)
        writer.asked = writer.acked  # nothing on its way yet on this connection
        return data + self._ask(session_id, writer)

    def forget_session(self, session_id: str, error: FlightlogError) -> None:
        """A reopen was refused: the session fails with ``error``, its kept frames go."""
        writer = self._writers.pop(session_id, None)
        session = self._sessions.get(session_id)
        if session is not None:
            session.fail(RecordingError(error.message, code=error.code))
        if writer is not None:
            writer.frames.clear()

    def retry(self, request: Pending[T]) -> Pending[T]:
        """``request`` again, on the new connection after a reconnect.

        What the file shows done is not done again: a checkpoint it holds is settled
        (``request.settled``) with the seq the file gave it, a run it closed with None;
        a run whose ``run_start`` it holds is resumed rather than started again, and a
        ``create`` is sent again marked ``recreate``: refused with ``session_exists``,
        the caller opens the file instead (see :meth:`open_instead`), which may be the one the
        request whose reply was lost created.
        """
        if request.kind == "unsubscribe":
            # Its subscription ended with the connection, and nothing subscribes again.
            return _settled(request, None)
        if request.kind == "subscribe" and request.item in self._tails:
            # Subscribed again by :meth:`resubscribe`.
            return _settled(request, request.item)
        if request.path is not None and request._rebuild is not None:
            again = request._rebuild()
            again.path, again.kind = request.path, "recreate"
            return again
        writer = self._writers.get(request.session_id or "")
        if writer is not None:
            kind = request.kind
            if (
                kind == "checkpoint"
                and request.item <= writer.resumed_items
                and writer.checkpoint_seq is not None
            ):
                return _settled(request, writer.checkpoint_seq)
            if kind == "close" and writer.last_run != request.run_id:
                return _settled(request, None)
            run_id = request.run_id
            if kind == "begin" and run_id is not None and writer.last_run == run_id:
                return self._resumed_begin(request, run_id)
        if request._rebuild is None:
            raise LocalProtocolError("this request cannot be sent again")
        again = request._rebuild()
        again.acks, again.kind, again.run_id = request.acks, request.kind, request.run_id
        again.item = request.item
        return again

    def open_instead(self, request: Pending[T], error: FlightlogError) -> Pending[T] | None:
        """The ``open`` to send instead of a ``create`` sent again after a reconnect and
        refused with ``session_exists``; None for any other refusal."""
        if request.kind != "recreate" or error.code != ErrorCode.SESSION_EXISTS:
            return None
        assert request.path is not None
        return cast("Pending[T]", self.open(request.path))

    def _resumed_begin(self, request: Pending[T], run_id: str) -> Pending[T]:
        session_id = request.session_id or ""
        resumed = self._begin(session_id, _same_started, resume=run_id)
        # The same request, resumed: its reply finishes as the begin_run's would have.
        again = cast("Pending[T]", resumed)
        again._finish = request._finish
        return again

    # ------------------------------------------------------------------ pushes

    def sticky_error(self, session_id: str, run_id: str | None) -> RecordingError | None:
        """The error pushed for this run, else the session's failure, else None."""
        return sticky_of(self._sessions.get(session_id), run_id)

    def session_state(self, session_id: str) -> SessionMachine[RecordingError] | None:
        """The rules and sticky errors of a session this client writes (None when it
        does not), which outlive its closing: a run keeps its own."""
        return self._sessions.get(session_id)

    def tail_ready(self, subscription: int) -> bool:
        """Whether :meth:`next_tail` has something (or the connection failed, or frames
        wait in the outbox: a tail reading files after a reconnect asks for the next)."""
        tail = self._tails.get(subscription)
        return tail is None or bool(tail.items) or self._failure is not None or self.has_outbox

    @property
    def has_outbox(self) -> bool:
        """Whether :meth:`take_outbox` has frames to send."""
        return bool(self._outbox)

    def next_tail(self, subscription: int) -> list[tuple[str | None, Record]] | None:
        """The records of the next batch with their session path, or None at the end.

        Raises :class:`DaemonError` when the daemon ended the subscription with an
        error, and the connection's failure when it broke.
        """
        tail = self._tails.get(subscription)
        if tail is None:
            return None
        if not tail.items:
            if self._failure is not None:
                raise self._failure
            return []
        item = tail.items.popleft()
        if not isinstance(item, TailEnd):
            return item
        del self._tails[subscription]
        self._tail_ends[subscription] = item
        if item.reason == "error":
            raise DaemonError(
                item.message or "the subscription failed",
                code=item.code or ErrorCode.INTERNAL,
            )
        return None

    def pop_tail_end(self, subscription: int) -> TailEnd | None:
        """The daemon's TailEnd of an ended subscription (once), or None."""
        return self._tail_ends.pop(subscription, None)

    def tail_ended(self, subscription: int) -> bool:
        """Whether the daemon ended the subscription (or it was never made)."""
        return subscription not in self._tails

    def abandon_tail(self, subscription: int) -> None:
        """The subscriber is gone: drop its pushes and queue an unsubscribe.

        Safe to call at any time (a finaliser may): the unsubscribe goes out before
        the next frame this connection sends, and its reply is dropped.
        """
        tail = self._tails.pop(subscription, None)
        if tail is not None and tail.route is not None and self._failure is None:
            self._unsubscribe_later(tail.route)

    def end_tail(self, subscription: int, error: FlightlogError) -> None:
        """End the tail with ``error`` (a subscribe again refused, the connection gone),
        after the records it has."""
        tail = self._tails.get(subscription)
        if tail is None or tail.ended:
            return
        tail.ended = True
        tail.items.append(
            TailEnd(
                subscription=subscription, reason="error", code=error.code, message=error.message
            )
        )

    def _unsubscribe_later(self, route: int) -> None:
        request_id = next(self._ids)
        self._encoder.encode_into(Unsubscribe(id=request_id, subscription=route), self._outbox)

    def _subscribed(self, reply: Subscribed | ErrorReply) -> None:
        tail, path = self._subscribing.pop(reply.id)
        if isinstance(reply, ErrorReply):
            if path is not None and reply.code != ErrorCode.SHUTTING_DOWN:
                # A session no longer there to read (or no longer to this client): its
                # live records, if any come, are what there is of it.
                self._caught_up(tail, path)
            elif path is None and reply.id not in self._waiting:
                # Subscribing again after falling behind was refused: that ends it.
                self.end_tail(tail.number, self._refusal(reply, None))
            return
        if path is None and reply.id in self._waiting:
            # Its pushes follow right behind the reply: they must find the tail.
            self._tails[tail.number] = tail
        if self._tails.get(tail.number) is not tail:
            self._unsubscribe_later(reply.subscription)  # nobody waits for it any more
            return
        self._routes[reply.subscription] = (tail, path)
        if path is None:
            tail.route = reply.subscription
            if not tail.holding:
                tail.since = monotonic()

    def _pushed(
        self, route: int, tail: _Tail, path: str | None, message: TailBatch | TailEnd
    ) -> None:
        if isinstance(message, TailEnd):
            del self._routes[route]
        if self._tails.get(tail.number) is not tail:
            return  # abandoned
        if isinstance(message, TailEnd):
            if path is not None:
                # Cut short by the daemon going away: read again after the reconnect
                # (releasing what is held now would leave out the rest of the file).
                if message.reason != "shutting_down":
                    self._caught_up(tail, path)
                return
            tail.route = None
            if message.code == ErrorCode.TOO_MANY and tail.path is None:
                self._fell_behind(tail)
                return
            if not (message.reason == "shutting_down" and self.tails_resume):
                tail.ended = True
                tail.items.append(message)
            # else the daemon is going away: the tail is subscribed again once it is back.
            return
        records = [_decode_line(line) for line in message.lines]
        if tail.path is not None:
            if records:
                tail.after = records[-1].seq
                tail.items.append([(message.path, record) for record in records])
            return
        where = path or message.path or ""
        if path is None and (tail.holding or where in tail.held):
            tail.held.setdefault(where, []).extend(records)
            return
        batch = [(message.path, record) for record in records if tail.advance(where, record)]
        if batch:
            tail.items.append(batch)

    # ------------------------------------------------------------ tails again

    def tails(self) -> list[int]:
        """The tails to subscribe again after a reconnect."""
        if not self.tails_resume:
            return []
        return [number for number, tail in self._tails.items() if not tail.ended]

    def resubscribe(self, subscription: int) -> Pending[int]:
        """Subscribe the tail again, on a new connection, with its filters: a tail of one
        session after the last seq it received; a tail of every session for what is
        written from now on, holding it until :meth:`catch_up` has been answered."""
        tail = self._tails[subscription]
        tail.holding = tail.path is None
        return self._subscribe(tail)

    def _fell_behind(self, tail: _Tail) -> None:
        """The daemon ended a tail of every session that fell more than its buffer
        behind: subscribe again and read what it dropped from the files, as after a
        reconnect (the requests go to the outbox, the status answer plans the reads)."""
        tail.holding = True
        request_id = next(self._ids)
        self._subscribing[request_id] = (tail, None)
        self._encoder.encode_into(
            Subscribe(
                id=request_id,
                path=None,
                follow=tail.follow,
                types=tail.types,
                run_id=tail.run_id,
            ),
            self._outbox,
        )
        status_id = next(self._ids)
        self._planning[status_id] = tail
        self._encoder.encode_into(Status(id=status_id, closed=True), self._outbox)

    def catch_up(self, subscription: int) -> Pending[None] | None:
        """For a tail of every session subscribed again: ``status``, whose answer tells
        which paths to read from the files (their subscriptions, without ``follow``, go
        to the outbox, a few at a time).  None for a tail of one session."""
        tail = self._tails.get(subscription)
        if tail is None or tail.path is not None:
            return None

        def planned(reply: StatusReply) -> None:
            self._plan(tail, reply)

        return self._request(lambda id: Status(id=id, closed=True), planned, StatusReply)

    def _plan(self, tail: _Tail, reply: StatusReply) -> None:
        after = {path: seq for path, (_, seq) in tail.positions.items()}
        # Sessions never received from, and the seq after which the new daemon wrote.
        fresh: dict[str, tuple[str, int]] = {}
        opened = {session.path: session.session_id for session in reply.sessions}
        for session in reply.sessions:
            position = tail.positions.get(session.path)
            if position is not None and position[0] == session.session_id:
                if session.last_seq <= position[1] and session.path not in tail.held:
                    del after[session.path]  # nothing new: the rest comes live
            elif session.records or session.path in tail.held:
                # Never received from: what the new daemon wrote is new to the tail.
                fresh[session.path] = (session.session_id, session.last_seq - session.records)
        # A daemon started since the tail was last caught up closed its sessions while
        # the tail was away, one created in that time included: each never received
        # from is read after the lines that daemon wrote to it (over all its openings).
        # The daemon the tail was on closed some before: nothing tells which, so none.
        restarted = tail.since is None or reply.uptime <= monotonic() - tail.since
        for session in reply.closed if restarted else ():
            path, session_id = session.path, session.session_id
            position = tail.positions.get(path)
            if (position is not None and position[0] == session_id) or opened.get(
                path, session_id
            ) != session_id:
                continue  # read after its position, or another session is there now
            start = session.last_seq - session.records
            known = fresh.get(path)
            fresh[path] = (session_id, start if known is None else min(known[1], start))
        for path, (_, start) in fresh.items():
            after[path] = max(start, 0)
        for path, records in tail.held.items():
            if path not in after:
                after[path] = records[0].seq - 1
        tail.holding = False
        tail.since = monotonic()
        for path, seq in after.items():
            tail.held.setdefault(path, [])
            tail.queued.append((path, seq))
        for _ in range(_CATCH_UPS):
            self._next_catch_up(tail)

    def _next_catch_up(self, tail: _Tail) -> None:
        if not tail.queued or self._failure is not None:
            return
        path, after = tail.queued.popleft()
        request_id = next(self._ids)
        self._subscribing[request_id] = (tail, path)
        self._encoder.encode_into(
            Subscribe(
                id=request_id,
                path=path,
                after=after,
                follow=False,
                types=tail.types,
                run_id=tail.run_id,
            ),
            self._outbox,
        )

    def _caught_up(self, tail: _Tail, path: str) -> None:
        held = tail.held.pop(path, [])
        batch: list[tuple[str | None, Record]] = [
            (path, record) for record in held if tail.advance(path, record)
        ]
        if batch:
            tail.items.append(batch)
        self._next_catch_up(tail)

    # ------------------------------------------------------------------ rules

    def _session(self, session_id: str) -> SessionMachine[RecordingError]:
        session = self._sessions.get(session_id)
        if session is None:
            session = SessionMachine()
            session.state = SessionState.CLOSED
        return session

    def _check(self, session_id: str, run_id: str | None, op: SessionOp) -> None:
        if self._failure is not None:
            raise self._failure
        session = self._session(session_id)
        if run_id is not None and (sticky := session.run_failure(run_id)) is not None:
            raise sticky
        session.check(op, run_id)


def sticky_of(
    session: SessionMachine[RecordingError] | None, run_id: str | None
) -> RecordingError | None:
    """The error pushed for the run ``run_id`` of ``session``, else the session's
    failure, else None."""
    if session is None:
        return None
    if run_id is not None and (sticky := session.run_failure(run_id)) is not None:
        return sticky
    return session.failure


def _ack_seq(reply: Ack) -> int:
    return reply.seq


def _ack_none(reply: Ack) -> None:
    return None


def _settled(request: Pending[T], result: Any) -> Pending[T]:
    request.settled = (result,)
    return request


def _same_opened(reply: SessionOpened) -> SessionOpened:
    return reply


def _same_started(reply: RunStarted) -> RunStarted:
    return reply


def _same(reply: StatusReply) -> StatusReply:
    return reply


def _event_time(encoded: EncodedEvent, time: datetime | str | None) -> str:
    if time is None:
        # The moment the event happened at its source, not the moment it is written.
        return encoded.time
    if isinstance(time, datetime):
        return format_time(time)
    utc = utc_time(time)
    if utc is None:
        raise LocalProtocolError(
            f"time {time!r} is not an RFC 3339 time like 2026-11-29T20:00:00.000000Z",
            code=ErrorCode.BAD_EVENT,
        )
    return utc


def _decode_line(line: bytes) -> Record:
    try:
        return _record_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RemoteProtocolError(
            f"the daemon sent a tailed line that is not a record: {exc}",
            code=ErrorCode.BAD_MESSAGE,
        ) from None
