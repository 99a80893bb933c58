"""One client connection: read frames, route them, write replies and pushes.

The socket is driven by a :class:`~._channel.Channel`: the event loop reads it into
the frame decoder whenever it is readable, and replies are written straight to it.
The connection's task routes each decoded message: records and session requests go
to the session's actor mailbox (in the order received, so a reply never overtakes
earlier records), the rest is answered here.  Replies and pushes that the socket does
not take at once are queued, bounded in bytes, so a client that does not read cannot
make an actor buffer without limit.  A connection that has handed more than its budget
of bytes to actors stops taking frames until they are written, and its channel stops
reading once a buffer's worth is waiting: backpressure reaches the client as a full
socket buffer.

The connection always reads to the end of the stream, even when replies can no longer
be sent, so whatever a client sent before it went away is written.  At shutdown the
read side of the socket is shut down, which makes that end come right after what the
client has already sent.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable

import anyio
import structlog

from flightlog.protocol import (
    PROTOCOL_VERSION,
    BeginRun,
    CloseRun,
    CloseSession,
    ConnectionState,
    Create,
    ErrorCode,
    ErrorReply,
    FlightlogError,
    FrameEncoder,
    Hello,
    LoadCheckpoint,
    LocalProtocolError,
    Message,
    Open,
    RecordEvent,
    RecordFailed,
    RemoteProtocolError,
    SaveCheckpoint,
    SessionOpened,
    Status,
    StatusReply,
    Subscribe,
    Sync,
    Unsubscribe,
    Welcome,
    connection_transition,
    server_decoder,
)

from ._actor import SessionActor
from ._channel import Channel, ThreadWrite
from ._config import Config
from ._peers import Release, payload_size
from ._primitives import Poller
from ._sessions import Sessions
from ._tail import Tails

__all__ = ["Connection", "peer_credentials"]

log = structlog.get_logger("flightlogd.connection")

_READ_SIZE = 256 * 1024
#: Bytes of replies (checkpoints loaded, tailed lines) queued for one client at most.
_OUTBOX_BYTES = 8 * 1024 * 1024
#: Read windows after a client's last request during which it is read at once.
_QUIET_WINDOWS = 40
#: Frames in a row that are no message, after which the connection is closed: a peer
#: that sends only garbage does not speak the protocol, and reading on (a GiB of it,
#: each frame earning a reply) would help nobody.
_BAD_FRAMES_IN_A_ROW = 8


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from SO_PEERCRED."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return (0, -1, -1)
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


class Connection:
    """A client connection; a :class:`~._peers.Peer` to the actors it writes and a
    :class:`~._tail.TailPeer` to its subscriptions.

    It is given what it uses: the settings, the poller its socket is read by, the
    sessions and the tails, the daemon's name for the hello and a way to ask the
    daemon's status."""

    def __init__(
        self,
        sock: socket.socket,
        number: int,
        *,
        config: Config,
        poller: Poller,
        sessions: Sessions,
        tails: Tails,
        server: tuple[int, str],
        status: Callable[[int], StatusReply],
    ) -> None:
        self.number = number
        self.pid, self.uid, self.gid = peer_credentials(sock)
        self.client = ""
        self.closed = False
        self.state = ConnectionState.AWAIT_HELLO
        #: The sessions this connection writes, by id.
        self.sessions: dict[str, SessionActor] = {}
        self._config = config
        self._registry = sessions
        self._tails = tails
        self._server = server
        self._status = status
        self._decoder = server_decoder(config.max_frame_size)
        self._encoder = FrameEncoder()
        self._channel = Channel(
            sock, poller, self._decoder, read_size=_READ_SIZE, queue_bytes=_OUTBOX_BYTES
        )
        self._inflight = 0
        self._bad_frames = 0  # frames in a row that were no message
        self._requests_seen = False  # in the frames handled since the last read
        self._drained = anyio.Event()
        self._drained.set()
        self._read_scope = anyio.CancelScope()
        self._stopping = False
        self.log = log.bind(conn=number, pid=self.pid, uid=self.uid)

    # ------------------------------------------------------------ Peer protocol

    async def send(self, message: Message) -> None:
        """Send a reply; waits while the queue of unsent replies is full (in bytes).
        Dropped once the client cannot be written to: nobody is left to tell."""
        await self._channel.send(self._encoder.encode(message))

    def push(self, message: Message) -> None:
        """Send a push without waiting; dropped when the queue is full or the client
        gone (pushes are sticky errors, of which the client needs only the first)."""
        if self._channel.queued <= _OUTBOX_BYTES:
            self._channel.write(self._encoder.encode(message))

    def thread_write(self, messages: list[Message]) -> ThreadWrite | None:
        return self._channel.thread_write(b"".join(map(self._encoder.encode, messages)))

    def release_bytes(self, count: int) -> None:
        self._inflight -= count
        if self._inflight <= self._config.connection_buffer // 2:
            self._drained.set()

    # ---------------------------------------------------------------- serving

    async def serve(self) -> None:
        """Serve until the client hangs up, breaks the protocol, or the daemon stops."""
        self.log.info("connection_opened")
        try:
            with self._read_scope:
                await self._read_loop()
        finally:
            self.closed = True
            try:
                with anyio.CancelScope(shield=True):
                    await self._release_all()
                # Let the replies queued go out, but not forever.
                with anyio.move_on_after(5):
                    await self._channel.flush()
            finally:
                self._channel.close()
                self.log.info("connection_closed")

    def stop(self) -> None:
        """Stop reading (daemon shutdown).  Frames the client sent before this moment
        still land: the read side of the socket is shut down, so the daemon reads what
        is in the socket buffer and then the end of the stream, and the client's later
        sends fail (EPIPE) instead of vanishing."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._channel.shutdown_read()
        except OSError:
            self._read_scope.cancel()

    async def _read_loop(self) -> None:
        channel = self._channel
        window = self._config.read_window
        clock = time.monotonic
        last = last_request = 0.0
        while True:
            await channel.wait_readable()
            self._requests_seen = False
            if not await self._handle_frames():
                return
            if window:
                # A client streaming records (a burst less than a window after the
                # last, or more sent while it was held) is left unread for a window:
                # its sends meanwhile wake nobody.  A client that makes requests waits
                # for their answers: it is read at once, and so for a while after its
                # last request.
                now = clock()
                if self._requests_seen:
                    last_request = now
                elif (
                    channel.streaming or now - last < window
                ) and now - last_request > _QUIET_WINDOWS * window:
                    channel.hold_reading(window)
                channel.streaming = False
                last = now
            if channel.read_ended:
                if channel.read_error is not None:
                    self.log.info("connection_error", reason=str(channel.read_error))
                return
            if self._inflight > self._config.connection_buffer:
                self._drained = anyio.Event()
                await self._drained.wait()

    async def _handle_frames(self) -> bool:
        """Route every complete frame; False when the connection must close."""
        while True:
            try:
                message = self._decoder.next_message()
            except RemoteProtocolError as bad:
                # The decoder turns every undecodable frame (too deep too) into this.
                self._refuse(bad)
                self._bad_frames += 1
                # Nothing can be read after an oversized frame; and bytes that are no
                # message before the hello, or frame after frame of them, mean the
                # peer does not speak this protocol.
                hang_up = (
                    bad.code == ErrorCode.FRAME_TOO_LARGE
                    or self.state is ConnectionState.AWAIT_HELLO
                    or self._bad_frames >= _BAD_FRAMES_IN_A_ROW
                )
                text = bad.message
                if self._bad_frames >= _BAD_FRAMES_IN_A_ROW:
                    text += f"; {self._bad_frames} frames in a row were no message: closing"
                await self.send(ErrorReply(id=0, code=bad.code, message=text))
                if hang_up:
                    return False
                continue
            if message is None:
                return True
            self._bad_frames = 0
            if (
                message.__class__ is RecordEvent
                and self.state is ConnectionState.READY
                and (actor := self.sessions.get(message.session_id)) is not None
            ):
                # The hot path: a record for a session this connection writes, into
                # a mailbox with room (counted until written, as in _hand_to).
                if actor.offer(self, message):
                    self._inflight += len(message.data)
                    continue
                try:
                    await self._hand_to(actor, message)
                except FlightlogError as exc:
                    self._refuse_record(message, exc)
                continue
            self._requests_seen = True
            try:
                self.state = connection_transition(self.state, message)
            except RemoteProtocolError as exc:
                self._refuse(exc)
                await self.send(
                    ErrorReply(id=getattr(message, "id", 0), code=exc.code, message=exc.message)
                )
                if self.state is ConnectionState.AWAIT_HELLO:
                    return False
                continue
            try:
                await self._route(message)
            except FlightlogError as exc:
                if isinstance(message, RecordEvent):
                    self._refuse_record(message, exc)
                else:
                    self._refuse(exc)
                    await self.send(
                        ErrorReply(
                            id=getattr(message, "id", 0),
                            code=exc.code,
                            message=exc.message,
                            session_id=getattr(message, "session_id", None),
                        )
                    )

    def _refuse(self, exc: FlightlogError) -> None:
        self.log.warning("refused", code=exc.code, reason=exc.message)

    def _refuse_record(self, message: RecordEvent, exc: FlightlogError) -> None:
        """A record has no reply: its error is pushed to the writer."""
        self._refuse(exc)
        self.push(
            RecordFailed(
                session_id=message.session_id,
                run_id=message.run_id,
                code=exc.code,
                message=exc.message,
            )
        )

    async def _route(self, message: Message) -> None:
        match message:
            case (
                BeginRun()
                | SaveCheckpoint()
                | CloseRun()
                | CloseSession()
                | Sync()
                | LoadCheckpoint()
                | RecordEvent()
            ):
                actor = self._writable(message.session_id)
                if isinstance(message, CloseSession):
                    del self.sessions[message.session_id]
                await self._hand_to(actor, message)
            case Hello():
                self.client = message.client[:200]
                self.log = self.log.bind(client=self.client)
                pid, server = self._server
                await self.send(
                    Welcome(
                        id=message.id,
                        version=PROTOCOL_VERSION,
                        max_frame_size=self._config.max_frame_size,
                        daemon_pid=pid,
                        server=server,
                    )
                )
            case Create():
                actor = await self._registry.create(self, message.path, dict(message.meta))
                await self._opened(message.id, actor)
            case Open():
                await self._opened(message.id, await self._registry.open(self, message.path))
            case Status():
                await self.send(self._status(message.id))
            case Subscribe():
                await self._tails.subscribe(self, message, self._registry.live)
            case Unsubscribe():
                await self._tails.unsubscribe(self, message)
            case _:  # pragma: no cover - the state table admits nothing else
                raise LocalProtocolError(
                    f"unexpected {type(message).__name__}", code=ErrorCode.BAD_MESSAGE
                )

    async def _opened(self, request_id: int, actor: SessionActor) -> None:
        self.sessions[actor.session_id] = actor
        file = actor.file
        await self.send(
            SessionOpened(
                id=request_id,
                session_id=actor.session_id,
                path=actor.path,
                last_seq=file.last_seq,
                meta=file.meta,
                interrupted_runs=list(file.interrupted_runs),
                truncated_bytes=file.truncated_bytes,
            )
        )

    async def _hand_to(self, actor: SessionActor, message: Message) -> None:
        # Counted until the actor has written it: what makes reading stop.
        size = payload_size(message)
        self._inflight += size
        try:
            await actor.put(self, message)
        except BaseException:
            self.release_bytes(size)
            raise

    def _writable(self, session_id: str) -> SessionActor:
        actor = self.sessions.get(session_id)
        if actor is not None:
            return actor
        if self._registry.is_open(session_id):
            raise LocalProtocolError(
                f"session {session_id[:32]} is written by another connection",
                code=ErrorCode.NOT_WRITER,
            )
        raise LocalProtocolError(
            f"session {session_id[:32]} is not open on this connection; create or open it",
            code=ErrorCode.SESSION_NOT_FOUND,
        )

    async def _release_all(self) -> None:
        for actor in list(self.sessions.values()):
            with contextlib.suppress(FlightlogError):
                await actor.put(self, Release())
        self.sessions.clear()
        self._tails.drop_peer(self)
