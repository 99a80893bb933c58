"""The daemon's hand-made concurrency primitives, and the contract of each.

The daemon runs on one asyncio event loop (uvloop when installed), structured with
anyio: every task lives in a task group, cancellation is anyio's.  Four hot paths
use a primitive of their own instead of anyio's general ones, each for a cost that
docs/benchmarks.md measures.  What each promises when its caller is cancelled:

- :class:`Mailbox` (a session actor's queue): a cancelled ``put`` queues nothing; a
  cancelled ``wait`` takes nothing; ``close`` refuses every waiting and later put.
- :class:`Disk` (one data root's blocking file work in threads): a cancelled caller
  waits for its job to finish, then sees the cancellation; a job is never abandoned.
- :class:`Poller` (one epoll set for every connection's reads, and :class:`TimerFd`
  for the read window): callbacks on the loop, nothing to cancel; a descriptor is
  out of the set once unwatched, and a hold always ends in its release.
- :class:`~._channel.Channel` (a connection's socket, on the poller): a cancelled
  ``send`` writes nothing of its message; a cancelled ``wait_readable`` loses no
  bytes (they stay in the decoder).  A reply written by a disk thread
  (:class:`~._channel.ThreadWrite`) is never written to a closed socket, and its
  rest is handed to the loop whatever became of the job.

They are asyncio only (plain or uvloop), which is what the daemon runs on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import os
import queue
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import anyio

__all__ = [
    "DISK_THREADS",
    "READER_THREADS",
    "Account",
    "Disk",
    "Disks",
    "Mailbox",
    "Poller",
    "TimerFd",
    "timed",
]

T = TypeVar("T")
Item = TypeVar("Item")

# ---------------------------------------------------------------------- Mailbox


class Mailbox(Generic[Item]):
    """A bounded queue with one reader and the puts waiting for room (backpressure),
    served in the order they came.

    What anyio's memory object stream did for the actors, for a fraction of its cost
    per item and per wake-up (docs/benchmarks.md).  Cancellation: a put cancelled
    while waiting for room queues nothing; a cancelled :meth:`wait` takes nothing.
    """

    __slots__ = ("_putters", "_reader", "closed", "items", "size")

    def __init__(self, size: int) -> None:
        self.items: collections.deque[Item] = collections.deque()
        self.size = size
        self.closed = False
        self._reader: asyncio.Future[None] | None = None
        # Each waiting put: its future (True once its item is in, False if closed).
        self._putters: collections.deque[tuple[asyncio.Future[bool], Item]] = collections.deque()

    def put_nowait(self, item: Item) -> bool:
        """Queue ``item`` if there is room; False when it must wait (or is closed)."""
        putters = self._putters
        while putters and putters[0][0].done():
            putters.popleft()  # cancelled while waiting
        # A put still waiting means the mailbox is full: take() gives room to those first.
        if self.closed or putters or len(self.items) >= self.size:
            return False
        self.items.append(item)
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)
        return True

    async def put(self, item: Item) -> bool:
        """Queue ``item``, waiting for room; False when the mailbox is (or gets) closed."""
        if self.closed:
            return False
        if self.put_nowait(item):
            return True
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._putters.append((waiter, item))
        # Cancelled while waiting: its entry stays, done, and is skipped.
        return await waiter

    async def wait(self, seconds: float) -> bool:
        """Wait for an item, at most ``seconds``; whether there is one."""
        if not self.items:
            loop = asyncio.get_running_loop()
            reader = self._reader = loop.create_future()
            timer = loop.call_later(seconds, _wake, reader)
            try:
                await reader
            finally:
                timer.cancel()
                self._reader = None
        return bool(self.items)

    def take(self, limit: int) -> list[Item]:
        """Up to ``limit`` items, oldest first; the puts waiting get their room."""
        items = self.items
        if len(items) <= limit:
            batch = list(items)
            items.clear()
        else:
            batch = [items.popleft() for _ in range(limit)]
        putters = self._putters
        while putters and len(items) < self.size:
            waiter, item = putters.popleft()
            if not waiter.done():
                items.append(item)
                waiter.set_result(True)
        return batch

    def close(self) -> None:
        """Refuse every later put, and the puts waiting; drop what is queued."""
        self.closed = True
        self.items.clear()
        for waiter, _ in self._putters:
            if not waiter.done():
                waiter.set_result(False)
        self._putters.clear()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# ------------------------------------------------------------------------- Disk

#: Threads that the blocking file work (create, open, write and fsync, reading) under
#: one root may use at once.  A disk that hangs holds at most these; the sessions under
#: every other root go on (a single pool would be exhausted by the hung disk's fsyncs).
DISK_THREADS = 16
#: Threads the tails of one root may read with at once, apart from the writers' ones.
READER_THREADS = 4

#: Seconds a thread with nothing to do waits for a job before it exits.
IDLE_SECONDS = 10.0


class Account(Protocol):
    """Whose disk job it is (a uid's ``_fairness.UidShare``): how many of its jobs may
    run at once, and where the time the job took is counted."""

    @property
    def disk_jobs(self) -> anyio.CapacityLimiter | None: ...

    def charge(self, seconds: float) -> None: ...


_Job = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class Disk:
    """Long-lived threads for one data root's blocking file work.

    A job goes to them through a :class:`queue.SimpleQueue`; its outcome comes back
    with one ``loop.call_soon_threadsafe``, which is cheaper than
    ``anyio.to_thread.run_sync`` (docs/benchmarks.md).  A thread that finds another
    job queued when it finishes one takes it without sleeping.  The root's
    :class:`anyio.CapacityLimiter` bounds its threads: a disk that hangs holds at most
    those.  Cancellation is ``anyio.to_thread.run_sync``'s default: a cancelled caller
    waits for its job to finish, then sees the cancellation.
    """

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

    async def run(self, func: Callable[..., T], *args: Any, account: Account | None = None) -> T:
        """``func(*args)`` in one of the root's threads; its result or exception.  With
        ``account``: once fewer of its jobs than its bound run, in any root, and the
        thread's time the job took is charged to it."""
        jobs = account.disk_jobs if account is not None else None
        if jobs is None:
            return await self._run(func, args)
        assert account is not None
        token = object()
        try:
            jobs.acquire_on_behalf_of_nowait(token)
        except anyio.WouldBlock:
            await jobs.acquire_on_behalf_of(token)
        try:
            ok, value, seconds = await self._run(timed, (func, args))
        finally:
            jobs.release_on_behalf_of(token)
        account.charge(seconds)
        if not ok:
            raise value
        result: T = value
        return result

    async def _run(self, func: Callable[..., T], args: tuple[Any, ...]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        limiter = self.limiter
        try:
            limiter.acquire_on_behalf_of_nowait(future)
        except anyio.WouldBlock:
            # Every thread of this root is busy (or hung): wait for one, cancellably.
            await limiter.acquire_on_behalf_of(future)
        try:
            self._ensure_thread()
            with anyio.CancelScope(shield=True):
                # The thread needs the GIL, which this one lets go of only once the
                # loop waits: queue the job as late as possible.
                self._jobs.put((func, args, loop, future))
                result = await future
        finally:
            limiter.release_on_behalf_of(future)
        return result

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                return
            self._threads += 1
        # Before the job is queued: a job must not wait for a thread that never came
        # (to run, much later, for a caller long gone).
        try:
            threading.Thread(
                target=self._work, name=f"flightlogd disk {self.name}", daemon=True
            ).start()
        except BaseException:
            with self._lock:
                self._threads -= 1
            raise

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


def timed(func: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any, float]:
    """Whether ``func(*args)`` returned, what it returned or raised, and the thread's
    time it took."""
    began = time.thread_time()
    try:
        result: Any = func(*args)
    except BaseException as exc:  # handed to the caller, whatever it is
        return False, exc, time.thread_time() - began
    return True, result, time.thread_time() - began


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class Disks:
    """The :class:`Disk` of each data root, made on first use, and apart from it the
    root's threads for tails' reads: a writer's fsync never waits behind a reader."""

    def __init__(self) -> None:
        self._disks: dict[str, Disk] = {}
        self._readers: dict[str, Disk] = {}

    def __call__(self, root: str) -> Disk:
        """The threads of the root's writers: create, open, write, fsync."""
        disk = self._disks.get(root)
        if disk is None:
            disk = self._disks[root] = Disk(root, anyio.CapacityLimiter(DISK_THREADS))
        return disk

    def reader(self, root: str) -> Disk:
        """The threads of the root's tails, :data:`READER_THREADS` at most."""
        disk = self._readers.get(root)
        if disk is None:
            disk = self._readers[root] = Disk(
                f"{root} (tails)", anyio.CapacityLimiter(READER_THREADS)
            )
        return disk


# ----------------------------------------------------------------------- Poller


class Poller:
    """One epoll set of the daemon's own, watched by the event loop as one descriptor.

    A descriptor stays in it while its owner wants to be told it is readable, so
    nothing is registered per read (docs/benchmarks.md); :meth:`unwatch` takes it out
    at once.  Holds (:meth:`hold`) end on a :class:`TimerFd` in the same set.
    Everything runs as loop callbacks: there is nothing to cancel.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._epoll = select.epoll()
        self._readers: dict[int, Callable[[], object]] = {}
        self._timer = TimerFd()
        # (deadline, release) in deadline order: every hold lasts the same window.
        self._holds: collections.deque[tuple[float, Callable[[], object]]] = collections.deque()
        self.watch(self._timer.fd, self._release_holds)
        self._loop.add_reader(self._epoll.fileno(), self._dispatch)

    def watch(self, fd: int, on_readable: Callable[[], object]) -> None:
        self._watch(fd, select.EPOLLIN, on_readable)

    def watch_hangup(self, fd: int, on_hangup: Callable[[], object]) -> None:
        """Call ``on_hangup`` (instead of what :meth:`watch` gave) once the peer of
        the socket ``fd`` has shut its sending side, and for as long as ``fd`` stays
        watched: nothing for bytes that arrive."""
        self._watch(fd, select.EPOLLRDHUP, on_hangup)

    def _watch(self, fd: int, events: int, call: Callable[[], object]) -> None:
        if fd in self._readers:
            self._epoll.modify(fd, events)
        else:
            self._epoll.register(fd, events)
        self._readers[fd] = call

    def unwatch(self, fd: int) -> None:
        if self._readers.pop(fd, None) is not None:
            self._epoll.unregister(fd)

    def hold(self, seconds: float, release: Callable[[], object]) -> None:
        """Call ``release`` in ``seconds``."""
        deadline = time.monotonic() + seconds
        if not self._holds:
            self._timer.fire_at(deadline)
        self._holds.append((deadline, release))

    def _release_holds(self) -> None:
        self._timer.clear()
        holds = self._holds
        now = time.monotonic()
        while holds and holds[0][0] <= now:
            holds.popleft()[1]()
        if holds:
            self._timer.fire_at(holds[0][0])

    def _dispatch(self) -> None:
        readers = self._readers
        for fd, _ in self._epoll.poll(0, 256):
            on_readable = readers.get(fd)
            if on_readable is not None:
                on_readable()

    def close(self) -> None:
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
        self._timer.close()
        self._readers.clear()
        self._holds.clear()

    def __enter__(self) -> Poller:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------- TimerFd

_CLOCK_MONOTONIC = 1  # the clock of time.monotonic()
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)
_timerfd_create = _libc.timerfd_create
_timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
_timerfd_create.restype = ctypes.c_int
_timerfd_settime = _libc.timerfd_settime
_timerfd_settime.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(_Itimerspec),
    ctypes.POINTER(_Itimerspec),
]
_timerfd_settime.restype = ctypes.c_int


def _check(result: int) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


class TimerFd:
    """A one-shot Linux timer on CLOCK_MONOTONIC, a descriptor that becomes readable
    at a point in time; read it (:meth:`clear`) once it fired.

    The loop's own timers (uvloop's) count whole milliseconds, too coarse for the read
    window, a fraction of one.  Python gains ``os.timerfd_create`` only in 3.13; this is
    the same two system calls through ctypes.
    """

    def __init__(self) -> None:
        self.fd = _check(_timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC))
        self._spec = _Itimerspec()

    def fire_at(self, deadline: float) -> None:
        """Become readable at ``deadline`` (a :func:`time.monotonic` value)."""
        seconds = int(deadline)
        value = self._spec.it_value
        value.tv_sec = seconds
        value.tv_nsec = int((deadline - seconds) * 1e9)
        _check(_timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None))

    def clear(self) -> None:
        """Take the expiration, so the descriptor is no longer readable."""
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)

    def close(self) -> None:
        os.close(self.fd)
