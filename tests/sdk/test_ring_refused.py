"""A daemon's side that hands an agent a hostile ring: the agent survives and records.

The peer here is a small fake daemon on a real Unix socket: flightlog.protocol's
:class:`ServerConnection` (through :class:`MemoryDaemon`, which keeps what it
accepts) with a ring of its own making.  Either it passes a memfd without seals and
shrinks it once the client wrote into it (an agent that mapped it would die of
SIGBUS at its next record), or a sealed ring whose ``head`` it breaks after a while
(the writer refuses it).  The agent is a real process: it must exit cleanly, say once
why it refused the ring, and every record must reach the peer, by the socket.  A
third peer passes a sound ring with a blocking eventfd it never signals, and holds
the ring full: the agent must look again by itself (it blocked reading the eventfd
for ever before).  A fourth passes a pipe's write end where the eventfd belongs and
holds the ring full: the agent's read of it after a wait failed with a bare OSError
out of ``record()`` before; the SDK now refuses the ring at the welcome.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import platform
import select
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from flightlog.protocol.ring import (
    MAX_RING_SIZE,
    RING_HEADER,
    RingReader,
    ring_supported,
)
from flightlog.protocol.wire import (
    DEFAULT_MAX_FRAME_SIZE,
    ServerConnection,
    line_bound,
)
from flightlog.sdk import ConnectionLost, MemoryDaemon, SocketTransport

pytestmark = pytest.mark.skipif(
    not ring_supported(sys.platform, platform.machine(), sys.thread_info.lock),
    reason="rings are used only where a lock is a full fence (x86-64 Linux)",
)

SIZE = 4096
RECORDS = 400
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL

# The agent: records RECORDS turns through the SDK (the sync client, or the async
# one), and says what its transport saw.
_AGENT = """
import json, logging, sys
import anyio
from flightlog.protocol import events
from flightlog.sdk import connect
from flightlog.sdk.aio import aconnect
logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
path, count, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def said(client):
    transport = client._link.transport
    return json.dumps({
        "refused": transport.ring_refused,
        "ring": transport._ring is not None,
        "reconnects": client.reconnects,
    })

def record():
    with connect(path, reconnect_grace=30) as client:
        session = client.create("hostile.jsonl")
        with session.begin_run() as run:
            for n in range(count):
                run.record(events.TurnStart(turn_index=n))
        session.close()
        print(said(client))

async def arecord():
    async with aconnect(path, reconnect_grace=30) as client:
        session = await client.create("hostile.jsonl")
        async with await session.begin_run() as run:
            for n in range(count):
                await run.record(events.TurnStart(turn_index=n))
        await session.aclose()
        print(said(client))

record() if kind == "sync" else anyio.run(arecord)
"""


class _HostileDaemon:
    """Serves one connection at a time on ``path``; ``attack`` is ``"shrink"``,
    ``"head"``, ``"silent"`` or ``"pipe"``."""

    def __init__(self, path: str, attack: str) -> None:
        self.attack = attack
        self.memory = MemoryDaemon()
        self.lock = threading.Lock()
        self.rings = 0
        self.attacked = False
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept)
        self._accepting.start()

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._accepting.join(timeout=30)
        for thread in self._threads:
            thread.join(timeout=30)

    def turns(self) -> list[int]:
        lines = self.memory.session("hostile.jsonl").lines
        records = [json.loads(line) for line in lines]
        return [r["data"]["turn_index"] for r in records if r["type"] == "turn_start"]

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(sock,))
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        ring: dict[str, Any] = {}

        def make_ring() -> int:
            fd = os.memfd_create("hostile-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, RING_HEADER + SIZE)
            if self.attack != "shrink":
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            mapping = mmap.mmap(fd, RING_HEADER + SIZE)
            view = memoryview(mapping)
            if self.attack == "pipe":
                out, room = os.pipe2(os.O_CLOEXEC)
                os.close(out)
            else:
                room = os.eventfd(0, os.EFD_CLOEXEC)
            ring.update(fd=fd, room=room, mapping=mapping, view=view)
            ring["reader"] = RingReader(view, SIZE, threading.Lock())
            self.rings += 1
            return SIZE

        with self.lock:
            conn = self.memory.connect()
            conn.server = ServerConnection(
                max_frame_size=DEFAULT_MAX_FRAME_SIZE,
                pid=os.getpid(),
                server="hostile",
                written_elsewhere=self.memory.written_elsewhere,
                max_line=line_bound(DEFAULT_MAX_FRAME_SIZE),
                ring=make_ring,
            )
        try:
            self._talk(sock, conn, ring)
        finally:
            sock.close()
            for name in ("fd", "room"):
                if name in ring:
                    os.close(ring[name])

    def _talk(self, sock: socket.socket, conn: Any, ring: dict[str, Any]) -> None:
        def feed(view: memoryview) -> None:
            with self.lock:
                conn.receive_data(bytes(view))

        ring["sock"] = sock
        passed = False
        while True:
            reader: RingReader | None = ring.get("reader")
            if reader is not None and not ring.get("done"):
                told = self.attack not in ("silent", "pipe")
                if reader.take(feed, 1 << 20) and reader.wanted() and told:
                    os.eventfd_write(ring["room"], 1)
                self._maybe_attack(ring)
            with self.lock:
                out = conn.data_to_send()
            if out:
                if reader is not None and not passed:
                    socket.send_fds(sock, [out], [ring["fd"], ring["room"]])
                    passed = True
                else:
                    sock.sendall(out)
            if reader is not None and not ring.get("done") and reader.sleep():
                continue
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if reader is not None:
                reader.wake()
            if not data:
                with self.lock:
                    conn.receive_data(b"")
                return
            if reader is None:
                with self.lock:
                    conn.receive_data(data)

    def _maybe_attack(self, ring: dict[str, Any]) -> None:
        reader: RingReader = ring["reader"]
        if self.attack == "shrink" and ring["view"][128:136] != bytes(8):
            # The client wrote into the ring: take the memory from under its mapping
            # (this end touches its own mapping no more).
            os.ftruncate(ring["fd"], 0)
        elif self.attack == "head" and len(self.turns_so_far()) >= 20:
            # Stop reading, and say a head the client never published up to.
            ring["view"][64:72] = (2**64 - 1).to_bytes(8, "little")
        elif self.attack == "silent" and not self.attacked and len(self.turns_so_far()) >= 20:
            self.attacked = self._hold(ring)
            return
        else:
            return
        ring["done"] = True
        self.attacked = True
        reader.release()
        ring["view"].release()

    def _hold(self, ring: dict[str, Any]) -> bool:
        """Take nothing until the client waits for room, then until it poked twice,
        each poke answered with a new wait number: the second comes only once it went
        round its wait, unsignalled.  Whether it did (False: it hung up)."""
        view, sock = ring["view"], ring["sock"]
        while view[136:144] == bytes(8):  # ``waiting``: the ring is full
            if _hung_up(sock):
                return False
        for number in (1000, 1001):
            view[192:200] = number.to_bytes(8, "little")  # ``asleep``
            if sock.recv(1) != b"\x00":
                return False
        view[192:200] = bytes(8)
        return True

    def turns_so_far(self) -> list[int]:
        with self.lock:
            if "hostile.jsonl" not in self.memory.sessions:
                return []
            return self.turns()


def _hung_up(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0.01)[0]) and not sock.recv(1, socket.MSG_PEEK)


def _run_agent(daemon: _HostileDaemon, path: str, kind: str) -> dict[str, Any]:
    """Run the agent against ``daemon`` to its end; what it said."""
    try:
        env = {k: v for k, v in os.environ.items() if k != "FLIGHTLOG_RING"}
        agent = subprocess.run(
            [sys.executable, "-c", _AGENT, path, str(RECORDS), kind],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        daemon.close()
    assert agent.returncode == 0, agent.stderr  # SIGBUS before: -7
    said: dict[str, Any] = json.loads(agent.stdout)
    said["refusals logged"] = agent.stderr.count("flightlog refused the ring")
    return said


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("attack", ["shrink", "head", "pipe"])
def test_a_hostile_ring_is_refused_and_records_go_by_the_socket(
    short_tmp: Path, attack: str, kind: str
) -> None:
    path = str(short_tmp / "hostile.sock")
    daemon = _HostileDaemon(path, attack)
    said = _run_agent(daemon, path, kind)
    assert daemon.rings == 1  # the reconnect asked for none
    assert said["ring"] is False and said["reconnects"] == 1
    assert said["refused"] is not None
    why = {"shrink": "not sealed", "head": "head", "pipe": "not an eventfd"}[attack]
    assert why in said["refused"]
    assert said["refusals logged"] == 1
    assert daemon.turns() == list(range(RECORDS))
    if attack == "head":
        assert daemon.attacked


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_ring_whose_room_is_never_signalled_is_looked_at_again(
    short_tmp: Path, kind: str
) -> None:
    path = str(short_tmp / "silent.sock")
    daemon = _HostileDaemon(path, "silent")
    said = _run_agent(daemon, path, kind)
    assert daemon.attacked  # the agent went round its wait, unsignalled
    assert said == {"refused": None, "ring": True, "reconnects": 0, "refusals logged": 0}
    assert daemon.turns() == list(range(RECORDS))


def _memfd(size: int, seals: int, *, magic: bool = True) -> int:
    fd = os.memfd_create("ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if magic and size >= RING_HEADER + SIZE:
        with mmap.mmap(fd, RING_HEADER + SIZE) as mapping:
            view = memoryview(mapping)
            RingReader(view, SIZE, threading.Lock()).release()
            view.release()
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


_SHRINK_SEAL = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
_F_SEAL_FUTURE_WRITE = 0x10  # Linux 5.1; not in fcntl before Python 3.13


def _eventfd() -> int:
    return os.eventfd(0, os.EFD_CLOEXEC)


def _huge_ring() -> int:
    """A sealed ring of twice the largest size a daemon makes, laid out as a daemon
    would (sparse: only its header is written)."""
    size = 2 * MAX_RING_SIZE
    fd = os.memfd_create("huge", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, RING_HEADER + size)
    with mmap.mmap(fd, RING_HEADER + size) as mapping:
        view = memoryview(mapping)
        RingReader(view, size, threading.Lock()).release()
        view.release()
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    return fd


def _write_end() -> int:
    out, into = os.pipe2(os.O_CLOEXEC)
    os.close(out)
    return into


def _a_file() -> int:
    """A file of a ring's length (not sealed on tmpfs, no seals at all elsewhere)."""
    with tempfile.TemporaryFile() as file:
        file.write(bytes(RING_HEADER + SIZE))
        return os.dup(file.fileno())


def _twice() -> list[int]:
    """The ring's memfd passed again in the eventfd's place."""
    fd = _memfd(RING_HEADER + SIZE, _SEALS)
    return [fd, os.dup(fd)]


@pytest.mark.parametrize(
    ("passed", "announced", "why"),
    [
        (lambda: [_memfd(RING_HEADER + SIZE, 0), _eventfd()], SIZE, "not sealed"),
        (lambda: [_memfd(RING_HEADER + SIZE, fcntl.F_SEAL_SHRINK), _eventfd()], SIZE, "not sealed"),
        (lambda: [_memfd(RING_HEADER + SIZE, fcntl.F_SEAL_SEAL), _eventfd()], SIZE, "not sealed"),
        (lambda: [_memfd(RING_HEADER + 2 * SIZE, _SEALS), _eventfd()], SIZE, "holds"),
        (lambda: [_memfd(RING_HEADER + SIZE, _SHRINK_SEAL), _eventfd()], 2 * SIZE, "holds"),
        (lambda: [_memfd(RING_HEADER + SIZE, _SEALS), _eventfd()], SIZE - 1, "power of two"),
        (lambda: [_memfd(RING_HEADER + SIZE, _SEALS), _eventfd()], -RING_HEADER, "power of two"),
        (lambda: [_memfd(RING_HEADER + SIZE, _SEALS, magic=False), _eventfd()], SIZE, "not a ring"),
        (lambda: [*os.pipe()], SIZE, "seals cannot be read"),
        (lambda: [], SIZE, "not passed"),
        (lambda: [_memfd(RING_HEADER + SIZE, _SEALS)], SIZE, "not passed"),
        # Sealed against writes through a mapping: it cannot be mapped to write.
        (
            lambda: [_memfd(RING_HEADER + SIZE, _SEALS | fcntl.F_SEAL_WRITE), _eventfd()],
            SIZE,
            "mapped",
        ),
        (
            lambda: [_memfd(RING_HEADER + SIZE, _SEALS | _F_SEAL_FUTURE_WRITE), _eventfd()],
            SIZE,
            "mapped",
        ),
        # Not a memfd: a file, an eventfd in its place.
        (lambda: [_a_file(), _eventfd()], SIZE, "seal"),
        (lambda: [_eventfd(), _memfd(RING_HEADER + SIZE, _SEALS)], SIZE, "seals cannot be read"),
        # Issue 27, 2: taken before, then fixed.  A sound ring larger than a daemon
        # makes (it would hold as much of the agent's memory as it wrote through it) ...
        (lambda: [_huge_ring(), _eventfd()], 2 * MAX_RING_SIZE, "larger than"),
        # ... and a room descriptor that is no eventfd: its read after a wait failed
        # (a bare OSError out of record()), or could block for ever (a file on FUSE).
        (lambda: [_memfd(RING_HEADER + SIZE, _SEALS), _write_end()], SIZE, "not an eventfd"),
        (_twice, SIZE, "not an eventfd"),
        (
            lambda: [_memfd(RING_HEADER + SIZE, _SEALS), os.open(os.devnull, os.O_RDONLY)],
            SIZE,
            "not an eventfd",
        ),
        (
            lambda: [_memfd(RING_HEADER + SIZE, _SEALS), os.open("/", os.O_RDONLY)],
            SIZE,
            "not an eventfd",
        ),
    ],
)
def test_a_ring_unsafe_to_map_is_refused_before_it_is_mapped(
    short_tmp: Path,
    passed: Any,
    announced: int,
    why: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each check the SDK makes of a passed ring (a memfd, then an eventfd), in
    process: the ring is refused with the reason, said once, the descriptors are
    closed, and the connection ends (the daemon reads its stream from the ring, so the
    socket cannot carry on); a new connection to that path asks for no ring."""
    ours, theirs = socket.socketpair()
    path = str(short_tmp / "refused.sock")
    transport = SocketTransport(ours, path, ring=True)
    transport._fds = passed()
    transport.welcomed(announced)
    assert transport.ring_refused is not None and why in transport.ring_refused
    assert transport._ring is None and transport._fds == []
    assert theirs.recv(1) == b""  # the connection ended
    with pytest.raises(ConnectionLost):
        transport.send(b"x")
    transport.close()
    theirs.close()
    ours, theirs = socket.socketpair()
    again = SocketTransport(ours, path)
    assert not again.wants_ring and again.ring_refused == transport.ring_refused
    again.close()
    theirs.close()
    said = [r.getMessage() for r in caplog.records if "refused the ring" in r.getMessage()]
    assert len(said) == 1 and why in said[0]


def test_descriptors_passed_before_the_welcome_are_kept_two_at_most(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer that passes descriptors with every byte before its welcome (issue 27,
    2): the transport kept them all until the welcome, so a peer that took its time
    filled the agent's descriptor table (EMFILE for every open of the agent's);
    now it keeps the first two, closes the rest as they come, and refuses the ring."""
    ours, theirs = socket.socketpair()
    transport = SocketTransport(ours, str(short_tmp / "many.sock"), ring=True)
    room = _eventfd()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(200):
        socket.send_fds(theirs, [b"w"], [room, room, room])
        assert transport.receive() == b"w"
    assert len(transport._fds) == 2
    assert len(os.listdir("/proc/self/fd")) <= before + 2  # 600 more before
    transport.welcomed(SIZE)
    assert transport.ring_refused is not None and "two descriptors" in transport.ring_refused
    assert transport._fds == [] and len(os.listdir("/proc/self/fd")) <= before
    assert theirs.recv(1) == b""  # the connection ended
    transport.close()
    theirs.close()
    os.close(room)


def test_a_room_descriptor_that_fails_its_read_breaks_the_ring(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where /proc is absent an anonymous inode passes for the eventfd; one whose read
    fails after a wait (an epoll here) breaks the ring like a bad head, a
    ConnectionLost (the bare OSError reached record() before)."""

    def no_proc(path: str) -> str:
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "readlink", no_proc)
    ours, theirs = socket.socketpair()
    transport = SocketTransport(ours, str(short_tmp / "epoll.sock"), ring=True)
    epoll = select.epoll()
    transport._fds = [_memfd(RING_HEADER + SIZE, _SEALS), os.dup(epoll.fileno())]
    transport.welcomed(SIZE)
    assert transport._ring is not None  # taken: nothing read it, nothing signals
    with pytest.raises(ConnectionLost, match="broke the ring"):
        transport.send(b"x" * (SIZE + 1))
    assert transport.ring_refused is not None and "cannot be read" in transport.ring_refused
    transport.close()
    theirs.close()
    epoll.close()
