"""The few primitives whose sync and async forms differ, with one surface for both.

:class:`AsyncLock` and :class:`Lock` are interchangeable apart from ``async with`` (and
``try_acquire()``, a thread lock's ``acquire(blocking=False)``), so ``_sync.py`` can be
generated from ``_async.py`` by renaming (and so can
:func:`asleep` and :func:`sleep`).  :class:`AwaitableContext`
lets ``aconnect()``, ``create()``, ``open()`` and ``begin_run()`` be awaited or used
directly in ``async with``; their sync forms return the object itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Generator
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import anyio

__all__ = [
    "AsyncLock",
    "AwaitableContext",
    "Lock",
    "asleep",
    "async_wait_blocks_loop",
    "sleep",
    "wait_blocks_loop",
]

#: Waiting without holding the event loop (async) or the thread (sync).
asleep = anyio.sleep
sleep = time.sleep


def async_wait_blocks_loop() -> bool:
    """Whether waiting for a reply would stall an event loop: never, for an awaiting client."""
    return False


def wait_blocks_loop() -> bool:
    """Whether this thread runs an asyncio event loop, which a blocking wait would stall.

    The sync callbacks of async frameworks (trace processors, callback handlers) run
    there: the sync client then sends requests whose reply only confirms durability
    without waiting for that reply.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class AsyncLock:
    """An anyio lock that can also be tried without waiting."""

    def __init__(self) -> None:
        self._lock = anyio.Lock()

    async def __aenter__(self) -> None:
        await self._lock.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self._lock.release()

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never waits."""
        try:
            self._lock.acquire_nowait()
        except anyio.WouldBlock:
            return False
        return True

    def release(self) -> None:
        self._lock.release()


#: The sync client's lock: :class:`AsyncLock`'s surface, with ``acquire(blocking=False)``
#: for its ``try_acquire()`` (the generated client is renamed to it).  A plain thread lock:
#: every ``record()`` takes it, and a Python wrapper's two calls cost more than the lock.
Lock = threading.Lock


class _AsyncContextManager(Protocol):
    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


C = TypeVar("C", bound=_AsyncContextManager)


class AwaitableContext(Generic[C]):
    """An object being made: ``await`` it, or enter it with ``async with``.

    ``async with`` awaits the object, enters it and, on exit, exits it.
    """

    __slots__ = ("_coro", "_value")

    def __init__(self, coro: Coroutine[Any, Any, C]) -> None:
        self._coro = coro
        self._value: C | None = None

    def __await__(self) -> Generator[Any, None, C]:
        return self._coro.__await__()

    async def __aenter__(self) -> C:
        self._value = await self._coro
        await self._value.__aenter__()
        return self._value

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._value is not None
        await self._value.__aexit__(exc_type, exc, tb)
