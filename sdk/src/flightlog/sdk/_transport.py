"""The transport seam: how the clients move bytes, and nothing else.

A transport sends bytes, receives them (``b""`` once the daemon closed the
connection), and polls without waiting (``receive_nowait``: None when nothing is
waiting), which lets ``record()`` pick up pushed errors without a round trip.  Socket
failures become :class:`ConnectionLost`; a failed connect becomes
:class:`DaemonNotRunning` or :class:`ConnectError`.

* :class:`SocketTransport`: a plain blocking ``AF_UNIX`` socket, for :class:`Client`.
* :class:`AsyncSocketTransport`: anyio's ``connect_unix``, for :class:`AsyncClient`.
* :class:`MockTransport` and :class:`AsyncMockTransport`: a daemon in the same
  process, for tests: a :class:`~._memory.MemoryDaemon`, which applies flightlogd's
  rules through the protocol's real server connection and keeps sessions in memory.
"""

from __future__ import annotations

import errno
import select
import socket
from typing import Any, Final, Protocol

import anyio
import anyio.abc
import anyio.lowlevel

from flightlog.protocol import Message, encode_frame, server_decoder

from ._exceptions import ConnectError, ConnectionLost, DaemonNotRunning
from ._memory import MemoryDaemon

__all__ = [
    "AsyncMockTransport",
    "AsyncSocketTransport",
    "AsyncTransport",
    "MockTransport",
    "SocketTransport",
    "Transport",
]

_CHUNK: Final = 256 * 1024
# Errors that mean nothing listens on the path (as opposed to, say, a permission).
_NOT_LISTENING: Final = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR})


class Transport(Protocol):
    """What :class:`Client` needs to talk to the daemon."""

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
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return ConnectionLost(f"the connection to the daemon broke: {reason or type(exc).__name__}")


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


class SocketTransport:
    """A blocking Unix socket connected to the daemon."""

    def __init__(self, sock: socket.socket, path: str | None = None) -> None:
        self._sock = sock
        self.path = path
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)

    @classmethod
    def connect(cls, path: str) -> SocketTransport:
        """Connect to the daemon's socket at ``path``.

        Raises :class:`DaemonNotRunning` when nothing listens there and
        :class:`ConnectError` for any other failure.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise _connect_failed(path, exc) from None
        return cls(sock, path)

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise _lost(exc) from exc

    def receive(self) -> bytes:
        try:
            return self._sock.recv(_CHUNK)
        except OSError as exc:
            raise _lost(exc) from exc

    def receive_nowait(self) -> bytes | None:
        if self._sock.fileno() < 0:
            raise ConnectionLost("the connection to the daemon is closed")
        return _drain(self._sock, self._poller)

    def close(self) -> None:
        self._sock.close()


class AsyncSocketTransport:
    """An anyio Unix socket stream connected to the daemon."""

    def __init__(self, stream: anyio.abc.SocketStream, path: str | None = None) -> None:
        self._stream = stream
        self._sock: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        self.path = path

    @classmethod
    async def connect(cls, path: str) -> AsyncSocketTransport:
        """Connect to the daemon's socket at ``path``.

        Raises :class:`DaemonNotRunning` when nothing listens there and
        :class:`ConnectError` for any other failure.
        """
        try:
            stream = await anyio.connect_unix(path)
        except OSError as exc:
            raise _connect_failed(path, exc) from None
        return cls(stream, path)

    async def send(self, data: bytes) -> None:
        # Sent by hand rather than with stream.send() to know how much went out: a
        # cancellation before the first byte leaves the connection usable, one after it
        # would leave half a frame on the wire, so then the connection is closed.
        view = memoryview(data)
        await anyio.lowlevel.checkpoint()
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

    async def receive(self) -> bytes:
        try:
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


class _MockLink:
    """The client's end of a connection to a :class:`MemoryDaemon`."""

    def __init__(self, daemon: MemoryDaemon, chunk_size: int | None) -> None:
        self.daemon = daemon
        self.chunk_size = chunk_size
        self.sent: list[Any] = []
        self.closed = False
        self.eof = False
        self._server = daemon.connect()
        self._decoder = server_decoder()
        self._out = bytearray()

    def client_sends(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionLost("the mock transport is closed")
        self._decoder.feed(data)
        self.sent.extend(self._decoder)
        self._server.receive_data(data)

    def push(self, message: Message) -> None:
        self._out += self._server.data_to_send()
        self._out += encode_frame(message)

    def take(self, *, wait: bool) -> bytes | None:
        if self.closed:
            raise ConnectionLost("the mock transport is closed")
        # What the daemon sent, including pushes caused by other connections.
        self._out += self._server.data_to_send()
        if not self._out:
            # Nothing will ever come, so a wait would last forever: read it as the end.
            return b"" if wait or self.eof else None
        size = self.chunk_size or len(self._out)
        data = bytes(self._out[:size])
        del self._out[:size]
        return data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._server.receive_data(b"")


class _MockTransportBase:
    def __init__(self, daemon: MemoryDaemon | None = None, *, chunk_size: int | None = None):
        self.daemon = daemon if daemon is not None else MemoryDaemon()
        self._link = _MockLink(self.daemon, chunk_size)
        self.path: str | None = None

    @property
    def sent(self) -> list[Any]:
        """Every message the client sent, in order."""
        return self._link.sent

    def push(self, message: Message) -> None:
        """Queue ``message`` for the client, as the daemon pushing it."""
        self._link.push(message)

    def hang_up(self) -> None:
        """The daemon closes the connection once everything queued has been read."""
        self._link.eof = True

    def receive_nowait(self) -> bytes | None:
        return self._link.take(wait=False)


class MockTransport(_MockTransportBase):
    """A transport to a daemon in memory, for tests of :class:`Client`.

    ``daemon`` is the :class:`MemoryDaemon` it connects to (a new one when None; share
    one between transports for several connections).  :meth:`push` queues a message
    unasked, as the daemon pushing it; :attr:`sent` lists everything the client sent.
    A receive with nothing queued reads as the daemon closing the connection.
    ``chunk_size`` hands bytes out in pieces of at most that size, to exercise
    reassembly.
    """

    def send(self, data: bytes) -> None:
        self._link.client_sends(data)

    def receive(self) -> bytes:
        return self._link.take(wait=True) or b""

    def close(self) -> None:
        self._link.close()


class AsyncMockTransport(_MockTransportBase):
    """:class:`MockTransport` for :class:`AsyncClient`."""

    async def send(self, data: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        self._link.client_sends(data)

    async def receive(self) -> bytes:
        await anyio.lowlevel.checkpoint()
        return self._link.take(wait=True) or b""

    async def aclose(self) -> None:
        self._link.close()
