"""The transport seam: how the clients move bytes, and nothing else.

A transport sends bytes, receives them (``b""`` once the daemon closed the
connection), and polls without waiting (``receive_nowait``: None when nothing is
waiting), which lets ``record()`` pick up pushed errors without a round trip.  Socket
failures become :class:`ConnectionLost`; a failed connect becomes
:class:`DaemonNotRunning` or :class:`ConnectError`.

* :class:`SocketTransport`: a plain blocking ``AF_UNIX`` socket, for :class:`Client`.
* :class:`AsyncSocketTransport`: anyio's ``connect_unix``, for :class:`AsyncClient`.

Both ask the daemon for a ring of shared memory (``wants_ring``; docs/protocol.md,
"The ring") unless ``$FLIGHTLOG_RING`` is ``0`` or the machine's fences do not make it
sound (:func:`~flightlog.protocol.ring_supported`).  Until the client has the
daemon's Welcome (:meth:`welcomed`), the socket is read with room for the memfd the
daemon passes with it; from then on ``send`` copies into the ring and publishes
(:class:`~flightlog.protocol.ring.RingWriter`), and writes a poke byte to the socket only
when the daemon said it sleeps.  A ring with no room makes the sender say it waits
and wait on the eventfd the daemon passed with the ring, which it signals once it
took bytes from a ring whose client waits: a full ring holds the sender as a full
socket buffer would.  The wait also ends every :data:`_ROOM_RECHECK` seconds (the
room is looked at again), and when the daemon hangs up (ConnectionLost).  The
socket still carries the daemon's replies and pushes, and the end of the connection
either way.  A ring is mapped only when its memfd is sealed against shrinking and
against changes to its seals and holds the size announced (:func:`_ring_fault`), so
nothing the daemon's side does later can fault the mapping; a ring the writer finds
broken (``head`` out of reach) is refused too, and ends the connection
(ConnectionLost).  A refused ring is logged once, kept in ``ring_refused``, and ends
the connection (before anything but the hello went out, unless it broke later): the
client's reconnect makes a new one, which asks no ring of that socket path again (its
records go by the socket, and the unacknowledged ones are sent again).

The mock transports, a daemon in the same process for tests, are in
:mod:`._mock_transport`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import platform
import select
import socket
import stat
import sys
import threading
from collections.abc import Iterable
from typing import Final, Protocol

import anyio
import anyio.abc
import anyio.lowlevel

from flightlog.protocol import (
    RemoteProtocolError,
)
from flightlog.protocol.ring import (
    MAX_RING_SIZE,
    RING_HEADER,
    RingWriter,
    ring_supported,
    ring_writer,
)

from ._exceptions import ConnectError, ConnectionLost, DaemonNotRunning
from ._trust import check_directory, check_peer, trusted_uids

__all__ = ["AsyncSocketTransport", "AsyncTransport", "SocketTransport", "Transport"]

_CHUNK: Final = 256 * 1024
# Errors that mean nothing listens on the path (as opposed to, say, a permission).
_NOT_LISTENING: Final = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR})
#: Seconds a sender waits for room on the daemon's eventfd before it looks again.
_ROOM_RECHECK: Final = 0.01
_POKE: Final = b"\x00"
#: The rings' fence (flightlog.protocol.ring.FenceLock): never held, so never contended.
_FENCE: Final = threading.Lock()
_RINGS: Final = ring_supported(sys.platform, platform.machine(), sys.thread_info.lock)
#: The seals a ring's memfd must hold before it is mapped: no shrinking (a mapping
#: past the end of the file faults: SIGBUS), and no more changes to the seals.
_RING_SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
#: The descriptors a ring comes with: its memfd and the eventfd that tells of room.
_RING_FDS: Final = 2
#: Why a ring a daemon passed was refused, by socket path: connections made there
#: afterwards ask for none.
_REFUSED_RINGS: dict[str, str] = {}
logger = logging.getLogger("flightlog.sdk")


def wants_ring() -> bool:
    """Whether a new connection asks for a ring: where rings are sound, unless
    ``$FLIGHTLOG_RING`` is ``0``."""
    return _RINGS and os.environ.get("FLIGHTLOG_RING", "1") != "0"


class Transport(Protocol):
    """What :class:`Client` needs to talk to the daemon."""

    #: Whether the hello asks for a ring.
    wants_ring: bool

    def welcomed(self, ring: int) -> None:
        """The Welcome came, announcing a ring of ``ring`` bytes (0: none)."""

    def send(self, data: bytes) -> None:
        """Send all of ``data``, waiting while the daemon does not read."""

    def receive(self) -> bytes:
        """Wait for bytes; ``b""`` when the daemon closed the connection."""

    def receive_nowait(self) -> bytes | None:
        """The bytes already waiting, ``b""`` at the end, None when there are none."""

    def close(self) -> None:
        """Close the connection; sending or receiving afterwards raises ConnectionLost."""


class AsyncTransport(Protocol):
    """What :class:`AsyncClient` needs to talk to the daemon."""

    #: Whether the hello asks for a ring.
    wants_ring: bool

    def welcomed(self, ring: int) -> None:
        """The Welcome came, announcing a ring of ``ring`` bytes (0: none)."""

    async def send(self, data: bytes) -> None:
        """Send all of ``data``; cancelled midway, the transport is closed."""

    async def receive(self) -> bytes:
        """Wait for bytes; ``b""`` when the daemon closed the connection."""

    def receive_nowait(self) -> bytes | None:
        """The bytes already waiting, ``b""`` at the end, None when there are none."""

    async def aclose(self) -> None:
        """Close the connection at once."""


def _connect_failed(path: str, exc: OSError) -> ConnectError:
    if exc.errno in _NOT_LISTENING:
        return DaemonNotRunning(path)
    return ConnectError(f"cannot connect to the flightlog daemon at {path}: {exc.strerror or exc}")


def _lost(exc: BaseException) -> ConnectionLost:
    """The :class:`ConnectionLost` an error of the socket means.

    A :class:`TimeoutError` is raised again as it is: no socket here has a timeout, so it
    is the caller's own (a signal handler's, raised while the client waited), not the
    connection's, and must reach the caller.
    """
    if isinstance(exc, TimeoutError):
        raise exc
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return ConnectionLost(f"the connection to the daemon broke: {reason or type(exc).__name__}")


def _closed() -> ConnectionLost:
    """A send through a ring the transport's close let go of (another thread or task
    closed it meanwhile)."""
    return ConnectionLost("the connection to the daemon is closed")


def _drain(sock: socket.socket, poller: select.poll | None = None) -> bytes | None:
    """Everything the socket holds right now, without waiting.

    With ``poller`` (registered for the socket), an empty socket is found by one cheap
    ``poll`` instead of a ``recv`` that raises: ``record()`` runs it up to once a
    millisecond.
    """
    if poller is not None and not poller.poll(0):
        return None
    chunks: list[bytes] = []
    while True:
        try:
            chunk = sock.recv(_CHUNK, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            break
        except OSError as exc:
            raise _lost(exc) from exc
        chunks.append(chunk)
        if not chunk or len(chunk) < _CHUNK:
            break
    if not chunks:
        return None
    return b"".join(chunks)


def _ring_fault(fd: int, size: int) -> str | None:
    """Why the memfd ``fd``, passed as a ring whose data area is ``size`` bytes, is not
    safe to map (None: it is).  The seals are looked at before the size, which they
    then keep."""
    if size <= 0 or size & (size - 1):
        return f"its announced size {size} is not a power of two"
    if size > MAX_RING_SIZE:
        return f"its announced size {size} is larger than a daemon makes ({MAX_RING_SIZE})"
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        status = os.fstat(fd)
    except OSError as exc:
        return f"its seals cannot be read ({exc.strerror or exc})"
    if seals & _RING_SEALS != _RING_SEALS:
        return f"its memfd is not sealed against shrinking and resealing (seals {seals:#x})"
    if not stat.S_ISREG(status.st_mode) or status.st_size != RING_HEADER + size:
        return f"its memfd holds {status.st_size} bytes, not the {RING_HEADER + size} announced"
    return None


def _room_fault(fd: int) -> str | None:
    """Why ``fd``, passed as the eventfd that tells of room, is not one (None: it is).
    Anything else could fail the read after a wait, or block it (a file on a file
    system that ignores ``O_NONBLOCK``)."""
    try:
        kind = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        # No /proc: an anonymous inode (no file type) at least, whose reads honour
        # O_NONBLOCK; an error from one breaks the ring (_room_told).
        try:
            mode = os.fstat(fd).st_mode
        except OSError as exc:
            return f"its room descriptor cannot be read ({exc.strerror or exc})"
        kind = "anon_inode:[eventfd]" if stat.S_IFMT(mode) == 0 else f"mode {mode:#o}"
    if kind != "anon_inode:[eventfd]":
        return f"its room descriptor is not an eventfd ({kind})"
    return None


class _RingEnd:
    """The ring a socket transport sends through, once the daemon passed one."""

    def __init__(self, sock: socket.socket, ring: bool | None, path: str | None) -> None:
        self._sock = sock
        #: Why a ring the daemon at this path passed was refused (None: none was).
        self.ring_refused = _REFUSED_RINGS.get(path) if path is not None else None
        self.wants_ring = (wants_ring() if ring is None else ring) and self.ring_refused is None
        #: Until welcomed(): descriptors passed with what was received (the first
        #: two; more are closed as they come, and the ring is refused).
        self._awaiting = self.wants_ring
        self._fds: list[int] = []
        self._more_fds = False
        self._ring: RingWriter | None = None
        self._mapping: mmap.mmap | None = None
        #: The daemon's eventfd that tells a sender waiting for room of it.
        self._room_fd = -1

    def _recv_fds(self, flags: int = 0) -> bytes:
        """A receive that keeps the descriptors passed with the bytes (SCM_RIGHTS)."""
        data, fds, _, _ = socket.recv_fds(
            self._sock, _CHUNK, _RING_FDS + 1, flags | socket.MSG_CMSG_CLOEXEC
        )
        for fd in fds:
            if len(self._fds) < _RING_FDS:
                self._fds.append(fd)
            else:
                # However many a peer passes before its Welcome, two are kept.
                self._more_fds = True
                os.close(fd)
        return data

    def welcomed(self, ring: int) -> None:
        """Map the ring the daemon passed with its Welcome, if it announced one."""
        if not self._awaiting:
            return
        self._awaiting = False
        fds, self._fds = self._fds, []
        try:
            if ring:
                if len(fds) != _RING_FDS or self._more_fds:
                    fault: str | None = "it was not passed with its two descriptors"
                else:
                    fault = _ring_fault(fds[0], ring) or _room_fault(fds[1])
                if fault is not None:
                    self._refuse(fault)
                    return
                try:
                    mapping = mmap.mmap(fds[0], RING_HEADER + ring)
                except OSError as exc:
                    self._refuse(f"it cannot be mapped ({exc.strerror or exc})")
                    return
                view = memoryview(mapping)
                try:
                    self._ring = ring_writer(view, _FENCE)
                except ValueError as exc:
                    view.release()  # else the mapping cannot close (BufferError)
                    mapping.close()
                    self._refuse(str(exc))
                    return
                self._mapping = mapping
                self._room_fd = fds.pop()
                # Read after each wait that timed out: never one that blocks.
                os.set_blocking(self._room_fd, False)
        except OSError as exc:
            raise _lost(exc) from exc
        finally:
            for fd in fds:
                os.close(fd)

    def _refuse(self, fault: str) -> None:
        """Refuse the daemon's ring: say why (once per socket path), and end the
        connection, whose stream the daemon reads from the ring now; the reconnect asks
        for none."""
        self.ring_refused = fault
        path = getattr(self, "path", None)
        if isinstance(path, str) and path not in _REFUSED_RINGS:
            _REFUSED_RINGS[path] = fault
            logger.warning(
                "flightlog refused the ring of shared memory the daemon at %s passed (%s); "
                "the connection is made again and records go by the socket",
                path,
                fault,
            )
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def _broken(self, exc: RemoteProtocolError) -> ConnectionLost:
        """The daemon's side wrote a header the ring's writer refused: the ring is
        refused (as :meth:`_refuse`), and the connection is lost."""
        self._refuse(f"its header broke: {exc.message}")
        return ConnectionLost(f"the daemon broke the ring: {exc.message}")

    def _broken_room(self, exc: OSError) -> ConnectionLost:
        """The eventfd that tells of room failed to be read: the ring is refused (as
        :meth:`_refuse`), and the connection is lost."""
        reason = exc.strerror or str(exc) or type(exc).__name__
        self._refuse(f"its room descriptor cannot be read ({reason})")
        return ConnectionLost(f"the daemon broke the ring: {reason}")

    def _poke(self) -> None:
        """Wake the daemon: one byte on the socket (a full socket is awake already)."""
        try:
            self._sock.send(_POKE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            raise _lost(exc) from exc

    def _room_told(self) -> None:
        """Take the eventfd's count (it was signalled, or the wait timed out); one
        that fails to be read breaks the ring (ConnectionLost)."""
        try:
            os.eventfd_read(self._room_fd)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            raise self._broken_room(exc) from None

    def _hung_up(self) -> bool:
        """Whether the daemon closed the connection (polled, no wait)."""
        poller = select.poll()
        poller.register(self._sock, select.POLLRDHUP)
        return bool(poller.poll(0))

    def _close_ring(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self._room_fd >= 0:
            os.close(self._room_fd)
            self._room_fd = -1
        if self._ring is not None:
            self._ring.release()
            self._ring = None
        if self._mapping is not None:
            self._mapping.close()
            self._mapping = None


class SocketTransport(_RingEnd):
    """A blocking Unix socket connected to the daemon; ``ring``: whether to ask for a
    ring (None: :func:`wants_ring`)."""

    def __init__(
        self, sock: socket.socket, path: str | None = None, *, ring: bool | None = None
    ) -> None:
        self.path = path
        super().__init__(sock, ring, path)
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)

    @classmethod
    def connect(cls, path: str, trusted: Iterable[int] = ()) -> SocketTransport:
        """Connect to the daemon's socket at ``path``; ``trusted``: uids trusted as the
        daemon's beside the defaults (:func:`~._trust.trusted_uids`).

        Raises :class:`DaemonNotRunning` when nothing listens there,
        :class:`UntrustedDaemon` when the socket is not the daemon's, and
        :class:`ConnectError` for any other failure.
        """
        trusted = trusted_uids(also=trusted)
        check_directory(path, trusted)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            check_peer(sock, path, trusted)
        except OSError as exc:
            sock.close()
            raise _connect_failed(path, exc) from None
        except BaseException:
            sock.close()
            raise
        return cls(sock, path)

    def send(self, data: bytes) -> None:
        ring = self._ring
        if ring is None:
            try:
                self._sock.sendall(data)
            except OSError as exc:
                raise _lost(exc) from exc
            return
        try:
            taken, poke = ring.write(data)
        except ValueError:
            raise _closed() from None
        except RemoteProtocolError as exc:
            raise self._broken(exc) from None
        if poke:
            self._poke()
        if taken < len(data):
            self._send_slowly(ring, memoryview(data)[taken:])

    def _send_slowly(self, ring: RingWriter, rest: memoryview) -> None:
        """The ring is full: wait on the daemon's eventfd for room, and go on."""
        waiting = select.poll()
        waiting.register(self._room_fd, select.POLLIN)
        try:
            while rest:
                if not ring.wait():
                    if ring.poke_due():
                        self._poke()
                    if not waiting.poll(_ROOM_RECHECK * 1000) and self._hung_up():
                        raise ConnectionLost("the daemon closed the connection")
                    self._room_told()
                    continue
                ring.waited()
                taken, poke = ring.write(rest)
                rest = rest[taken:]
                if poke:
                    self._poke()
        except ValueError:
            raise _closed() from None
        except RemoteProtocolError as exc:
            raise self._broken(exc) from None
        finally:
            if self._ring is ring:
                ring.waited()

    def receive(self) -> bytes:
        try:
            if self._awaiting:
                return self._recv_fds()
            return self._sock.recv(_CHUNK)
        except OSError as exc:
            raise _lost(exc) from exc

    def receive_nowait(self) -> bytes | None:
        if self._sock.fileno() < 0:
            raise ConnectionLost("the connection to the daemon is closed")
        return _drain(self._sock, self._poller)

    def close(self) -> None:
        self._sock.close()
        self._close_ring()


class AsyncSocketTransport(_RingEnd):
    """An anyio Unix socket stream connected to the daemon; ``ring``: whether to ask
    for a ring (None: :func:`wants_ring`)."""

    def __init__(
        self, stream: anyio.abc.SocketStream, path: str | None = None, *, ring: bool | None = None
    ) -> None:
        self.path = path
        super().__init__(stream.extra(anyio.abc.SocketAttribute.raw_socket), ring, path)
        self._stream = stream

    @classmethod
    async def connect(cls, path: str, trusted: Iterable[int] = ()) -> AsyncSocketTransport:
        """Connect to the daemon's socket at ``path``; ``trusted``: uids trusted as the
        daemon's beside the defaults (:func:`~._trust.trusted_uids`).

        Raises :class:`DaemonNotRunning` when nothing listens there,
        :class:`UntrustedDaemon` when the socket is not the daemon's, and
        :class:`ConnectError` for any other failure.
        """
        trusted = trusted_uids(also=trusted)
        check_directory(path, trusted)
        try:
            stream = await anyio.connect_unix(path)
        except OSError as exc:
            raise _connect_failed(path, exc) from None
        try:
            check_peer(stream.extra(anyio.abc.SocketAttribute.raw_socket), path, trusted)
        except BaseException:
            await anyio.aclose_forcefully(stream)
            raise
        return cls(stream, path)

    async def send(self, data: bytes) -> None:
        # Sent by hand rather than with stream.send() to know how much went out: a
        # cancellation before the first byte leaves the connection usable, one after it
        # would leave half a frame on the wire, so then the connection is closed.
        view = memoryview(data)
        await anyio.lowlevel.checkpoint()
        ring = self._ring
        if ring is not None:
            try:
                taken, poke = ring.write(view)
            except ValueError:
                raise _closed() from None
            except RemoteProtocolError as exc:
                raise self._broken(exc) from None
            if poke:
                self._poke()
            if taken < len(data):
                await self._send_slowly(ring, view[taken:])
            return
        try:
            while view:
                try:
                    view = view[self._sock.send(view) :]
                except BlockingIOError:
                    await anyio.wait_writable(self._sock)
        except OSError as exc:
            raise _lost(exc) from exc
        except BaseException:
            if len(view) < len(data):
                await self.aclose()
            raise

    async def _send_slowly(self, ring: RingWriter, rest: memoryview) -> None:
        """The ring is full: wait on the daemon's eventfd for room, and go on;
        cancelled midway, the transport is closed (part of a frame is in the ring)."""
        try:
            while rest:
                if not ring.wait():
                    if ring.poke_due():
                        self._poke()
                    with anyio.move_on_after(_ROOM_RECHECK) as scope:
                        await anyio.wait_readable(self._room_fd)
                    if scope.cancelled_caught and self._hung_up():
                        raise ConnectionLost("the daemon closed the connection")
                    self._room_told()
                    continue
                ring.waited()
                taken, poke = ring.write(rest)
                rest = rest[taken:]
                if poke:
                    self._poke()
        except ValueError:
            raise _closed() from None
        except RemoteProtocolError as exc:
            await self.aclose()
            raise self._broken(exc) from None
        except BaseException:
            await self.aclose()
            raise
        finally:
            if self._ring is ring:
                ring.waited()

    async def receive(self) -> bytes:
        try:
            if self._awaiting:
                while True:
                    await anyio.wait_readable(self._sock)
                    try:
                        return self._recv_fds(socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        continue
            return await self._stream.receive(_CHUNK)
        except anyio.EndOfStream:
            return b""
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise _lost(exc) from exc

    def receive_nowait(self) -> bytes | None:
        if self._sock.fileno() < 0:
            raise ConnectionLost("the connection to the daemon is closed")
        return _drain(self._sock)

    async def aclose(self) -> None:
        await anyio.aclose_forcefully(self._stream)
        self._close_ring()
