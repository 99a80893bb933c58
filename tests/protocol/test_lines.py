"""The line reader: bytes fed in, records, NEED_DATA and END_OF_FILE out, and every
reading rule of docs/format.md section 5 in one place."""

from __future__ import annotations

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings

from flightlog.protocol import (
    FileFormatError,
    LocalProtocolError,
    Record,
)
from flightlog.protocol.format import (
    END_OF_FILE,
    MAX_LINE_BYTES,
    NEED_DATA,
    LineReader,
    ReadState,
    encode_line,
)

SID = "0123456789abcdef0123456789abcdef"
RUN = "fedcba9876543210fedcba9876543210"


def line(seq: int, type_: str = "turn_start", data: bytes = b"{}", sid: str = SID) -> bytes:
    return encode_line(
        Record(
            session_id=sid,
            seq=seq,
            type=type_,
            time="2026-11-29T20:00:00.000000Z",
            run_id=None if type_ == "session_start" else RUN,
            data=msgspec.Raw(data),
        )
    )


HEADER = line(1, "session_start", b'{"format_version":1,"meta":{"app":"t"}}')


def drain(reader: LineReader) -> list[Record | ReadState]:
    """Everything next() gives until it needs data or the input is over."""
    items: list[Record | ReadState] = []
    while True:
        item = reader.next()
        items.append(item)
        if isinstance(item, ReadState):
            return items


def test_records_come_out_as_their_lines_complete() -> None:
    reader = LineReader()
    assert reader.next() is NEED_DATA
    reader.feed(HEADER[:10])
    assert reader.next() is NEED_DATA
    reader.feed(HEADER[10:] + line(2)[:-1])
    header, need = drain(reader)
    assert isinstance(header, Record) and header.type == "session_start"
    assert need is NEED_DATA
    assert (reader.session_id, reader.meta, reader.format_version) == (SID, {"app": "t"}, 1)
    assert (reader.lines, reader.last_seq, reader.offset) == (1, 1, len(HEADER))
    assert reader.position == len(HEADER + line(2)) - 1  # the second line is held
    assert reader.line == HEADER[:-1]
    reader.feed(b"\n" + line(3))
    two, three, need = drain(reader)
    assert [two.seq, three.seq] == [2, 3]  # type: ignore[union-attr]
    assert reader.line == line(3)[:-1]
    assert reader.offset == len(HEADER + line(2) + line(3))
    assert need is NEED_DATA
    reader.feed_eof()
    assert reader.next() is END_OF_FILE
    assert reader.next() is END_OF_FILE
    assert (reader.tail, reader.tail_size) == (b"", 0)


def test_feeding_several_pieces_before_reading_keeps_every_line() -> None:
    reader = LineReader()
    for piece in (HEADER, line(2), line(3)[:5], line(3)[5:]):
        reader.feed(piece)
    reader.feed_eof()
    assert [getattr(item, "seq", item) for item in drain(reader)] == [1, 2, 3, END_OF_FILE]


def test_an_unfinished_last_line_is_set_aside_not_refused() -> None:
    reader = LineReader()
    torn = line(3)[:-1]  # a whole record, but no "\n": never acknowledged
    reader.feed(HEADER + line(2) + torn)
    reader.feed_eof()
    assert [getattr(item, "seq", item) for item in drain(reader)] == [1, 2, END_OF_FILE]
    assert (reader.tail, reader.tail_size) == (torn, len(torn))
    assert reader.error is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file: empty file: no session_start"),
        (HEADER[:-1], "line 1: no complete line: the session_start line is unfinished"),
        (bytes(500), "line 1: no complete line: the session_start line is unfinished"),
    ],
)
def test_the_end_of_an_input_without_a_first_line_is_damage(content: bytes, message: str) -> None:
    reader = LineReader()
    reader.feed(content)
    assert reader.next() is NEED_DATA
    reader.feed_eof()
    with pytest.raises(FileFormatError) as caught:
        reader.next()
    assert caught.value.message == message
    assert reader.tail_size == len(content)


def test_an_error_is_sticky_and_names_the_line() -> None:
    reader = LineReader()
    reader.feed(HEADER + line(2) + line(4) + line(5))
    assert [getattr(item, "seq", None) for item in (reader.next(), reader.next())] == [1, 2]
    with pytest.raises(FileFormatError) as first:
        reader.next()
    assert first.value.line == 3
    assert first.value.reason == "seq 4 leaves a gap: expected 3, 1 record(s) missing"
    with pytest.raises(FileFormatError) as again:
        reader.next()
    assert again.value is first.value is reader.error
    assert (reader.lines, reader.last_seq) == (2, 2)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (line(3, data=b'{"t":"\xff"}'), "invalid UTF-8 at byte 172 of the line"),
        (line(3, data=b'{"t":"\xed\xa0\x80"}'), "invalid UTF-8 at byte 172 of the line"),
        (line(3, data=b'{"t":1}')[:-1] + b"\r\n", "line ends with \\r\\n"),
        (line(3, sid="f" * 32), "is not the file's session_id"),
        (line(2), "seq 2 repeats the seq of the line before"),
        (line(1), "seq 1 goes backwards: the line before has seq 2"),
        (HEADER.replace(b'"seq":1', b'"seq":3'), "session_start is allowed on line 1 only"),
        (b"\x00" * 20 + b"\n", "a line of NUL bytes"),
        (b"\n", "empty line"),
    ],
)
def test_what_breaks_a_later_line(bad: bytes, reason: str) -> None:
    reader = LineReader()
    reader.feed(HEADER + line(2) + bad)
    drain_until_error = [reader.next(), reader.next()]
    assert all(isinstance(item, Record) for item in drain_until_error)
    with pytest.raises(FileFormatError) as caught:
        reader.next()
    assert caught.value.line == 3
    assert reason in caught.value.reason


def test_invalid_utf8_in_a_member_the_envelope_skips_is_refused() -> None:
    unknown = line(2)[:-2] + b',"extra":"\xc3("}\n'
    assert msgspec.json.decode(unknown, type=Record).seq == 2  # msgspec lets it pass
    reader = LineReader()
    reader.feed(HEADER + unknown)
    reader.next()
    with pytest.raises(FileFormatError, match="line 2: invalid UTF-8"):
        reader.next()


def test_a_line_longer_than_the_limit_is_refused_when_it_ends() -> None:
    limit = len(HEADER)
    reader = LineReader(max_line_bytes=limit)
    reader.feed(HEADER + b"x" * 150)
    assert [getattr(item, "seq", item) for item in drain(reader)] == [1, NEED_DATA]
    reader.feed(b"x" * 150)
    assert reader.next() is NEED_DATA
    reader.feed(b"x\n")
    with pytest.raises(FileFormatError) as caught:
        reader.next()
    assert caught.value.line == 2
    assert caught.value.reason == f"line is 301 bytes long, more than {limit}"


def test_a_long_unfinished_tail_is_held_only_up_to_the_limit() -> None:
    reader = LineReader(max_line_bytes=1000)
    reader.feed(HEADER)
    reader.next()
    for _ in range(100):
        reader.feed(bytes(777))
        assert reader.next() is NEED_DATA
    reader.feed_eof()
    assert reader.next() is END_OF_FILE
    assert (len(reader.tail), reader.tail_size) == (1000, 77_700)


def test_default_limit() -> None:
    assert LineReader().max_line_bytes == MAX_LINE_BYTES == 256 * 1024 * 1024


def test_feeding_after_the_end_is_a_local_error() -> None:
    reader = LineReader()
    reader.feed_eof()
    with pytest.raises(LocalProtocolError, match="after feed_eof"):
        reader.feed(HEADER)


def test_resume_goes_on_mid_file_with_its_session_and_line_numbers() -> None:
    content = HEADER + line(2) + line(3) + line(4, sid="e" * 32)
    offset = len(HEADER + line(2))
    reader = LineReader.resume(SID, 2, offset)
    assert (reader.offset, reader.position) == (offset, offset)
    reader.feed(content[offset:])
    assert reader.position == len(content)
    three = reader.next()
    assert isinstance(three, Record) and three.seq == 3
    assert (reader.lines, reader.offset) == (3, len(content) - len(line(4)))
    with pytest.raises(FileFormatError) as caught:
        reader.next()
    assert caught.value.line == 4
    assert "is not the file's session_id" in caught.value.reason


def test_resume_refuses_a_second_session_start() -> None:
    reader = LineReader.resume(SID, 7, 1000)
    reader.feed(line(8, "session_start", b'{"format_version":1}'))
    with pytest.raises(FileFormatError, match="line 8: session_start is allowed on line 1 only"):
        reader.next()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(1, 50), max_size=20))
def test_any_bytes_in_any_pieces_raise_only_file_format_errors(
    content: bytes, sizes: list[int]
) -> None:
    reader = LineReader(max_line_bytes=200)
    position, seqs = 0, []
    try:
        while True:
            item = reader.next()
            if isinstance(item, Record):
                seqs.append(item.seq)
            elif item is END_OF_FILE:
                break
            elif position < len(content):
                size = sizes.pop() if sizes else len(content)
                reader.feed(content[position : position + size])
                position += size
            else:
                reader.feed_eof()
    except FileFormatError as exc:
        assert exc.line in (reader.lines + 1, 0)
    assert seqs == list(range(1, len(seqs) + 1))
