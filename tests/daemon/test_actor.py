"""A session actor inside the real registry (Sessions, Tails, the disk threads), driven
through its mailbox: durable replies wait for the sync and leave from the disk thread,
a hung sync holds no other session's replies on the same connection, a failed sync
answers with its error; the registry
hears of every write and of the end; subscribers attach and detach."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from flightlog.daemon import _storage
from flightlog.daemon._access import Access
from flightlog.daemon._actor import SessionActor
from flightlog.daemon._budget import ConnectionBudget, MemoryBudget
from flightlog.daemon._channel import Channel, ThreadWrite
from flightlog.daemon._config import Config
from flightlog.daemon._fairness import UidShare
from flightlog.daemon._paths import Roots
from flightlog.daemon._peers import REQUEST_SIZE
from flightlog.daemon._primitives import Disks, Poller
from flightlog.daemon._sessions import Sessions
from flightlog.daemon._tail import Tails
from flightlog.protocol import (
    FlightlogError,
    new_id,
    now,
)
from flightlog.protocol.wire import (
    Ack,
    BeginRun,
    CloseSession,
    ErrorReply,
    Message,
    RecordEvent,
    RecordFailed,
    RunStarted,
    SaveCheckpoint,
    StartRun,
    Sync,
    client_decoder,
    encode_frame,
    server_decoder,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    backend: tuple[str, dict[str, bool]] = request.param
    return backend


class _Writer:
    """A connection as an actor sees it (a Peer): what it was sent, and optionally a
    real channel on a socket pair, which a disk thread may write."""

    pid = 4242
    # The daemon's own uid: its paths resolve at the top of the data root.
    uid = os.geteuid()
    gid = os.getegid()
    groups: tuple[int, ...] = ()
    client = "test"
    closed = False
    share = UidShare(uid, None)  # the daemon's own: no per-uid limits

    @property
    def refusals(self) -> object:
        return self

    def __init__(self, channel: Channel | None = None) -> None:
        self.sent: list[Message] = []
        self.pushed: list[Message] = []
        self.released = 0
        self.thread_writes: list[ThreadWrite] = []
        self.arrived = anyio.Event()
        self._channel = channel

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        self.arrived.set()

    def refuse(self, record: RecordEvent, error: FlightlogError) -> None:
        self.pushed.append(
            RecordFailed(
                session_id=record.session_id,
                run_id=record.run_id,
                code=error.code,
                message=error.message,
            )
        )

    def fail(self, session_id: str, error: FlightlogError) -> None:
        self.pushed.append(
            RecordFailed(session_id=session_id, run_id=None, code=error.code, message=error.message)
        )

    def release_bytes(self, count: int) -> None:
        self.released += count

    def thread_write(self, messages: list[Message]) -> ThreadWrite | None:
        if self._channel is None:
            return None
        write = self._channel.thread_write(b"".join(map(encode_frame, messages)))
        if write is not None:
            self.thread_writes.append(write)
        return write

    async def reply(self) -> Message:
        with anyio.fail_after(10):
            while not self.sent:
                await self.arrived.wait()
                self.arrived = anyio.Event()
        return self.sent.pop(0)


@dataclass
class _Daemon:
    sessions: Sessions
    tails: Tails
    root: Path


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[_Daemon]:
    config = Config(socket_path=str(tmp_path / "sock"), root=str(tmp_path / "root"))
    roots = Roots(config.root)
    (tmp_path / "root").mkdir()
    async with anyio.create_task_group() as tg:
        disks = Disks()
        access = Access(roots, daemon_uid=os.geteuid(), readers_gid=None)
        tails = Tails(config, roots, disks, tg, access)
        sessions = Sessions(config, roots, disks, tg, tails, access)
        yield _Daemon(sessions, tails, tmp_path / "root")
        await sessions.shutdown()


class _Fsyncs:
    """The fault seam's fsync, counted, with the thread it ran in; ``fail`` makes it
    fail with EIO, ``gates`` makes the fsync of a descriptor wait for its event."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[str] = []
        self.fail = False
        self.gates: dict[int, threading.Event] = {}
        self.held = threading.Event()  # a gated fsync is waiting
        self._real = _storage._os_fsync
        monkeypatch.setattr(_storage, "_os_fsync", self)

    def __call__(self, fd: int) -> None:
        self.threads.append(threading.current_thread().name)
        if fd in self.gates:
            self.held.set()
            self.gates[fd].wait(10)
        if self.fail:
            raise OSError(errno.EIO, "Input/output error")
        self._real(fd)


async def _begin(actor: SessionActor, writer: _Writer) -> str:
    """A run begun as the writer's connection does it: its rules first, then the actor."""
    run_id = new_id()
    actor.rules.begin_run(run_id)
    begin = BeginRun(id=1, session_id=actor.session_id, time=now())
    await actor.put(writer, StartRun(request=begin, run_id=run_id))
    started = await writer.reply()
    assert started == RunStarted(id=1, run_id=run_id, seq=actor.file.last_seq)
    return run_id


def _record(actor: SessionActor, run_id: str, n: int) -> RecordEvent:
    return RecordEvent(
        session_id=actor.session_id,
        run_id=run_id,
        event_type="turn_start",
        time=now(),
        data=b'{"turn_index":%d}' % n,
    )


def _checkpoint(actor: SessionActor, run_id: str, request_id: int) -> SaveCheckpoint:
    return SaveCheckpoint(
        id=request_id,
        session_id=actor.session_id,
        run_id=run_id,
        time=now(),
        snapshot=b'{"turn":1}',
    )


async def test_a_checkpoint_is_acknowledged_once_synced(
    daemon: _Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = _Fsyncs(monkeypatch)
    writer = _Writer()
    actor = await daemon.sessions.create(writer, "a.jsonl", {})
    run_id = await _begin(actor, writer)
    synced = len(fsyncs.threads)
    for n in range(3):
        await actor.put(writer, [_record(actor, run_id, n)])
    await actor.put(writer, _checkpoint(actor, run_id, 2))
    ack = await writer.reply()
    assert ack == Ack(id=2, seq=6)  # session_start, run_start, 3 records, the checkpoint
    assert len(fsyncs.threads) > synced
    assert all(name.startswith("flightlogd disk") for name in fsyncs.threads)
    # Every byte counted for the writer is handed back: the begin_run and the
    # checkpoint as requests, the records as their payloads.
    records = sum(len(b'{"turn_index":%d}' % n) for n in range(3))
    assert writer.released == records + len(b'{"turn":1}') + 2 * REQUEST_SIZE
    assert not actor.file.dirty


async def test_the_reply_leaves_from_the_disk_thread(
    daemon: _Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = _Fsyncs(monkeypatch)
    ours, theirs = socket.socketpair()
    with Poller() as poller:
        channel = Channel(
            ours,
            poller,
            server_decoder(),
            read_size=65536,
            queue_bytes=1 << 20,
            send_timeout=10,
            budget=ConnectionBudget(MemoryBudget(1 << 30)),
        )
        try:
            writer = _Writer(channel)
            actor = await daemon.sessions.create(writer, "b.jsonl", {})
            run_id = await _begin(actor, writer)
            await actor.put(writer, [_record(actor, run_id, 1)])
            await actor.put(writer, _checkpoint(actor, run_id, 7))
            await actor.put(writer, Sync(id=8, session_id=actor.session_id))
            replies = await anyio.to_thread.run_sync(_receive, theirs, 2)
        finally:
            channel.close()
            theirs.close()
    assert replies == [Ack(id=7, seq=4), Ack(id=8, seq=4)]
    assert [write.sent for write in writer.thread_writes] == [
        len(b"".join(map(encode_frame, replies)))
    ]
    assert writer.sent == []  # nothing went the loop's way
    assert fsyncs.threads


async def test_a_hung_sync_holds_no_other_sessions_reply_on_the_same_connection(
    daemon: _Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = _Fsyncs(monkeypatch)
    ours, theirs = socket.socketpair()
    gate = threading.Event()
    with Poller() as poller:
        channel = Channel(
            ours,
            poller,
            server_decoder(),
            read_size=65536,
            queue_bytes=1 << 20,
            send_timeout=10,
            budget=ConnectionBudget(MemoryBudget(1 << 30)),
        )
        try:
            writer = _Writer(channel)
            hung = await daemon.sessions.create(writer, "hung.jsonl", {})
            other = await daemon.sessions.create(writer, "other.jsonl", {})
            hung_run = await _begin(hung, writer)
            await _begin(other, writer)
            assert hung.file.fd is not None
            fsyncs.gates[hung.file.fd] = gate
            await hung.put(writer, _checkpoint(hung, hung_run, 20))
            assert await anyio.to_thread.run_sync(fsyncs.held.wait, 10)
            await other.put(writer, Sync(id=21, session_id=other.session_id))
            first = await anyio.to_thread.run_sync(_receive, theirs, 1)
            gate.set()
            second = await anyio.to_thread.run_sync(_receive, theirs, 1)
        finally:
            gate.set()
            channel.close()
            theirs.close()
    assert first == [Ack(id=21, seq=2)]
    assert second == [Ack(id=20, seq=3)]


async def test_a_failed_sync_answers_with_its_error_and_sends_nothing_early(
    daemon: _Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = _Fsyncs(monkeypatch)
    ours, theirs = socket.socketpair()
    with Poller() as poller:
        channel = Channel(
            ours,
            poller,
            server_decoder(),
            read_size=65536,
            queue_bytes=1 << 20,
            send_timeout=10,
            budget=ConnectionBudget(MemoryBudget(1 << 30)),
        )
        try:
            writer = _Writer(channel)
            actor = await daemon.sessions.create(writer, "c.jsonl", {})
            run_id = await _begin(actor, writer)
            fsyncs.fail = True
            await actor.put(writer, _checkpoint(actor, run_id, 3))
            reply = await writer.reply()
        finally:
            channel.close()
            theirs.close()
    assert isinstance(reply, ErrorReply)
    assert (reply.id, reply.code) == (3, "write_failed")
    assert [write.sent for write in writer.thread_writes] == [None]  # never sent
    assert actor.error is not None
    # The session's rules refuse every later write, and the writer heard of it once.
    assert actor.rules.failure is actor.error
    assert [m.code for m in writer.pushed if isinstance(m, RecordFailed)] == ["write_failed"]
    assert daemon.sessions.errors == 1


async def test_the_registry_counts_every_line_of_the_file_and_forgets_the_session(
    daemon: _Daemon,
) -> None:
    writer = _Writer()
    actor = await daemon.sessions.create(writer, "d.jsonl", {})
    run_id = await _begin(actor, writer)
    for n in range(5):
        await actor.put(writer, [_record(actor, run_id, n)])
    await actor.put(writer, Sync(id=9, session_id=actor.session_id))
    assert await writer.reply() == Ack(id=9, seq=7)
    data = (daemon.root / "d.jsonl").read_bytes()
    (status,) = daemon.sessions.status(writer)
    assert (status.records, status.bytes) == (data.count(b"\n"), len(data)) == (7, len(data))
    assert (daemon.sessions.records_written, daemon.sessions.bytes_written) == (7, len(data))
    await daemon.sessions.shutdown()
    assert daemon.sessions.status(writer) == []
    assert actor.finished.is_set()


class _Subscriber:
    def __init__(self) -> None:
        self.chunks: list[tuple[bytes, int, int]] = []
        self.closed_at: int | None = None

    def publish(
        self, chunk: bytes, first_seq: int, last_seq: int, end_offset: int, path: str = ""
    ) -> None:
        self.chunks.append((chunk, first_seq, last_seq))

    def session_closed(self, last_seq: int) -> None:
        self.closed_at = last_seq


async def test_subscribers_attach_and_detach(daemon: _Daemon) -> None:
    writer = _Writer()
    actor = await daemon.sessions.create(writer, "e.jsonl", {})
    run_id = await _begin(actor, writer)
    staying, leaving = _Subscriber(), _Subscriber()
    actor.attach(staying)
    actor.attach(leaving)
    assert actor.subscribers == 2
    await _written(actor, writer, _record(actor, run_id, 1), request_id=10)
    actor.detach(leaving)
    await _written(actor, writer, _record(actor, run_id, 2), request_id=11)
    assert [(first, last) for _, first, last in staying.chunks] == [(3, 3), (4, 4)]
    assert [(first, last) for _, first, last in leaving.chunks] == [(3, 3)]
    await daemon.sessions.shutdown()
    assert (staying.closed_at, leaving.closed_at) == (4, None)


class _Witness(_Writer):
    """A writer that looks, as each reply is sent, at this process's descriptors (the
    actor runs here): which of them point at ``path``."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.open_at_reply: list[list[str]] = []

    async def send(self, message: Message) -> None:
        self.open_at_reply.append(_descriptors_of(self.path))
        await super().send(message)


def _descriptors_of(path: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                found.append(fd)
    return found


async def test_close_session_is_acknowledged_once_the_file_is_closed(daemon: _Daemon) -> None:
    path = daemon.root / "closing.jsonl"
    writer = _Witness(path)
    actor = await daemon.sessions.create(writer, "closing.jsonl", {})
    run_id = await _begin(actor, writer)
    await actor.put(writer, [_record(actor, run_id, 1)])
    assert _descriptors_of(path)  # the actor holds the file open while it writes it
    await actor.put(writer, CloseSession(id=5, session_id=actor.session_id))
    assert await writer.reply() == Ack(id=5, seq=3)
    # When the acknowledgement left, the file was synced and closed: a client that
    # deletes it then gets its space back at once.
    assert writer.open_at_reply[-1] == []
    assert actor.file.fd is None
    assert not actor.file.dirty
    assert path.read_bytes().count(b"\n") == 3


async def _written(
    actor: SessionActor, writer: _Writer, record: RecordEvent, *, request_id: int
) -> None:
    await actor.put(writer, [record])
    await actor.put(writer, Sync(id=request_id, session_id=actor.session_id))
    assert isinstance(await writer.reply(), Ack)


def _receive(sock: socket.socket, count: int) -> list[Message]:
    decoder = client_decoder()
    messages: list[Message] = []
    sock.settimeout(10)
    while len(messages) < count:
        decoder.feed(sock.recv(65536))
        messages.extend(iter(decoder.next_message, None))
    return messages
