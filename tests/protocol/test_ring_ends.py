"""The ring's two ends over one buffer, sans I/O: the stream that goes in comes out
whole and in order whatever the sizes and wraps, the writer stops at a full ring,
the sleep flag is seen across, and a tail the reader cannot trust is refused."""

from __future__ import annotations

import threading

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightlog.protocol import (
    RemoteProtocolError,
)
from flightlog.protocol.ring import (
    RING_HEADER,
    RingReader,
    RingWriter,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    Hello,
    Welcome,
)

SIZE = 64


def _ends(size: int = SIZE) -> tuple[RingWriter, RingReader, memoryview]:
    buf = memoryview(bytearray(RING_HEADER + size))
    reader = RingReader(buf, size, threading.Lock())
    return RingWriter(buf, threading.Lock()), reader, buf[:RING_HEADER].cast("Q")


@given(st.lists(st.binary(min_size=1, max_size=3 * SIZE), max_size=30), st.integers(1, SIZE))
def test_bytes_come_out_whole_and_in_order(pieces: list[bytes], limit: int) -> None:
    writer, reader, _ = _ends()
    out = bytearray()
    for piece in pieces:
        view = memoryview(piece)
        while view:
            taken, _ = writer.write(view)
            view = view[taken:]
            reader.take(out.extend, limit)
    while reader.take(out.extend, limit):
        pass
    assert bytes(out) == b"".join(pieces)


def test_a_full_ring_takes_nothing_more() -> None:
    writer, reader, _ = _ends()
    assert writer.write(b"x" * (SIZE + 10)) == (SIZE, False)
    assert writer.write(b"y") == (0, False)
    out = bytearray()
    assert reader.take(out.extend, 10) == 10
    assert writer.room == 10
    assert writer.write(b"z" * 20)[0] == 10


def test_the_writer_is_told_to_poke_while_the_reader_sleeps() -> None:
    writer, reader, _ = _ends()
    assert reader.sleep() is False
    assert writer.write(b"a") == (1, True)
    assert reader.sleep() is True  # bytes came: it stays awake
    assert writer.write(b"b") == (1, False)


def test_the_writer_pokes_once_per_wait_of_the_reader() -> None:
    """A wait poked already ends on that poke: publishes during it poke no more; the
    reader's next wait (and its hang-up) has a number of its own and is poked again."""
    writer, reader, _ = _ends()
    out = bytearray()
    assert reader.sleep() is False
    assert writer.write(b"a") == (1, True)
    assert writer.write(b"b") == (1, False)
    assert writer.poke_due() is False
    reader.wake()  # the poke came
    assert reader.take(out.extend, SIZE) == 2
    assert writer.write(b"c") == (1, False)  # awake: no poke
    reader.take(out.extend, SIZE)
    assert reader.sleep() is False
    assert writer.write(b"d") == (1, True)
    reader.wake()
    reader.take(out.extend, SIZE)
    reader.hang_up()
    assert writer.poke_due() is True
    assert writer.write(b"e") == (1, False)
    assert bytes(out) == b"abcd"


@pytest.mark.parametrize("tail", [SIZE + 1, 2**64 - 1])
def test_a_tail_out_of_reach_is_refused(tail: int) -> None:
    _, reader, words = _ends()
    words[16] = tail
    with pytest.raises(RemoteProtocolError) as raised:
        reader.take(bytearray().extend, SIZE)
    assert raised.value.code == "bad_message"


def test_a_tail_that_goes_back_is_refused() -> None:
    writer, reader, words = _ends()
    writer.write(b"abcdef")
    reader.take(bytearray().extend, SIZE)
    words[16] = 2
    with pytest.raises(RemoteProtocolError):
        reader.take(bytearray().extend, SIZE)


@pytest.mark.parametrize(("tail", "published"), [(SIZE + 7, SIZE), (1, 0), (2**64 - 1, SIZE)])
def test_published_stays_within_the_ring_whatever_the_tail(tail: int, published: int) -> None:
    writer, reader, words = _ends()
    assert reader.published == 0
    writer.write(b"abcdef")
    assert reader.published == 6
    reader.take(bytearray().extend, 2)
    assert reader.published == 4
    words[16] = tail  # the client's to write: behind the head, or too far ahead
    assert reader.published == published


def test_a_buffer_that_is_no_ring_is_refused() -> None:
    with pytest.raises(ValueError):
        RingWriter(memoryview(bytearray(RING_HEADER + SIZE)), threading.Lock())
    with pytest.raises(ValueError):
        RingReader(memoryview(bytearray(RING_HEADER + 48)), 48, threading.Lock())


def test_the_ring_fields_are_optional_both_ways() -> None:
    """An old daemon reads a new hello, and a new client an old welcome."""

    class OldHello(msgspec.Struct, tag_field="type", tag="hello", kw_only=True):
        id: int
        version: int

    class OldWelcome(msgspec.Struct, tag_field="type", tag="welcome", kw_only=True):
        id: int
        version: int
        max_frame_size: int

    hello = msgspec.msgpack.encode(Hello(id=1, version=PROTOCOL_VERSION, ring=True))
    assert msgspec.msgpack.decode(hello, type=OldHello).version == PROTOCOL_VERSION
    old = msgspec.msgpack.encode(OldWelcome(id=1, version=1, max_frame_size=1024))
    assert msgspec.msgpack.decode(old, type=Welcome).ring == 0


def test_a_writer_waiting_for_room_is_seen_by_the_reader() -> None:
    writer, reader, _ = _ends()
    writer.write(b"x" * SIZE)
    assert writer.wait() == 0
    out = bytearray()
    reader.take(out.extend, 10)
    assert reader.wanted()
    assert writer.wait() == 10  # the room came meanwhile: no need to wait
    writer.waited()
    assert not reader.wanted()
