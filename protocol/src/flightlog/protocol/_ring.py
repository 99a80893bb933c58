"""A ring of shared memory that carries a client's byte stream to the daemon.

Theory of operation (docs/protocol.md, "The ring"; docs/architecture.md): the daemon
makes a buffer of shared memory per connection and passes it with its Welcome; from
then on the client writes its frames into it instead of its socket.  The ring is a
byte stream like the socket was: the client copies bytes in and publishes how far it
wrote, the daemon copies them out into the connection's frame decoder and publishes
how far it read.  A frame may wrap around the end of the data area, and one larger
than the free room goes in pieces, each published as it is copied.

Layout, in bytes (every field an aligned 8-byte word, each side's on cache lines of
its own, so every store is one aligned store that never shares a line with the other
side's)::

    0    MAGIC, then the data area's size (written once by the daemon)
    64   head: the daemon's read position
    128  tail: the client's write position; at 136, waiting: non-zero while
         the client waits for room
    192  asleep: while the daemon waits for a poke, the number of that wait
         (they count up from 1); zero while it is awake
    256  the data area (a power of two bytes)

Positions count bytes from the start of the stream and only grow; a byte at position
``p`` lives at ``p % size`` of the data area.  The client has ``size - (tail - head)``
bytes of room.

Wake-ups are Dekker's: the client stores ``tail``, runs a full fence and reads
``asleep``, poking the daemon (a byte on the socket) only when it is set; the daemon
stores ``asleep``, runs a full fence and reads ``tail`` again before it waits.  One of
the two sees the other's store, so a published byte is never left unseen.  The client
pokes once per wait: a wait it poked already ends on that poke's byte (the daemon then
takes all there is), so its later publishes during the same wait need no poke.  Each
wait has a number of its own for this, so a new wait is never taken for one poked.  Room is
told the same way the other way round: a client with no room stores ``waiting``, runs
a fence and reads ``head`` again before it waits on the eventfd passed with the ring;
the daemon stores ``head``, runs a fence and reads ``waiting``, and signals the
eventfd when it is set (:meth:`RingReader.wanted`).  Python has no fence of its own:
the ends use the acquire and release of an uncontended ``threading.Lock``, which on
Linux with glibc is an atomic read-modify-write (a ``lock``-prefixed instruction on
x86-64, a full fence there); the owner passes the lock in (:class:`FenceLock`).
:func:`ring_supported` says where that holds; elsewhere the socket carries
everything.

This module holds the layout and the two ends' arithmetic over a buffer the owner
maps; it does no I/O.  Neither end trusts what the other writes in the buffer.
:class:`RingReader` reads ``tail`` once per drain and checks it (it only grows, and is
never more than ``size`` ahead of ``head``), and copies the bytes out before they are
decoded, since the client may rewrite them afterwards; ``head`` and ``asleep`` are
kept by the daemon on its side and only stored, never read back.  :class:`RingWriter`
takes a ring only as laid out new (the magic, a power-of-two ``size`` its mapping
holds, ``head`` and ``tail`` 0), keeps ``tail`` on its side, and reads each of the
daemon's words once into a local before it uses it: ``head`` must lie between the
last ``head`` it read and its own ``tail`` (it only grows, and never passes what was
published), or :class:`RemoteProtocolError` (``bad_message``) is raised and nothing
is written; ``asleep`` is only compared, so any value is harmless.  So no header a
daemon writes, at any moment, makes the writer copy outside the data area.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol, cast

from ._accel import CRingWriter
from ._errors import ErrorCode, RemoteProtocolError

__all__ = [
    "DEFAULT_RING_SIZE",
    "MAX_RING_SIZE",
    "MIN_RING_SIZE",
    "RING_HEADER",
    "FenceLock",
    "RingReader",
    "RingWriter",
    "ring_supported",
    "ring_writer",
]

#: Bytes of the header before the data area.
RING_HEADER: Final = 256
#: The data area's size the daemon makes by default.
DEFAULT_RING_SIZE: Final = 512 * 1024
#: The smallest and the largest data area a daemon makes (``flightlogd --ring-size``);
#: a client maps none larger, which would hold as much of its memory.
MIN_RING_SIZE: Final = 4096
MAX_RING_SIZE: Final = 64 * 1024 * 1024
#: The first word of a ring: "flightlo" as a little-endian word.
MAGIC: Final = int.from_bytes(b"flightlo", "little")

# Word indexes (8-byte words) of the header's fields.
_MAGIC, _SIZE, _HEAD, _TAIL, _WAITING, _ASLEEP = 0, 1, 8, 16, 17, 24


class FenceLock(Protocol):
    """What the ring's ends take as their fence: a lock whose uncontended acquire and
    release run a full memory fence (the owner's ``threading.Lock``, where
    :func:`ring_supported` says so)."""

    def acquire(self) -> bool: ...

    def release(self) -> None: ...


def ring_supported(system: str, machine: str, lock: str | None) -> bool:
    """Whether an uncontended lock is a full fence: on Linux (``system``, as
    ``sys.platform``) on x86-64 (``machine``, as ``platform.machine()``), where
    CPython's lock (``lock``, as ``sys.thread_info.lock``) is a glibc semaphore or
    mutex, both taken with a locked instruction."""
    return (
        system == "linux" and machine in ("x86_64", "AMD64") and lock in ("semaphore", "mutex+cond")
    )


_Feed = Callable[[memoryview], None]


def _words(buf: memoryview) -> memoryview:
    return buf[:RING_HEADER].cast("Q")


class RingWriter:
    """The client's end: copies bytes into the data area and publishes them.

    ``buf`` is the whole mapping, header included, as the daemon laid it out;
    :class:`ValueError` if it is not a ring; ``fence``: see :class:`FenceLock`.
    :meth:`write` copies what fits and returns how many bytes it took; the caller
    pokes when :meth:`write` says so and waits for room when it took less than it was
    given.
    """

    __slots__ = (
        "_acquire",
        "_data",
        "_head",
        "_mask",
        "_poked",
        "_release",
        "_tail",
        "_words",
        "size",
    )

    def __init__(self, buf: memoryview, fence: FenceLock) -> None:
        if len(buf) < RING_HEADER:
            raise ValueError("a ring's mapping is smaller than its header")
        words = _words(buf)
        size = words[_SIZE]
        why = None
        if (
            words[_MAGIC] != MAGIC
            or size <= 0
            or size & (size - 1)
            or len(buf) != RING_HEADER + size
        ):
            why = "the mapping is not a ring of the size it announces"
        elif words[_HEAD] or words[_TAIL]:
            why = "the ring is not new: its head or tail is not 0"
        if why is not None:
            words.release()  # the owner's mapping can close
            raise ValueError(why)
        self._words = words
        self._data = buf[RING_HEADER:]
        self.size = size
        self._mask = size - 1
        self._tail = 0
        self._head = 0
        self._acquire = fence.acquire
        self._release = fence.release
        #: The daemon's wait this end poked last (``asleep`` then).
        self._poked = 0

    @property
    def room(self) -> int:
        """Bytes that can be written now (the daemon's ``head`` read again).

        Raises :class:`RemoteProtocolError` (``bad_message``) when ``head`` went back
        or passed ``tail``: the daemon broke the ring.
        """
        head = self._words[_HEAD]
        if not self._head <= head <= self._tail:
            raise RemoteProtocolError(
                f"the ring's head {head} is not between its last head {self._head}"
                f" and its tail {self._tail}",
                code=ErrorCode.BAD_MESSAGE,
            )
        self._head = head
        return self.size - (self._tail - head)

    def write(self, data: bytes | memoryview) -> tuple[int, bool]:
        """Copy as much of ``data`` as fits and publish it: (bytes taken, whether the
        daemon sleeps in a wait not poked yet, and must be poked now).

        Raises :class:`RemoteProtocolError` as :attr:`room` does (nothing written)."""
        size = self.size
        tail = self._tail
        room = size - (tail - self._head)
        n = len(data)
        if room < n:
            room = self.room
            if room <= 0:
                return 0, False
            if room < n:
                data = memoryview(data)[:room]
                n = room
        start = tail & self._mask
        end = start + n
        if end <= size:
            self._data[start:end] = data
        else:
            first = size - start
            self._data[start:] = data[:first]
            self._data[: end - size] = data[first:]
        self._tail = tail = tail + n
        words = self._words
        words[_TAIL] = tail
        self._acquire()
        self._release()
        return n, self.poke_due()

    def poke_due(self) -> bool:
        """Whether the daemon sleeps in a wait not poked yet (noted as poked now)."""
        asleep = self._words[_ASLEEP]
        if asleep == 0 or asleep == self._poked:
            return False
        self._poked = asleep
        return True

    def wait(self) -> int:
        """Say the client waits for room; the room there is now (if any, it need not
        wait).  :meth:`waited` when done.  Raises as :attr:`room` does."""
        self._words[_WAITING] = 1
        self._acquire()
        self._release()
        return self.room

    def waited(self) -> None:
        """The client waits for room no more."""
        self._words[_WAITING] = 0

    def release(self) -> None:
        """Let go of the mapping (the views into it)."""
        self._words.release()
        self._data.release()


def ring_writer(buf: memoryview, fence: FenceLock) -> RingWriter:
    """The client's end of the ring in ``buf``: the C one (:mod:`._accel`, the same
    methods and answers, with a fence of its own) when built, else :class:`RingWriter`."""
    if CRingWriter is not None:
        return cast(RingWriter, CRingWriter(buf))
    return RingWriter(buf, fence)


class RingReader:
    """The daemon's end: lays out a ring in ``buf`` (zeroed, ``RING_HEADER + size``
    bytes) and takes what the client published.  ``fence``: see :class:`FenceLock`."""

    __slots__ = ("_asleep", "_data", "_fence", "_head", "_mask", "_waits", "_words", "size")

    def __init__(self, buf: memoryview, size: int, fence: FenceLock) -> None:
        if size <= 0 or size & (size - 1) or len(buf) != RING_HEADER + size:
            raise ValueError("a ring's size is a power of two and its buffer holds it")
        words = _words(buf)
        words[_SIZE] = size
        words[_MAGIC] = MAGIC
        self._words = words
        self._data = buf[RING_HEADER:]
        self.size = size
        self._mask = size - 1
        self._head = 0
        self._asleep = False
        self._waits = 0  # the number of the last wait, stored in ``asleep``
        self._fence = fence

    @property
    def pending(self) -> bool:
        """Whether the client published bytes not taken yet (no check: :meth:`take`
        does that)."""
        return self._words[_TAIL] != self._head

    @property
    def published(self) -> int:
        """Bytes the client published and the daemon did not take yet, within
        ``0 .. size`` whatever the client wrote (:meth:`take` refuses a bad ``tail``)."""
        return min(max(self._words[_TAIL] - self._head, 0), self.size)

    def take(self, feed: _Feed, limit: int) -> int:
        """Hand up to ``limit`` published bytes to ``feed`` (which copies them: a
        view into the mapping is only valid during the call), publish the new
        ``head`` and return how many there were.

        Raises :class:`RemoteProtocolError` (``bad_message``) when ``tail`` went
        back or is more than ``size`` ahead: the client broke the ring.
        """
        tail = self._words[_TAIL]
        head = self._head
        ahead = tail - head
        if ahead == 0:
            return 0
        if ahead < 0 or ahead > self.size:
            raise RemoteProtocolError(
                f"the ring's tail {tail} is not within {self.size} bytes after its head {head}",
                code=ErrorCode.BAD_MESSAGE,
            )
        n = min(ahead, limit)
        size = self.size
        start = head & self._mask
        end = start + n
        data = self._data
        if end <= size:
            feed(data[start:end])
        else:
            feed(data[start:])
            feed(data[: end - size])
        self._head = head = head + n
        self._words[_HEAD] = head
        return n

    def wanted(self) -> bool:
        """After a :meth:`take`: whether the client waits for the room it made (to be
        told through the eventfd).  Only a hint: a client can say so always, and
        costs itself a wake-up per take."""
        self._fence.acquire()
        self._fence.release()
        return self._words[_WAITING] != 0

    def sleep(self) -> bool:
        """Say the daemon waits for a poke; whether bytes came meanwhile (then it
        does not wait, and is awake again)."""
        words = self._words
        self._waits += 1
        words[_ASLEEP] = self._waits
        self._asleep = True
        self._fence.acquire()
        self._fence.release()
        if words[_TAIL] != self._head:
            self.wake()
            return True
        return False

    def wake(self) -> None:
        """Say the daemon is awake: the client does not poke."""
        if self._asleep:
            self._asleep = False
            self._words[_ASLEEP] = 0

    def hang_up(self) -> None:
        """The daemon reads no more: ``asleep`` stays set (a wait of its own), so the
        client pokes at its next publish and learns from the failed poke that the
        connection is over."""
        self._waits += 1
        self._words[_ASLEEP] = self._waits
        self._asleep = False  # wake() leaves it set

    def release(self) -> None:
        """Let go of the views into the mapping."""
        self._words.release()
        self._data.release()
