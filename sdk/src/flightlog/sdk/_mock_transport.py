"""The mock transports: :class:`MockTransport` and :class:`AsyncMockTransport`, a daemon
in the same process, for tests.

Each connects to a :class:`~._memory.MemoryDaemon`, which applies flightlogd's rules
through the protocol's real server connection and keeps sessions in memory; they
implement the transport seam of :mod:`._transport` (``Transport``, ``AsyncTransport``).
"""

from __future__ import annotations

from typing import Any

import anyio.lowlevel

from flightlog.protocol.wire import Message, encode_frame, server_decoder

from ._exceptions import ConnectionLost
from ._memory import MemoryDaemon

__all__ = ["AsyncMockTransport", "MockTransport"]


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
        self.wants_ring = False

    def welcomed(self, ring: int) -> None:
        """Nothing to do: a mock has no ring."""

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
