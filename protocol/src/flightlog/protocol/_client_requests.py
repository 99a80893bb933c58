"""The requests a client sends, sans I/O (see :mod:`._client`).

:class:`ClientRequests` is the part of :class:`~._client.ClientConnection` that builds
requests: each method checks the session rules locally (its base,
:class:`~._client_sessions.ClientSessions`), takes a fresh id and returns a
:class:`~._pending.Pending` with the frame to send and what turns the reply into the
result; a reply that brings news (a session opened, a run started or closed) tells the
replay log.  Receiving, pushes, records and reconnects are the connection's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

from ._client_sessions import ClientSessions
from ._codec import Codec
from ._diagnostics import joined
from ._errors import ErrorCode, RemoteProtocolError
from ._framer import RecordFramer
from ._framing import FrameEncoder
from ._pending import Pending, ack_seq, same
from ._records import Origin, new_id, now
from ._replay import ReplayLog
from ._state import SessionMachine, SessionOp, SessionState
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
    RunStarted,
    SaveCheckpoint,
    SessionOpened,
    Status,
    StatusReply,
    Sync,
    Welcome,
)

__all__ = ["ClientRequests"]

T = TypeVar("T")
_ReplyT = TypeVar("_ReplyT", bound=Message)


class ClientRequests(ClientSessions):
    """Request ids and the frames of requests, for ``codec``, ``client_name`` and
    ``pid`` (see :class:`~._client.ClientConnection`); the record framer, and the
    :attr:`replay_log` (``max_unacked``) its replies tell."""

    def __init__(self, *, codec: Codec, client_name: str, pid: int, max_unacked: int) -> None:
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
        self._framer = RecordFramer(codec, self._encoder)
        #: The ids of the requests whose replies someone waits for.
        self._waiting: set[int] = set()
        self.replay_log = ReplayLog(
            max_unacked=max_unacked,
            next_id=self._next_id,
            encode=self._encoder.encode,
            failure=lambda: self._failure,
        )

    @property
    def max_frame_size(self) -> int:
        """The largest frame the daemon takes (its Welcome's, once it said)."""
        return self._encoder.max_frame_size

    def _next_id(self) -> int:
        return next(self._ids)

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
