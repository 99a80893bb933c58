"""Worker threads for one data root's blocking file work, with a cheap handoff.

A round trip through ``anyio.to_thread.run_sync`` to an idle thread took ~67 µs on a
2-vCPU VM, ~14 µs of it anyio's own work (two event-loop checkpoints, an async
capacity limiter, a fresh context per call); the rest is waking the thread and then
the loop, which no handoff avoids.  A :class:`Disk` keeps its threads: a job goes to
them through a :class:`queue.SimpleQueue`, its outcome comes back with one
``loop.call_soon_threadsafe`` to an asyncio future the caller awaits.  A thread that
finds another job queued when it finishes one takes it at once, without sleeping: a
burst of fsyncs from more sessions than there are threads is drained without a
wake-up per job.

Each data root has its own ``Disk``, and its :class:`anyio.CapacityLimiter` bounds
the threads doing the root's file work at once (creates, opens, fsyncs, checkpoint
and tail reads): a disk that hangs holds at most those, and every other root goes on.

Cancellation is the same as ``anyio.to_thread.run_sync``'s default: a caller whose
task is cancelled waits for its job to finish, then sees the cancellation.  A job is
never abandoned half-way while its caller goes on (the session's descriptor might be
closed under it).

asyncio only (plain or uvloop), which is what the daemon runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

__all__ = ["Disk"]

T = TypeVar("T")

#: Seconds a thread with nothing to do waits for a job before it exits.
IDLE_SECONDS = 10.0

_Job = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class Disk:
    """The threads that do one root's blocking file work; see the module docstring."""

    def __init__(self, name: str, limiter: anyio.CapacityLimiter) -> None:
        self.name = name
        self.limiter = limiter
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        # Threads waiting for a job that no job queued so far is promised to.
        self._idle = 0

    @property
    def threads(self) -> int:
        """Threads alive (busy or waiting)."""
        return self._threads

    async def run(self, func: Callable[..., T], *args: Any) -> T:
        """``func(*args)`` in one of the root's threads; its result or exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        limiter = self.limiter
        try:
            limiter.acquire_on_behalf_of_nowait(future)
        except anyio.WouldBlock:
            # Every thread of this root is busy (or hung): wait for one, cancellably.
            await limiter.acquire_on_behalf_of(future)
        try:
            with self._lock:
                if self._idle:
                    self._idle -= 1
                    start = False
                else:
                    self._threads += 1
                    start = True
            if start:
                # Before the job is queued: a job must not wait for a thread that
                # never came (to run, much later, for a caller long gone).
                try:
                    threading.Thread(
                        target=self._work, name=f"flightlogd disk {self.name}", daemon=True
                    ).start()
                except BaseException:
                    with self._lock:
                        self._threads -= 1
                    raise
            with anyio.CancelScope(shield=True):
                # The thread needs the GIL, which this one lets go of only once the
                # loop waits: queue the job as late as possible.
                self._jobs.put((func, args, loop, future))
                result = await future
        finally:
            limiter.release_on_behalf_of(future)
        return result

    def _work(self) -> None:
        jobs, lock = self._jobs, self._lock
        while True:
            try:
                func, args, loop, future = jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with lock:
                    # Leave only if some waiting thread has no job promised to it;
                    # otherwise this one is needed for a job about to be queued.
                    if self._idle:
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            try:
                outcome: tuple[bool, Any] = (True, func(*args))
            except BaseException as exc:  # handed to the caller, whatever it is
                outcome = (False, exc)
            del func, args
            # Waiting again before the caller hears of it: its next job finds this
            # thread instead of starting another.
            with lock:
                self._idle += 1
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
                loop.call_soon_threadsafe(_settle, future, outcome)
            del loop, future, outcome


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
