"""A root's disk threads: results and errors come back, threads are kept and bounded,
a hung root stalls no other, and a cancelled caller waits for its job."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import anyio
import pytest

from flightlog.daemon import _primitives
from flightlog.daemon._primitives import Disk
from flightlog.daemon._storage import StorageError

pytestmark = pytest.mark.anyio


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),  # the daemon's loop
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    backend: tuple[str, dict[str, bool]] = request.param
    return backend


async def _until(condition: Callable[[], object]) -> None:
    with anyio.fail_after(5):
        for _ in itertools.count():
            if condition():
                return
            await anyio.sleep(0.001)


def _disk_of(threads: int = 4) -> Disk:
    return Disk("/root", anyio.CapacityLimiter(threads))


async def test_results_and_errors_come_back() -> None:
    disk = _disk_of()
    assert await disk.run(lambda: threading.current_thread().name) == "flightlogd disk /root"
    assert await disk.run(divmod, 7, 2) == (3, 1)
    error = StorageError("/root/a.jsonl", "fsync", OSError(5, "Input/output error"))

    def fail() -> None:
        raise error

    with pytest.raises(StorageError) as info:
        await disk.run(fail)
    assert info.value is error
    assert info.value.code == "write_failed"


async def test_one_caller_at_a_time_keeps_one_thread() -> None:
    disk = _disk_of()
    names = {await disk.run(lambda: threading.get_ident()) for _ in range(200)}
    assert len(names) == 1
    assert disk.threads == 1
    assert disk.limiter.borrowed_tokens == 0


async def test_concurrent_jobs_get_threads_up_to_the_limit() -> None:
    disk = _disk_of(threads=3)
    gate = threading.Event()
    running = 0
    most = 0
    lock = threading.Lock()

    def job() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        gate.wait(10)
        with lock:
            running -= 1

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(disk.run, job)
        await _until(lambda: disk.limiter.borrowed_tokens >= 3)
        await anyio.sleep(0.05)
        assert running == 3
        gate.set()
    assert most == 3
    assert disk.threads <= 3
    assert disk.limiter.borrowed_tokens == 0


async def test_a_hung_root_stalls_no_other_root() -> None:
    hung, other = _disk_of(threads=2), _disk_of(threads=2)
    gate = threading.Event()
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(hung.run, gate.wait, 10)
            await _until(lambda: hung.limiter.borrowed_tokens >= 2)
            with anyio.fail_after(5):
                for _ in range(20):
                    assert await other.run(lambda: 1) == 1
            assert not gate.is_set()
            gate.set()
    finally:
        gate.set()


async def test_a_cancelled_caller_waits_for_its_job() -> None:
    disk = _disk_of()
    started, finished = threading.Event(), threading.Event()

    def job() -> None:
        started.set()
        time.sleep(0.2)
        finished.set()

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(disk.run, job)
            await anyio.to_thread.run_sync(started.wait, 5)
            scope.cancel()
    # The job was not abandoned: it finished before the cancelled caller went on.
    assert finished.is_set()
    assert disk.limiter.borrowed_tokens == 0


async def test_a_caller_waiting_for_a_thread_can_be_cancelled() -> None:
    disk = _disk_of(threads=1)
    gate = threading.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(disk.run, gate.wait, 10)
            await _until(lambda: disk.limiter.borrowed_tokens >= 1)
            with anyio.move_on_after(0.05) as scope:
                await disk.run(lambda: None)
            assert scope.cancelled_caught
            gate.set()
    finally:
        gate.set()
    assert disk.limiter.borrowed_tokens == 0


async def test_idle_threads_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_primitives, "IDLE_SECONDS", 0.05)
    disk = _disk_of()
    gate = threading.Event()
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(disk.run, gate.wait, 10)
        await _until(lambda: disk.limiter.borrowed_tokens >= 3)
        # Three jobs at once, three threads (checked while they wait: once done, an
        # idle thread may exit before the task group is over).
        assert disk.threads == 3
        gate.set()
    await _until(lambda: not disk.threads)
    # And a new job starts a new thread.
    assert await disk.run(lambda: 2) == 2
    assert disk.threads == 1
