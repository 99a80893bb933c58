"""The frame codec, sans I/O: partial frames, many frames, limits and garbage."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightlog.protocol import (
    LocalProtocolError,
    RemoteProtocolError,
)
from flightlog.protocol.wire import (
    HEADER_SIZE,
    Ack,
    Create,
    FrameDecoder,
    FrameEncoder,
    Hello,
    RecordEvent,
    Status,
    client_decoder,
    encode_frame,
    server_decoder,
)

RECORD = RecordEvent(
    session_id="a" * 32,
    run_id="b" * 32,
    event_type="tool_exec_end",
    time="2026-11-29T20:00:00.000000Z",
    data='{"content":"é ✓ 💥"}'.encode(),
)
MESSAGES = [Hello(id=1, version=1, client="t"), Create(id=2, path="a.jsonl"), RECORD, Status(id=3)]


def test_a_frame_is_a_big_endian_length_then_msgpack() -> None:
    frame = encode_frame(Status(id=7))
    body = msgspec.msgpack.encode({"type": "status", "id": 7})
    assert frame == len(body).to_bytes(HEADER_SIZE, "big") + body


def test_fed_one_byte_at_a_time() -> None:
    decoder = server_decoder()
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    received = []
    for index in range(len(stream)):
        decoder.feed(stream[index : index + 1])
        received.extend(decoder)
    assert received == MESSAGES
    assert decoder.buffered == 0


def test_many_frames_in_one_chunk() -> None:
    decoder = server_decoder()
    decoder.feed(b"".join(encode_frame(RECORD) for _ in range(10_000)))
    assert sum(1 for _ in decoder) == 10_000
    assert decoder.buffered == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=40))
def test_any_split_of_the_stream_gives_the_same_messages(cuts: list[int]) -> None:
    stream = b"".join(encode_frame(m) for m in MESSAGES * 3)
    decoder = server_decoder()
    received = []
    position = 0
    for cut in cuts * (len(stream) // sum(cuts) + 1):
        decoder.feed(stream[position : position + cut])
        position += cut
        received.extend(decoder)
    assert received == MESSAGES * 3


def test_a_partial_frame_waits() -> None:
    decoder = server_decoder()
    frame = encode_frame(RECORD)
    decoder.feed(frame[:-1])
    assert decoder.next_message() is None
    assert decoder.buffered == len(frame) - 1
    decoder.feed(frame[-1:])
    assert decoder.next_message() == RECORD


def test_missing_says_what_the_next_message_lacks() -> None:
    decoder = server_decoder()
    frame = encode_frame(RECORD)
    assert decoder.missing == HEADER_SIZE
    decoder.feed(frame[:2])
    assert decoder.missing == HEADER_SIZE - 2  # the header's bytes alone, so far
    decoder.feed(frame[2:-5])
    assert decoder.missing == 5
    decoder.feed(frame[-5:] + frame[:1])
    assert decoder.missing == 0  # one is complete
    assert decoder.next_message() == RECORD
    assert decoder.missing == HEADER_SIZE - 1


def test_a_frame_over_the_limit_breaks_the_stream_for_good() -> None:
    decoder = server_decoder(max_frame_size=100)
    decoder.feed((101).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError) as caught:
        decoder.next_message()
    assert caught.value.code == "frame_too_large"
    assert "101" in caught.value.message and "100" in caught.value.message
    decoder.feed(encode_frame(Status(id=1)))
    with pytest.raises(RemoteProtocolError):
        decoder.next_message()


def test_a_frame_at_the_limit_is_fine() -> None:
    frame = encode_frame(RECORD)
    decoder = server_decoder(max_frame_size=len(frame) - HEADER_SIZE)
    decoder.feed(frame)
    assert decoder.next_message() == RECORD


def test_an_undecodable_frame_is_skipped_and_the_next_one_read() -> None:
    decoder = server_decoder()
    junk = b"\xc1\xc1\xc1"  # 0xc1 is never used in MessagePack
    decoder.feed(len(junk).to_bytes(4, "big") + junk + encode_frame(Status(id=4)))
    with pytest.raises(RemoteProtocolError) as caught:
        decoder.next_message()
    assert caught.value.code == "bad_message"
    assert decoder.next_message() == Status(id=4)


def test_a_message_of_the_other_direction_is_a_bad_message() -> None:
    decoder = server_decoder()
    decoder.feed(encode_frame(Ack(id=1)))
    with pytest.raises(RemoteProtocolError) as caught:
        decoder.next_message()
    assert caught.value.code == "bad_message"


def test_a_frame_nested_too_deeply_is_a_bad_message_not_a_crash() -> None:
    # create{meta: {a: [[[...]]]}}, 5000 arrays deep, written by hand.
    body = (
        b"\x84\xa4type\xa6create\xa2id\x01\xa4path\xa1x\xa4meta\x81\xa1a" + b"\x91" * 5000 + b"\x90"
    )
    decoder = server_decoder()
    decoder.feed(len(body).to_bytes(4, "big") + body + encode_frame(Status(id=2)))
    with pytest.raises(RemoteProtocolError) as caught:
        decoder.next_message()
    assert caught.value.code == "bad_message"
    assert decoder.next_message() == Status(id=2)


def test_the_encoder_refuses_frames_the_peer_would_refuse() -> None:
    encoder = FrameEncoder(max_frame_size=64)
    buf = bytearray(b"earlier")
    with pytest.raises(LocalProtocolError) as caught:
        encoder.encode_into(RECORD, buf)
    assert caught.value.code == "frame_too_large"
    assert buf == b"earlier"  # nothing half-written
    encoder.encode_into(Status(id=1), buf)
    assert buf[7:] == encode_frame(Status(id=1))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_only_ever_raise_remote_protocol_errors(data: bytes) -> None:
    for decoder in (server_decoder(max_frame_size=1 << 16), client_decoder(max_frame_size=1 << 16)):
        decoder.feed(data)
        for _ in range(len(data) + 1):
            try:
                if decoder.next_message() is None:
                    break
            except RemoteProtocolError as exc:
                assert exc.code in ("bad_message", "frame_too_large")
                if exc.code == "frame_too_large":
                    break


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_valid_frames_only_ever_raise_remote_protocol_errors(data: st.DataObject) -> None:
    stream = bytearray(b"".join(encode_frame(m) for m in MESSAGES))
    for _ in range(data.draw(st.integers(1, 8))):
        index = data.draw(st.integers(0, len(stream) - 1))
        stream[index] = data.draw(st.integers(0, 255))
    decoder: FrameDecoder[object] = server_decoder(max_frame_size=1 << 20)
    decoder.feed(bytes(stream))
    while True:
        try:
            if decoder.next_message() is None:
                break
        except RemoteProtocolError as exc:
            if exc.code == "frame_too_large":
                break
