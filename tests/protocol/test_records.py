"""The record envelope and the structural records, through lines and the reader."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings

from flightlog.protocol import (
    AGENT_FACT_TYPES,
    CHECKPOINT,
    FORMAT_VERSION,
    RECORD_TYPES,
    RUN_CLOSE,
    RUN_RESUME,
    RUN_START,
    SESSION_START,
    CheckpointData,
    LocalProtocolError,
    Reader,
    Record,
    RunCloseData,
    RunResumeData,
    RunStartData,
    SessionStartData,
    default_codec,
    format_time,
    new_id,
    now,
    parse_time,
)
from flightlog.protocol.format import (
    NEVER_WRITTEN_TYPES,
    STRUCTURAL_TYPES,
    LineEncoder,
    append_line,
    encode_line,
    is_session_id,
    is_time,
    parse_line,
    utc_time,
)

SID = new_id()
TIME_TEXT = "2026-11-29T20:00:00.000000Z"


def test_type_sets_are_disjoint_and_complete() -> None:
    assert {SESSION_START, RUN_START, CHECKPOINT, RUN_CLOSE, RUN_RESUME} == STRUCTURAL_TYPES
    assert not STRUCTURAL_TYPES & AGENT_FACT_TYPES
    assert not NEVER_WRITTEN_TYPES & RECORD_TYPES
    assert RECORD_TYPES == STRUCTURAL_TYPES | AGENT_FACT_TYPES
    assert len(AGENT_FACT_TYPES) == 22


def test_envelope_field_order_and_one_line() -> None:
    record = Record(
        session_id=SID,
        seq=1,
        type="session_start",
        time="2026-11-29T20:00:00.000000Z",
        data=msgspec.Raw(b'{"format_version":1,"meta":{}}'),
    )
    assert encode_line(record) == (
        b'{"session_id":"%s","seq":1,"type":"session_start",'
        b'"time":"2026-11-29T20:00:00.000000Z","run_id":null,'
        b'"data":{"format_version":1,"meta":{}}}\n' % SID.encode()
    )


def test_append_line_appends() -> None:
    buf = bytearray(b"previous\n")
    record = Record(session_id=SID, seq=2, type="x", time=now())
    append_line(buf, record)
    append_line(buf, record)
    assert buf.startswith(b"previous\n")
    assert buf.count(b"\n") == 3
    assert bytes(buf[9:]) == encode_line(record) * 2


_msgspec_line = msgspec.json.Encoder().encode

# Any text msgspec can encode: escapes, control characters, non-ASCII, line separators.
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_types = st.one_of(st.sampled_from(sorted(RECORD_TYPES)), _text)


@settings(max_examples=300, deadline=None)
@given(
    session_id=_text,
    lines=st.lists(
        st.tuples(
            st.integers(-(2**63), 2**64),
            _types,
            _text,
            st.one_of(st.none(), st.sampled_from(["r1", "r2"]), _text),
            st.sampled_from([b"{}", b'{"a":[1,"\\u00e9"]}', b'{ "spaced" : 1 }', b"[1]", b"null"]),
        ),
        max_size=6,
    ),
)
def test_the_line_encoder_writes_what_msgspec_writes_for_the_record(
    session_id: str, lines: list[tuple[int, str, str, str | None, bytes]]
) -> None:
    # The guard beside the fast path: cached envelope pieces give msgspec's bytes.
    encoder = LineEncoder(session_id)
    buf = bytearray(b"before\n")
    expected = b"before\n"
    for seq, record_type, time, run_id, data in lines:
        encoder.append(buf, seq, record_type, time, run_id, data)
        record = Record(
            session_id=session_id,
            seq=seq,
            type=record_type,
            time=time,
            run_id=run_id,
            data=msgspec.Raw(data),
        )
        expected += _msgspec_line(record) + b"\n"
        assert encode_line(record) == _msgspec_line(record) + b"\n"
    assert bytes(buf) == expected


def test_append_line_switches_sessions() -> None:
    one, two = new_id(), new_id()
    buf = bytearray()
    for session_id in (one, two, one):
        append_line(buf, Record(session_id=session_id, seq=1, type="x", time=TIME_TEXT))
    assert [msgspec.json.decode(line)["session_id"] for line in buf.splitlines()] == [one, two, one]


def test_record_defaults() -> None:
    record = Record(session_id=SID, seq=3, type="agent_end", time=now())
    assert record.run_id is None
    assert bytes(record.data) == b"{}"


def test_record_decode_data_and_to_builtins() -> None:
    record = Record(
        session_id=SID,
        seq=2,
        type=RUN_START,
        time=now(),
        run_id="r",
        data=msgspec.Raw(b'{"pid":12,"client":"demo"}'),
    )
    assert record.decode_data(RunStartData) == RunStartData(pid=12, client="demo")
    assert record.decode_data() == {"pid": 12, "client": "demo"}
    builtins = record.to_builtins()
    assert builtins["data"] == {"pid": 12, "client": "demo"}
    assert list(builtins) == ["session_id", "seq", "type", "time", "run_id", "data"]


def test_session_start_data_defaults() -> None:
    assert SessionStartData() == SessionStartData(format_version=FORMAT_VERSION, meta={})
    assert FORMAT_VERSION == 1


def test_time_format() -> None:
    moment = datetime(2026, 11, 29, 21, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert format_time(moment) == "2026-11-29T20:00:00.123456Z"
    assert parse_time("2026-11-29T20:00:00.123456Z") == moment
    assert parse_time("2026-11-29T20:00:00Z") == datetime(2026, 11, 29, 20, tzinfo=UTC)
    assert parse_time("2026-11-29T20:00:00.123456789Z").microsecond == 123456


def test_format_time_pads_early_years() -> None:
    text = format_time(datetime(999, 1, 2, 3, 4, 5, 6, tzinfo=UTC))
    assert text == "0999-01-02T03:04:05.000006Z"
    assert is_time(text)
    assert parse_time(text) == datetime(999, 1, 2, 3, 4, 5, 6, tzinfo=UTC)


def test_format_time_refuses_a_naive_datetime() -> None:
    with pytest.raises(LocalProtocolError):
        format_time(datetime(2026, 1, 1))


@pytest.mark.parametrize(
    "text",
    ["2026-11-29T20:00:00+00:00", "2026-11-29 20:00:00Z", "2026-11-29T20:00Z", "", "now"],
)
def test_not_record_times(text: str) -> None:
    assert not is_time(text)


@pytest.mark.parametrize(
    "text", ["0000-01-01T00:00:00Z", "0000-02-28T23:59:59.999999Z", "0000-12-31T00:00:00.1Z"]
)
def test_year_zero_is_no_record_time(text: str) -> None:
    """Year 0000 was accepted, and every reader's datetime then failed on it (issue 27)."""
    assert not is_time(text)
    assert utc_time(text) is None
    assert is_time("0001" + text[4:])
    parse_time("0001" + text[4:])


@pytest.mark.parametrize(
    "text", ["2026-11-29T20:00Z", "", "now", "2026-02-30T20:00:00Z", "2026-11-29T20:00:00+24:00"]
)
def test_not_rfc_3339_times(text: str) -> None:
    assert utc_time(text) is None
    with pytest.raises(ValueError):
        parse_time(text)


@pytest.mark.parametrize(
    ("text", "utc"),
    [
        ("2026-11-29T20:00:00.000001Z", "2026-11-29T20:00:00.000001Z"),
        ("2026-11-29T20:00:00+00:00", "2026-11-29T20:00:00Z"),
        ("2026-11-29 20:00:00Z", "2026-11-29T20:00:00Z"),
        ("2026-11-30T05:45:00.25+09:45", "2026-11-29T20:00:00.25Z"),
        ("2026-01-01T00:30:00+01:00", "2025-12-31T23:30:00Z"),
    ],
)
def test_any_rfc_3339_time_in_utc(text: str, utc: str) -> None:
    assert utc_time(text) == utc
    assert is_time(utc)
    assert parse_time(text) == parse_time(utc)


def test_now_is_a_record_time() -> None:
    assert is_time(now())


def test_ids() -> None:
    ids = {new_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(is_session_id(i) for i in ids)
    assert not is_session_id("ABC")
    assert not is_session_id(SID.upper())


# --- every record type through a line and the reader -----------------------------------------

keys = st.text(max_size=10)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=15,
)
big_texts = st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=3), st.integers(0, 100_000))


def structural_data(type_: str) -> st.SearchStrategy[bytes]:
    if type_ == SESSION_START:
        return st.builds(SessionStartData, meta=st.dictionaries(keys, json_values, max_size=5)).map(
            msgspec.json.encode
        )
    if type_ == RUN_START:
        return st.builds(RunStartData, pid=st.integers(0, 2**31), client=st.text()).map(
            msgspec.json.encode
        )
    if type_ == CHECKPOINT:
        return st.one_of(json_values, big_texts).map(
            lambda v: msgspec.json.encode(
                CheckpointData(snapshot=msgspec.Raw(default_codec.encode_value(v)))
            )
        )
    if type_ == RUN_RESUME:
        return st.builds(
            RunResumeData, pid=st.integers(0, 2**31), client=st.text(), items=st.integers(0)
        ).map(msgspec.json.encode)
    return st.builds(RunCloseData, error=st.none() | st.text() | big_texts).map(msgspec.json.encode)


@pytest.mark.parametrize("type_", sorted(STRUCTURAL_TYPES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_structural_records_round_trip_through_the_reader(type_: str, data: Any) -> None:
    payload = data.draw(structural_data(type_))
    head = Record(
        session_id=SID,
        seq=1,
        type=SESSION_START,
        time=now(),
        data=msgspec.Raw(payload if type_ == SESSION_START else b'{"format_version":1}'),
    )
    records = [head]
    if type_ != SESSION_START:
        records.append(
            Record(
                session_id=SID,
                seq=2,
                type=type_,
                time=now(),
                run_id=new_id(),
                data=msgspec.Raw(payload),
            )
        )
    content = b"".join(map(encode_line, records))
    assert content.count(b"\n") == len(records)
    read = list(Reader(io.BytesIO(content)))
    assert read == records
    last = read[-1]
    kind = {
        SESSION_START: SessionStartData,
        RUN_START: RunStartData,
        CHECKPOINT: CheckpointData,
        RUN_CLOSE: RunCloseData,
        RUN_RESUME: RunResumeData,
    }[type_]
    assert msgspec.json.encode(last.decode_data(kind)) == payload


@settings(max_examples=200, deadline=None)
@given(
    type_=st.text(min_size=1),
    run_id=st.none() | st.text(),
    seq=st.integers(1, 2**63 - 1),
    data=st.dictionaries(keys, json_values, max_size=5),
)
def test_any_envelope_round_trips_through_one_line(
    type_: str, run_id: str | None, seq: int, data: dict[str, Any]
) -> None:
    record = Record(
        session_id=SID,
        seq=seq,
        type=type_,
        time=now(),
        run_id=run_id,
        data=msgspec.Raw(msgspec.json.encode(data)),
    )
    encoded = encode_line(record)
    assert encoded.endswith(b"\n")
    assert encoded.count(b"\n") == 1
    assert b"\r" not in encoded
    parsed = parse_line(encoded[:-1], lineno=1, session_id=SID, expected_seq=seq)
    assert parsed == record
    assert parsed.decode_data() == data


@pytest.mark.parametrize(
    "text",
    [
        "2026-02-30T20:00:00Z",  # no such day
        "2026-11-29T24:00:00Z",
        "2026-11-29T20:60:00Z",
        "2026-11-29T20:00:60Z",  # leap seconds are not record times
        "\uff12\uff10\uff12\uff16-11-29T20:00:00Z",  # fullwidth digits, not ASCII ones
    ],
)
def test_impossible_or_non_ascii_times_are_not_record_times(text: str) -> None:
    assert not is_time(text)
