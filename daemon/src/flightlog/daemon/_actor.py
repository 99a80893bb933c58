"""The session actor: the only task that writes a session file.

An actor drains its bounded mailbox (:class:`~._primitives.Mailbox`) in batches: it
waits for an item, then takes everything queued.  It assigns each record its seq,
encodes every line of the batch into one buffer and appends it with one ``write``.  It
syncs (in one of its root's disk threads) only when the batch holds a checkpoint, a run
close, a sync, a session close or a release, and sends the replies of those requests
only once the data is durable.

What reaches the mailbox passed the rules of the writer's
:class:`~flightlog.protocol.wire.ServerConnection` (the run, the type, the time, the JSON),
which applies them to the session's :class:`~flightlog.protocol.wire.SessionMachine`, kept
here across writers as :attr:`SessionActor.rules`.  What only the actor can know is the
storage: a failed write or sync is sticky, the actor keeps the error, refuses with it
what was queued behind it, fails the session's rules through the writer (which
refuses every later write) and returns the error on close.

The mailbox carries :data:`Item` tuples in the order the writer's connection sent
them, so a reply never overtakes the records sent before its request; records come
as :data:`~._peers.Records`, those of one session the connection took in a row.  The actor
reaches connections, tails and its registry through the Protocols of :mod:`._peers`.
"""

from __future__ import annotations

import os
import time

import anyio
import msgspec
import structlog

from flightlog.protocol import (
    ErrorCode,
    FlightlogError,
    LocalProtocolError,
)
from flightlog.protocol._blobs import BLOB_MIN, Blob, extract, extract_tails, may_hold_payload
from flightlog.protocol.format import (
    LineEncoder,
    event_id_key,
)
from flightlog.protocol.wire import (
    Ack,
    CloseRun,
    CloseSession,
    LoadCheckpoint,
    Message,
    RecordLines,
    SaveCheckpoint,
    SessionMachine,
    StartRun,
    Sync,
)

from ._batch import Batch, Reply, checkpoint_reply, error_reply, ready
from ._blobstore import BlobStore
from ._channel import ThreadWrite
from ._config import Config
from ._peers import Item, Peer, Records, Registry, Release, Shutdown, Subscriber, payload_size
from ._primitives import Disk, Mailbox
from ._refusals import log_refusal
from ._storage import SessionFile, StorageError

__all__ = ["Item", "SessionActor"]

log = structlog.get_logger("flightlogd.session")

_encode_json = msgspec.json.Encoder().encode

#: Bytes of a batch written from the event loop at most; a larger one is written by
#: a disk thread.
_WRITE_ON_THE_LOOP = 1024 * 1024

#: Bytes of loaded checkpoints a batch holds before it answers them.
_BATCH_REPLY_BYTES = 16 * 1024 * 1024

#: Items an actor takes from its mailbox at once.
_BATCH_ITEMS = 4096


class SessionActor:
    """Owns one session file; see the module docstring."""

    def __init__(
        self,
        file: SessionFile,
        writer: Peer,
        *,
        registry: Registry[SessionActor],
        disk: Disk,
        config: Config,
        blobs: BlobStore | None = None,
    ) -> None:
        self.file = file
        self.writer: Peer | None = writer
        #: The session's rules, applied by its writer's connection.
        self.rules: SessionMachine[FlightlogError] = SessionMachine()
        #: Records dropped because the session held their event id, since the file was
        #: opened (status); the open run's are its ledger's.
        self.duplicates = 0
        #: The write or sync failure of the file (sticky).
        self.error: FlightlogError | None = None
        # A file this daemon created holds the session_start line it wrote.
        self.records_written = 1 if file.created_line else 0
        self.bytes_written = len(file.created_line)
        self.busy = False  # a disk thread is using the descriptor
        self.closing = False
        self.finished = anyio.Event()
        self.released = anyio.Event()
        self._registry = registry
        self._disk = disk
        self._idle_timeout = config.idle_timeout
        self._max_line = config.max_line
        self._subscribers: set[Subscriber] = set()
        self._mailbox: Mailbox[Item] = Mailbox(config.mailbox_size)
        self._log = log.bind(session_id=file.session_id, path=file.path)
        self._lines = LineEncoder(file.session_id)
        #: Where payloads taken out of records go (None: they stay inline), and those
        #: taken out of the batch being made, stored before its lines are written.
        self._blob_store = blobs
        self._blobs: list[Blob] = []
        #: The writer's uid's share (only the owner writes): each batch takes its
        #: turn, is paced, and its disk jobs are counted there.
        self._share = writer.share
        #: The loop's time the batch being made has taken (records, the write).
        self._spent = 0.0

    @property
    def session_id(self) -> str:
        return self.file.session_id

    @property
    def path(self) -> str:
        return self.file.path

    @property
    def run_id(self) -> str | None:
        """The run a writer has open, without its run_close yet."""
        return self.file.ledger.writing

    @property
    def subscribers(self) -> int:
        """Live tails of this session."""
        return len(self._subscribers)

    # ------------------------------------------------------------ the outside

    async def put(
        self, peer: Peer | None, message: Message | StartRun | Release | Shutdown | Records
    ) -> None:
        """Queue ``message``; waits while the mailbox is full (backpressure).  Raises
        :class:`LocalProtocolError` (``session_closed``) once the actor is closing."""
        mailbox = self._mailbox
        if not mailbox.put_nowait((peer, message)) and not await mailbox.put((peer, message)):
            raise LocalProtocolError("the session is closed", code=ErrorCode.SESSION_CLOSED)

    def offer(self, peer: Peer, records: Records) -> bool:
        """Queue ``records`` if the mailbox has room now; False when :meth:`put` must
        wait for room (or raise, the session being closed)."""
        return self._mailbox.put_nowait((peer, records))

    def claim(self, writer: Peer) -> None:
        """Make ``writer`` the session's writer; the previous one must have been released."""
        assert self.writer is None and not self.closing
        self.writer = writer
        self.released = anyio.Event()

    def attach(self, subscriber: Subscriber) -> None:
        """Feed ``subscriber`` every line written from now on."""
        self._subscribers.add(subscriber)

    def detach(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)

    # --------------------------------------------------------------------- task

    async def run(self) -> None:
        """The actor task: process batches until closed, or released and unobserved."""
        mailbox = self._mailbox
        try:
            while True:
                if not mailbox.items and not await mailbox.wait(self._idle_timeout):
                    if self.writer is None and not self._subscribers:
                        return
                    if not self.busy:
                        self._registry.file_idle(self)
                    continue
                # One turn of the uid's at a time, its connections' and its sessions'.
                await self._share.take_turn()
                self._spent = 0.0
                try:
                    done = await self._process(mailbox.take(_BATCH_ITEMS))
                except Exception:
                    self._fail_unexpectedly("processing a batch")
                    done = False
                if done:
                    return
                await self._share.pace(0, self._spent)
        finally:
            with anyio.CancelScope(shield=True):
                await self._finish()

    async def _finish(self) -> None:
        self.closing = True
        # What is left in the mailbox is dropped (its bytes handed back); later puts,
        # and those waiting for room, fail with session_closed.
        for peer, message in self._mailbox.items:
            if peer is not None:
                peer.release_bytes(payload_size(message))
        self._mailbox.close()
        if self.error is None:
            try:
                await self._sync()
            except StorageError as exc:
                self._fail(exc)
        if self.error is None and self.file.index_due:
            # Every line is in the file: a big one keeps its index up to its end, so
            # that the next open reads none of it again (a small one takes no thread
            # hop: its close is as quick as before there were indexes).
            try:
                await self._disk.run(self.file.save_index, account=self._share)
            except Exception:  # a bug: the index is only ever a shortcut
                self._log.exception("unexpected_error", during="writing the index")
        self.file.close()
        for subscriber in list(self._subscribers):
            subscriber.session_closed(self.file.last_seq)
        self._subscribers.clear()
        self._registry.session_finished(self)
        error = self.error.message if self.error else None
        self._log.info("session_closed", last_seq=self.file.last_seq, error=error)
        self.released.set()
        self.finished.set()

    # ---------------------------------------------------------------- a batch

    async def _process(self, items: list[Item]) -> bool:
        """Write one batch; returns True when the actor should stop."""
        batch = Batch(self.file.last_seq + 1, self._max_line)
        stop = False
        index, end = 0, len(items)
        while index < end:
            peer, message = items[index]
            if isinstance(message, list):
                # Records come in stretches: take the whole stretch in one go.
                assert peer is not None
                began = time.thread_time()
                index, lines, size = self._records(
                    items, index, batch.buf, batch.first_seq + batch.count
                )
                self._spent += time.thread_time() - began
                batch.count += lines
                self.file.ledger.wrote(lines)
                batch.release(peer, size)
                continue
            index += 1
            match message:
                case Release():
                    batch.needs_sync = True
                    if peer is self.writer:
                        self._release()
                case Shutdown():
                    batch.needs_sync = True
                    stop = self.closing = True
                case _:
                    assert peer is not None
                    if (
                        isinstance(message, LoadCheckpoint)
                        and not stop
                        and not self._room_to_load(peer)
                    ):
                        # The client's budget has no room for the checkpoint: answer
                        # what the batch holds first, so that nothing is held while
                        # the load waits for room.
                        await self._complete(batch, False)
                        batch = Batch(self.file.last_seq + 1, self._max_line)
                    stop = await self._request(batch, peer, message) or stop
                    if batch.reply_bytes > _BATCH_REPLY_BYTES and not stop:
                        # Checkpoints loaded and not yet sent: answer them (waiting
                        # for the client to read) before loading more.
                        await self._complete(batch, False)
                        batch = Batch(self.file.last_seq + 1, self._max_line)
        return await self._complete(batch, stop)

    async def _request(self, batch: Batch, peer: Peer, message: Message | StartRun) -> bool:
        """Handle one request of the batch; True when it closes the session."""
        batch.release(peer, payload_size(message))
        request = message.request if isinstance(message, StartRun) else message
        request_id: int = getattr(request, "id", 0)
        try:
            if peer is not self.writer:
                raise _not_writer()
            match message:
                case StartRun():
                    reply = self._begin_run(batch, message)
                case SaveCheckpoint():
                    reply = self._save_checkpoint(batch, message)
                case CloseRun():
                    reply = self._close_run(batch, message)
                case Sync():
                    self._check_writable()
                    batch.needs_sync = batch.needs_sync or message.durable
                    reply = self._ack_last(request_id)
                case LoadCheckpoint():
                    reply = await self._load_checkpoint(batch, message)
                case CloseSession():
                    reply = self._close_session(batch, message)
                case _:
                    raise LocalProtocolError(
                        f"{type(message).__name__} is not a session request",
                        code=ErrorCode.BAD_MESSAGE,
                    )
        except Exception as exc:
            name = type(request).__name__
            if isinstance(exc, FlightlogError):
                self._log_refusal(peer, name, exc)
            else:
                # A bug: answer the request rather than leave its caller waiting, and
                # keep the session (and the daemon) serving.
                self._log.exception("request_failed", request=name)
                exc = FlightlogError(
                    f"{name} failed inside flightlogd; see its log", code=ErrorCode.INTERNAL
                )
            if isinstance(message, StartRun):
                peer.run_not_opened(message)
            reply = ready(error_reply(request_id, exc, self.session_id))
        batch.replies.append((peer, reply))
        return isinstance(message, CloseSession) and self.closing

    def _begin_run(self, batch: Batch, start: StartRun) -> Reply:
        self._check_writable()
        # Who the kernel says the writer is, next to what the agent says it is.
        writer = self.writer
        assert writer is not None
        entry = self.file.ledger.begin_run(
            start, peer_pid=writer.pid, uid=writer.uid, gid=writer.gid
        )
        return self._durable(entry.reply(batch.add(self.session_id, *entry[:4])))

    def _save_checkpoint(self, batch: Batch, message: SaveCheckpoint) -> Reply:
        self._check_writable()
        entry = self.file.ledger.checkpoint(message)
        start = len(batch.buf)
        seq = batch.add(self.session_id, *entry[:4])
        batch.checkpoints.append((seq, start, len(batch.buf) - start))
        batch.needs_sync = True
        return self._durable(entry.reply(seq))

    def _close_run(self, batch: Batch, message: CloseRun) -> Reply:
        self._check_writable()
        entry = self.file.ledger.close_run(message)
        seq = batch.add(self.session_id, *entry[:4])
        batch.needs_sync = True
        return self._durable(entry.reply(seq))

    def _room_to_load(self, peer: Peer) -> bool:
        ref = self.file.checkpoint
        return ref is None or peer.fits(2 * ref.length)

    async def _load_checkpoint(self, batch: Batch, message: LoadCheckpoint) -> Reply:
        # The checkpoint may be in this very batch: write first, then read.
        await self._flush(batch)
        batch.restart(self.file.last_seq + 1)
        if self.error is not None:
            raise self.error
        ref = self.file.checkpoint
        # Its line read, then its data (one copy each, the line freed once parsed),
        # then its encoded reply: twice the line's length, held until the reply is
        # sent.
        size = 2 * ref.length if ref is not None else 0
        if size:
            # What it loads is the client's to hold until its reply is sent: it waits
            # for room in the client's memory budget first.
            peer = self.writer
            assert peer is not None
            await peer.reserve(size)
            batch.loaded.append((peer, size))
        self.busy = True
        try:
            record = await self._disk.run(self.file.read_checkpoint, account=self._share)
            calls = (
                await self._disk.run(self.file.resume_calls, account=self._share)
                if message.calls
                else None
            )
        except StorageError as exc:
            self._fail(exc)
            raise
        finally:
            self.busy = False
        if record is not None:
            batch.reply_bytes += len(record.data)
        return ready(checkpoint_reply(message.id, record, calls))

    def _close_session(self, batch: Batch, message: CloseSession) -> Reply:
        # Closing from now on: an open that comes while this batch is written and
        # synced waits for the actor to finish, and is not handed the released actor
        # just before it stops.
        self.closing = True
        self._release()
        batch.needs_sync = True
        return self._ack_last(message.id)

    async def _complete(self, batch: Batch, stop: bool) -> bool:
        """Write the batch, sync it if it needs it, then hand back the connections'
        bytes and send the replies; True when the actor should stop."""
        await self._flush(batch)
        replied = False
        if batch.needs_sync and self.error is None:
            # The replies go out from the disk thread right after the sync: the loop's
            # wake-up is then off the caller's path (docs/architecture.md).
            write = None if stop else self._thread_write(batch.replies)
            try:
                await self._sync(write)
            except StorageError as exc:
                self._fail(exc)
            except Exception:
                self._fail_unexpectedly("sync")
            finally:
                replied = write is not None and write.end()
        for peer, size in batch.released.values():
            peer.release_bytes(size)
        if stop:
            # From the acknowledgement on, the session is closed: a new subscriber
            # must find the file at rest, not this actor on its way out, and a client
            # that deletes the file finds its space freed.
            self.closing = True
            self.file.close()
        try:
            if not replied:
                for peer, make_reply in batch.replies:
                    await peer.send(make_reply())
        finally:
            # Sent (queued replies are charged by the channel), or never to be.
            for peer, size in batch.loaded:
                peer.release_bytes(size)
            batch.loaded.clear()
        if stop:
            return True
        return self.writer is None and not self._subscribers and not self._mailbox.items

    def _thread_write(self, replies: list[tuple[Peer, Reply]]) -> ThreadWrite | None:
        """``replies``, for the disk thread to write once synced, when they all go to
        one peer."""
        if not replies or not self.file.dirty:
            return None
        peer = replies[0][0]
        if any(other is not peer for other, _ in replies):
            return None
        return peer.thread_write([make_reply() for _, make_reply in replies])

    def _release(self) -> None:
        writer, self.writer = self.writer, None
        # A run left open stays without run_close: the gap stays visible in the file.
        self.file.ledger.release()
        self._log.info("writer_released", pid=writer.pid if writer else None)
        self.released.set()

    def _records(
        self, batch: list[Item], index: int, buf: bytearray, seq: int
    ) -> tuple[int, int, int]:
        """Append the lines of the stretch of records from one peer that starts at
        ``batch[index]`` (its :data:`~._peers.Records` items in a row), the first
        numbered ``seq``.  Returns the index after the stretch, the lines appended and
        the payload bytes the stretch carried.

        The writer's connection checked each record against the rules; what is left
        is whether the peer still writes the session and the file took no failure,
        which nothing but a request changes: looked up once per stretch.
        """
        peer = batch[index][0]
        assert peer is not None
        refusal = self.error if peer is self.writer else _not_writer()
        if refusal is not None:
            self._log_refusal(peer, "RecordEvent", refusal)
        append, run_id = self._lines.append, self.run_id
        first, size, end = seq, 0, len(batch)
        while index < end:
            item_peer, records = batch[index]
            if item_peer is not peer or not isinstance(records, list):
                break
            index += 1
            for record in records:
                if isinstance(record, RecordLines):
                    size += record.size
                    if refusal is None and record.run_id == run_id:
                        tails = record.tails
                        if record.size >= BLOB_MIN and self._blob_store is not None:
                            tails, blobs = extract_tails(tails)
                            self._blobs += blobs
                        seq += self._lines.append_tails(buf, seq, tails)
                    else:
                        peer.refuse(record, refusal or _run_not_open(record.run_id))
                    continue
                data = record.data
                size += len(data)
                if refusal is None and record.run_id == run_id:
                    if record.event_id is not None and not self._first_time(record.event_id):
                        continue
                    if (
                        len(data) >= BLOB_MIN
                        and self._blob_store is not None
                        and may_hold_payload(data)
                    ):
                        data, blobs = extract(bytes(data))
                        self._blobs += blobs
                    if record.event_id is not None:
                        append(
                            buf, seq, record.event_type, record.time, run_id, data, record.event_id
                        )
                    else:
                        append(buf, seq, record.event_type, record.time, run_id, data)
                    seq += 1
                else:
                    # Not the writer, a failed file, or sent behind a begin_run this
                    # session refused.
                    peer.refuse(record, refusal or _run_not_open(record.run_id))
        return index, seq - first, size

    def _first_time(self, event_id: str) -> bool:
        """Whether the session holds no record with ``event_id`` yet (it does from now
        on); a repeat is counted, and written nowhere."""
        key = event_id_key(event_id)
        ids = self.file.event_ids
        if key in ids:
            self.duplicates += 1
            self.file.ledger.dropped(1)
            return False
        ids.add(key)
        return True

    def _check_writable(self) -> None:
        # What was queued behind a failure is refused with it.
        if self.error is not None:
            raise self.error

    def _log_refusal(self, peer: Peer, what: str, error: FlightlogError) -> None:
        log_refusal(
            peer.refusals,
            self._log,
            request=what,
            code=error.code,
            reason=error.message,
            pid=peer.pid,
            uid=peer.uid,
        )

    def _durable(self, reply: Message) -> Reply:
        """The reply to a request whose line is in this batch."""
        return self._after_write(getattr(reply, "id", 0), lambda: reply)

    def _ack_last(self, request_id: int) -> Reply:
        return self._after_write(request_id, lambda: Ack(id=request_id, seq=self.file.last_seq))

    def _after_write(self, request_id: int, make: Reply) -> Reply:
        """``make``, called once the batch is written (and synced), or the error the
        write (or sync) failed with."""
        return lambda: (
            make() if self.error is None else error_reply(request_id, self.error, self.session_id)
        )

    # ----------------------------------------------------------------- storage

    async def _flush(self, batch: Batch) -> None:
        if not batch.count or self.error is not None:
            return
        if not self._blobs:
            await self._write(batch)
            return
        # The blobs the lines refer to are on disk before the lines, and the store's
        # lock is held until the lines are written: no collection takes them between.
        blobs, self._blobs = self._blobs, []
        assert self._blob_store is not None
        try:
            lock = await self._disk.run(
                self._blob_store.save, self.file.resolved, blobs, account=self._share
            )
        except (OSError, FlightlogError) as exc:
            reason = exc if isinstance(exc, OSError) else exc.message
            self._fail(StorageError(self.path, "storing a blob", reason))
            return
        try:
            await self._write(batch)
        finally:
            os.close(lock)

    async def _write(self, batch: Batch) -> None:
        count, buf = batch.count, batch.buf
        offset = self.file.size
        try:
            if len(buf) > _WRITE_ON_THE_LOOP or self.file.compressed:
                # Megabytes: copied into the page cache by a disk thread, while the
                # event loop serves everyone else; so is the first write to a
                # compressed file, which first gives it its plain form.
                self.busy = True
                try:
                    await self._disk.run(self.file.write, buf, count, account=self._share)
                finally:
                    self.busy = False
            else:
                began = time.thread_time()
                self.file.write(buf, count=count)
                self._spent += time.thread_time() - began
        except StorageError as exc:
            self._fail(exc)
            return
        except Exception:
            self._fail_unexpectedly("write")
            return
        for seq, start, length in batch.checkpoints:
            self.file.note_checkpoint(seq, offset + start, length)
        batch.checkpoints.clear()
        self.records_written += count
        self.bytes_written += len(buf)
        registry = self._registry
        registry.file_used(self, count, len(buf))
        if self._subscribers or registry.tailing_all:
            began = time.thread_time()
            chunk = bytes(buf)
            first_seq = batch.first_seq
            last_seq, end = first_seq + count - 1, self.file.size
            for subscriber in list(self._subscribers):
                subscriber.publish(chunk, first_seq, last_seq, end)
            registry.publish_all(chunk, first_seq, last_seq, end, self.path)
            self._spent += time.thread_time() - began

    async def _sync(self, write: ThreadWrite | None = None) -> None:
        """fsync what was written, then (in the same disk thread) send ``write``: the
        replies leave only once the sync succeeded."""
        if not self.file.dirty:
            return
        self.busy = True
        try:
            await self._disk.run(_sync_then_send, self.file, write, account=self._share)
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
        self._registry.session_failed(self)
        self._log.error("session_failed", code=error.code, reason=error.message)
        if self.writer is not None:
            # Its rules refuse every later write, and the client hears of it.
            self.writer.fail(self.session_id, error)
        # Even when no connection holds the rules now: a next writer finds them failed.
        self.rules.fail(error)


def _run_not_open(run_id: str) -> LocalProtocolError:
    return LocalProtocolError(
        f"run {run_id[:32]} is not open in this session", code=ErrorCode.RUN_NOT_OPEN
    )


def _not_writer() -> LocalProtocolError:
    return LocalProtocolError(
        "this connection is not the session's writer", code=ErrorCode.NOT_WRITER
    )


def _sync_then_send(file: SessionFile, write: ThreadWrite | None) -> None:
    file.sync()
    if write is not None:
        write.send()
