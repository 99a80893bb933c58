"""An actor's mailbox: order, backpressure, cancelled and refused puts, the idle wait."""

from __future__ import annotations

import anyio
import pytest

from flightlog.daemon._peers import Item, Release
from flightlog.daemon._primitives import Mailbox

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


def _items(n: int, start: int = 0) -> list[Item]:
    # Distinct items: a Release each, told apart by identity.
    return [(None, Release()) for _ in range(start, start + n)]


async def test_items_come_out_in_order_up_to_the_limit() -> None:
    mailbox = Mailbox[Item](8)
    items = _items(8)
    for item in items:
        assert mailbox.put_nowait(item)
    assert not mailbox.put_nowait(_items(1)[0])  # full
    assert mailbox.take(3) == items[:3]
    assert mailbox.take(100) == items[3:]
    assert mailbox.take(100) == []


async def test_a_full_mailbox_makes_puts_wait_and_serves_them_in_order() -> None:
    mailbox = Mailbox[Item](2)
    first = _items(2)
    waiting = _items(3)
    for item in first:
        assert await mailbox.put(item)
    results: list[bool] = []

    async def put(item: Item) -> None:
        results.append(await mailbox.put(item))

    async with anyio.create_task_group() as tg:
        for item in waiting:
            tg.start_soon(put, item)
            await anyio.sleep(0.001)
        await anyio.sleep(0.01)
        assert results == []
        assert not mailbox.put_nowait(_items(1)[0])  # no overtaking the waiting puts
        assert mailbox.take(10) == first
        await anyio.sleep(0.01)
        assert results == [True, True]
        assert mailbox.take(10) == waiting[:2]
    assert results == [True, True, True]
    assert mailbox.take(10) == waiting[2:]


async def test_a_cancelled_put_is_skipped_and_blocks_nobody() -> None:
    mailbox = Mailbox[Item](1)
    assert mailbox.put_nowait(_items(1)[0])
    cancelled = _items(1)[0]
    with anyio.move_on_after(0.01):
        await mailbox.put(cancelled)
    mailbox.take(10)
    # Room now, and the cancelled put's item never arrived.
    later = _items(1)[0]
    assert mailbox.put_nowait(later)
    assert mailbox.take(10) == [later]


async def test_a_cancelled_put_behind_an_empty_mailbox_blocks_nobody() -> None:
    mailbox = Mailbox[Item](1)
    assert mailbox.put_nowait(_items(1)[0])
    with anyio.move_on_after(0.01):
        await mailbox.put(_items(1)[0])
    mailbox.take(10)  # empty now, the cancelled put still queued behind
    assert mailbox.take(10) == []
    later = _items(1)[0]
    with anyio.fail_after(1):
        assert await mailbox.put(later)
    assert mailbox.take(10) == [later]


async def test_closing_refuses_waiting_and_later_puts() -> None:
    mailbox = Mailbox[Item](1)
    assert mailbox.put_nowait(_items(1)[0])
    results: list[bool] = []

    async def put() -> None:
        results.append(await mailbox.put(_items(1)[0]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(put)
        await anyio.sleep(0.01)
        mailbox.close()
    assert results == [False]
    assert not await mailbox.put(_items(1)[0])
    assert not mailbox.put_nowait(_items(1)[0])
    assert mailbox.take(10) == []


async def test_the_idle_wait() -> None:
    mailbox = Mailbox[Item](4)
    with anyio.fail_after(2):
        assert not await mailbox.wait(0.01)  # nothing came
    item = _items(1)[0]
    async with anyio.create_task_group() as tg:

        async def later() -> None:
            await anyio.sleep(0.01)
            mailbox.put_nowait(item)

        tg.start_soon(later)
        with anyio.fail_after(2):
            assert await mailbox.wait(60)
    assert await mailbox.wait(60)  # already there: no wait
    assert mailbox.take(1) == [item]
    with anyio.move_on_after(0.01) as scope:
        await mailbox.wait(60)
    assert scope.cancelled_caught
