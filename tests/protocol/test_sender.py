"""The client's C path (flightlog.protocol._sender) against the Python it replaces.

``encode_record`` must make msgspec's frame byte for byte, or say None (and then
``FrameEncoder.encode_record`` raises what ``encode`` raises); the C ``RingWriter``
must answer every call as the Python one does, and leave the same bytes in the ring.
Both sides run the same input; C must also take the common case, or it is dead weight.
"""

from __future__ import annotations

import threading
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import example, given

from flightlog.protocol import (
    RING_HEADER,
    FrameEncoder,
    LocalProtocolError,
    RecordEvent,
    RingReader,
    RingWriter,
    _accel,
    encode_frame,
    ring_writer,
)

pytestmark = pytest.mark.skipif(_accel.encode_record is None, reason="the C accelerator is off")

# Lengths where msgpack's str and bin headers change form.
_EDGES = [0, 1, 31, 32, 255, 256, 65535, 65536]


def _frame(fields: tuple[str, str, str, str], data: bytes) -> bytes:
    """msgspec's frame of the RecordEvent of ``fields`` (session, run, type, time)."""
    session_id, run_id, event_type, time = fields
    return encode_frame(
        RecordEvent(
            session_id=session_id, run_id=run_id, event_type=event_type, time=time, data=data
        )
    )


def _text(length: int) -> str:
    """``length`` UTF-8 bytes, two of them one character when there is room."""
    return "ü" + "x" * (length - 2) if length >= 2 else "x" * length


@given(
    session_id=st.text(max_size=40),
    run_id=st.text(max_size=300),
    event_type=st.text(max_size=40),
    time=st.text(max_size=40),
    data=st.binary(max_size=600),
)
@example("s" * 32, "r" * 32, "tool_exec_start", "2026-12-02T03:00:00.000000Z", b'{"a":1}')
def test_a_record_frame_is_msgspecs_to_the_byte(
    session_id: str, run_id: str, event_type: str, time: str, data: bytes
) -> None:
    expected = encode_frame(
        RecordEvent(
            session_id=session_id, run_id=run_id, event_type=event_type, time=time, data=data
        )
    )
    made = _accel.encode_record(session_id, run_id, event_type, time, data, 2**32)
    if made is None:
        # Only a string that is not UTF-8 (a lone surrogate) makes C unsure.
        assert any("\ud800" <= c <= "\udfff" for c in session_id + run_id + event_type + time)
    else:
        assert made == expected


@pytest.mark.parametrize("length", [*_EDGES, 70_000])
def test_every_header_form_of_a_str_and_of_bin(length: int) -> None:
    text, data = _text(length), b"d" * length
    for fields in [(text, "r", "t", "z"), ("s", text, "t", "z"), ("s", "r", text, "z")]:
        message = RecordEvent(
            session_id=fields[0], run_id=fields[1], event_type=fields[2], time=fields[3], data=data
        )
        assert _accel.encode_record(*fields, data, 2**32) == encode_frame(message)


def test_the_frame_limit_is_the_python_encoders() -> None:
    fields = ("s" * 32, "r" * 32, "tool_exec_start", "2026-12-02T03:00:00.000000Z")
    data = b'{"text":"' + b"x" * 1000 + b'"}'
    body = len(_frame(fields, data)) - 4
    assert _accel.encode_record(*fields, data, body) is not None
    assert _accel.encode_record(*fields, data, body - 1) is None
    with pytest.raises(LocalProtocolError) as raised:
        FrameEncoder(body - 1).encode_record(*fields, data)
    assert raised.value.code == "frame_too_large"


@pytest.mark.parametrize(
    "args",
    [
        ("s", "r", "t", "z", bytearray(b"{}")),  # not bytes: the Python encoder decides
        ("s", "r", "t", "\ud800", b"{}"),  # not UTF-8
        (1, "r", "t", "z", b"{}"),
    ],
)
def test_c_is_unsure_of_what_it_does_not_handle(args: tuple[Any, ...]) -> None:
    assert _accel.encode_record(*args, 2**32) is None


@pytest.mark.parametrize("limit", [2**64, -1])
def test_a_limit_c_cannot_hold_is_left_to_the_python_encoder(limit: int) -> None:
    """A peer may announce any frame limit: C says None, the Python encoder decides."""
    fields = ("s", "r", "tool_exec_start", "2026-12-02T03:00:00.000000Z")
    assert _accel.encode_record(*fields, b"{}", limit) is None
    expected = _frame(fields, b"{}")
    if limit > 0:
        assert FrameEncoder(limit).encode_record(*fields, b"{}") == expected
    else:
        with pytest.raises(LocalProtocolError):
            FrameEncoder(limit).encode_record(*fields, b"{}")


# ------------------------------------------------------------------ the ring writer

SIZE = 64

_steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.binary(min_size=1, max_size=3 * SIZE)),
        st.tuples(st.just("take"), st.integers(1, 2 * SIZE)),
        st.tuples(st.sampled_from(["sleep", "wake", "hang_up", "wait", "waited"]), st.none()),
        st.tuples(st.sampled_from(["room", "poke_due"]), st.none()),
    ),
    max_size=60,
)


class _Side:
    """One writer and its reader over a buffer of their own."""

    def __init__(self, writer: type[Any] | None) -> None:
        self.buf = memoryview(bytearray(RING_HEADER + SIZE))
        lock = threading.Lock()
        self.reader = RingReader(self.buf, SIZE, lock)
        self.writer = RingWriter(self.buf, lock) if writer is None else writer(self.buf)
        self.out = bytearray()

    def step(self, name: str, arg: Any) -> object:
        if name == "write":
            return self.writer.write(arg)
        if name == "take":
            return self.reader.take(self.out.extend, arg)
        if name in ("sleep", "wake", "hang_up"):
            return getattr(self.reader, name)()
        if name == "room":
            return self.writer.room
        return getattr(self.writer, name)()


@given(_steps)
def test_the_c_writer_answers_as_the_python_one(steps: list[tuple[str, Any]]) -> None:
    python, c = _Side(None), _Side(_accel.CRingWriter)
    for name, arg in steps:
        assert c.step(name, arg) == python.step(name, arg), (name, arg)
        assert bytes(c.buf) == bytes(python.buf)
    assert c.out == python.out


def test_the_ring_writer_is_the_c_one_where_built() -> None:
    buf = memoryview(bytearray(RING_HEADER + SIZE))
    RingReader(buf, SIZE, threading.Lock())
    writer = ring_writer(buf, threading.Lock())
    assert isinstance(writer, _accel.CRingWriter)
    assert writer.size == SIZE


def test_the_c_writer_refuses_what_is_no_ring_and_lets_go_of_the_mapping() -> None:
    with pytest.raises(ValueError):
        _accel.CRingWriter(memoryview(bytearray(RING_HEADER + SIZE)))  # no magic
    with pytest.raises(ValueError):
        _accel.CRingWriter(memoryview(bytearray(10)))
    buf = bytearray(RING_HEADER + SIZE)
    RingReader(memoryview(buf), SIZE, threading.Lock())
    writer = _accel.CRingWriter(buf)
    with pytest.raises(BufferError):
        buf.append(0)  # exported: the writer holds it
    writer.release()
    buf.append(0)
    with pytest.raises(ValueError):
        writer.write(b"x")  # as a released memoryview: the transport's "closed"
