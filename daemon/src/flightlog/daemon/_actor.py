"""The session actor: the only task that writes a session file.

An actor drains its bounded mailbox in batches: it waits for an item, then takes
everything queued.  It assigns each record its seq, encodes every line of the batch
into one buffer and appends it with one ``write``.  It syncs (in one of its root's
disk threads) only when the batch holds a checkpoint, a run close, a sync, a session
close or a release, and sends the replies of those requests only once the data is
durable.  A failed write or sync is sticky: the actor keeps the
error, refuses every later write with it, pushes it to the writer and returns it on
close.

The actor's mailbox carries :class:`Item` tuples in the order the writer's connection
sent them, so a reply never overtakes the records sent before its request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import anyio
import msgspec
import structlog

from flightlog.protocol import (
    AGENT_FACT_TYPES,
    CHECKPOINT,
    RUN_CLOSE,
    RUN_START,
    Ack,
    BeginRun,
    CheckpointData,
    CheckpointLoaded,
    CloseRun,
    CloseSession,
    ErrorCode,
    ErrorReply,
    FlightlogError,
    LineEncoder,
    LoadCheckpoint,
    LocalProtocolError,
    Message,
    Record,
    RecordEvent,
    RecordFailed,
    RunCloseData,
    RunStartData,
    RunStarted,
    SaveCheckpoint,
    SessionOp,
    SessionState,
    Sync,
    append_line,
    is_time,
    new_id,
    session_transition,
)

from ._json import check_json
from ._storage import SessionFile, StorageError

if TYPE_CHECKING:
    from ._sessions import Sessions

__all__ = [
    "Peer",
    "Release",
    "SessionActor",
    "Shutdown",
    "Subscriber",
    "payload_size",
]

log = structlog.get_logger("flightlogd.session")

_encode_json = msgspec.json.Encoder().encode


class Peer(Protocol):
    """What an actor needs of a connection."""

    pid: int
    uid: int
    client: str
    closed: bool

    async def send(self, message: Message) -> None: ...

    def push(self, message: Message) -> None: ...

    def release_bytes(self, count: int) -> None: ...


class Subscriber(Protocol):
    """A live tail of this session, fed after every successful write."""

    def publish(
        self, chunk: bytes, first_seq: int, last_seq: int, end_offset: int, path: str = ""
    ) -> None: ...

    def session_closed(self, last_seq: int) -> None: ...


class Release(msgspec.Struct, frozen=True):
    """The writer's connection went away: write what it sent, sync, release."""


class Shutdown(msgspec.Struct, frozen=True):
    """The daemon is stopping: write, sync and close."""


Item = tuple["Peer | None", Message | Release | Shutdown]


class _Mailbox:
    """An actor's bounded mailbox: the items in order, the actor waiting for them, and
    the puts waiting for room (backpressure), in the order they came.

    What anyio's memory object stream did here, for a fraction of its cost per item
    and per wake-up; asyncio only, like the rest of the daemon.
    """

    __slots__ = ("_putters", "_reader", "closed", "items", "size")

    def __init__(self, size: int) -> None:
        self.items: deque[Item] = deque()
        self.size = size
        self.closed = False
        self._reader: asyncio.Future[None] | None = None
        # Each waiting put: its future (True once its item is in, False if closed).
        self._putters: deque[tuple[asyncio.Future[bool], Item]] = deque()

    def put_nowait(self, item: Item) -> bool:
        """Queue ``item`` if there is room; False when it must wait (or is closed)."""
        putters = self._putters
        while putters and putters[0][0].done():
            putters.popleft()  # cancelled while waiting
        # A put still waiting means the mailbox is full: take() gives room to those first.
        if self.closed or putters or len(self.items) >= self.size:
            return False
        self.items.append(item)
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)
        return True

    async def put(self, item: Item) -> bool:
        """Queue ``item``, waiting for room; False when the mailbox is (or gets) closed."""
        if self.closed:
            return False
        if self.put_nowait(item):
            return True
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._putters.append((waiter, item))
        # Cancelled while waiting: its entry stays, done, and is skipped.
        return await waiter

    async def wait(self, seconds: float) -> bool:
        """Wait for an item, at most ``seconds``; whether there is one."""
        if not self.items:
            loop = asyncio.get_running_loop()
            reader = self._reader = loop.create_future()
            timer = loop.call_later(seconds, _wake, reader)
            try:
                await reader
            finally:
                timer.cancel()
                self._reader = None
        return bool(self.items)

    def take(self, limit: int) -> list[Item]:
        """Up to ``limit`` items, oldest first; the puts waiting get their room."""
        items = self.items
        if len(items) <= limit:
            batch = list(items)
            items.clear()
        else:
            batch = [items.popleft() for _ in range(limit)]
        putters = self._putters
        while putters and len(items) < self.size:
            waiter, item = putters.popleft()
            if not waiter.done():
                items.append(item)
                waiter.set_result(True)
        return batch

    def close(self) -> None:
        """Refuse every later put, and the puts waiting; drop what is queued."""
        self.closed = True
        self.items.clear()
        for waiter, _ in self._putters:
            if not waiter.done():
                waiter.set_result(False)
        self._putters.clear()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SessionActor:
    """Owns one session file; see the module docstring."""

    def __init__(self, file: SessionFile, sessions: Sessions, writer: Peer) -> None:
        self.file = file
        self.sessions = sessions
        self.writer: Peer | None = writer
        self.state = SessionState.IDLE
        self.run_id: str | None = None
        self.error: FlightlogError | None = None
        self.subscribers: set[Subscriber] = set()
        self.records_written = 0
        self.bytes_written = 0
        self.busy = False  # a worker thread is using the descriptor
        self.closing = False
        self.finished = anyio.Event()
        self.released = anyio.Event()
        self._failure_pushed_for: str | None = None
        self._mailbox = _Mailbox(sessions.config.mailbox_size)
        self._log = log.bind(session_id=file.session_id, path=file.path)
        self._disk = sessions.disk(file.resolved.root)
        self._lines = LineEncoder(file.session_id)

    @property
    def session_id(self) -> str:
        return self.file.session_id

    @property
    def path(self) -> str:
        return self.file.path

    # ------------------------------------------------------------------ mailbox

    async def put(self, peer: Peer | None, message: Message | Release | Shutdown) -> None:
        """Queue ``message``; waits while the mailbox is full (backpressure)."""
        mailbox = self._mailbox
        if not mailbox.put_nowait((peer, message)) and not await mailbox.put((peer, message)):
            raise LocalProtocolError("the session is closed", code=ErrorCode.SESSION_CLOSED)

    def offer(self, peer: Peer, message: Message) -> bool:
        """Queue ``message`` if the mailbox has room now; False when :meth:`put` must
        wait for room (or raise, the session being closed)."""
        return self._mailbox.put_nowait((peer, message))

    def claim(self, writer: Peer) -> None:
        """Make ``writer`` the session's writer; the previous one must have been released."""
        assert self.writer is None and not self.closing
        self.writer = writer
        self.released = anyio.Event()

    # --------------------------------------------------------------------- task

    async def run(self) -> None:
        """The actor task: process batches until closed, or released and unobserved."""
        mailbox = self._mailbox
        try:
            while True:
                if not mailbox.items and not await mailbox.wait(self.sessions.config.idle_timeout):
                    if self.writer is None and not self.subscribers:
                        return
                    if not self.busy:
                        self.sessions.file_idle(self)
                    continue
                batch = mailbox.take(4096)
                try:
                    done = await self._process(batch)
                except Exception:
                    self._fail_unexpectedly("processing a batch")
                    done = False
                if done:
                    return
        finally:
            with anyio.CancelScope(shield=True):
                await self._finish()

    async def _finish(self) -> None:
        self.closing = True
        # What is left in the mailbox is dropped; later puts, and those waiting for
        # room, fail with session_closed.
        self._mailbox.close()
        if self.error is None:
            try:
                await self._sync()
            except StorageError as exc:
                self._fail(exc)
        self.file.close()
        self.sessions.file_closed(self)
        for subscriber in list(self.subscribers):
            subscriber.session_closed(self.file.last_seq)
        self.subscribers.clear()
        self.sessions.forget(self)
        self._log.info("session_closed", last_seq=self.file.last_seq, error=_text(self.error))
        self.released.set()
        self.finished.set()

    # ---------------------------------------------------------------- a batch

    async def _process(self, batch: list[Item]) -> bool:
        """Write one batch; returns True when the actor should stop."""
        buf = bytearray()
        count = 0
        first_seq = self.file.last_seq + 1
        # Replies wait for the write (and the sync, if any) of everything before them.
        replies: list[tuple[Peer, Callable[[], Message]]] = []
        needs_sync = False
        stop = False
        released_bytes: dict[int, tuple[Peer, int]] = {}
        # (seq, offset, length) of checkpoints in the buffer, indexed once written.
        checkpoints: list[tuple[int, int, int]] = []

        def add(record_type: str, time: str, data: bytes, run_id: str | None) -> int:
            nonlocal count
            seq = first_seq + count
            append_line(
                buf,
                Record(
                    session_id=self.session_id,
                    seq=seq,
                    type=record_type,
                    time=time,
                    run_id=run_id,
                    data=msgspec.Raw(data),
                ),
            )
            count += 1
            return seq

        index, end = 0, len(batch)
        while index < end:
            peer, message = batch[index]
            if message.__class__ is RecordEvent:
                # Records come in stretches: take the whole stretch in one go.
                assert peer is not None
                index, lines, size = self._records(batch, index, buf, first_seq + count)
                count += lines
                _, n = released_bytes.get(id(peer), (peer, 0))
                released_bytes[id(peer)] = (peer, n + size)
                continue
            index += 1
            if peer is not None and (size := payload_size(message)):
                _, n = released_bytes.get(id(peer), (peer, 0))
                released_bytes[id(peer)] = (peer, n + size)
            if isinstance(message, (Release, Shutdown)):
                needs_sync = True
                if isinstance(message, Release) and peer is self.writer:
                    self._release()
                if isinstance(message, Shutdown):
                    stop = self.closing = True
                continue
            assert peer is not None
            request_id = getattr(message, "id", 0)
            try:
                if peer is not self.writer:
                    raise LocalProtocolError(
                        "this connection is not the session's writer", code=ErrorCode.NOT_WRITER
                    )
                if isinstance(message, BeginRun):
                    if not is_time(message.time):
                        raise _bad_time(message.time)
                    self._transition(SessionOp.BEGIN_RUN)
                    self.state = SessionState.RUN_OPEN
                    self.run_id = new_id()
                    self._failure_pushed_for = None
                    run_id = self.run_id
                    data = _encode_json(RunStartData(pid=message.pid, client=message.client))
                    seq = add(RUN_START, message.time, data, run_id)
                    replies.append(
                        (peer, self._durable(RunStarted(id=request_id, run_id=run_id, seq=seq)))
                    )
                elif isinstance(message, SaveCheckpoint):
                    self._check_run(message.run_id, SessionOp.SAVE_CHECKPOINT)
                    if not is_time(message.time):
                        raise _bad_time(message.time)
                    check_json(message.snapshot, "checkpoint snapshot")
                    data = b'{"snapshot":' + message.snapshot + b"}"
                    start = len(buf)
                    seq = add(CHECKPOINT, message.time, data, message.run_id)
                    offset = self.file.size + start
                    checkpoints.append((seq, offset, len(buf) - start))
                    needs_sync = True
                    replies.append((peer, self._durable(Ack(id=request_id, seq=seq))))
                elif isinstance(message, CloseRun):
                    self._check_run(message.run_id, SessionOp.CLOSE_RUN)
                    if not is_time(message.time):
                        raise _bad_time(message.time)
                    self.state = session_transition(self.state, SessionOp.CLOSE_RUN)
                    data = _encode_json(RunCloseData(error=message.error))
                    seq = add(RUN_CLOSE, message.time, data, message.run_id)
                    self.run_id = None
                    needs_sync = True
                    replies.append((peer, self._durable(Ack(id=request_id, seq=seq))))
                elif isinstance(message, Sync):
                    self._transition(SessionOp.SYNC)
                    needs_sync = True
                    replies.append((peer, self._ack_last(request_id)))
                elif isinstance(message, LoadCheckpoint):
                    self._transition(SessionOp.LOAD_CHECKPOINT)
                    # The checkpoint may be in this very batch: write first, then read.
                    await self._flush(buf, count, first_seq, checkpoints)
                    first_seq, count = self.file.last_seq + 1, 0
                    buf = bytearray()
                    record = await self._read_checkpoint()
                    replies.append((peer, _reply(_checkpoint_reply(request_id, record))))
                elif isinstance(message, CloseSession):
                    self.state = session_transition(self.state, SessionOp.CLOSE_SESSION)
                    # Closing from now on: an open that comes while this batch is
                    # written and synced waits for the actor to finish, and is not
                    # handed the released actor just before it stops.
                    stop = self.closing = True
                    self._release()
                    needs_sync = True
                    replies.append((peer, self._ack_last(request_id)))
                else:
                    raise LocalProtocolError(
                        f"{type(message).__name__} is not a session request",
                        code=ErrorCode.BAD_MESSAGE,
                    )
            except FlightlogError as exc:
                self._log_refusal(peer, type(message).__name__, exc)
                replies.append((peer, _reply(_error_reply(request_id, exc, self.session_id))))
            except Exception:
                # A bug: answer the request rather than leave its caller waiting, and
                # keep the session (and the daemon) serving.
                self._log.exception("request_failed", request=type(message).__name__)
                error = FlightlogError(
                    f"{type(message).__name__} failed inside flightlogd; see its log",
                    code=ErrorCode.INTERNAL,
                )
                replies.append((peer, _reply(_error_reply(request_id, error, self.session_id))))

        await self._flush(buf, count, first_seq, checkpoints)
        if needs_sync and self.error is None:
            try:
                await self._sync()
            except StorageError as exc:
                self._fail(exc)
            except Exception:
                self._fail_unexpectedly("sync")
        for peer, n in released_bytes.values():
            peer.release_bytes(n)
        if stop:
            # From the acknowledgement on, the session is closed: a new subscriber
            # must find the file at rest, not this actor on its way out.
            self.closing = True
        for peer, make_reply in replies:
            await peer.send(make_reply())
        if stop:
            return True
        return self.writer is None and not self.subscribers and not self._mailbox.items

    def _release(self) -> None:
        writer, self.writer = self.writer, None
        if self.run_id is not None:
            # The run stays without run_close: the gap stays visible in the file.
            self.file.interrupted_runs.append(self.run_id)
            self.run_id = None
        if self.state is SessionState.RUN_OPEN:
            self.state = SessionState.IDLE
        self._log.info("writer_released", pid=writer.pid if writer else None)
        self.released.set()

    def _records(
        self, batch: list[Item], index: int, buf: bytearray, seq: int
    ) -> tuple[int, int, int]:
        """Append the lines of the stretch of records from one peer that starts at
        ``batch[index]``, the first numbered ``seq``.  Returns the index after the
        stretch, the lines appended and the payload bytes the stretch carried.

        Nothing but a request can change the writer, the run or the session's state,
        so they are looked up once per stretch; a record that fails any check goes
        through :meth:`_check_record`, which names the problem.
        """
        peer = batch[index][0]
        assert peer is not None
        run_id = self.run_id
        if not (
            peer is self.writer
            and self.error is None
            and self.state is SessionState.RUN_OPEN
            and run_id is not None
        ):
            run_id = None  # no record matches: each one takes the slow path
        append = self._lines.append
        facts = AGENT_FACT_TYPES
        first, size, end = seq, 0, len(batch)
        while index < end:
            item_peer, message = batch[index]
            if item_peer is not peer or not isinstance(message, RecordEvent):
                break
            index += 1
            data = message.data
            size += len(data)
            time = message.time
            if (
                message.run_id == run_id
                and message.event_type in facts
                and is_time(time)
                and data[:1] == b"{"
            ):
                try:
                    check_json(data, "record data")
                except LocalProtocolError as exc:
                    self._push_failure(peer, message.run_id, exc)
                    continue
                append(buf, seq, message.event_type, time, run_id, data)
                seq += 1
                continue
            problem = self._check_record(peer, message)
            if problem is not None:
                self._push_failure(peer, message.run_id, problem)
                continue
            # Not reached while the checks above agree with _check_record.
            append(buf, seq, message.event_type, time, message.run_id, data)
            seq += 1
        return index, seq - first, size

    def _check_record(self, peer: Peer, message: RecordEvent) -> FlightlogError | None:
        if peer is not self.writer:
            return LocalProtocolError(
                "this connection is not the session's writer", code=ErrorCode.NOT_WRITER
            )
        if self.error is not None:
            return self.error
        if self.state is not SessionState.RUN_OPEN or message.run_id != self.run_id:
            return LocalProtocolError(
                f"run {message.run_id} is not open in this session", code=ErrorCode.RUN_NOT_OPEN
            )
        if message.event_type not in AGENT_FACT_TYPES:
            return LocalProtocolError(
                f"{message.event_type!r} is not an agent fact type that may be recorded",
                code=ErrorCode.BAD_EVENT,
            )
        if not is_time(message.time):
            return _bad_time(message.time)
        data = message.data
        if data[:1] != b"{":
            return LocalProtocolError(
                "record data must be one JSON object on one line", code=ErrorCode.BAD_EVENT
            )
        try:
            check_json(data, "record data")
        except LocalProtocolError as exc:
            return exc
        return None

    def _check_run(self, run_id: str, op: SessionOp) -> None:
        if self.error is not None:
            raise self.error
        if self.state is SessionState.RUN_OPEN and run_id != self.run_id:
            raise LocalProtocolError(
                f"run {run_id} is not open in this session", code=ErrorCode.RUN_NOT_OPEN
            )
        session_transition(self.state, op)

    def _transition(self, op: SessionOp) -> None:
        if self.error is not None and op is not SessionOp.LOAD_CHECKPOINT:
            raise self.error
        session_transition(self.state, op)

    def _push_failure(self, peer: Peer, run_id: str | None, error: FlightlogError) -> None:
        # One push per run: the SDK keeps the first error sticky, more would only flood.
        if self._failure_pushed_for == run_id:
            return
        self._failure_pushed_for = run_id
        self._log_refusal(peer, "RecordEvent", error)
        peer.push(
            RecordFailed(
                session_id=self.session_id, run_id=run_id, code=error.code, message=error.message
            )
        )

    def _log_refusal(self, peer: Peer, what: str, error: FlightlogError) -> None:
        self._log.warning(
            "refused",
            request=what,
            code=error.code,
            reason=error.message,
            pid=peer.pid,
            uid=peer.uid,
        )

    def _durable(self, reply: Message) -> Callable[[], Message]:
        """The reply to a request whose line is in this batch: made once the batch is
        written (and synced), and an error instead if that failed."""
        request_id: int = getattr(reply, "id", 0)

        def make() -> Message:
            if self.error is not None:
                return _error_reply(request_id, self.error, self.session_id)
            return reply

        return make

    def _ack_last(self, request_id: int) -> Callable[[], Message]:
        def make() -> Message:
            if self.error is not None:
                return _error_reply(request_id, self.error, self.session_id)
            return Ack(id=request_id, seq=self.file.last_seq)

        return make

    # ----------------------------------------------------------------- storage

    async def _flush(
        self,
        buf: bytearray,
        count: int,
        first_seq: int,
        checkpoints: list[tuple[int, int, int]],
    ) -> None:
        if not count or self.error is not None:
            return
        try:
            self.file.write(buf, count=count)
        except StorageError as exc:
            self._fail(exc)
            return
        except Exception:
            self._fail_unexpectedly("write")
            return
        for seq, offset, length in checkpoints:
            self.file.note_checkpoint(seq, offset, length)
        checkpoints.clear()
        self.records_written += count
        self.bytes_written += len(buf)
        self.sessions.file_used(self, count, len(buf))
        tails = self.sessions.tails
        if self.subscribers or tails.all:
            chunk = bytes(buf)
            last_seq, end = first_seq + count - 1, self.file.size
            for subscriber in list(self.subscribers):
                subscriber.publish(chunk, first_seq, last_seq, end)
            tails.publish_all(chunk, first_seq, last_seq, end, self.path)

    async def _sync(self) -> None:
        if not self.file.dirty:
            return
        self.busy = True
        try:
            await self._disk.run(self.file.sync)
        finally:
            self.busy = False

    async def _read_checkpoint(self) -> Record | None:
        if self.error is not None:
            raise self.error
        self.busy = True
        try:
            return await self._disk.run(self.file.read_checkpoint)
        except StorageError as exc:
            self._fail(exc)
            raise
        finally:
            self.busy = False

    def _fail_unexpectedly(self, what: str) -> None:
        # A bug, not the disk: still final for the session (what reached the file is
        # unknown), never for the daemon.
        self._log.exception("unexpected_error", during=what)
        self._fail(
            FlightlogError(
                f"{what} of {self.path} failed inside flightlogd; see its log",
                code=ErrorCode.INTERNAL,
            )
        )

    def _fail(self, error: FlightlogError) -> None:
        if self.error is not None:
            return
        self.error = error
        self.state = SessionState.FAILED
        self.sessions.note_error()
        self._log.error("session_failed", code=error.code, reason=error.message)
        if self.writer is not None:
            self._failure_pushed_for = self.run_id
            self.writer.push(
                RecordFailed(
                    session_id=self.session_id,
                    run_id=self.run_id,
                    code=error.code,
                    message=error.message,
                )
            )


def _reply(message: Message) -> Callable[[], Message]:
    return lambda: message


def _error_reply(request_id: int, error: FlightlogError, session_id: str) -> ErrorReply:
    return ErrorReply(id=request_id, code=error.code, message=error.message, session_id=session_id)


def _checkpoint_reply(request_id: int, record: Record | None) -> CheckpointLoaded:
    if record is None:
        return CheckpointLoaded(id=request_id)
    data = msgspec.json.decode(record.data, type=CheckpointData)
    return CheckpointLoaded(
        id=request_id,
        seq=record.seq,
        run_id=record.run_id,
        time=record.time,
        snapshot=bytes(data.snapshot),
    )


def _bad_time(time: str) -> LocalProtocolError:
    return LocalProtocolError(
        f"time {time[:40]!r} is not RFC 3339 UTC (2026-11-29T20:00:00.000000Z)",
        code=ErrorCode.BAD_EVENT,
    )


def payload_size(message: object) -> int:
    """Bytes of JSON payload a message carries: what a connection's buffer counts."""
    if isinstance(message, RecordEvent):
        return len(message.data)
    if isinstance(message, SaveCheckpoint):
        return len(message.snapshot)
    return 0


def _text(error: FlightlogError | None) -> str | None:
    return None if error is None else error.message
