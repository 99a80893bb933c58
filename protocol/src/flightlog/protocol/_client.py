"""The client's side of the wire protocol, sans I/O: one state machine for both clients.

Theory of operation
-------------------

:class:`ClientConnection` is the client role of the wire protocol, as
:class:`~._server.ServerConnection` is the daemon's: it builds every frame the client
sends and digests every byte it receives, and never touches a socket.  The sync and
async clients only move bytes:

* A request method (``create``, ``begin_run``, ``close_run``, …) checks the session
  rules locally (each session it writes has a :class:`~._state.SessionMachine`, the
  daemon's rules, so a mistake is refused before it reaches the daemon) and returns a
  :class:`~._pending.Pending` request: a fresh id and the frame to send.  The caller
  sends ``request.data``, feeds what it receives to :meth:`ClientConnection.receive_data`
  until :meth:`~ClientConnection.answered`, then takes :meth:`~ClientConnection.result`:
  the reply turned into a value, or an :class:`ErrorReply` turned into an exception.
  Replies are matched by id, so replies for requests that were given up (a cancelled
  wait) are dropped.
* :meth:`ClientConnection.record` returns the frame of one ``record`` (no reply), or
  None for an event the codec never writes.  An event holding a value the codec cannot
  encode is framed with a marker in its place, and one too large for a frame as its
  stub; the run keeps an account of them for its ``run_close`` (:mod:`._diagnostics`).
  A codec error (not an event, a field of the wrong type) and a sticky error are raised
  from it, before anything is sent; a strict client makes a codec error the run's
  sticky error (:meth:`~ClientConnection.refuse_run`).
* Pushes are kept: :class:`RecordFailed` becomes a sticky :class:`RecordingError`: the
  run's, which every later write of that run raises, or the session's failure
  (``write_failed``, or no run named), which every later write of the session raises;
  :class:`TailBatch` and :class:`TailEnd` go to the tails (:mod:`._tails`).
* End of stream, a transport failure or a frame that breaks the protocol leaves the
  connection failed: every answer not yet received and every later request raises that
  failure, until :meth:`ClientConnection.reset` starts a new connection.

Two collaborators of its own keep the rest, each in its module with its theory: the
:class:`~._replay.ReplayLog` keeps what the daemon has not acknowledged, so that after a
restart each run goes on where it was cut and each record is written exactly once; the
:class:`~._tails.TailRouter` keeps the tails, across the daemon's subscriptions and
restarts.  The connection builds them and hands them only request ids, a way to frame or
queue a message, and its failure.
The session machines, their sticky errors and the connection's failure are its base,
:class:`~._client_sessions.ClientSessions` (:mod:`._client_sessions`).

After a reconnect (:meth:`~ClientConnection.reset`), :meth:`~ClientConnection.reopen`
opens each session again, :meth:`~ClientConnection.resume` continues its run, the
replay log sends again what the file lacks, :meth:`~ClientConnection.retry` sends again
a request that was waiting for its reply, and the router takes up each tail.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar, cast

from ._client_sessions import ClientSessions
from ._codec import Codec
from ._diagnostics import joined
from ._errors import (
    ConnectionLost,
    DaemonError,
    ErrorCode,
    FlightlogError,
    LocalProtocolError,
    RecordingError,
    RemoteProtocolError,
)
from ._events import Event
from ._framer import RecordFramer
from ._framing import FrameEncoder, client_decoder
from ._pending import Pending, ack_seq, same, settled, sticky_of
from ._records import Origin, new_id, now
from ._replay import DEFAULT_MAX_UNACKED, ReplayLog
from ._state import SessionMachine, SessionOp, SessionState
from ._tails import TailRouter
from ._wire import (
    PROTOCOL_VERSION,
    Ack,
    BeginRun,
    BlobLoaded,
    CheckpointLoaded,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    Hello,
    LoadBlob,
    LoadCheckpoint,
    Message,
    Open,
    RecordFailed,
    RunStarted,
    SaveCheckpoint,
    SessionOpened,
    Status,
    StatusReply,
    Subscribed,
    Sync,
    TailBatch,
    TailEnd,
    Welcome,
)

__all__ = ["DEFAULT_MAX_UNACKED", "ClientConnection", "Pending", "sticky_of"]

T = TypeVar("T")
_ReplyT = TypeVar("_ReplyT", bound=Message)


class ClientConnection(ClientSessions):
    """The client's protocol state: request ids, pending replies, sticky errors, and
    its :attr:`replay_log` and :attr:`tails`.

    ``codec`` encodes events, checkpoints and decodes loaded checkpoints;
    ``client_name`` and ``pid`` are announced in the hello and in every ``run_start``;
    ``clock`` is the caller's monotonic clock in seconds (``time.monotonic``: a tail
    of every session compares it with the daemon's uptime); ``max_unacked`` bounds the
    bytes of records kept per session until acknowledged.
    """

    def __init__(
        self,
        *,
        codec: Codec,
        client_name: str,
        pid: int,
        clock: Callable[[], float],
        max_unacked: int = DEFAULT_MAX_UNACKED,
    ) -> None:
        super().__init__()
        self.codec = codec
        self.client_name = client_name
        self.pid = pid
        #: The daemon's Welcome, once the handshake is done.
        self.welcome: Welcome | None = None
        #: Whether the hello asks for a ring (the transport's to say).
        self.ring = False
        self._ids = itertools.count(1)
        self._encoder = FrameEncoder()
        self._decoder = client_decoder()
        self._waiting: set[int] = set()
        self._replies: dict[int, Message] = {}
        self._outbox = bytearray()
        self._framer = RecordFramer(codec, self._encoder)
        self.replay_log = ReplayLog(
            max_unacked=max_unacked,
            next_id=self._next_id,
            encode=self._encoder.encode,
            failure=lambda: self._failure,
        )
        self.tails = TailRouter(
            request=self._request,
            next_id=self._next_id,
            queue=self._queue,
            waiting=self._waiting.__contains__,
            failure=lambda: self._failure,
            refusal=partial(self._refusal, session_id=None),
            clock=clock,
        )

    @property
    def max_frame_size(self) -> int:
        """The largest frame the daemon takes (its Welcome's, once it said)."""
        return self._encoder.max_frame_size

    def _next_id(self) -> int:
        return next(self._ids)

    def _queue(self, message: Message) -> None:
        self._encoder.encode_into(message, self._outbox)

    # ------------------------------------------------------------------ receiving

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
            if request.refused is not None:
                return request.refused(reply)
            raise self._refusal(reply, request.session_id)
        return request.finish(reply)

    def forget(self, request: Pending[Any]) -> None:
        """Give up waiting for ``request``: its reply will be dropped when it comes."""
        self._waiting.discard(request.id)
        self._replies.pop(request.id, None)

    @property
    def has_outbox(self) -> bool:
        """Whether :meth:`take_outbox` has frames to send."""
        return bool(self._outbox)

    def take_outbox(self) -> bytes:
        """Frames queued without a caller (unsubscribes of abandoned tails, a tail's next
        file to read); send them first."""
        if not self._outbox:
            return b""
        data = bytes(self._outbox)
        self._outbox.clear()
        return data

    def send_records(self, session_id: str, frames: Sequence[bytes]) -> bytes:
        """The bytes to send for record ``frames`` of the session (:meth:`record`'s):
        the frames queued without a caller, then ``frames``, kept by the replay log
        until acknowledged, then a ``sync`` when one is due (``ReplayLog.keep``).

        Raises the connection's failure, the frames kept: a reconnect sends them.
        """
        replay = self.replay_log
        if len(frames) == 1:
            data = replay.keep(session_id, frames[0])
        else:
            data = replay.keep_all(session_id, frames)
        if self._failure is not None:
            raise self._failure
        if self._outbox:
            return self.take_outbox() + data
        return data

    def _dispatch(self, message: Message) -> None:
        replay = self.replay_log
        if replay.asking and replay.answered(getattr(message, "id", 0)):
            return  # a sync of the replay log's: nobody waits for its reply
        match message:
            case RecordFailed(session_id=session_id, run_id=run_id, code=code):
                self._stick(session_id, run_id, RecordingError(message.message, code=code))
            case TailBatch() | TailEnd():
                self.tails.pushed(message)
            case ErrorReply(id=0, session_id=str(session_id), code=code):
                # An error about no request, but about a session: a record it refused.
                self._stick(session_id, None, RecordingError(message.message, code=code))
            case ErrorReply(id=0):
                self.connection_lost(
                    DaemonError(message.message, code=message.code, session_id=None)
                )
            case Subscribed(id=subscribe_id) | ErrorReply(id=subscribe_id) if self.tails.answers(
                subscribe_id
            ):
                self.tails.subscribed(message)
                if subscribe_id in self._waiting:
                    self._replies[subscribe_id] = message
            case StatusReply(id=status_id) if self.tails.plans(status_id):
                self.tails.planned(message)
            case _:
                request_id = getattr(message, "id", None)
                # Replies to requests given up on are dropped, never mismatched.
                if isinstance(request_id, int) and request_id in self._waiting:
                    self._replies[request_id] = message

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

    def create(
        self, path: str, meta: Mapping[str, Any], origin: Origin | None = None
    ) -> Pending[SessionOpened]:
        """Create a session file and become its writer."""
        pending = self._request(
            lambda id: Create(id=id, path=path, meta=dict(meta), origin=origin),
            self._opened,
            SessionOpened,
        )
        pending.path = path
        return pending

    def open(self, path: str) -> Pending[SessionOpened]:
        """Open an existing session file and become its writer."""
        return self._request(lambda id: Open(id=id, path=path), self._opened, SessionOpened)

    def _opened(self, reply: SessionOpened) -> SessionOpened:
        self._sessions[reply.session_id] = SessionMachine()
        self.replay_log.opened(reply)
        return reply

    def _begin(
        self,
        session_id: str,
        finish: Callable[[RunStarted], RunStarted],
        *,
        run_id: str | None = None,
        resume: str | None = None,
        repair: bool = False,
    ) -> Pending[RunStarted]:
        """A ``begin_run``: of the new run ``run_id``, or continuing ``resume`` (to
        ``repair`` it)."""
        pending = self._request(
            lambda id: BeginRun(
                id=id,
                session_id=session_id,
                time=now(),
                client=self.client_name,
                pid=self.pid,
                run_id=run_id,
                resume=resume,
                repair=repair,
            ),
            finish,
            RunStarted,
            session_id,
        )
        pending.kind, pending.run_id = "begin", run_id or resume
        return pending

    def _started(self, session_id: str, continued: bool, reply: RunStarted) -> RunStarted:
        session = self._sessions.get(session_id)
        if session is not None:  # else closed meanwhile
            session.begin_run(reply.run_id)
            self.replay_log.started(session_id, reply.run_id, continued=continued)
        return reply

    def continue_run(
        self, session_id: str, run_id: str, *, repair: bool = False
    ) -> Pending[RunStarted]:
        """Continue the session's last run, cut without ``run_close`` when it was
        opened (``SessionOpened.last_run``): ``begin_run`` with ``resume``.  With
        ``repair``, any run the file left without ``run_close``, to repair it."""
        self._check(session_id, None, SessionOp.BEGIN_RUN)
        started = partial(self._started, session_id, True)
        return self._begin(session_id, started, resume=run_id, repair=repair)

    def begin_run(self, session_id: str) -> Pending[RunStarted]:
        """Start a run; raises the session's sticky error or a local refusal."""
        self._check(session_id, None, SessionOp.BEGIN_RUN)
        started = partial(self._started, session_id, False)
        return self._begin(session_id, started, run_id=new_id())

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
        With ``event_id`` the frame carries it (see :func:`._framer.identified`).
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
        return self._framer.frame(session_id, run_id, event, time, event_id)

    def diagnosed(self, run_id: str) -> int:
        """How many events of the open run ``run_id`` were written with markers or as
        stubs (its ``run_close`` names them)."""
        return self._framer.diagnosed(run_id)

    def save_checkpoint(self, session_id: str, run_id: str, snapshot: Any) -> Pending[int]:
        """Append a codec-encoded checkpoint; the result is its seq, once durable."""
        self._check(session_id, run_id, SessionOp.SAVE_CHECKPOINT)
        data = self.codec.encode_value(snapshot)
        pending = self._request(
            lambda id: SaveCheckpoint(
                id=id, session_id=session_id, run_id=run_id, time=now(), snapshot=data
            ),
            ack_seq,
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
        notes = self._framer.closing(run_id)
        if session.state is SessionState.FAILED:
            # The daemon takes no more writes: the run stays without run_close.
            session.release()
            if sticky is not None:
                raise sticky
            session.check(SessionOp.CLOSE_RUN)
        session.close_run(run_id)
        text = sticky.message if sticky is not None else error
        text = joined(text, notes)

        def closed(reply: Ack) -> None:
            self.replay_log.run_closed(session_id, run_id)
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
            lambda id: Sync(id=id, session_id=session_id), ack_seq, Ack, session_id
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

    def load_resumption(self, session_id: str) -> Pending[tuple[Any, CheckpointLoaded]]:
        """The latest checkpoint's snapshot (or None) and the daemon's reply, which
        holds the session's cut runs and open calls when the daemon gathers them."""
        self._check(session_id, None, SessionOp.LOAD_CHECKPOINT)

        def loaded(reply: CheckpointLoaded) -> tuple[Any, CheckpointLoaded]:
            snapshot = None if reply.snapshot is None else self.codec.decode_value(reply.snapshot)
            return snapshot, reply

        return self._request(
            lambda id: LoadCheckpoint(id=id, session_id=session_id, calls=True),
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
            self.replay_log.session_closed(session_id)

        pending = self._request(
            lambda id: CloseSession(id=id, session_id=session_id), closed, Ack, session_id
        )
        pending.acks = True
        return pending

    def load_blob(self, path: str, sha256: str) -> Pending[bytes]:
        """The bytes of the blob ``sha256`` from the store of the session at ``path``
        (as a tail names it), for a reader that cannot read the store itself."""

        def loaded(reply: BlobLoaded) -> bytes:
            if reply.sha256 != sha256:
                raise RemoteProtocolError(
                    f"the daemon answered a load of blob {sha256} with blob {reply.sha256}",
                    code=ErrorCode.BAD_MESSAGE,
                )
            return reply.data

        return self._request(
            lambda id: LoadBlob(id=id, path=path, sha256=sha256), loaded, BlobLoaded
        )

    def status(self) -> Pending[StatusReply]:
        """What the daemon holds."""
        return self._request(lambda id: Status(id=id), same, StatusReply)

    # ------------------------------------------------------------------ tails

    def tail_ready(self, subscription: int) -> bool:
        """Whether ``tails.next`` has something (or the connection failed, or frames
        wait in the outbox: a tail reading files after a reconnect asks for the next)."""
        return self.tails.ready(subscription) or self._failure is not None or self.has_outbox

    # ------------------------------------------------------------------ delivery

    def give_up(
        self, path: str, grace: float, last: FlightlogError | None, *, keep: bool = False
    ) -> ConnectionLost:
        """The reconnect grace is over: fail the connection with one error naming the
        records never acknowledged, and drop them (``replay_log.lost`` counts them: the
        file holds a prefix of them, perhaps none), unless ``keep``: then after a later
        :meth:`reset` the replay log still sends them."""
        error = self.replay_log.unreachable(path, grace, last)
        self._failure = error
        if not keep:
            self.replay_log.drop()
        return error

    # ------------------------------------------------------------ a new connection

    def reset(self) -> None:
        """Start over on a new connection: the sessions and their runs are kept.

        Replies still awaited will never come: their callers :meth:`retry` them.  Tails
        are subscribed again (``tails.resubscribe``), unless ``tails.resume`` is false:
        then they end with a ``connection_lost`` error.
        """
        self._failure = None
        self.welcome = None
        self._decoder = client_decoder()
        self._waiting.clear()
        self._replies.clear()
        self._outbox.clear()
        self.replay_log.reset()
        self.tails.reset()

    def reopen(self, session_id: str) -> Pending[SessionOpened]:
        """Open a session this client writes again, on a new connection."""
        path = self.replay_log.path(session_id)
        return self._request(lambda id: Open(id=id, path=path), same, SessionOpened)

    def resume(self, session_id: str, opened: SessionOpened) -> Pending[RunStarted] | None:
        """Continue the session's run after :meth:`reopen`; None when there is none.

        Drops the kept frames the file already holds; ``replay_log.replay`` gives the
        rest.
        A run the file closed meanwhile (its ``close_run`` was written) is over; a run
        that cannot be continued any more fails, sticky.
        """
        run_id = self.replay_log.run_of(session_id)
        if self.replay_log.reopened(session_id, opened):
            assert run_id is not None
            return self._begin(session_id, same, resume=run_id)
        session = self._sessions.get(session_id)
        if run_id is not None and session is not None and session.run_id == run_id:
            session.run_failed(
                run_id,
                RecordingError(
                    f"run {run_id} was cut by a daemon restart and cannot be continued",
                    code=ErrorCode.CONNECTION_LOST,
                ),
            )
        return None

    def forget_session(self, session_id: str, error: FlightlogError) -> None:
        """A reopen was refused: the session fails with ``error``, its kept frames go."""
        self.replay_log.forget(session_id)
        session = self._sessions.get(session_id)
        if session is not None:
            session.fail(RecordingError(error.message, code=error.code))

    def retry(self, request: Pending[T]) -> Pending[T]:
        """``request`` again, on the new connection after a reconnect.

        What the file shows done is not done again: a checkpoint it holds is settled
        (``request.settled``) with the seq the file gave it, a run it closed with None;
        a run whose ``run_start`` it holds is resumed rather than started again, and a
        ``create`` is sent again marked ``recreate``: refused with ``session_exists``,
        the caller opens the file instead (see :meth:`open_instead`), which may be the
        one the request whose reply was lost created.
        """
        if request.kind == "unsubscribe":
            # Its subscription ended with the connection, and nothing subscribes again.
            return settled(request, None)
        if request.kind == "subscribe" and self.tails.is_subscribed(request.item):
            # Subscribed again by ``tails.resubscribe``.
            return settled(request, request.item)
        if request.path is not None and request.rebuild is not None:
            again = request.rebuild()
            again.path, again.kind = request.path, "recreate"
            return again
        done = self.replay_log.done(request)
        if done is not None:
            return settled(request, done[0])
        if self.replay_log.resumes(request):
            assert request.run_id is not None
            resumed = cast(
                "Pending[T]",
                self._begin(request.session_id or "", same, resume=request.run_id),
            )
            # The same request, resumed: its reply finishes as the begin_run's would have.
            resumed.finish = request.finish
            return resumed
        if request.rebuild is None:
            raise LocalProtocolError("this request cannot be sent again")
        again = request.rebuild()
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
