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
The request methods are its base :class:`~._client_requests.ClientRequests`
(:mod:`._client_requests`), whose base :class:`~._client_sessions.ClientSessions`
(:mod:`._client_sessions`) keeps the session machines, their sticky errors and the
connection's failure.

After a reconnect (:meth:`~ClientConnection.reset`), :meth:`~ClientConnection.reopen`
opens each session again, :meth:`~ClientConnection.resume` continues its run, the
replay log sends again what the file lacks, :meth:`~ClientConnection.retry` sends again
a request that was waiting for its reply, and the router takes up each tail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar, cast

from ._client_requests import ClientRequests
from ._codec import Codec
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
from ._framing import client_decoder
from ._pending import Pending, same, settled, sticky_of
from ._replay import DEFAULT_MAX_UNACKED
from ._state import SessionOp, SessionState
from ._tails import TailRouter
from ._wire import (
    ErrorReply,
    Message,
    Open,
    RecordFailed,
    RunStarted,
    SessionOpened,
    StatusReply,
    Subscribed,
    TailBatch,
    TailEnd,
)

__all__ = ["DEFAULT_MAX_UNACKED", "ClientConnection", "Pending", "sticky_of"]

T = TypeVar("T")


class ClientConnection(ClientRequests):
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
        super().__init__(codec=codec, client_name=client_name, pid=pid, max_unacked=max_unacked)
        self._decoder = client_decoder()
        self._replies: dict[int, Message] = {}
        self._outbox = bytearray()
        self.tails = TailRouter(
            request=self._request,
            next_id=self._next_id,
            queue=self._queue,
            waiting=self._waiting.__contains__,
            failure=lambda: self._failure,
            refusal=partial(self._refusal, session_id=None),
            clock=clock,
        )

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
