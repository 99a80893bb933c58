"""The async client shared by tasks, and cancelled while it waits."""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.lowlevel import checkpoint

from flightlog.protocol.events import (
    AgentStart,
)
from flightlog.protocol.wire import (
    Ack,
    Message,
    Sync,
)
from flightlog.sdk import MemoryDaemon
from flightlog.sdk.aio import AsyncClient, AsyncMockTransport, AsyncSession, aconnect

pytestmark = pytest.mark.anyio


class WaitingTransport(AsyncMockTransport):
    """A mock whose receive waits for bytes, like a socket, instead of reading the end."""

    def __init__(self, memory: MemoryDaemon) -> None:
        super().__init__(memory)
        self._arrived = anyio.Event()

    def push(self, message: Message) -> None:
        super().push(message)
        self._arrived.set()

    async def send(self, data: bytes) -> None:
        await super().send(data)
        self._arrived.set()

    async def receive(self) -> bytes:
        await checkpoint()
        while (data := self.receive_nowait()) is None:
            self._arrived = anyio.Event()
            await self._arrived.wait()
        return data


@pytest.fixture
def transport(memory: MemoryDaemon) -> WaitingTransport:
    return WaitingTransport(memory)


async def start(transport: WaitingTransport) -> tuple[AsyncClient, AsyncSession]:
    client = await aconnect(transport=transport)
    return client, await client.create("s.jsonl")


def hold_syncs(memory: MemoryDaemon) -> list[Sync]:
    memory.hold(Sync)
    return memory.held


async def test_a_cancelled_wait_leaves_the_client_usable(
    memory: MemoryDaemon, transport: WaitingTransport
) -> None:
    client, session = await start(transport)
    held = hold_syncs(memory)
    with anyio.move_on_after(0.01) as scope:
        await session.sync()
    assert scope.cancelled_caught
    # Its reply arrives late and is dropped; the next request gets its own.
    transport.push(Ack(id=held[0].id, seq=99))
    assert (await client.status()).records_written == 1
    await client.aclose()


async def test_tasks_find_their_own_replies(
    memory: MemoryDaemon, transport: WaitingTransport
) -> None:
    client, session = await start(transport)
    held = hold_syncs(memory)
    synced: list[int] = []

    async def sync() -> None:
        synced.append(await session.sync())

    async with anyio.create_task_group() as tg:
        tg.start_soon(sync)
        await wait_all_tasks_blocked()
        # The sync holds the receive lock; the status reply reaches its task anyway.
        assert (await client.status()).records_written == 1
        assert synced == []
        transport.push(Ack(id=held[0].id, seq=42))
    assert synced == [42]
    await client.aclose()


async def test_records_go_on_while_another_task_follows_a_tail(
    memory: MemoryDaemon, transport: WaitingTransport
) -> None:
    client, session = await start(transport)
    tailed: list[int] = []

    async def follow() -> None:
        async with client.tail("s.jsonl", follow=True) as tail:
            async for record in tail:
                tailed.append(record.seq)
                if record.seq == 5:
                    return

    run = await session.begin_run()
    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await wait_all_tasks_blocked()
        for _ in range(3):
            await run.record(AgentStart())
    assert tailed == [1, 2, 3, 4, 5]
    assert [type(m).__name__ for m in transport.sent[-4:]] == [
        "RecordEvent",
        "RecordEvent",
        "RecordEvent",
        "Unsubscribe",
    ]
    await client.aclose()


async def test_the_awaitable_context_enters_what_it_makes(transport: WaitingTransport) -> None:
    opening = aconnect(transport=transport)
    async with opening as client:
        assert isinstance(client, AsyncClient)
    assert client.closed
