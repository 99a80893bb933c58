"""A connection's socket, read and written from event-loop callbacks.

Connections are watched for reading by the daemon's :class:`~._primitives.Poller`.  A
socket stays in its epoll set as long as the connection wants bytes: each time it is
readable, :meth:`Channel._on_readable` reads what is there into the frame decoder and
wakes the connection's task, once per burst (why not anyio's socket streams:
docs/benchmarks.md).  Reading pauses while the decoder holds more than ``read_size``
bytes the task has not taken: that, and the connection's own budget of bytes handed to
actors, is the backpressure a client feels as a full socket buffer.  A paused socket
is out of the epoll set, so data arriving meanwhile wakes nobody.

Writes go straight to the socket when nothing is queued before them (a reply costs one
``send`` and no task switch), and the rest is queued and written when the socket is
writable again.  A failed write only ends writing: the read side goes on to the end of
the stream, so whatever the client sent before it went away still lands.

A disk thread may write too (:class:`ThreadWrite`: a reply right after its fsync); a
lock orders its write with the loop's, and nothing is written to a closed socket.

A send waits for room in the queue at most ``send_timeout``: a client that takes
nothing for that long is not read from or written to any more (:meth:`Channel._stall`),
so nothing in the daemon waits on it without a bound.

Cancellation (see :mod:`._primitives`): a cancelled :meth:`Channel.send` writes nothing
of its message; a cancelled :meth:`Channel.wait_readable` loses no bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any

from flightlog.protocol import FrameDecoder

from ._budget import ConnectionBudget
from ._primitives import Poller

__all__ = ["Channel", "ThreadWrite"]


class Channel:
    """Reads into ``decoder`` and writes with a queue bounded by ``queue_bytes``."""

    def __init__(
        self,
        sock: socket.socket,
        poller: Poller,
        decoder: FrameDecoder[Any],
        *,
        read_size: int,
        queue_bytes: int,
        send_timeout: float,
        budget: ConnectionBudget,
    ) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._poller = poller
        self._loop = asyncio.get_running_loop()
        self._decoder = decoder
        self._read_size = read_size
        self._budget = budget
        #: Bytes read into the decoder and charged to the budget, not yet settled.
        self._in_decoder = 0
        self._budget_timer: asyncio.TimerHandle | None = None
        self._reading = False
        self._held = False
        #: Whether the client sent more while its socket was held (the last hold).
        self.streaming = False
        self._reads = 0
        #: Bytes read from the socket so far.
        self.bytes_read = 0
        self._news = False
        self._waiter: asyncio.Future[None] | None = None
        #: Reading ended: at the end of the stream (read_error None) or on an error.
        self.read_ended = False
        self.read_error: OSError | None = None
        self._queue = bytearray()
        self._queue_bytes = queue_bytes
        self._send_timeout = send_timeout
        #: A send waited ``send_timeout`` for room: the client reads nothing, so writing
        #: ended (what was queued is dropped) and the read side was shut down.
        self.stalled = False
        self._writing = False  # registered for writability
        self._room = asyncio.Event()  # set whenever the queue shrinks or ends
        self._send_lock = asyncio.Lock()
        self.write_ended = False
        # The send side (socket and queue): the loop's writes and a disk thread's.
        self._write_lock = threading.Lock()
        self._closed = False

    @property
    def queued(self) -> int:
        """Bytes written by the connection and not yet taken by the socket."""
        return len(self._queue)

    # ------------------------------------------------------------------ reading

    def resume_reading(self) -> None:
        if not self._reading and not self._held and not self.read_ended and not self._closed:
            if not self._budget.may_read():
                self._wait_for_budget()
                return
            self._reading = True
            self._poller.watch(self._fd, self._on_readable)

    def _wait_for_budget(self) -> None:
        """Not read until the daemon's memory budget has room; cut off if that takes
        longer than ``send_timeout`` (whoever holds the budget then gets on)."""
        self._budget.wait(self, self._budget_room)
        if self._budget_timer is None:
            self._budget_timer = self._loop.call_later(self._send_timeout, self._budget_expired)

    def _budget_room(self) -> None:
        if self._budget_timer is not None:
            self._budget_timer.cancel()
            self._budget_timer = None
        self.resume_reading()

    def _budget_expired(self) -> None:
        self._budget_timer = None
        self._budget.forget(self)
        self._end_reading(
            TimeoutError(
                f"not read for {self._send_timeout:g} s: the daemon's memory budget is spent"
            )
        )

    def settle(self) -> None:
        """The connection took messages from the decoder: their bytes leave the budget
        (handed to actors, they are charged again by the connection)."""
        taken = self._in_decoder - self._decoder.buffered
        if taken:
            self._in_decoder -= taken
            self._budget.discharge(taken)

    def _pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._poller.unwatch(self._fd)

    def hold_reading(self, seconds: float) -> None:
        """Stop watching the socket for ``seconds``: what the client sends meanwhile
        waits in the socket buffer, where it is as safe from the client's crash as in
        the daemon, and costs the client no wake-up of the daemon."""
        if self._reading and not self._held:
            self._pause_reading()
            self._held = True
            self._poller.hold(seconds, self._release_hold)

    def _release_hold(self) -> None:
        self._held = False
        if self._closed:
            return
        self.resume_reading()
        reads = self._reads
        self._on_readable()
        self.streaming = self._reads != reads

    def _on_readable(self) -> None:
        """Read what is there."""
        try:
            data = self._sock.recv(self._read_size)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._end_reading(exc)
            return
        if not data:
            self._end_reading(None)
            return
        self._reads += 1
        self.bytes_read += len(data)
        self._decoder.feed(data)
        self._in_decoder += len(data)
        self._budget.charge(len(data))
        if self._decoder.buffered >= self._read_size:
            self._pause_reading()
        elif not self._budget.may_read():
            self._pause_reading()
            self._wait_for_budget()
        self._wake()

    def _end_reading(self, error: OSError | None) -> None:
        self._pause_reading()
        self.read_ended = True
        self.read_error = error
        self._wake()

    def _wake(self) -> None:
        self._news = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_readable(self) -> None:
        """Wait until bytes were read into the decoder, or reading ended, since the
        last call.  Resumes reading first if it was paused."""
        self.resume_reading()
        while not self._news:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._news = False

    def shutdown_read(self) -> None:
        """Shut the socket's read side: what the client already sent is still read,
        then the end of the stream; the client's later sends fail."""
        self._sock.shutdown(socket.SHUT_RD)

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        """Send ``data`` now, or queue it behind what is already queued; never waits.
        Dropped once writing has ended."""
        if self.write_ended or self._closed:
            return
        with self._write_lock:
            if self._queue:
                self._queue += data
                return
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._end_writing()
                return
            if sent < len(data):
                self._queue += memoryview(data)[sent:]
                self._start_writing()

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes may be queued now: always into an empty queue."""
        return not self._queue or len(self._queue) + size <= self._queue_bytes

    async def send(self, data: bytes) -> None:
        """:meth:`write`, after waiting (first come, first served) while the queue has
        no room for it."""
        if not self._send_lock.locked() and self.fits(len(data)):
            self.write(data)
            return
        async with self._send_lock:
            loop = self._loop
            deadline = loop.time() + self._send_timeout
            timer = loop.call_at(deadline, self._make_room)
            try:
                while not self.write_ended and not self._closed and not self.fits(len(data)):
                    if loop.time() >= deadline:
                        self._stall()
                        return
                    self._room.clear()
                    await self._room.wait()
            finally:
                timer.cancel()
            self.write(data)

    def _stall(self) -> None:
        """The client took nothing for ``send_timeout``: give up writing to it, and
        shut the read side, so what it sent already still lands and its later sends
        fail instead of waiting for replies that cannot come."""
        self.stalled = True
        self.abandon_writing()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RD)

    def thread_write(self, data: bytes) -> ThreadWrite | None:
        """``data``, to be written from a disk thread (see :class:`ThreadWrite`); None
        once writing has ended."""
        if self.write_ended or self._closed:
            return None
        return ThreadWrite(self, data)

    def _write_from_thread(self, data: bytes) -> tuple[int, OSError | None]:
        """In a disk thread: send ``data`` now, or queue it behind what is queued.
        The loop registers for writability later (:meth:`_thread_write_done`)."""
        with self._write_lock:
            if self.write_ended or self._closed:
                return 0, None
            sent = 0
            if not self._queue:
                try:
                    while sent < len(data):
                        sent += self._sock.send(data[sent:] if sent else data)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as exc:
                    return sent, exc
            if sent < len(data):
                self._queue += memoryview(data)[sent:]
            return sent, None

    def _thread_write_done(self, error: OSError | None) -> None:
        with self._write_lock:
            if error is not None:
                self._end_writing()
            elif self._queue and not self._closed:
                self._start_writing()

    def _on_writable(self) -> None:
        with self._write_lock:
            try:
                sent = self._sock.send(self._queue)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._end_writing()
                return
            del self._queue[:sent]
            if not self._queue:
                self._stop_writing()
        self._make_room()

    def _start_writing(self) -> None:
        if not self._writing and not self.write_ended:
            self._writing = True
            self._loop.add_writer(self._fd, self._on_writable)

    def _stop_writing(self) -> None:
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)

    def _make_room(self) -> None:
        self._room.set()

    def abandon_writing(self) -> None:
        """Drop what is queued and every later write; whoever waits to send returns."""
        with self._write_lock:
            self._end_writing()

    def _end_writing(self) -> None:
        self.write_ended = True
        self._queue.clear()
        self._stop_writing()
        self._make_room()

    async def flush(self) -> None:
        """Wait until the queue is written, or writing has ended."""
        while self._queue and not self.write_ended and not self._closed:
            self._room.clear()
            await self._room.wait()

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        if self._closed:
            return
        with self._write_lock:  # a disk thread never writes to a closed socket
            self._closed = True
            self._pause_reading()
            self._stop_writing()
            self._queue.clear()
            with contextlib.suppress(OSError):
                self._sock.close()
        if self._budget_timer is not None:
            self._budget_timer.cancel()
        self._budget.forget(self)
        self._budget.discharge(self._in_decoder)
        self._in_decoder = 0
        self._make_room()


class ThreadWrite:
    """Bytes a disk thread writes to a channel's socket, right after its job.

    :meth:`send` runs in the thread (at most once): the bytes go out at once when
    nothing is queued before them, else they are queued behind it, like
    :meth:`Channel.write` would; a closed channel takes nothing.  :meth:`end` runs on
    the loop afterwards, always (whether or not :meth:`send` ran), and has the loop
    write what the socket did not take."""

    __slots__ = ("_channel", "data", "error", "sent")

    def __init__(self, channel: Channel, data: bytes) -> None:
        self._channel = channel
        self.data = data
        self.sent: int | None = None  # None: send() did not run
        self.error: OSError | None = None

    def send(self) -> None:
        """Write or queue the bytes (in the disk thread)."""
        self.sent, self.error = self._channel._write_from_thread(self.data)

    def end(self) -> bool:
        """Back on the loop: whether :meth:`send` ran."""
        if self.sent is None:
            return False
        self._channel._thread_write_done(self.error)
        return True
