"""A channel written by a disk thread (Channel.thread_write): at once when nothing is
queued, else behind what is; the loop writes the rest; never to a closed socket."""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from flightlog.daemon._budget import (
    FLOOR,
    FLOOR_POOL,
    UID_FLOOR_ROOM,
    UID_SHARE,
    ConnectionBudget,
    MemoryBudget,
    UidMemory,
)
from flightlog.daemon._channel import Channel
from flightlog.daemon._primitives import Poller
from flightlog.protocol.wire import FrameDecoder, server_decoder

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
        channel = Channel(
            ours,
            poller,
            server_decoder(),
            read_size=65536,
            queue_bytes=1 << 24,
            send_timeout=10,
            budget=ConnectionBudget(MemoryBudget(1 << 30)),
        )
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


async def test_what_the_thread_writes_goes_out_at_once_when_nothing_waits(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, theirs = pair
    write = channel.thread_write(b"reply;")
    assert write is not None
    channel.write(b"push;")  # the loop, meanwhile: the socket is its own until then
    _in_thread(write.send)
    assert write.sent == len(b"reply;")
    assert write.end()
    channel.write(b"later;")
    await channel.flush()
    assert await _read(theirs, 17) == b"push;reply;later;"


async def test_what_the_thread_writes_waits_behind_what_is_queued(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, theirs = pair
    first = b"x" * (1 << 22)  # more than the socket takes: the rest is queued
    channel.write(first)
    assert channel.queued
    write = channel.thread_write(b"reply")
    assert write is not None
    _in_thread(write.send)
    assert write.sent == 0
    assert write.end()
    channel.write(b"later")
    async with anyio.create_task_group() as tg:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await _read(theirs, len(first) + 10))

        tg.start_soon(read)
        await channel.flush()
    assert got == [first + b"replylater"]


async def test_what_the_thread_writes_past_the_queues_bound_is_left_to_the_loop(
    pair: tuple[Channel, socket.socket],
) -> None:
    """The queue's bound holds for a disk thread's replies too: what does not fit is
    not queued, and the loop sends it, waiting for room (issue 27, 4)."""
    channel, theirs = pair
    first = b"x" * ((1 << 24) - 4096)  # the queue holds nearly all its bound
    channel.write(first)
    queued = channel.queued
    reply = b"y" * (1 << 16)
    write = channel.thread_write(reply)
    assert write is not None
    _in_thread(write.send)
    assert write.sent is None
    assert not write.end()  # still to send: the loop's
    assert channel.queued == queued
    async with anyio.create_task_group() as tg:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await _read(theirs, len(first) + len(reply)))

        tg.start_soon(read)
        await channel.send(reply)
        await channel.flush()
    assert got == [first + reply]


async def test_what_the_socket_did_not_take_is_written_by_the_loop(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, theirs = pair
    big = bytes(range(256)) * 8192  # 2 MiB: more than the socket buffers hold
    write = channel.thread_write(big)
    assert write is not None
    _in_thread(write.send)
    assert write.sent is not None and 0 < write.sent < len(big)
    channel.write(b"after")  # queued behind the rest
    assert write.end()
    async with anyio.create_task_group() as tg:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await _read(theirs, len(big) + 5))

        tg.start_soon(read)
        await channel.flush()
    assert got == [big + b"after"]


async def test_a_write_the_thread_never_sent_sends_nothing(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, theirs = pair
    write = channel.thread_write(b"never")
    assert write is not None
    assert not write.end()  # send() never ran: a failed sync sends no reply
    channel.write(b"error;")
    await channel.flush()
    assert await _read(theirs, 6) == b"error;"


async def test_a_failed_send_ends_writing(pair: tuple[Channel, socket.socket]) -> None:
    channel, theirs = pair
    theirs.close()
    write = channel.thread_write(b"reply")
    assert write is not None
    _in_thread(write.send)
    assert isinstance(write.error, OSError)
    assert write.end()
    assert channel.write_ended
    assert channel.thread_write(b"more") is None
    channel.write(b"dropped")
    assert channel.queued == 0


async def test_nothing_is_written_to_a_closed_channel(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, theirs = pair
    write = channel.thread_write(b"reply")
    assert write is not None
    channel.close()
    _in_thread(write.send)
    assert write.sent == 0
    assert write.end()
    theirs.settimeout(10)
    assert theirs.recv(100) == b""  # the end of the stream, and nothing before it


# ------------------------------------------------ a hang-up while the budget is spent


@dataclass
class Starved:
    """A channel whose daemon's budget another connection (``hog``) holds whole: it
    reads its floor, then waits for room (for an hour: never, in a test)."""

    channel: Channel
    theirs: socket.socket
    account: ConnectionBudget
    hog: ConnectionBudget
    decoder: FrameDecoder[Any]

    async def send_while_read(self, data: bytes) -> int:
        """Send ``data`` as the channel reads it, until it is all sent or the channel
        holds its floor (and waits for the budget); the bytes sent."""
        self.theirs.setblocking(False)
        sent = 0
        while sent < len(data) and self.account.held < FLOOR:
            try:
                sent += self.theirs.send(data[sent : sent + 65536])
            except BlockingIOError:
                with anyio.fail_after(10):
                    await self.channel.wait_readable()
        return sent

    async def read_to_the_end(self) -> None:
        with anyio.fail_after(10):
            while not self.channel.read_ended:
                await self.channel.wait_readable()


@pytest.fixture
async def starved() -> AsyncIterator[Starved]:
    ours, theirs = socket.socketpair()
    budget = MemoryBudget(4 * FLOOR)
    hog = ConnectionBudget(budget)
    hog.charge(budget.cap)
    account = ConnectionBudget(budget)
    decoder = server_decoder(max_frame_size=8 << 20)
    with Poller() as poller:
        channel = Channel(
            ours,
            poller,
            decoder,
            read_size=65536,
            queue_bytes=1 << 24,
            send_timeout=3600,
            budget=account,
        )
        try:
            yield Starved(channel, theirs, account, hog, decoder)
        finally:
            channel.close()
            theirs.close()


async def test_a_client_that_hangs_up_mid_frame_while_the_budget_is_spent_ends_at_once(
    starved: Starved,
) -> None:
    """Its frame can never be completed: the stream ends and the bytes held go back,
    rather than waiting for room (before: until ``send_timeout`` cut it off)."""
    frame = (4 << 20).to_bytes(4, "big") + bytes(4 << 20)
    sent = await starved.send_while_read(frame)
    assert sent < len(frame) and starved.account.held >= FLOOR
    starved.theirs.close()
    await starved.read_to_the_end()
    assert starved.channel.read_error is None  # the end of the stream, as if read to it
    starved.channel.close()
    assert starved.account.held == 0


async def test_a_client_that_hangs_up_after_a_whole_frame_is_read_once_there_is_room(
    starved: Starved,
) -> None:
    """What it sent before it hung up holds a whole frame: it waits for room and is
    read to its end, nothing dropped."""
    payload = FLOOR + (64 << 10)
    frame = payload.to_bytes(4, "big") + bytes(payload)
    sent = await starved.send_while_read(frame)
    starved.theirs.setblocking(True)
    starved.theirs.sendall(frame[sent:])  # the socket takes the rest: less than a read
    starved.theirs.close()
    await anyio.wait_all_tasks_blocked()
    assert not starved.channel.read_ended  # it waits for room: the rest completes a frame
    starved.hog.discharge(starved.hog.held)  # room again: the rest is read, then the end
    await starved.read_to_the_end()
    assert starved.channel.read_error is None
    assert starved.decoder.missing == 0 and starved.decoder.buffered == len(frame)


def test_floors_beyond_the_budget_share_one_pool_and_look_again_when_it_has_room() -> None:
    """Issue 27, 4: two uids each hold their share and then floors on further
    connections; together the floors stop at the budget and ``FLOOR_POOL`` (before,
    each uid's stopped only at its share and ``UID_FLOOR_ROOM``), a third uid that
    holds at most a floor is still read, and once another uid frees a floor's room in
    the pool, the connections waiting for it are resumed."""
    budget = MemoryBudget(8 * FLOOR)
    uids = [UidMemory(limited=True) for _ in range(3)]
    first, second, third = uids
    share = budget.cap // UID_SHARE
    for uid in (first, second):
        ConnectionBudget(budget, uid).charge(share)
    floors: dict[int, list[ConnectionBudget]] = {id(uid): [] for uid in uids}
    # Each of the two uids' new connections takes a floor while it may read.
    for _ in range(UID_FLOOR_ROOM // FLOOR):
        for uid in (first, second):
            connection = ConnectionBudget(budget, uid)
            if connection.may_read():
                connection.charge(FLOOR)
                floors[id(uid)].append(connection)
    assert budget.used == budget.cap + FLOOR_POOL
    waiting = ConnectionBudget(budget, first)
    assert not waiting.may_read()  # its uid is within its room, the pool is not
    resumed: list[str] = []
    waiting.wait("waiting", lambda: resumed.append("waiting"))
    # A uid holding little goes on: one floor, not two.
    little = ConnectionBudget(budget, third)
    assert little.may_read()
    little.charge(FLOOR // 2)
    assert ConnectionBudget(budget, third).may_read()
    little.charge(FLOOR // 2)
    assert not ConnectionBudget(budget, third).may_read()
    # The pool gets a floor's room back: the waiting connection looks again.
    little.discharge(FLOOR)
    assert not resumed
    floors[id(second)][-1].discharge(FLOOR)
    assert resumed == ["waiting"]
    assert waiting.may_read()
