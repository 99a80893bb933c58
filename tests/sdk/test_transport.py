"""The transports: real sockets without a daemon, connect failures, the mock."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest

from flightlog.protocol.wire import (
    Create,
    ErrorReply,
    Hello,
    Status,
    StatusReply,
    Welcome,
    client_decoder,
)
from flightlog.sdk import (
    ConnectError,
    ConnectionLost,
    DaemonNotRunning,
    FlightlogError,
    MemoryDaemon,
    MockTransport,
    SocketTransport,
    connect,
)
from flightlog.sdk.aio import AsyncMockTransport, AsyncSocketTransport, aconnect


@pytest.fixture
def pair() -> Iterator[tuple[SocketTransport, socket.socket]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    transport = SocketTransport(ours)
    try:
        yield transport, theirs
    finally:
        transport.close()
        theirs.close()


def stale_socket(path: Path) -> socket.socket:
    """A socket file nobody listens on, as a crashed daemon leaves it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


# ------------------------------------------------------------------- nothing listening


def test_connect_with_no_socket_file(short_tmp: Path) -> None:
    path = str(short_tmp / "missing.sock")
    with pytest.raises(DaemonNotRunning) as caught:
        connect(path)
    message = str(caught.value)
    assert path in message
    assert "flightlogd" in message
    assert "systemctl --user start flightlogd.socket" in message
    assert caught.value.code == "daemon_not_running"
    assert caught.value.path == path


def test_connect_to_a_socket_nobody_listens_on(short_tmp: Path) -> None:
    path = short_tmp / "stale.sock"
    with stale_socket(path), pytest.raises(DaemonNotRunning):
        connect(str(path))


def test_connect_to_a_path_that_cannot_be_a_socket(short_tmp: Path) -> None:
    with pytest.raises(ConnectError) as caught:
        connect(str(short_tmp / ("x" * 200)))
    assert not isinstance(caught.value, DaemonNotRunning)
    assert isinstance(caught.value, FlightlogError)


def test_connect_defaults_to_flightlog_socket(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(short_tmp / "from-env.sock")
    monkeypatch.setenv("FLIGHTLOG_SOCKET", path)
    with pytest.raises(DaemonNotRunning) as caught:
        connect()
    assert caught.value.path == path


def test_connect_defaults_to_the_runtime_dir(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLIGHTLOG_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    with pytest.raises(DaemonNotRunning) as caught:
        connect()
    assert caught.value.path == f"{short_tmp}/flightlog/flightlog.sock"


@pytest.mark.anyio
async def test_aconnect_with_nothing_listening(short_tmp: Path) -> None:
    with pytest.raises(DaemonNotRunning):
        await aconnect(str(short_tmp / "missing.sock"))
    path = short_tmp / "stale.sock"
    with stale_socket(path), pytest.raises(DaemonNotRunning):
        async with aconnect(str(path)):
            pass


# ---------------------------------------------------------------------- sync socket


def test_receive_nowait_never_waits(pair: tuple[SocketTransport, socket.socket]) -> None:
    transport, theirs = pair
    assert transport.receive_nowait() is None
    theirs.sendall(b"abc")
    theirs.sendall(b"def")
    assert transport.receive_nowait() == b"abcdef"
    assert transport.receive_nowait() is None
    theirs.close()
    assert transport.receive_nowait() == b""


def test_send_and_receive(pair: tuple[SocketTransport, socket.socket]) -> None:
    transport, theirs = pair
    transport.send(b"x" * 100_000)
    received = b""
    while len(received) < 100_000:
        received += theirs.recv(1 << 20)
    theirs.sendall(b"reply")
    assert transport.receive() == b"reply"
    theirs.close()
    assert transport.receive() == b""


def test_send_to_a_closed_peer_loses_the_connection(
    pair: tuple[SocketTransport, socket.socket],
) -> None:
    transport, theirs = pair
    theirs.close()
    with pytest.raises(ConnectionLost):
        for _ in range(100):
            transport.send(b"x" * 65536)


def test_a_closed_transport_loses_the_connection(
    pair: tuple[SocketTransport, socket.socket],
) -> None:
    transport, _ = pair
    transport.close()
    with pytest.raises(ConnectionLost):
        transport.send(b"x")
    with pytest.raises(ConnectionLost):
        transport.receive()


# --------------------------------------------------------------------- async socket


@contextlib.asynccontextmanager
async def connected(
    directory: Path,
) -> AsyncIterator[tuple[AsyncSocketTransport, anyio.abc.SocketStream]]:
    """An async transport connected to a listener of the test's: (transport, peer)."""
    path = str(directory / "s.sock")
    with anyio.fail_after(10):
        async with await anyio.create_unix_listener(path) as listener:
            transport = await AsyncSocketTransport.connect(path)
            assert transport.path == path
            async with await listener.accept() as peer:
                try:
                    yield transport, peer
                finally:
                    await transport.aclose()


@pytest.mark.anyio
async def test_async_socket_transport(short_tmp: Path) -> None:
    received: list[bytes] = []
    async with connected(short_tmp) as (transport, peer):
        assert transport.receive_nowait() is None
        await peer.send(b"hello")
        assert await transport.receive() == b"hello"

        async def drain() -> None:
            while sum(map(len, received)) < 300_000:
                received.append(await peer.receive())

        # More than the socket buffers hold: the send waits for the peer to read.
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            await transport.send(b"x" * 300_000)
        await peer.send(b"pushed")
        await anyio.wait_readable(transport._sock)
        assert transport.receive_nowait() == b"pushed"
        await peer.aclose()
        assert await transport.receive() == b""
        assert transport.receive_nowait() == b""
        await transport.aclose()
        with pytest.raises(ConnectionLost):
            transport.receive_nowait()


@pytest.mark.anyio
async def test_a_send_cancelled_before_its_first_byte_keeps_the_connection(
    short_tmp: Path,
) -> None:
    async with connected(short_tmp) as (transport, peer):
        with anyio.CancelScope() as scope:
            scope.cancel()
            await transport.send(b"never")
        await transport.send(b"sent")
        assert await peer.receive() == b"sent"


@pytest.mark.anyio
async def test_a_send_cancelled_midway_closes_the_connection(short_tmp: Path) -> None:
    async with connected(short_tmp) as (transport, _):
        # The peer never reads: the send fills the buffers and waits, then is cancelled.
        with anyio.move_on_after(0.2):
            await transport.send(b"x" * 50_000_000)
        with pytest.raises(ConnectionLost):
            await transport.send(b"more")


@pytest.mark.anyio
async def test_the_peer_closing_loses_the_connection(short_tmp: Path) -> None:
    async with connected(short_tmp) as (transport, peer):
        await peer.aclose()
        with pytest.raises(ConnectionLost):
            for _ in range(100):
                await transport.send(b"x" * 65536)


# ----------------------------------------------------------------------------- mock


def test_mock_transport_talks_to_a_daemon_in_memory() -> None:
    transport = MockTransport(chunk_size=3)
    transport.send(b"".join(_frames(Hello(id=1, version=1), Status(id=2))))
    assert transport.sent == [Hello(id=1, version=1), Status(id=2)]
    received = b""
    while chunk := transport.receive_nowait():
        assert len(chunk) <= 3
        received += chunk
    decoder = client_decoder()
    decoder.feed(received)
    welcome, status = list(decoder)
    assert isinstance(welcome, Welcome) and welcome.server == transport.daemon.name
    assert isinstance(status, StatusReply) and status.id == 2
    # Nothing queued: a wait would last forever, so it reads as the end.
    assert transport.receive() == b""
    transport.hang_up()
    assert transport.receive_nowait() == b""
    transport.close()
    with pytest.raises(ConnectionLost):
        transport.send(b"")


def test_mock_transports_share_a_daemon() -> None:
    daemon = MemoryDaemon()
    first, second = MockTransport(daemon), MockTransport(daemon)
    for transport in (first, second):
        transport.send(b"".join(_frames(Hello(id=1, version=1), Create(id=2, path="a.jsonl"))))
    decoder = client_decoder()
    decoder.feed(second.receive())
    _, refused = list(decoder)
    assert isinstance(refused, ErrorReply) and refused.code == "session_exists"
    assert daemon.session("a.jsonl").writer is not None
    first.close()
    assert daemon.session("a.jsonl").writer is None


@pytest.mark.anyio
async def test_async_mock_transport() -> None:
    transport = AsyncMockTransport()
    await transport.send(b"".join(_frames(Status(id=1))))
    # Not a hello first: the daemon says so, and hangs up.
    decoder = client_decoder()
    decoder.feed(await transport.receive())
    [refused] = list(decoder)
    assert isinstance(refused, ErrorReply) and refused.code == "hello_required"
    assert await transport.receive() == b""
    await transport.aclose()
    with pytest.raises(ConnectionLost):
        await transport.receive()


def _frames(*messages: object) -> list[bytes]:
    from flightlog.protocol.wire import (
        encode_frame,
    )

    return [encode_frame(message) for message in messages]  # type: ignore[arg-type]
