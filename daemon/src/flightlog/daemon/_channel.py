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
lock orders its write with the loop's, nothing is written to a closed socket, and
what does not fit in the queue is left for the loop to send, waiting for room.

A send waits for room in the queue at most ``send_timeout``: a client that takes
nothing for that long is not read from or written to any more (:meth:`Channel._stall`),
so nothing in the daemon waits on it without a bound.

A connection whose client asked for a ring (docs/protocol.md, "The ring") reads its
frames from shared memory instead (:meth:`Channel.attach_ring`): the ring is another
source of bytes for the same decoder, under the same pauses, holds and budget.  From
then on what the socket brings are pokes, read and dropped, and its end; the ring is
taken from whenever the socket is read, when a hold ends, when reading resumes and
right before the connection's task would wait.  Before it waits the channel tells the
client it sleeps (:meth:`~flightlog.protocol.RingReader.sleep`), so the next publish
pokes it; a hold or a pause leaves the flag clear, so a streaming client pokes
nobody.  A timer of :data:`RING_RECHECK` seconds after each sleep looks at the ring
once more: a missed wake-up would cost that much latency, never a record.  At the end
of the stream, the ring is taken to its end first: what the client published before
it died still lands.  A client that waits for room (the ring full) is told of it
through an eventfd passed with the ring, after each take that finds it waiting.  At
the end the ring says it sleeps for good, so a client still alive
(the daemon shut its read side) pokes at its next publish and fails there, as its
next send on the socket would.  A ``tail`` the client wrote that cannot be (behind ``head``, or
more than the ring ahead) ends reading with a :class:`RemoteProtocolError`.  When the
channel closes it gives the ring's pages back (``MADV_REMOVE``), whether or not the
client still holds the memfd: the ring's memory lives no longer than its connection.

Cancellation (see :mod:`._primitives`): a cancelled :meth:`Channel.send` writes nothing
of its message; a cancelled :meth:`Channel.wait_readable` loses no bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import mmap
import os
import socket
import sys
import termios
import threading
from typing import Any, Final

from flightlog.protocol import (
    RemoteProtocolError,
)
from flightlog.protocol.ring import (
    RING_HEADER,
    RingReader,
)
from flightlog.protocol.wire import (
    FrameDecoder,
)

from ._budget import ConnectionBudget
from ._primitives import Poller

__all__ = ["RING_RECHECK", "Channel", "ThreadWrite"]

#: Seconds after the channel went to sleep on a ring that it looks at it once more.
RING_RECHECK: Final = 0.005
#: Bytes of pokes read at once from a ring's socket, and read before the task, which
#: paces its uid, has run again.
_POKES = 4096
#: The rings' fence (flightlog.protocol.ring.FenceLock): never held, so never contended.
_FENCE = threading.Lock()


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
        #: Watched for the client's hang-up alone (while it waits for the budget).
        self._hangup_watched = False
        self._held = False
        #: Whether the client sent more while its socket was held (the last hold).
        self.streaming = False
        self._reads = 0
        #: Bytes read from the socket (or the ring) so far, pokes included.
        self.bytes_read = 0
        #: Bytes of pokes read since the task last waited.
        self._pokes = 0
        self._news = False
        self._waiter: asyncio.Future[None] | None = None
        #: Reading ended: at the end of the stream (read_error None) or on an error.
        self.read_ended = False
        self.read_error: OSError | RemoteProtocolError | None = None
        self._ring: RingReader | None = None
        self._mapping: mmap.mmap | None = None
        #: The ring's memfd, until it is passed with the next write.
        self._pass_fd: int | None = None
        #: The eventfd the client waits on for room in its ring.
        self._room_fd = -1
        self._recheck: asyncio.TimerHandle | None = None
        self._queue = bytearray()
        #: Bytes of the queue charged to the budget (settled on the loop).
        self._queue_charged = 0
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
            self._hangup_watched = False  # watch() replaces that
            self._poller.watch(self._fd, self._on_readable)
            if self._ring is not None:
                self._take_ring()

    def _wait_for_budget(self) -> None:
        """Not read until the daemon's memory budget has room; cut off if that takes
        longer than ``send_timeout`` (whoever holds the budget then gets on).  A
        client that hangs up meanwhile is seen at once (:meth:`_on_hangup`)."""
        self._budget.wait(self, self._budget_room)
        if self._budget_timer is None:
            self._budget_timer = self._loop.call_later(self._send_timeout, self._budget_expired)
        if not self._hangup_watched:
            self._hangup_watched = True
            self._poller.watch_hangup(self._fd, self._on_hangup)

    def _budget_room(self) -> None:
        if self._budget_timer is not None:
            self._budget_timer.cancel()
            self._budget_timer = None
        self.resume_reading()

    def _on_hangup(self) -> None:
        """The client shut its sending side while the channel waits for the budget.
        When what is left to read (in the socket, or the ring) cannot complete the
        frame the decoder holds the start of, no message can come any more: the
        stream ends now, and the partial frame's memory goes back with the
        connection, instead of staying until the budget lets the channel read (or
        ``send_timeout`` cuts it off), while every other such connection waits too."""
        self._hangup_watched = False
        self._poller.unwatch(self._fd)
        error: OSError | None = None
        try:
            left = self._ring.published if self._ring is not None else _unread(self._sock)
        except OSError as exc:
            left, error = 0, exc
        if left < self._decoder.missing:
            self._budget_stopped()
            self._end_reading(error)

    def _budget_stopped(self) -> None:
        """The channel waits for the budget no more."""
        if self._budget_timer is not None:
            self._budget_timer.cancel()
            self._budget_timer = None
        self._budget.forget(self)

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
            if self._ring is not None:
                # Not asleep: the channel comes back by itself, unpoked.
                self._ring.wake()
                self._cancel_recheck()
        elif self._hangup_watched:
            self._hangup_watched = False
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
        reads = self._reads
        self.resume_reading()
        self._on_readable()
        self.streaming = self._reads != reads

    def _on_readable(self) -> None:
        """Read what is there."""
        if self._ring is not None:
            self._on_poke()
            return
        if not self._budget.may_read():
            # Its uid's other connections filled the room since this one was
            # watched: each of them reads once more at most, not a read each.
            self._pause_reading()
            self._wait_for_budget()
            return
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
        self._decoder.feed(data)
        self._fed(len(data))

    def _end_reading(self, error: OSError | RemoteProtocolError | None) -> None:
        self._pause_reading()
        if self._ring is not None:
            self._ring.hang_up()
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
        if self._ring is not None and not self._news and self._reading and not self._take_ring():
            self._doze()
        while not self._news:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._news = False
        self._pokes = 0

    # ------------------------------------------------------------------ the ring

    def attach_ring(self, fd: int, size: int) -> None:
        """Read from now on from the ring of ``size`` bytes in the memfd ``fd`` (the
        channel's from now: closed once passed), which is passed to the client with
        the next write, with the eventfd that tells it of room.  Raises
        :class:`OSError` if either cannot be made."""
        room = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            mapping = mmap.mmap(fd, RING_HEADER + size)
        except OSError:
            os.close(room)
            raise
        self._ring = RingReader(memoryview(mapping), size, _FENCE)
        self._mapping = mapping
        self._pass_fd = fd
        self._room_fd = room

    def _on_poke(self) -> None:
        """The ring's socket is readable: pokes, or its end."""
        try:
            data = self._sock.recv(_POKES)
        except (BlockingIOError, InterruptedError):
            data = None
        except OSError as exc:
            self._take_ring(last=True)
            self._end_reading(exc)
            return
        if data == b"":
            self._take_ring(last=True)
            self._end_reading(None)
            return
        ring = self._ring
        assert ring is not None
        ring.wake()
        self._cancel_recheck()
        if data:
            # Pokes count as bytes read (the uid's rate paces them), and past a read's
            # worth of them the socket waits for the task, which paces the uid.
            self.bytes_read += len(data)
            self._pokes += len(data)
            if self._pokes >= _POKES:
                self._pause_reading()
                self._wake()
                return
        if not self._take_ring() and self._waiter is not None and self._reading:
            # A poke for bytes taken already: the task still waits, so sleep again.
            self._doze()

    def _doze(self) -> None:
        """Nothing to take, and the task waits: sleep until poked (or rechecked)."""
        ring = self._ring
        assert ring is not None
        if ring.sleep():
            self._take_ring()
        elif self._recheck is None:
            self._recheck = self._loop.call_later(RING_RECHECK, self._on_recheck)

    def _take_ring(self, *, last: bool = False) -> bool:
        """Take what the client published into the decoder; whether there was any.
        ``last``: the stream ended, everything is taken whatever the pauses say."""
        ring = self._ring
        assert ring is not None
        try:
            count = ring.take(self._decoder.feed, ring.size)
        except RemoteProtocolError as exc:
            if not self.read_ended:
                self._end_reading(exc)
            return False
        if not count:
            return False
        if ring.wanted():
            with contextlib.suppress(OSError):
                os.eventfd_write(self._room_fd, 1)
        self._fed(count, pause=not last)
        return True

    def _fed(self, count: int, *, pause: bool = True) -> None:
        """``count`` bytes went into the decoder: charge them, pause reading when the
        decoder or the budget is full (unless ``pause`` is off), and wake the task."""
        self._reads += 1
        self.bytes_read += count
        self._in_decoder += count
        self._budget.charge(count)
        if pause:
            if self._decoder.buffered >= self._read_size:
                self._pause_reading()
            elif not self._budget.may_read():
                self._pause_reading()
                self._wait_for_budget()
        self._wake()

    def _on_recheck(self) -> None:
        self._recheck = None
        ring = self._ring
        if ring is not None and self._reading and ring.pending:
            ring.wake()
            self._take_ring()

    def _cancel_recheck(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None

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
                self._settle_queue()
                return
            try:
                pass_fd = self._pass_fd is not None
                sent = self._send_ring(data) if pass_fd else self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._end_writing()
                return
            if sent < len(data):
                self._queue += memoryview(data)[sent:]
                self._start_writing()
        self._settle_queue()

    def _settle_queue(self) -> None:
        """Charge the budget with what the queue holds now (on the loop): unsent
        replies are memory the client makes the daemon hold."""
        change = len(self._queue) - self._queue_charged
        if change:
            self._queue_charged += change
            if change > 0:
                self._budget.charge(change)
            else:
                self._budget.discharge(-change)

    def _send_ring(self, data: bytes) -> int:
        """Send ``data`` with the ring's memfd attached (SCM_RIGHTS), then close it
        here: the mapping stays."""
        fd, self._pass_fd = self._pass_fd, None
        assert fd is not None
        try:
            return socket.send_fds(self._sock, [data], [fd, self._room_fd])
        finally:
            os.close(fd)

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

    def _write_from_thread(self, data: bytes) -> tuple[int | None, OSError | None]:
        """In a disk thread: send ``data`` now, or queue it behind what is queued if
        it fits (:meth:`fits`) and no send waits for room; else None, and the loop
        sends it (:meth:`send`).  The loop registers for writability later."""
        with self._write_lock:
            if self.write_ended or self._closed:
                return 0, None
            if self._send_lock.locked() or not self.fits(len(data)):
                return None, None
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
        self._settle_queue()

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
                # An emptied queue lets its buffer go (a bytearray keeps its largest
                # size): megabytes of replies once queued are not kept for ever.
                self._queue = bytearray()
        self._settle_queue()
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
        self._queue = bytearray()
        self._settle_queue()
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
        self._budget_stopped()
        self._close_ring()
        # The partial frame read goes now, not whenever the connection's objects are
        # collected (they hold each other): that can take long, and it may be
        # megabytes on each of many connections.
        with contextlib.suppress(RemoteProtocolError):  # a broken decoder keeps it
            buf, _ = self._decoder.pending()
            buf.clear()
            self._decoder.consumed(0)
        self._budget.discharge(self._in_decoder)
        self._in_decoder = 0
        self._settle_queue()
        self._make_room()

    def _close_ring(self) -> None:
        self._cancel_recheck()
        if self._pass_fd is not None:
            os.close(self._pass_fd)
            self._pass_fd = None
        if self._ring is not None:
            self._ring.release()
            self._ring = None
        if self._mapping is not None:
            # The client may keep the memfd (and its mapping) after hanging up: the
            # pages are given back now, not when it lets go, so that nothing the
            # daemon faulted in outlives the connection it was charged to.  What the
            # client touches afterwards is its own memory.
            with contextlib.suppress(OSError):
                self._mapping.madvise(mmap.MADV_REMOVE)
            self._mapping.close()
            self._mapping = None
        if self._room_fd >= 0:
            os.close(self._room_fd)
            self._room_fd = -1


def _unread(sock: socket.socket) -> int:
    """Bytes in ``sock``'s receive queue."""
    return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(4)), sys.byteorder)


class ThreadWrite:
    """Bytes a disk thread writes to a channel's socket, right after its job.

    :meth:`send` runs in the thread (at most once): the bytes go out at once when
    nothing is queued before them, else they are queued behind it, like
    :meth:`Channel.write` would, within ``queue_bytes``; a closed channel takes
    nothing.  :meth:`end` runs on the loop afterwards, always, and has the loop write
    what the socket did not take; False: the bytes are still to send (no room)."""

    __slots__ = ("_channel", "data", "error", "sent")

    def __init__(self, channel: Channel, data: bytes) -> None:
        self._channel = channel
        self.data = data
        self.sent: int | None = None  # None: send() did not run, or left the bytes
        self.error: OSError | None = None

    def send(self) -> None:
        """Write or queue the bytes (in the disk thread)."""
        self.sent, self.error = self._channel._write_from_thread(self.data)

    def end(self) -> bool:
        """Back on the loop: whether :meth:`send` took the bytes."""
        if self.sent is None:
            return False
        self._channel._thread_write_done(self.error)
        return True
