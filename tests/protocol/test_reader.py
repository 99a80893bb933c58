"""The reader: every reading rule of docs/format.md section 5, streaming and in constant memory."""

from __future__ import annotations

import io
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings

from flightlog.protocol import (
    CheckReport,
    ErrorCode,
    FileFormatError,
    LocalProtocolError,
    Reader,
    Record,
    check,
    default_codec,
    new_id,
    read_records,
)
from flightlog.protocol.format import (
    MAX_LINE_BYTES,
    STRUCTURAL_TYPES,
    encode_line,
    parse_line,
)

SID = "0123456789abcdef0123456789abcdef"
RUN = "fedcba9876543210fedcba9876543210"
TIME = "2026-11-29T20:00:00.000000Z"


def line(
    seq: int,
    type_: str = "agent_start",
    data: bytes = b"{}",
    *,
    session_id: str = SID,
    run_id: str | None = RUN,
) -> bytes:
    record = Record(
        session_id=session_id,
        seq=seq,
        type=type_,
        time=TIME,
        run_id=run_id,
        data=msgspec.Raw(data),
    )
    return encode_line(record)


def header(version: Any = 1, *, session_id: str = SID, meta: bytes = b'{"app":"t"}') -> bytes:
    data = b'{"format_version":' + msgspec.json.encode(version) + b',"meta":' + meta + b"}"
    return line(1, "session_start", data, session_id=session_id, run_id=None)


def session(n: int = 3) -> bytes:
    """A sound file: session_start, run_start, then facts up to seq n + 2, run_close."""
    body = [header(), line(2, "run_start", b'{"pid":7,"client":"t"}')]
    body += [line(seq, "turn_start", b'{"turn_index":%d}' % seq) for seq in range(3, n + 3)]
    body.append(line(n + 3, "run_close", b'{"error":null}'))
    return b"".join(body)


def read(content: bytes) -> tuple[Reader, list[Record]]:
    reader = Reader(io.BytesIO(content))
    return reader, list(reader)


def refused(content: bytes) -> FileFormatError:
    reader = Reader(io.BytesIO(content))
    with pytest.raises(FileFormatError) as info:
        list(reader)
    assert info.value.code == ErrorCode.SESSION_CORRUPT
    return info.value


# --- a sound file -------------------------------------------------------------------------


def test_a_sound_file() -> None:
    content = session(3)
    reader, records = read(content)
    assert [r.seq for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[0].type == "session_start"
    assert records[-1].type == "run_close"
    assert reader.session_id == SID
    assert reader.meta == {"app": "t"}
    assert reader.format_version == 1
    assert reader.last_seq == 6
    assert reader.lines == 6
    assert reader.offset == len(content)
    assert reader.tail == b""
    assert reader.tail_size == 0
    assert reader.done
    assert reader.error is None
    assert list(reader) == []  # exhausted, and stays so


def test_attributes_follow_the_iteration() -> None:
    content = session(1)
    reader = Reader(io.BytesIO(content))
    assert reader.session_id is None
    assert reader.last_seq == 0
    assert reader.offset == 0
    first = next(reader)
    assert reader.session_id == SID
    assert reader.offset == len(encode_line(first))
    next(reader)
    assert reader.last_seq == 2
    assert reader.lines == 2


def test_read_header_then_iterate_yields_the_header_once() -> None:
    reader = Reader(io.BytesIO(session(1)))
    head = reader.read_header()
    assert head.type == "session_start"
    assert reader.read_header() is head
    assert reader.meta == {"app": "t"}
    assert [r.seq for r in reader] == [1, 2, 3, 4]
    assert reader.read_header() is head


def test_read_records() -> None:
    assert [r.seq for r in read_records(io.BytesIO(session(2)))] == [1, 2, 3, 4, 5]


def test_record_data_passes_through_untouched() -> None:
    data = b'{"z":1,"a":[1.50,"\\u00e9"]}'
    _, records = read(header() + line(2, data=data))
    assert bytes(records[1].data) == data


def test_unknown_envelope_fields_and_record_types_are_read() -> None:
    # Newer writers may add fields and types; readers skip what they do not know.
    extra = line(2, "hologram").replace(b'{"session_id"', b'{"novel":[1,{"x":2}],"session_id"')
    _, records = read(header() + extra)
    assert records[1].type == "hologram"


def test_a_record_without_data_or_run_id_reads_with_their_defaults() -> None:
    bare = b'{"session_id":"%s","seq":2,"type":"agent_end","time":"%s"}\n' % (
        SID.encode(),
        TIME.encode(),
    )
    _, records = read(header() + bare)
    assert records[1].run_id is None
    assert bytes(records[1].data) == b"{}"


def test_unicode_line_separators_are_not_line_ends() -> None:
    data = '{"text":"a\u2028b\u0085c"}'.encode()
    _, records = read(header() + line(2, data=data))
    assert msgspec.json.decode(records[1].data) == {"text": "a\u2028b\u0085c"}


# --- line 1 -------------------------------------------------------------------------------


def test_an_empty_file_is_refused() -> None:
    error = refused(b"")
    assert error.line == 0
    assert error.reason == "empty file: no session_start"


def test_a_file_with_only_an_unfinished_first_line_is_refused() -> None:
    error = refused(header()[:-1])
    assert error.line == 1
    assert "unfinished" in error.reason


def test_a_missing_session_start_is_refused() -> None:
    error = refused(line(1, "run_start") + line(2))
    assert error.line == 1
    assert "session_start" in error.reason
    assert "'run_start'" in error.reason


def test_format_version_2_is_refused() -> None:
    error = refused(header(2) + line(2))
    assert error.line == 1
    assert "format_version 2 is not supported" in error.reason


@pytest.mark.parametrize("version", ["1", None, 1.5, True])
def test_a_format_version_that_is_not_an_integer_is_refused(version: Any) -> None:
    error = refused(header(version))
    assert error.line == 1
    assert "session_start data" in error.reason


def test_a_session_start_without_format_version_is_refused() -> None:
    bare = line(1, "session_start", b'{"meta":{}}', run_id=None)
    assert "format_version" in refused(bare).reason


def test_a_meta_that_is_not_an_object_is_refused() -> None:
    assert refused(header(meta=b"[1]")).line == 1


def test_session_start_must_have_seq_1() -> None:
    bad = header().replace(b'"seq":1', b'"seq":5')
    error = refused(bad)
    assert error.line == 1
    assert "seq 5" in error.reason


def test_an_empty_session_id_is_refused() -> None:
    assert "empty session_id" in refused(header(session_id="")).reason


def test_a_second_session_start_is_refused() -> None:
    second = line(2, "session_start", b'{"format_version":1,"meta":{}}', run_id=None)
    error = refused(header() + second)
    assert error.line == 2
    assert "line 1 only" in error.reason


# --- every later line -----------------------------------------------------------------------


def test_a_corrupt_line_in_the_middle() -> None:
    lines = [header(), line(2), b'{"session_id":"' + SID.encode() + b'","seq":3,"ty\n', line(4)]
    reader = Reader(io.BytesIO(b"".join(lines)))
    assert [r.seq for r in (next(reader), next(reader))] == [1, 2]
    with pytest.raises(FileFormatError) as info:
        next(reader)
    assert info.value.line == 3
    assert "not a valid record" in info.value.reason
    assert str(info.value).startswith("line 3: ")
    assert reader.offset == len(lines[0]) + len(lines[1])
    assert reader.lines == 2
    assert reader.last_seq == 2
    assert reader.error is info.value
    # Sticky: the reader does not skip the bad line and go on.
    with pytest.raises(FileFormatError) as again:
        next(reader)
    assert again.value is info.value


def test_a_seq_gap() -> None:
    error = refused(header() + line(2) + line(4) + line(5))
    assert error.line == 3
    assert "gap" in error.reason
    assert "expected 3" in error.reason


def test_a_repeated_seq() -> None:
    error = refused(header() + line(2) + line(2))
    assert error.line == 3
    assert "seq 2 repeats" in error.reason


def test_a_seq_going_backwards() -> None:
    error = refused(header() + line(2) + line(3) + line(2))
    assert error.line == 4
    assert "backwards" in error.reason


def test_a_foreign_session_id() -> None:
    error = refused(header() + line(2) + line(3, session_id=new_id()))
    assert error.line == 3
    assert "is not the file's session_id" in error.reason


def test_crlf_line_endings_are_refused() -> None:
    content = session(1).replace(b"\n", b"\r\n")
    error = refused(content)
    assert error.line == 1
    assert "CRLF" in error.reason


def test_a_crlf_ending_later_in_the_file() -> None:
    error = refused(header() + line(2)[:-1] + b"\r\n" + line(3))
    assert error.line == 2
    assert "CRLF" in error.reason


def test_a_raw_carriage_return_is_refused_even_where_json_allows_it() -> None:
    # JSON allows \r as whitespace between tokens; the line rule does not.
    bad = line(2).replace(b',"seq"', b',\r"seq"')
    msgspec.json.decode(bad)  # valid JSON
    error = refused(header() + bad)
    assert error.line == 2
    assert "carriage return" in error.reason


def test_a_raw_newline_inside_a_string_value_splits_into_two_bad_lines() -> None:
    good = line(2, data=b'{"text":"ab"}')
    broken = good.replace(b'"ab"', b'"a\nb"')
    assert broken.count(b"\n") == 2
    error = refused(header() + broken + line(3))
    assert error.line == 2
    assert "not a valid record" in error.reason


def test_an_empty_line_is_refused() -> None:
    error = refused(header() + b"\n" + line(2))
    assert error.line == 2
    assert error.reason == "empty line"


def test_data_must_be_an_object() -> None:
    for data in (b"[]", b"1", b'"x"', b"null"):
        error = refused(header() + line(2, data=data))
        assert error.line == 2
        assert "data must be a JSON object" in error.reason


@pytest.mark.parametrize(
    "bad",
    [
        b"[1,2,3]",
        b'{"session_id":"%s","seq":"2","type":"x","time":"t"}' % SID.encode(),
        b'{"session_id":"%s","type":"x","time":"t"}' % SID.encode(),
        b'{"session_id":"%s","seq":2,"type":"x","time":"t","run_id":5}' % SID.encode(),
        b"\xff\xfe{}",
        b"not json at all",
        b'{"session_id":"%s","seq":2,"type":"x","time":"t"} trailing' % SID.encode(),
    ],
)
def test_complete_lines_that_are_not_records(bad: bytes) -> None:
    error = refused(header() + bad + b"\n")
    assert error.line == 2


def test_absurd_nesting_is_refused_not_crashed() -> None:
    deep = b'{"a":' * 50_000 + b"1" + b"}" * 50_000
    error = refused(header() + line(2, data=deep))
    assert error.line == 2


def test_a_complete_line_of_nul_bytes() -> None:
    error = refused(header() + b"\x00" * 4096 + b"\n" + line(2))
    assert error.line == 2
    assert "NUL" in error.reason


# --- the unfinished tail ------------------------------------------------------------------


def test_a_torn_final_line_that_is_valid_json_is_ignored() -> None:
    content = session(1)
    torn = line(5)[:-1]  # a whole, valid record: only its \n is missing
    msgspec.json.decode(torn, type=Record)
    reader, records = read(content + torn)
    assert [r.seq for r in records] == [1, 2, 3, 4]
    assert reader.tail == torn
    assert reader.tail_size == len(torn)
    assert reader.offset == len(content)
    assert reader.last_seq == 4


def test_a_torn_final_line_that_is_not_json_is_ignored() -> None:
    content = session(1)
    reader, records = read(content + b'{"session_id":"01')
    assert len(records) == 4
    assert reader.tail == b'{"session_id":"01'


def test_a_final_line_of_nul_bytes_is_an_unfinished_tail() -> None:
    # ext4 after a crash: the size was updated, the data blocks were not.
    content = session(1)
    reader, records = read(content + b"\x00" * 8192)
    assert len(records) == 4
    assert reader.tail_size == 8192
    assert reader.offset == len(content)


def test_nul_bytes_over_what_were_complete_lines() -> None:
    # The NUL run hides the \n of the lines it replaced: one unfinished tail.
    content = session(3)
    cut = len(header()) + len(line(2, "run_start", b'{"pid":7,"client":"t"}'))
    damaged = content[:cut] + b"\x00" * (len(content) - cut)
    reader, records = read(damaged)
    assert [r.seq for r in records] == [1, 2]
    assert reader.offset == cut


def test_truncating_to_offset_leaves_a_file_without_tail() -> None:
    content = session(2) + b'{"torn'
    reader, records = read(content)
    truncated = content[: reader.offset]
    again, records_again = read(truncated)
    assert records_again == records
    assert again.tail == b""


@pytest.mark.parametrize("cut", range(0, len(session(1)) + 1, 7))
def test_every_cut_of_a_sound_file_reads_its_complete_lines(cut: int) -> None:
    content = session(1)
    lines = content.splitlines(keepends=True)
    complete, size = 0, 0
    for one in lines:
        if size + len(one) > cut:
            break
        complete, size = complete + 1, size + len(one)
    reader = Reader(io.BytesIO(content[:cut]))
    if complete == 0:
        with pytest.raises(FileFormatError):
            list(reader)
        return
    assert len(list(reader)) == complete
    assert reader.offset == size
    assert reader.tail == content[size:cut]


def test_a_line_longer_than_the_limit_is_refused() -> None:
    big = line(2, data=b'{"x":"' + b"y" * 5000 + b'"}')
    reader = Reader(io.BytesIO(header() + big), max_line_bytes=4096)
    with pytest.raises(FileFormatError, match="more than 4096") as info:
        list(reader)
    assert info.value.line == 2


@pytest.mark.parametrize("step", [1, 7, 1 << 20])
def test_a_line_of_exactly_the_limit_is_read_whole(step: int) -> None:
    big = line(2, data=b'{"x":"' + b"y" * 5000 + b'"}')
    limit = len(big) - 1
    content = header() + big + line(3)
    for file in (io.BytesIO(content), io.BufferedReader(ChunkedRaw(iter([content]), step=step))):
        reader = Reader(file, max_line_bytes=limit)
        assert [encode_line(r) for r in reader][1] == big
    with pytest.raises(FileFormatError, match=f"{limit} bytes long"):
        list(Reader(io.BytesIO(content), max_line_bytes=limit - 1))


def test_a_tail_longer_than_the_limit_is_still_only_a_tail() -> None:
    reader = Reader(io.BytesIO(header() + b"\x00" * 10_000), max_line_bytes=4096)
    assert len(list(reader)) == 1
    assert reader.tail_size == 10_000
    assert len(reader.tail) <= 4096


def test_default_line_limit() -> None:
    assert MAX_LINE_BYTES >= 16 * 1024 * 1024


def test_a_line_read_in_several_chunks() -> None:
    big = line(2, data=b'{"x":"' + b"y" * (3 * 1024 * 1024) + b'"}')
    _, records = read(header() + big + line(3))
    assert [r.seq for r in records] == [1, 2, 3]
    assert len(records[1].data) > 3 * 1024 * 1024


# --- file objects -------------------------------------------------------------------------


def test_a_text_mode_file_is_refused() -> None:
    with pytest.raises(LocalProtocolError, match="binary"):
        list(Reader(io.StringIO(session(1).decode())))  # type: ignore[arg-type]


class ChunkedRaw(io.RawIOBase):
    """A raw file that hands out at most ``step`` bytes per read, from a generator."""

    def __init__(self, chunks: Iterator[bytes], step: int = 1 << 16) -> None:
        self._chunks = chunks
        self._step = step
        self._buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buffer = memoryview(chunk)
        size = min(len(target), len(self._buffer), self._step)
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


def test_a_buffered_reader_over_short_reads() -> None:
    content = session(20) + b"tail"
    raw = ChunkedRaw(iter([content]), step=3)
    reader = Reader(io.BufferedReader(raw, buffer_size=16))
    assert len(list(reader)) == 23
    assert reader.tail == b"tail"


# --- constant memory ----------------------------------------------------------------------


def generated_session(total_bytes: int, line_bytes: int) -> Iterator[bytes]:
    yield header()
    prefix = b'{"session_id":"%s","seq":' % SID.encode()
    middle = b',"type":"tool_exec_end","time":"%s","run_id":"%s","data":{"content":"' % (
        TIME.encode(),
        RUN.encode(),
    )
    payload = b"x" * (line_bytes - 200)
    produced, seq = 0, 2
    while produced < total_bytes:
        one = prefix + b"%d" % seq + middle + payload + b'"}}\n'
        produced += len(one)
        seq += 1
        yield one


def test_reading_a_very_large_file_takes_constant_memory() -> None:
    total = 256 * 1024 * 1024
    source = io.BufferedReader(ChunkedRaw(generated_session(total, 64 * 1024)))
    started = time.monotonic()
    tracemalloc.start()
    try:
        reader = Reader(source)
        count = 0
        for _ in reader:
            count += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.offset >= total
    assert count == reader.last_seq > 4000
    assert peak < 2 * 1024 * 1024, f"peak {peak} bytes"
    assert time.monotonic() - started < 20


def test_a_huge_nul_tail_is_skipped_in_constant_memory() -> None:
    def chunks() -> Iterator[bytes]:
        yield header()
        for _ in range(64):
            yield bytes(1024 * 1024)

    tracemalloc.start()
    try:
        reader = Reader(io.BufferedReader(ChunkedRaw(chunks())), max_line_bytes=1024 * 1024)
        assert len(list(reader)) == 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.tail_size == 64 * 1024 * 1024
    assert peak < 8 * 1024 * 1024, f"peak {peak} bytes"


# --- fuzzing ------------------------------------------------------------------------------


def consume(content: bytes) -> list[Record]:
    """Read as far as the rules allow; only FileFormatError may stop the reader."""
    reader = Reader(io.BytesIO(content))
    records: list[Record] = []
    try:
        for record in reader:
            records.append(record)
    except FileFormatError as exc:
        assert exc.line == reader.lines + 1 or (exc.line == 0 and not content)
        assert reader.error is exc
    return records


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_raise_only_file_format_errors(content: bytes) -> None:
    records = consume(content)
    assert [r.seq for r in records] == list(range(1, len(records) + 1))


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_a_damaged_sound_file_raises_only_file_format_errors(data: st.DataObject) -> None:
    content = bytearray(session(4))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(content)))
        action = data.draw(st.sampled_from(["replace", "insert", "delete", "truncate"]))
        byte = data.draw(st.sampled_from([0, 10, 13, 34, 44, 92, 123, 125, 0xFF, 0x41]))
        if action == "replace" and position < len(content):
            content[position] = byte
        elif action == "insert":
            content.insert(position, byte)
        elif action == "delete" and position < len(content):
            del content[position]
        elif action == "truncate":
            del content[position:]
    records = consume(bytes(content))
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    assert len({r.session_id for r in records}) <= 1


# --- parse_line ---------------------------------------------------------------------------


def test_parse_line_without_expectations() -> None:
    record = parse_line(line(42)[:-1], lineno=9, session_id=None, expected_seq=None)
    assert record.seq == 42


def test_parse_line_checks_what_it_is_given() -> None:
    raw = line(42)[:-1]
    assert parse_line(raw, lineno=9, session_id=SID, expected_seq=42).seq == 42
    with pytest.raises(FileFormatError) as info:
        parse_line(raw, lineno=9, session_id=new_id(), expected_seq=42)
    assert info.value.line == 9
    with pytest.raises(FileFormatError, match="expected 41"):
        parse_line(raw, lineno=9, session_id=SID, expected_seq=41)


def test_parse_line_wants_the_line_without_its_newline() -> None:
    with pytest.raises(FileFormatError):
        parse_line(line(2) + b"\n" + line(3), lineno=2, session_id=None, expected_seq=None)


# --- check --------------------------------------------------------------------------------


def test_check_a_sound_file() -> None:
    content = session(3)
    report = check(io.BytesIO(content))
    assert report == CheckReport(
        sound=True,
        session_id=SID,
        format_version=1,
        records=6,
        runs=1,
        open_runs=[],
        checkpoints=0,
        last_seq=6,
        valid_bytes=len(content),
    )


def test_check_reports_open_runs_checkpoints_and_the_tail() -> None:
    other = new_id()
    content = (
        header()
        + line(2, "run_start")
        + line(3, "checkpoint", b'{"snapshot":{}}')
        + line(4, "run_close", b'{"error":"disk full"}')
        + line(5, "run_start", run_id=other)
        + line(6, "checkpoint", b'{"snapshot":[1]}', run_id=other)
    )
    report = check(io.BytesIO(content + b'{"torn"'))
    assert report.sound
    assert report.runs == 2
    assert report.open_runs == [other]
    assert report.checkpoints == 2
    assert report.unfinished_tail
    assert report.tail_bytes == len(b'{"torn"')
    assert report.valid_bytes == len(content)
    assert report.error is None
    assert report.warnings == []


def test_check_an_unsound_file() -> None:
    content = header() + line(2, "run_start") + line(4)
    report = check(io.BytesIO(content))
    assert not report.sound
    assert report.error_line == 3
    assert report.error is not None
    assert "gap" in report.error
    assert report.records == 2
    assert report.valid_bytes == len(content) - len(line(4))
    assert report.open_runs == [RUN]


def test_check_an_empty_file() -> None:
    report = check(io.BytesIO(b""))
    assert not report.sound
    assert report.error == "empty file: no session_start"
    assert report.error_line == 0


def test_check_warns_about_records_outside_their_run() -> None:
    content = (
        header()
        + line(2, run_id=new_id())  # a run that never started
        + line(3, "run_start")
        + line(4, "run_close")
        + line(5)  # after its run_close
        + line(6, "run_start")  # the same run id again
    )
    report = check(io.BytesIO(content))
    assert report.sound
    assert len(report.warnings) == 3
    assert "never started" in report.warnings[0]
    assert "after its run_close" in report.warnings[1]
    assert "second time" in report.warnings[2]


def test_check_warns_about_a_time_no_daemon_wrote() -> None:
    """A time edited by hand (the daemon refuses them all): named, and the file read on."""
    odd = ["0001-01-01T00:00:00+01:00", "20260-01-01T00:00:00Z", "2026-12-31T23:59:60Z"]
    lines = [header(), line(2, "run_start")]
    for seq, text in enumerate(odd, start=3):
        lines.append(line(seq).replace(TIME.encode(), text.encode()))
    lines.append(line(6, "run_close"))
    report = check(io.BytesIO(b"".join(lines)))
    assert report.sound and report.records == 6
    assert report.warnings == [
        f"seq {seq}: time {text!r} is not a record time (RFC 3339 in UTC with a Z, years "
        "0001 to 9999)"
        for seq, text in enumerate(odd, start=3)
    ]


def call(seq: int, type_: str, id: str, *, kind: str = "model", attempt: int = 1) -> bytes:
    execution = {"id": id, "kind": kind, "attempt": attempt}
    return line(seq, type_, msgspec.json.encode({"execution": execution}))


def test_check_warns_about_an_execution_id_used_by_two_calls() -> None:
    content = (
        header()
        + line(2, "run_start")
        + call(3, "model_exec_start", "m1")
        + call(4, "model_exec_end", "m1")
        + call(5, "model_exec_start", "m1", attempt=2)  # another attempt: a call of its own
        + call(6, "model_exec_start", "m1")  # after m1's end: a second call under m1
        + call(7, "model_exec_end", "m1")
        + call(8, "tool_exec_start", "t1", kind="tool")
        + call(9, "tool_exec_start", "t1", kind="tool")  # a start recorded twice
        + call(10, "tool_exec_start", "t1", kind="tool")  # the same reuse: not said again
        + call(11, "tool_exec_start", "m1", kind="tool")  # same id, another kind: another call
        + line(12, "run_close")
    )
    report = check(io.BytesIO(content))
    assert report.sound
    assert report.open_runs == []
    assert report.warnings == [
        f"seq 6: model_exec_start in run {RUN} starts a second call under an execution id "
        "already used in that run; the two cannot be told apart",
        f"seq 9: tool_exec_start in run {RUN} starts a second call under an execution id "
        "already used in that run; the two cannot be told apart",
    ]


def test_check_reads_execution_ids_per_run() -> None:
    other = new_id()
    content = (
        header()
        + line(2, "run_start")
        + call(3, "model_exec_start", "m1")
        + call(4, "model_exec_end", "m1")
        + line(5, "run_close")
        + line(6, "run_start", run_id=other)
        + line(7, "model_exec_start", b'{"execution":{"id":"m1","kind":"model"}}', run_id=other)
        + line(8, "model_exec_end", b'{"execution":null}', run_id=other)
        + line(9, "tool_exec_end", b'{"execution":{"id":7}}', run_id=other)
    )
    report = check(io.BytesIO(content))
    assert report.sound
    assert report.warnings == []


def test_check_report_encodes_as_json() -> None:
    report = check(io.BytesIO(session(1)))
    assert msgspec.json.decode(msgspec.json.encode(report), type=CheckReport) == report


# --- the example of docs/format.md --------------------------------------------------------


def test_the_example_file_of_the_format_document_is_sound() -> None:
    document = Path(__file__).resolve().parents[2] / "docs" / "format.md"
    section = document.read_text(encoding="utf-8").split("## 10. An example file", 1)[1]
    example = section.split("```\n", 2)[1].encode()
    report = check(io.BytesIO(example))
    assert report.sound
    assert report.records == 18
    assert report.open_runs == []
    assert b"sk-ant" not in example
    for record in read_records(io.BytesIO(example)):
        if record.type not in STRUCTURAL_TYPES:
            event = default_codec.decode_event(record)
            encoded = default_codec.encode_event(event)
            assert encoded is not None
            assert encoded.data == bytes(record.data)  # the codec writes exactly this
