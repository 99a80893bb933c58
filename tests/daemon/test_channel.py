"""A channel's socket lent to a disk thread (Channel.lease): what the thread sends comes
first, what the loop writes meanwhile follows in order, and the socket stays open until
the lease ends."""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from flightlog.daemon._channel import Channel
from flightlog.daemon._primitives import Poller
from flightlog.protocol import server_decoder

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


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Channel, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    with Poller() as poller:
        channel = Channel(ours, poller, server_decoder(), read_size=65536, queue_bytes=1 << 24)
        try:
            yield channel, theirs
        finally:
            channel.close()
            theirs.close()


async def _read(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``sock``, read in a thread while the loop writes."""

    def read() -> bytes:
        data = bytearray()
        sock.settimeout(10)
        while len(data) < size:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
        return bytes(data)

    return await anyio.to_thread.run_sync(read)


def _in_thread(function: Callable[[], object]) -> None:
    thread = threading.Thread(target=function)
    thread.start()
    thread.join(10)


async def test_what_the_thread_sends_comes_before_what_the_loop_writes_meanwhile(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, theirs = pair
    lease = channel.lease(b"reply;")
    assert lease is not None
    assert channel.lease(b"other") is None  # one lease at a time
    channel.write(b"push;")  # the loop, while the socket is lent: queued
    assert channel.queued == len(b"push;")
    _in_thread(lease.send)
    assert lease.end()
    channel.write(b"later;")
    await channel.flush()
    assert await _read(theirs, 17) == b"reply;push;later;"


async def test_what_the_socket_did_not_take_is_sent_first(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, theirs = pair
    big = bytes(range(256)) * 8192  # 2 MiB: more than the socket buffers hold
    lease = channel.lease(big)
    assert lease is not None
    _in_thread(lease.send)
    assert lease.sent is not None and 0 < lease.sent < len(big)
    channel.write(b"after")
    assert lease.end()
    async with anyio.create_task_group() as tg:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await _read(theirs, len(big) + 5))

        tg.start_soon(read)
        await channel.flush()
    assert got == [big + b"after"]


async def test_a_lease_that_sent_nothing_gives_the_socket_back(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, theirs = pair
    lease = channel.lease(b"never")
    assert lease is not None
    channel.write(b"push;")
    assert not lease.end()  # send() never ran: a failed sync sends no reply
    channel.write(b"error;")
    await channel.flush()
    assert await _read(theirs, 11) == b"push;error;"


async def test_no_lease_while_bytes_wait_or_after_writing_ended(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, theirs = pair
    channel.write(b"x" * (1 << 22))  # more than the socket takes: the rest is queued
    assert channel.queued
    assert channel.lease(b"reply") is None
    await _read(theirs, 1 << 22)
    await channel.flush()
    lease = channel.lease(b"reply")
    assert lease is not None
    assert not lease.end()


async def test_a_failed_send_ends_writing(pair: tuple[Channel, socket.socket]) -> None:
    channel, theirs = pair
    theirs.close()
    lease = channel.lease(b"reply")
    assert lease is not None
    _in_thread(lease.send)
    assert isinstance(lease.error, OSError)
    assert lease.end()
    assert channel.write_ended
    channel.write(b"dropped")
    assert channel.queued == 0


async def test_the_socket_closes_only_once_the_lease_ended(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, theirs = pair
    sock = channel._sock
    lease = channel.lease(b"reply")
    assert lease is not None
    channel.close()
    assert sock.fileno() != -1  # still open: the disk thread may be writing to it
    _in_thread(lease.send)
    lease.end()
    assert sock.fileno() == -1
    assert await _read(theirs, 5) == b"reply"
