"""One client connection: read frames, route them, write replies and pushes.

The rules of the protocol are :class:`flightlog.protocol.wire.ServerConnection`'s: hello
first, one writer per session, one open run, the sticky failure, what a record must
be, bad frames and the bound on subscriptions.  This module does the I/O and the
storage around it.  The socket is driven by a :class:`~._channel.Channel`: the event
loop reads it into the server connection's frame decoder whenever it is readable, and
replies are written straight to it.  The connection's task routes each event the
server connection lets through: records and session requests go to the session's
actor mailbox (in the order received, so a reply never overtakes earlier records),
the rest is answered here.  Replies and pushes that the socket does
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

import asyncio
import contextlib
import fcntl
import os
import platform
import socket
import struct
import sys
import time
from collections.abc import Callable

import anyio
import structlog
from anyio.abc import TaskGroup

from flightlog.protocol import (
    FlightlogError,
    RemoteProtocolError,
)
from flightlog.protocol.format import (
    check_json,
)
from flightlog.protocol.ring import (
    RING_HEADER,
    ring_supported,
)
from flightlog.protocol.wire import (
    BlobLoaded,
    CloseRun,
    CloseSession,
    ConnectionClosed,
    ConnectionState,
    Create,
    ErrorReply,
    LoadBlob,
    LoadCheckpoint,
    Message,
    Open,
    RecordEvent,
    RecordLines,
    SaveCheckpoint,
    ServerConnection,
    ServerEvent,
    SessionOpened,
    StartRun,
    Status,
    StatusReply,
    Subscribe,
    Sync,
    Unsubscribe,
)

from ._access import peer_groups
from ._actor import SessionActor
from ._blobstore import open_blob, read_blob
from ._budget import ConnectionBudget, MemoryBudget
from ._channel import Channel, ThreadWrite
from ._config import Config
from ._fairness import UidShare
from ._peers import LARGE_PAYLOAD, Records, Release, payload_size
from ._primitives import Poller, timed
from ._refusals import (
    count_dropped,
    log_dropped,
    log_refusal,
    log_within,
    uid_connections,
    uid_refusals,
)
from ._sessions import Sessions
from ._tail import Tails

__all__ = ["Connection", "peer_credentials"]

log = structlog.get_logger("flightlogd.connection")

_READ_SIZE = 256 * 1024
#: Bytes of replies (checkpoints loaded, tailed lines) queued for one client at most.
_OUTBOX_BYTES = 8 * 1024 * 1024
#: Read windows after a client's last request during which it is read at once.
_QUIET_WINDOWS = 40
#: Seconds an abandoned connection (shutdown) waits to hand its sessions back.
_RELEASE_BOUND = 1.0
#: Frames taken the Python way in one turn of a connection (each tens of µs at most):
#: then the loop runs the others before the connection takes more.
_FRAMES_PER_TURN = 64
#: Requests (statuses, opens, syncs, ...) routed in one turn of a connection, each far
#: dearer than a record: then the loop runs the others.  (A bound in the loop's time
#: would count what ran while the turn waited: a client of requests would pay for
#: its flooders.)
_REQUESTS_PER_TURN = 8
#: The largest frame read before the hello (a hello is a few hundred bytes).
_HELLO_FRAME_SIZE = 64 * 1024
#: A BlobLoaded frame's bytes besides the blob's (its id, tag and digest; generous).
_BLOB_ENVELOPE = 256
#: A ring's memfd can neither shrink (the daemon's reads of it would fault) nor grow,
#: and its seals are final.
_RING_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
#: Whether this machine's fences make rings sound (see flightlog.protocol's ring).
_RINGS = ring_supported(sys.platform, platform.machine(), sys.thread_info.lock)


async def _check_off_the_loop(data: bytes, what: str, share: UidShare) -> None:
    """Check a large payload in a worker thread, as one of the uid's jobs there
    (``UidShare.disk_jobs``), its thread's time charged to the uid."""
    ok, error, seconds = await anyio.to_thread.run_sync(
        timed, check_json, (data, what), limiter=share.disk_jobs
    )
    share.charge(seconds)
    if not ok:
        raise error


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
    sessions and the tails, the daemon's name for the hello, a way to ask the
    daemon's status, and its uid's share of the daemon (per-uid limits)."""

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
        status: Callable[[int, Connection, bool], StatusReply],
        share: UidShare,
        budget: MemoryBudget,
    ) -> None:
        self.number = number
        self.pid, self.uid, self.gid = peer_credentials(sock)
        #: The client's name, from its hello.
        self.groups = peer_groups(sock)
        self.client = ""
        self.closed = False
        #: The sessions this connection writes, by id.
        self.sessions: dict[str, SessionActor] = {}
        self._config = config
        self._registry = sessions
        self._tails = tails
        self._status = status
        #: Its uid's share: the turns, the pace and the disk jobs of its work.
        self.share = self._share = share
        pid, name = server
        self._server = ServerConnection(
            max_frame_size=config.max_frame_size,
            pid=pid,
            server=name,
            written_elsewhere=lambda session_id: sessions.written_elsewhere(session_id, self),
            refused=self._log_refusal,
            max_line=config.max_line,
            check_inline=LARGE_PAYLOAD,
            hello_frame_size=_HELLO_FRAME_SIZE,
            ring=self._make_ring,
            record_lines=True,
            frames_per_turn=_FRAMES_PER_TURN,
        )
        self._daemon_memory = budget
        self._ring_size = 0
        #: What the connection makes the daemon hold (its subscriptions' too).
        self.memory = ConnectionBudget(budget, share.memory)
        self._channel = Channel(
            sock,
            poller,
            self._server.decoder,
            read_size=_READ_SIZE,
            queue_bytes=_OUTBOX_BYTES,
            send_timeout=config.send_timeout,
            budget=self.memory,
        )
        self._inflight = 0
        #: Places in the uid's share of sessions taken for creates and opens under way.
        self._claims = 0
        self._requests_seen = False  # in the frames handled since the last read
        #: Requests routed this turn, and whether the turn ended at their bound.
        self._turn_requests = 0
        self._turn_over = False
        self._drained = anyio.Event()
        self._drained.set()
        self._read_scope = anyio.CancelScope()
        #: Creates and opens that wait for another connection (see _route).
        self._waits: TaskGroup
        self._stopping = False
        self._abandoned = False
        self._cut_off = False
        self.log = log.bind(conn=number, pid=self.pid, uid=self.uid)
        #: Whether its connection_opened line was logged; its hello's clock (begin).
        self._logged = False
        self._late: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ Peer protocol

    async def send(self, message: Message) -> None:
        """Send a reply; waits while the queue of unsent replies is full (in bytes).
        Dropped once the client cannot be written to: nobody is left to tell."""
        await self._sent(self._server.encode(message))

    def refuse(self, record: RecordEvent | RecordLines, error: FlightlogError) -> None:
        self._server.refuse(record, error)
        self._push_queued()

    def run_not_opened(self, start: StartRun) -> None:
        self._server.run_not_opened(start)

    def fail(self, session_id: str, error: FlightlogError) -> None:
        self._server.fail(session_id, error)
        self._push_queued()

    def thread_write(self, messages: list[Message]) -> ThreadWrite | None:
        return self._channel.thread_write(b"".join(map(self._server.encode, messages)))

    def release_bytes(self, count: int) -> None:
        self._inflight -= count
        self.memory.discharge(count)
        if self._inflight <= self._config.connection_buffer // 2:
            self._drained.set()

    def fits(self, count: int) -> bool:
        return self._channel.write_ended or self.memory.fits(count)

    async def reserve(self, count: int) -> None:
        if self._channel.write_ended:
            # Nothing will be sent: the bytes are handed back at once after the load.
            self.memory.charge(count)
        else:
            await self.memory.reserve(count)
        self._inflight += count

    def _make_ring(self) -> int:
        """The hello asked for a ring: make one for the channel to read (its size), or
        none (0) when rings are off, unsound here, over their share of the memory
        budget, or the system refuses."""
        size = self._config.ring_size
        memory = self._share.memory
        if not size or not _RINGS or not self._daemon_memory.take_ring(RING_HEADER + size, memory):
            return 0
        fd = -1
        try:
            fd = os.memfd_create("flightlog-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, RING_HEADER + size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _RING_SEALS)
            self._channel.attach_ring(fd, size)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            self._daemon_memory.give_ring(RING_HEADER + size, memory)
            self.log.warning("ring_refused", reason=str(exc))
            return 0
        self._ring_size = RING_HEADER + size
        return size

    def _push_queued(self) -> None:
        # A push never waits: while the client does not read, it stays queued for the
        # connection's task, which waits for room.
        if self._channel.queued <= _OUTBOX_BYTES:
            data = self._server.data_to_send()
            if data:
                self._channel.write(data)

    # ---------------------------------------------------------------- serving

    def begin(self) -> None:
        """Log the connection and start its hello's clock, as the daemon sets it up.

        On a shared daemon its ``connection_opened`` line is one of its uid's few
        per window (``_refusals``; the daemon's own uid logs every one), and its own
        later lines (``connection_closed``, ``connection_error``, ``hello_timeout``)
        are logged if that one was, counted if not: a uid opening connections in a
        loop does not flood the log."""
        if self._share.limits is None:  # the daemon's own uid: every line
            self._logged = True
            self.log.info("connection_opened")
        else:
            self._logged = log_within(
                uid_connections(self.uid), self.log, "connection_opened", "info"
            )
        self._late = asyncio.get_running_loop().call_later(
            self._config.hello_timeout, self._hello_late
        )

    async def serve(self) -> None:
        """Serve until the client hangs up, breaks the protocol, or the daemon stops
        (:meth:`begin` first).  What its close takes of the loop is its uid's."""
        try:
            async with anyio.create_task_group() as self._waits:
                with self._read_scope:
                    await self._read_loop()
        finally:
            began = time.thread_time()
            if self._late is not None:
                self._late.cancel()
            self.closed = True
            try:
                with anyio.CancelScope(shield=True) as release:
                    if self._abandoned:
                        # The daemon stops: an actor that cannot take the release
                        # (its disk hangs) is told to stop by shutdown instead.
                        release.deadline = anyio.current_time() + _RELEASE_BOUND
                    await self._release_all()
                # Let the replies queued go out, but not forever.
                with anyio.move_on_after(5):
                    await self._channel.flush()
            finally:
                # A claim whose task never ran (cancelled first) gives its place back.
                while self._claims:
                    self._claimed()
                self._channel.close()
                if self._ring_size:
                    self._daemon_memory.give_ring(self._ring_size, self._share.memory)
                    self._ring_size = 0
                log_dropped(self, self.log)
                self._log_own("info", "connection_closed")
                self._share.spent(time.thread_time() - began)

    def _log_own(self, level: str, event: str, **fields: object) -> None:
        """A line of the connection's own (its close, its hello late, its socket's
        error): logged if its ``connection_opened`` was, else counted with its uid's."""
        if self._logged:
            getattr(self.log, level)(event, **fields)
        else:
            count_dropped(uid_connections(self.uid), event)

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

    def _hello_late(self) -> None:
        if self._server.state is ConnectionState.AWAIT_HELLO:
            self._log_own("warning", "hello_timeout", seconds=self._config.hello_timeout)
            self._read_scope.cancel()

    def abandon(self) -> None:
        """Give up on the client (shutdown, after the grace period): what is queued
        for it is dropped, and every send to it, waiting or to come, returns at once,
        so no actor waits for a client that does not read."""
        self.stop()
        self._abandoned = True
        self._channel.abandon_writing()

    async def _read_loop(self) -> None:
        channel = self._channel
        window = self._config.read_window
        clock = time.monotonic
        last = last_request = 0.0
        paced = 0
        while True:
            if self._server.more or self._turn_over:
                # The last turn handled its bound of frames (or requests): the other
                # connections run before this one takes the rest of what it read.
                self._turn_over = False
                await asyncio.sleep(0)
            else:
                await channel.wait_readable()
            # One turn of the uid's at a time, whichever of its connections.
            await self._share.take_turn()
            if channel.read_ended:
                self._server.receive_data(b"")
            self._requests_seen = False
            # The loop's time this turn takes is the uid's (for its share of the
            # loop): the rules' decoding, checking and refusing, the routing, the
            # answers.  A turn that waits (on a disk, for room) is charged what ran
            # meanwhile too: rare, and never less than the turn's own.
            began = time.thread_time()
            self._turn_requests = 0
            if not await self._handle_events():
                # Its last turn is its uid's too (a connection that sends one bad
                # frame, or a hello, and hangs up has no other).
                self._share.spent(time.thread_time() - began)
                error = channel.read_error
                if isinstance(error, RemoteProtocolError):
                    # A broken ring: told like a frame that is no message.
                    self.log.warning("protocol_error", code=error.code, reason=error.message)
                    await self.send(ErrorReply(id=0, code=error.code, message=error.message))
                elif error is not None:
                    self._log_own("info", "connection_error", reason=str(error))
                return
            # Counted before the wait: what is read meanwhile counts next time.
            paced, unpaced = channel.bytes_read, channel.bytes_read - paced
            await self._share.pace(unpaced, time.thread_time() - began)
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
            if self._inflight > self._config.connection_buffer:
                self._drained = anyio.Event()
                await self._drained.wait()

    async def _handle_events(self) -> bool:
        """Route every event of the frames read; False when the connection must close."""
        server, actors = self._server, self.sessions
        # The records of one session taken in a row: handed to its actor as one item,
        # before anything else is routed or awaited (docs/architecture.md).
        records: Records = []
        to: SessionActor | None = None
        size = 0
        events = server.events
        while True:
            event = next(events)
            if type(event) is RecordLines or type(event) is RecordEvent:
                if isinstance(event, RecordLines):
                    # A stretch the C accelerator took: checked, and small.
                    weight = event.size
                else:
                    weight = len(event.data)
                    if weight > LARGE_PAYLOAD:
                        if to is not None:
                            await self._hand_records(to, records, size)
                            to = None
                        if not await self._checked(event):
                            continue
                actor = actors[event.session_id]
                if actor is not to:
                    if to is not None:
                        await self._hand_records(to, records, size)
                    to, records, size = actor, [], 0
                records.append(event)
                size += weight
                continue
            if to is not None:
                await self._hand_records(to, records, size)
                to = None
            # What the rules answered themselves (the welcome, refusals) goes first.
            await self._flush()
            if event is None:
                self._channel.settle()
                return True
            if isinstance(event, ConnectionClosed):
                return False
            self._requests_seen = True
            try:
                await self._route(event)
            except FlightlogError as exc:
                self._log_refusal(exc)
                server.refuse(event, exc)
                await self._flush()
            self._turn_requests += 1
            if self._turn_requests >= _REQUESTS_PER_TURN:
                self._turn_over = True
                self._channel.settle()
                return True

    async def _hand_records(self, actor: SessionActor, records: Records, size: int) -> None:
        """Hand ``records`` (``size`` payload bytes) to ``actor``: at once into a mailbox
        with room, counted until written as in :meth:`_hand_to`; else waiting for room,
        or refused if the session closed meanwhile."""
        if actor.offer(self, records):
            self._inflight += size
            self.memory.charge(size)
            return
        try:
            await self._hand_to(actor, records)
        except FlightlogError as exc:
            self._log_refusal(exc)
            for record in records:
                self.refuse(record, exc)

    async def _flush(self) -> None:
        data = self._server.data_to_send()
        if data:
            self._requests_seen = True  # a reply: the client may wait for it
            if not self.client and self._server.client:
                self.client = self._server.client
                self.log = self.log.bind(client=self.client)
            await self._sent(data)

    async def _sent(self, data: bytes) -> None:
        """Send bytes, waiting for room; a client that leaves them unread for
        ``send_timeout`` seconds is cut off."""
        channel = self._channel
        await channel.send(data)
        if channel.stalled and not self._cut_off:
            self._cut_off = self._stopping = True
            self.log.warning(
                "client_not_reading",
                seconds=self._config.send_timeout,
                reason="a reply waited that long for the client to read: cut off",
            )

    async def _checked(self, record: RecordEvent) -> bool:
        """Whether a record's large data is JSON a reader reads back, checked in a
        worker thread (the event loop goes on meanwhile); if not, it is refused."""
        try:
            await _check_off_the_loop(record.data, "record data", self._share)
        except FlightlogError as exc:
            self.refuse(record, exc)
            return False
        return True

    @property
    def refusals(self) -> object:
        """What its refusals are counted under: a uid with a share of its own counts
        them over all its connections and their sessions (one opening connection after
        connection, each refused, would log each); the daemon's own uid per connection."""
        return self if self._share.limits is None else uid_refusals(self.uid)

    def _log_refusal(self, exc: FlightlogError) -> None:
        log_refusal(self.refusals, self.log, code=exc.code, reason=exc.message)

    async def _route(self, event: ServerEvent) -> None:
        match event:
            case StartRun(request=request):
                await self._hand_to(self.sessions[request.session_id], event)
            case SaveCheckpoint():
                if len(event.snapshot) > LARGE_PAYLOAD:
                    await _check_off_the_loop(event.snapshot, "checkpoint snapshot", self._share)
                await self._hand_to(self.sessions[event.session_id], event)
            case CloseRun() | Sync() | LoadCheckpoint():
                await self._hand_to(self.sessions[event.session_id], event)
            case CloseSession():
                await self._hand_to(self.sessions.pop(event.session_id), event)
            case Create() | Open():
                # The uid's place is taken before anything is awaited.
                self._share.claim_session()
                self._claims += 1
                if self._registry.must_wait(self, event.path):
                    # It waits for another connection: answered when done, while this
                    # connection's other sessions go on.
                    self._waits.start_soon(self._claim, event)
                else:
                    await self._claim(event)
            case Status():
                await self.send(self._status(event.id, self, event.closed))
            case Subscribe():
                await self._tails.subscribe(self, event, self._registry.live)
            case Unsubscribe():
                await self._tails.unsubscribe(self, event)
            case LoadBlob():
                await self._load_blob(event)

    async def _load_blob(self, request: LoadBlob) -> None:
        """Answer with a blob of a session's store, to a peer that may read the
        session; what it loads is charged to the memory budget, as a loaded
        checkpoint is, until the reply is sent."""
        access = self._tails.access
        resolved = access.resolve(self, request.path)
        access.check_read(self, resolved)
        most = self._config.max_frame_size - _BLOB_ENVELOPE
        fd, size = await anyio.to_thread.run_sync(
            open_blob, access.roots, resolved, request.sha256, most
        )
        try:
            # Its bytes, then its encoded reply.
            await self.reserve(2 * size)
        except BaseException:
            os.close(fd)
            raise
        try:
            data = await anyio.to_thread.run_sync(read_blob, fd, size)
            await self.send(BlobLoaded(id=request.id, sha256=request.sha256, data=data))
        finally:
            self.release_bytes(2 * size)

    async def _claim(self, message: Create | Open) -> None:
        """Create or open a session and answer with it; its place in the uid's share
        was taken (:meth:`UidShare.claim_session`) and is given back here."""
        registry = self._registry
        try:
            try:
                if isinstance(message, Create):
                    actor = await registry.create(
                        self, message.path, dict(message.meta), message.origin
                    )
                else:
                    actor = await registry.open(self, message.path)
            except BaseException:
                self._claimed()
                raise
        except FlightlogError as exc:
            self._log_refusal(exc)
            self._server.refuse(message, exc)
            await self._flush()
            return
        await self._opened(message.id, actor)

    async def _opened(self, request_id: int, actor: SessionActor) -> None:
        self.sessions[actor.session_id] = actor
        self._claimed()  # counted in ``sessions`` from now
        file = actor.file
        reply = SessionOpened(
            id=request_id,
            session_id=actor.session_id,
            path=actor.path,
            last_seq=file.last_seq,
            meta=file.meta,
            interrupted_runs=file.ledger.interrupted_runs,
            truncated_bytes=file.truncated_bytes,
            last_run=file.ledger.last_run,
            last_run_items=file.ledger.last_run_items,
            checkpoint_seq=file.checkpoint.seq if file.checkpoint else None,
        )
        self._server.opened(reply, actor.rules)
        await self._flush()

    def _claimed(self) -> None:
        self._claims -= 1
        self._share.claimed()

    async def _hand_to(self, actor: SessionActor, event: Message | StartRun | Records) -> None:
        # Counted until the actor has written it: what makes reading stop.
        size = payload_size(event)
        self._inflight += size
        self.memory.charge(size)
        try:
            await actor.put(self, event)
        except BaseException:
            self.release_bytes(size)
            raise

    async def _release_all(self) -> None:
        # The rules release the sessions' open runs; each actor writes what it was sent.
        self._server.close()
        for actor in list(self.sessions.values()):
            with contextlib.suppress(FlightlogError):
                await actor.put(self, Release())
        self.sessions.clear()
        self._tails.drop_peer(self)
