"""The ring (docs/protocol.md, "The ring"): a client's frames through shared memory.

A real flightlogd on a real socket; the clients are the SDK's and a raw one that
lays its bytes into the ring itself, to be hostile.  Records and requests keep the
stream's order, large frames wrap the ring and stream through it in pieces, a full
ring holds its sender back, a client that breaks the ring is hung up on while the
daemon and its other clients go on, and a daemon without rings, or a client that
does not ask, keep the socket.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import platform
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol import (
    events,
)
from flightlog.protocol.ring import (
    RING_HEADER,
    RingWriter,
    ring_supported,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    ErrorReply,
    Hello,
    Message,
    encode_frame,
)
from flightlog.sdk import connect
from flightlog.sdk.aio import aconnect
from support import DaemonProcess, RawClient, read_lines, wait_for
from support.daemon import assert_serving, begin, create, fact, synced_seq

pytestmark = pytest.mark.skipif(
    not ring_supported(sys.platform, platform.machine(), sys.thread_info.lock),
    reason="rings need x86-64 Linux",
)

_TAIL_WORD = 16  # the header's word index of ``tail`` (RING_HEADER / 8 words)


class RingClient(RawClient):
    """A raw client whose frames go through the ring the daemon passed."""

    def __init__(self, socket_path: str) -> None:
        super().__init__(socket_path, hello=False)
        self.send_socket(
            Hello(
                id=self.next_id(),
                version=PROTOCOL_VERSION,
                client="ring",
                pid=os.getpid(),
                ring=True,
            )
        )
        data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 4)
        assert len(fds) == 2, "the Welcome brings the memfd and the eventfd"
        self.fd, self.room_fd = fds
        self.decoder.feed(data)
        self.welcome = self.receive()
        assert self.welcome.ring > 0, self.welcome
        self.mapping = mmap.mmap(self.fd, RING_HEADER + self.welcome.ring)
        self.ring = RingWriter(memoryview(self.mapping), threading.Lock())
        self.words = memoryview(self.mapping)[:RING_HEADER].cast("Q")

    def send_socket(self, message: Message) -> None:
        self.sock.sendall(encode_frame(message))

    def send(self, message: Message) -> None:
        self.send_bytes(encode_frame(message))

    def send_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            taken, poke = self.ring.write(view)
            view = view[taken:]
            if poke or view:
                self.sock.send(b"\0")
            if view:
                wait_for(lambda: self.ring.room > 0)

    def close(self) -> None:
        self.ring.release()
        self.words.release()
        self.mapping.close()
        os.close(self.fd)
        os.close(self.room_fd)
        super().close()


@pytest.fixture
def small_ring(short_tmp: Path) -> Iterator[DaemonProcess]:
    """A daemon whose rings are 4 KiB: every frame of any size wraps them."""
    proc = DaemonProcess(short_tmp, "--log-format", "json", "--ring-size", "4096").start()
    try:
        yield proc
    finally:
        proc.stop()


def _turns(path: Path) -> list[int]:
    return [line["data"]["turn_index"] for line in read_lines(path) if line["type"] == "turn_start"]


def test_records_and_requests_keep_their_order_through_the_ring(daemon: DaemonProcess) -> None:
    with RingClient(daemon.socket) as client:
        opened = create(client, "a.jsonl")
        run = begin(client, opened.session_id)
        for n in range(300):
            client.send(fact(opened.session_id, run.run_id, n))
            if n % 50 == 49:
                # Each sync answers with the records sent before it: they came first.
                assert synced_seq(client, opened.session_id) == n + 3
        assert client.ring.room == client.ring.size  # the daemon took everything
    lines = read_lines(daemon.root / "a.jsonl")
    assert [line["seq"] for line in lines] == list(range(1, len(lines) + 1))
    assert _turns(daemon.root / "a.jsonl") == list(range(300))


def test_the_sdk_sends_through_the_ring(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        assert client.welcome.ring > 0
        session = client.create("sdk.jsonl")
        with session.begin_run() as run:
            for n in range(1000):
                run.record(events.TurnStart(turn_index=n))
                if n % 100 == 99:
                    run.save_checkpoint({"n": n})
        session.close()
        assert client._link.transport._ring is not None  # type: ignore[attr-defined]
    lines = read_lines(daemon.root / "sdk.jsonl")
    turns = [line["data"]["turn_index"] for line in lines if line["type"] == "turn_start"]
    assert turns == list(range(1000))
    checkpoints = [n for n, line in enumerate(lines) if line["type"] == "checkpoint"]
    assert len(checkpoints) == 10
    # Every checkpoint came right after the record it followed in the stream.
    assert all(lines[n - 1]["data"]["turn_index"] % 100 == 99 for n in checkpoints)


@pytest.mark.anyio
async def test_the_async_sdk_sends_through_the_ring(daemon: DaemonProcess) -> None:
    async with aconnect(daemon.socket) as client:
        assert client.welcome.ring > 0
        session = await client.create("async.jsonl")
        async with await session.begin_run() as run:
            for n in range(500):
                await run.record(events.TurnStart(turn_index=n))
            await run.save_checkpoint({"n": 500})
        await session.aclose()
    assert _turns(daemon.root / "async.jsonl") == list(range(500))


@pytest.mark.parametrize("size", [64 * 1024, 1024 * 1024 - 4096])
def test_large_frames_stream_through_a_small_ring(small_ring: DaemonProcess, size: int) -> None:
    payload = b'{"pad":"%s"}' % (b"x" * (size - 10))
    with connect(small_ring.socket) as client:
        assert client.welcome.ring == 4096
        session = client.create("large.jsonl")
        with session.begin_run() as run:
            for n in range(5):
                run.record(events.TurnStart(turn_index=n))
                run.record(events.Error(message=payload.decode()))
        session.close()
    lines = read_lines(small_ring.root / "large.jsonl")
    errors = [line for line in lines if line["type"] == "error"]
    assert [e["data"]["message"] for e in errors] == [payload.decode()] * 5
    assert _turns(small_ring.root / "large.jsonl") == list(range(5))


def test_a_full_ring_holds_its_sender_back(small_ring: DaemonProcess) -> None:
    """While the daemon is stopped, the sender fills the ring and waits; once it goes
    on, every record lands."""
    with connect(small_ring.socket) as client:
        session = client.create("full.jsonl")
        run = session.begin_run()
        ring = client._link.transport._ring  # type: ignore[attr-defined]
        done = threading.Event()

        def send() -> None:
            for n in range(2000):
                run.record(events.TurnStart(turn_index=n))
            done.set()

        os.kill(small_ring.pid, signal.SIGSTOP)
        try:
            sender = threading.Thread(target=send)
            sender.start()
            wait_for(lambda: ring.room == 0)
            assert not done.is_set()
        finally:
            os.kill(small_ring.pid, signal.SIGCONT)
        sender.join(timeout=60)
        assert done.is_set()
        run.close()
        session.close()
    assert _turns(small_ring.root / "full.jsonl") == list(range(2000))


# ------------------------------------------------------------------- hostile clients


def _hung_up_with_bad_message(client: RingClient) -> None:
    reply = client.receive()
    assert isinstance(reply, ErrorReply), reply
    assert reply.code == "bad_message"
    assert client.closed_by_daemon()


@pytest.mark.parametrize("how", ["too far ahead", "backwards"])
def test_a_broken_tail_is_hung_up_on(daemon: DaemonProcess, how: str) -> None:
    with connect(daemon.socket) as bystander:
        session = bystander.create("bystander.jsonl")
        run = session.begin_run()
        with RingClient(daemon.socket) as client:
            opened = create(client, "hostile.jsonl")
            begun = begin(client, opened.session_id)
            client.send(fact(opened.session_id, begun.run_id, 1))
            assert synced_seq(client, opened.session_id) == 3
            tail = client.words[_TAIL_WORD]
            client.words[_TAIL_WORD] = tail + client.ring.size + 1 if how != "backwards" else 1
            client.sock.send(b"\0")
            _hung_up_with_bad_message(client)
        run.record(events.TurnStart(turn_index=7))
        run.close()
        session.close()
    assert daemon.alive()
    assert _turns(daemon.root / "bystander.jsonl") == [7]
    assert_serving(daemon)


def test_garbage_in_the_ring_is_a_bad_frame(daemon: DaemonProcess) -> None:
    with RingClient(daemon.socket) as client:
        client.send_bytes(os.urandom(64) + b"\xff" * 64)
        # Bad frames in a row, or a frame announced too large: the daemon hangs up.
        reply = client.receive()
        assert isinstance(reply, ErrorReply), reply
        assert client.closed_by_daemon()
    assert daemon.alive()
    assert_serving(daemon)


def test_the_ring_cannot_be_resized_by_the_client(daemon: DaemonProcess) -> None:
    with RingClient(daemon.socket) as client:
        size = RING_HEADER + client.ring.size
        seals = fcntl.fcntl(client.fd, fcntl.F_GET_SEALS)
        wanted = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        assert seals & wanted == wanted
        for length in (0, size // 2, size * 2):
            with pytest.raises(PermissionError):
                os.ftruncate(client.fd, length)
        assert os.fstat(client.fd).st_size == size
        opened = create(client, "sealed.jsonl")
        begun = begin(client, opened.session_id)
        client.send(fact(opened.session_id, begun.run_id, 1))
        assert synced_seq(client, opened.session_id) == 3


def test_a_ring_client_killed_leaves_other_rings_alone(daemon: DaemonProcess) -> None:
    """Each connection has a ring of its own: a ring client's bytes never reach another."""
    with RingClient(daemon.socket) as first, RingClient(daemon.socket) as second:
        a, b = create(first, "first.jsonl"), create(second, "second.jsonl")
        run_a, run_b = begin(first, a.session_id), begin(second, b.session_id)
        for n in range(100):
            first.send(fact(a.session_id, run_a.run_id, n))
            second.send(fact(b.session_id, run_b.run_id, 1000 + n))
        first.words[_TAIL_WORD] = 0
        first.sock.send(b"\0")
        assert synced_seq(second, b.session_id) == 102
    assert _turns(daemon.root / "second.jsonl") == list(range(1000, 1100))


# --------------------------------------------------------------------- without rings


def test_a_client_that_does_not_ask_keeps_its_socket(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLIGHTLOG_RING", "0")
    with connect(daemon.socket) as client:
        assert client.welcome.ring == 0
        assert client._link.transport._ring is None  # type: ignore[attr-defined]
        session = client.create("plain.jsonl")
        with session.begin_run() as run:
            for n in range(100):
                run.record(events.TurnStart(turn_index=n))
        session.close()
    assert _turns(daemon.root / "plain.jsonl") == list(range(100))


def test_a_daemon_without_rings_answers_a_ring_hello_with_none(short_tmp: Path) -> None:
    proc = DaemonProcess(short_tmp, "--log-format", "json", "--ring-size", "0").start()
    try:
        with connect(proc.socket) as client:
            assert client.welcome.ring == 0
            session = client.create("off.jsonl")
            with session.begin_run() as run:
                for n in range(100):
                    run.record(events.TurnStart(turn_index=n))
            session.close()
        assert _turns(proc.root / "off.jsonl") == list(range(100))
    finally:
        proc.stop()


def test_an_old_hello_gets_no_ring(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        assert client.welcome.ring == 0
        opened = create(client, "old.jsonl")
        run = begin(client, opened.session_id)
        client.send(fact(opened.session_id, run.run_id, 5))
        assert synced_seq(client, opened.session_id) == 3
