"""The C accelerator against the Python path it speeds up, on random and hostile input.

The contract (flightlog.protocol._accel): C accepts only what Python accepts, with the
same output; on any doubt it says "not sure" and Python decides.  Each test runs the
same input both ways, the Python one with every fast path switched off, and checks
that C never accepts what Python refuses, that what both take comes out the same
(events, line bytes, replies, the session's state), and that C does accept the
common case (or it would be dead weight, and docs/benchmarks.md's figures would lie).

A C verdict is stack-independent where msgspec's is not (its nesting bound is the
recursion limit from where it is called): C takes nesting up to 64 only, so a caller
may be that far below the recursion limit and still get the verdict msgspec gives.
"""

from __future__ import annotations

import contextlib
import json
import struct
import sys
from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import event as note_event

from flightlog.protocol import (
    AGENT_FACT_TYPES,
    LocalProtocolError,
    Record,
    _accel,
    _json,
    _records,
    default_codec,
    events,
)
from flightlog.protocol.format import (
    MAX_NESTING,
    LineEncoder,
    check_json,
    is_time,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    BeginRun,
    CloseRun,
    Create,
    Hello,
    RecordEvent,
    RecordLines,
    ServerConnection,
    SessionOpened,
    StartRun,
    Status,
    encode_frame,
)

pytestmark = pytest.mark.skipif(not _accel.SPEEDUPS, reason="the C accelerator is off")
_record_decoder = msgspec.json.Decoder(Record)

_SPEEDUPS = sys.modules.get("flightlog.protocol._speedups")


@contextlib.contextmanager
def python_path() -> Iterator[None]:
    """Every fast path off: the Python code alone, as without the extension."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_json, "fast_check_json", None)
        patch.setattr(_records, "fast_is_time", None)
        yield


def python_check(data: bytes, limit: int = MAX_NESTING) -> str | None:
    """The Python path's verdict: None, or its refusal's message."""
    with python_path():
        try:
            check_json(data, "data", limit=limit)
        except LocalProtocolError as exc:
            assert exc.code == "bad_event"
            return exc.message
    return None


def c_accepts(data: bytes, limit: int = MAX_NESTING) -> bool:
    assert _SPEEDUPS is not None
    return bool(_SPEEDUPS.check_json(data, limit))


def same_verdict(data: bytes, limit: int = MAX_NESTING) -> bool:
    """C accepts only what Python accepts; returns whether C accepted."""
    accepted = c_accepts(data, limit)
    if accepted:
        assert python_check(data, limit) is None, data[:200]
    # Whichever way, check_json with C on says what Python says.
    with contextlib.suppress(LocalProtocolError):
        check_json(data, "data", limit=limit)
        assert python_check(data, limit) is None
    return accepted


# ------------------------------------------------------------------------ JSON

_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from('"\\/'),
    max_size=12,
)
_numbers = st.integers(-(10**30), 10**30) | st.floats(allow_nan=False, allow_infinity=False)
_values = st.recursive(
    st.none() | st.booleans() | _numbers | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=40,
)


def _dumps(value: Any, ascii_only: bool, spaced: bool) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps(value, ensure_ascii=ascii_only, separators=separators).encode()


def _deep(value: Any, level: int = 0) -> bool:
    if level >= 64:
        return True
    if isinstance(value, list):
        return any(_deep(v, level + 1) for v in value)
    if isinstance(value, dict):
        return any(_deep(v, level + 1) for v in value.values())
    return False


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values, st.booleans(), st.booleans(), st.data())
def test_json_is_accepted_as_python_accepts_it_and_never_where_python_refuses_once_mutated(
    value: Any, ascii_only: bool, spaced: bool, data: Any
) -> None:
    """Each value drawn (the drawing is most of the time) as json.dumps writes it, then
    mutated."""
    whole = _dumps(value, ascii_only, spaced)
    accepted = same_verdict(whole)
    if python_check(whole) is None and b"\\ud" not in whole.lower() and b"e+" not in whole:
        # What the codec and json.dumps write is the common case: C takes it.
        assert accepted or _deep(value) or b"e" in whole.lower(), whole[:200]
    text = bytearray(_dumps(value, ascii_only, False))
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(text)))
        what = data.draw(
            st.sampled_from(
                [
                    b"\n",
                    b"\r",
                    b"\t",
                    b"\x00",
                    b"\x1f",
                    b"\x7f",
                    b"\x80",
                    b"\xc0\x80",
                    b"\xed\xa0\x80",
                    b"\xf4\x90\x80\x80",
                    b"\xf5",
                    b"\xff",
                    b"\xe2\x82",
                    b"\xef\xbb\xbf",
                    b"\\",
                    b'"',
                    b"\\u",
                    b"\\ud800",
                    b"\\udc00",
                    b"\\u00e9",
                    b"\\x",
                    b"{",
                    b"}",
                    b"[",
                    b"]",
                    b",",
                    b":",
                    b"-",
                    b"+",
                    b".",
                    b"e",
                    b"E",
                    b"0",
                    b"1",
                    b"e999",
                    b"1e308",
                    b"1e309",
                    b"e-999",
                    b"true",
                    b"nul",
                    b"\x0b",
                    b"\x0c",
                    b" ",
                ]
            )
            | st.binary(max_size=3)
        )
        if data.draw(st.booleans()) and where < len(text):
            text[where : where + len(what)] = what
        else:
            text[where:where] = what
    same_verdict(bytes(text))


@pytest.mark.parametrize(
    "data",
    [
        b'{"n":' + b"9" * 200 + b"}",
        b'{"n":' + b"9" * 201 + b"}",
        b'{"n":' + b"9" * 210 + b"e99}",
        b'{"n":' + b"9" * 200 + b"e99}",
        b'{"n":' + b"9" * 4301 + b"}",
        b'{"n":1' + b"0" * 400 + b"}",
        b'{"n":1e99}',
        b'{"n":1e100}',
        b'{"n":1e308}',
        b'{"n":1e309}',
        b'{"n":1E+99}',
        b'{"n":-1e-99}',
        b'{"n":1e-400}',
        b'{"n":0.' + b"0" * 200 + b"1}",
        b'{"n":0.' + b"0" * 201 + b"1}",
        b'{"n":-0}',
        b'{"n":01}',
        b'{"n":1.}',
        b'{"n":.5}',
        b'{"n":1e}',
        b'{"n":+1}',
        b'{"n":-}',
        b'{"n":NaN}',
        b'{"n":Infinity}',
        b'{"s":"\\ud83d\\ude00"}',
        b'{"s":"\\ud800"}',
        b'{"s":"\\uDFFF"}',
        b'{"s":"\\u0000"}',
        b'{"s":"\\u00E9\\u00e9"}',
        b'{"s":"\\u12"}',
        b'{"s":"\\/\\b\\f\\n\\r\\t\\"\\\\"}',
        b'{"s":"\\a"}',
        b'{"s":"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"}',
        b'{"s":"\xc0\xaf"}',
        b'{"s":"\xe0\x80\xaf"}',
        b'{"s":"\xed\xa0\x80"}',
        b'{"s":"\xf4\x90\x80\x80"}',
        b'{"s":"\xf0\x9f\x98"}',
        b'{"s":"tab\there"}',
        b'{"s":"nl\nhere"}',
        b'{"a":1,}',
        b'{"a":1 "b":2}',
        b'{"a" 1}',
        b"{1:2}",
        b'{"a":1}{"b":2}',
        b'{"a":1} ',
        b' \t{"a":1}\t ',
        b'{"a":1}\n',
        b'\xef\xbb\xbf{"a":1}',
        b'{"a":1,"a":2}',
        b"{}",
        b"[]",
        b"",
        b" ",
        b"tru",
        b"nulls",
        b"[" * 64 + b"]" * 64,
        b"[" * 65 + b"]" * 65,
        b"[" * 256 + b"]" * 256,
        b"[" * 257 + b"]" * 257,
        b'{"a":"' + b"x" * 70000 + b'"}',
        b'{"a":"' + b"\xc3\xa9" * 40000 + b'"}',
        b'{"a":"' + b"x" * 70000 + b'\xff"}',
        b'{"a":[' + b"1e400," * 3 + b"1]}",
    ],
)
def test_json_edges(data: bytes) -> None:
    same_verdict(data)


def test_json_bounds_below_the_limit_and_in_range_are_taken() -> None:
    for data in (
        b'{"n":' + b"9" * 200 + b"e99}",
        b"[" * 64 + b"]" * 64,
        b'{"s":"\\u00e9\xc3\xa9\xf0\x9f\x98\x80\\/"}',
        b'{"a":"' + b"x" * 70000 + b'"}',
    ):
        assert c_accepts(data), data[:40]
    # Nesting deeper than the limit asked for is never taken.
    assert not c_accepts(b"[[[]]]", 2)
    assert python_check(b"[[[]]]", 2) is not None


@pytest.mark.parametrize(("limit"), [0, 1, 5, 64, 65, 256])
def test_json_nesting_at_each_limit(limit: int) -> None:
    for depth in range(0, 70):
        same_verdict(b"[" * depth + b"1" + b"]" * depth, limit)
        same_verdict(b'{"a":' * depth + b"1" + b"}" * depth, limit)


def _small() -> events.ToolExecStart:
    """The benchmarks' small event (bench/_events.py)."""
    return events.ToolExecStart(
        execution=events.Execution(id="tool-7", kind="tool", turn_index=3),
        tool_call_id="call_8f2b",
        name="read_file",
        arguments={"path": "src/app.py", "sent_ns": 1234567890},
    )


def test_the_codecs_events_are_taken() -> None:
    large = events.ToolExecStart(
        execution=events.Execution(id="tool-7", kind="tool", turn_index=3),
        tool_call_id="call_8f2b",
        name="write_file",
        arguments={"text": "The handler reads the request body. \u00e9\n" * 1500, "n": -1.5e-7},
    )
    for event in (_small(), large):
        data = default_codec.encode_event(event).data
        assert c_accepts(data) and python_check(data) is None


def test_check_json_on_what_is_not_bytes_goes_the_python_way() -> None:
    assert _SPEEDUPS is not None
    assert not _SPEEDUPS.check_json(bytearray(b"{}"), 256)  # type: ignore[arg-type]
    assert not _SPEEDUPS.check_json(memoryview(b"{}"), 256)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ time

_time_chars = st.sampled_from("0123456789-:.TtZz +\u0661\uff12")


@settings(max_examples=3000, deadline=None)
@given(
    st.from_regex(
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{0,11})?Z", fullmatch=True
    )
    | st.text(_time_chars, max_size=32)
)
@example("2024-02-29T23:59:59.123456789Z")
@example("2023-02-29T00:00:00Z")
@example("1900-02-29T00:00:00Z")
@example("2000-02-29T00:00:00Z")
@example("0000-01-01T00:00:00Z")
@example("0000-02-29T00:00:00Z")
@example("2026-04-31T00:00:00Z")
@example("2026-12-31T23:59:60Z")
@example("2026-12-31T24:00:00Z")
@example("2026-00-10T00:00:00Z")
@example("2026-13-10T00:00:00Z")
@example("2026-01-00T00:00:00Z")
@example("2026-01-01T00:00:00.Z")
@example("2026-01-01T00:00:00.1234567890Z")
@example("2026-01-01t00:00:00Z")
@example("2026-01-01T00:00:00z")
@example("2026-01-01T00:00:00+00:00")
@example("2026-01-0\u0661T00:00:00Z")
def test_times_are_accepted_as_python_accepts_them(text: str) -> None:
    assert _SPEEDUPS is not None
    accepted = _SPEEDUPS.is_time(text)
    with python_path():
        expected = is_time(text)
    if accepted:
        assert expected, text
    assert is_time(text) == expected


def test_record_times_are_taken() -> None:
    assert _SPEEDUPS is not None
    for text in ("2026-11-29T20:00:00.000000Z", "2024-02-29T00:00:00Z", "0001-01-01T00:00:00.1Z"):
        assert _SPEEDUPS.is_time(text)


# ------------------------------------------------------------ the record path

SID = "a" * 32
OTHER = "b" * 32
TIME = "2026-11-29T20:00:00.000000Z"


class Side:
    """One ServerConnection, writing two sessions with a run open in each."""

    def __init__(self, fast: bool, max_line: int | None) -> None:
        self.fast = fast
        self.server = ServerConnection(
            max_frame_size=1 << 20, max_line=max_line, check_inline=4096, record_lines=fast
        )
        self.runs = {SID: "1" * 32, OTHER: "2" * 32}
        self.lines = {SID: LineEncoder(SID), OTHER: LineEncoder(OTHER)}
        self.seq = {SID: 2, OTHER: 2}
        self.taken = 0  # records that came out in RecordLines
        self.feed(encode_frame(Hello(id=1, version=PROTOCOL_VERSION, client="t", pid=1)))
        for number, session_id in enumerate((SID, OTHER)):
            [create] = self.feed(encode_frame(Create(id=2 + number, path=f"{number}.jsonl")))
            assert isinstance(create, Create)
            self.server.opened(
                SessionOpened(id=create.id, session_id=session_id, path="p", last_seq=1)
            )
            run_id = self.runs[session_id]
            [start] = self.feed(
                encode_frame(
                    BeginRun(id=5 + number, session_id=session_id, time=TIME, run_id=run_id)
                )
            )
            assert isinstance(start, StartRun) and start.run_id == run_id
        self.server.data_to_send()

    def feed(self, data: bytes) -> list[Any]:
        """The events ``data`` makes: lines as bytes (one per record), the rest as is."""
        self.server.receive_data(data)
        with contextlib.nullcontext() if self.fast else python_path():
            events = list(iter(self.server.next_event, None))
        out: list[Any] = []
        for event in events:
            if isinstance(event, RecordLines):
                assert self.fast
                buf = bytearray()
                encoder = self.lines[event.session_id]
                count = encoder.append_tails(buf, self.seq[event.session_id], event.tails)
                assert count == event.count
                lines = bytes(buf).splitlines(keepends=True)
                assert len(lines) == count
                assert event.size == sum(len(_record_decoder.decode(line).data) for line in lines)
                self.seq[event.session_id] += count
                self.taken += count
                out.extend(lines)
            elif isinstance(event, RecordEvent):
                buf = bytearray()
                self.lines[event.session_id].append(
                    buf,
                    self.seq[event.session_id],
                    event.event_type,
                    event.time,
                    event.run_id,
                    event.data,
                )
                self.seq[event.session_id] += 1
                out.append(bytes(buf))
            else:
                out.append(event)
        return out

    def state(self) -> Any:
        return (
            self.server.state,
            {sid: repr(machine) for sid, machine in self.server.sessions.items()},
            self.server.data_to_send(),
        )


def _frames(run_ids: dict[str, str]) -> st.SearchStrategy[bytes]:
    """Frames: records good and bad in every field, other messages, hand-made layouts."""
    good_data = st.sampled_from(
        [b"{}", b'{"a":1}', b'{"path":"src/app.py","n":[1,2.5,-3e10],"ok":true}']
    ) | _values.map(lambda value: _dumps({"v": value}, False, False))
    data = good_data | st.sampled_from(
        [
            b"[]",
            b"",
            b"{",
            b'{"a":1e400}',
            b'{"a":"\xff"}',
            b'{"a":\n1}',
            b" {}",
            b"{" * 70 + b"}" * 70,
            b'{"a":"' + b"x" * 5000 + b'"}',
            b"{}" + b" " * 4095,
        ]
    )
    session = st.sampled_from([SID, OTHER, "c" * 32, "\u00e9" * 16])
    event_type = st.sampled_from([*sorted(AGENT_FACT_TYPES), "run_start", "nope", ""])
    time = st.sampled_from(
        [TIME, "2024-02-29T00:00:00Z", "2023-02-29T00:00:00Z", "2026-11-29T20:00:00+00:00", ""]
    )

    @st.composite
    def record(draw: st.DrawFn) -> bytes:
        session_id = draw(session)
        run_id = draw(st.sampled_from([run_ids.get(session_id, "r" * 32), "3" * 32, "f" * 32]))
        message = RecordEvent(
            session_id=session_id,
            run_id=run_id,
            event_type=draw(event_type),
            time=draw(time),
            data=draw(data),
        )
        frame = bytearray(encode_frame(message))
        for _ in range(draw(st.integers(0, 2)) if draw(st.booleans()) else 0):
            # Hostile bytes: any byte of the frame, its length included.
            where = draw(st.integers(0, len(frame) - 1))
            frame[where] = draw(st.integers(0, 255))
        return bytes(frame)

    def hand_made(fields: dict[str, Any]) -> bytes:
        body = msgspec.msgpack.encode(fields)
        return struct.pack(">I", len(body)) + body

    @st.composite
    def reordered(draw: st.DrawFn) -> bytes:
        fields = {
            "type": "record",
            "session_id": SID,
            "run_id": run_ids[SID],
            "event_type": "agent_start",
            "time": TIME,
            "data": b"{}",
        }
        items = draw(st.permutations(list(fields.items())))
        if draw(st.booleans()):
            items = [*items, ("extra", 1)]
        return hand_made(dict(items))

    other = st.sampled_from(
        [
            encode_frame(Status(id=9)),
            encode_frame(CloseRun(id=10, session_id=OTHER, run_id=run_ids[OTHER], time=TIME)),
            encode_frame(BeginRun(id=11, session_id=OTHER, time=TIME, run_id="3" * 32)),
            b"\x00\x00\x00\x01\xc1",
            b"\x00\x00\x00\x00",
        ]
    )

    @st.composite
    def good(draw: st.DrawFn) -> bytes:
        session_id = draw(st.sampled_from([SID, OTHER]))
        message = RecordEvent(
            session_id=session_id,
            run_id=run_ids[session_id],
            event_type=draw(st.sampled_from(sorted(AGENT_FACT_TYPES))),
            time=draw(st.sampled_from([TIME, "2024-02-29T00:00:00Z", "2026-01-31T23:59:59.9Z"])),
            data=draw(good_data),
        )
        return encode_frame(message)

    # Mostly records that pass, so that C takes stretches and the odd one breaks them.
    return st.one_of(good(), good(), good(), good(), record(), reordered(), other)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from([None, 64 * 1024 + 600, 64 * 1024 + 10]))
def test_the_record_path_makes_what_python_makes(data: Any, max_line: int | None) -> None:
    fast, slow = Side(True, max_line), Side(False, max_line)
    stream = b"".join(data.draw(st.lists(_frames(fast.runs), max_size=30)))
    cut = data.draw(st.integers(0, len(stream)))
    got = fast.feed(stream[:cut]) + fast.feed(stream[cut:])
    want = slow.feed(stream[:cut]) + slow.feed(stream[cut:])
    note_event("C took records" if fast.taken else "C took none")
    assert got == want
    assert fast.state() == slow.state()


def test_the_common_record_is_taken_in_one_stretch_per_session() -> None:
    side = Side(True, None)
    data = default_codec.encode_event(_small()).data

    def frame(session_id: str) -> bytes:
        return encode_frame(
            RecordEvent(
                session_id=session_id,
                run_id=side.runs[session_id],
                event_type="tool_exec_start",
                time=TIME,
                data=data,
            )
        )

    side.server.receive_data(frame(SID) * 3 + frame(OTHER) * 2 + frame(SID))
    events = list(iter(side.server.next_event, None))
    assert [(type(e), getattr(e, "session_id", None), getattr(e, "count", 1)) for e in events] == [
        (RecordLines, SID, 3),
        (RecordLines, OTHER, 2),
        (RecordLines, SID, 1),
    ]


def test_append_tails_c_and_python_write_the_same_lines() -> None:
    side = Side(True, None)
    side.server.receive_data(
        b"".join(
            encode_frame(
                RecordEvent(
                    session_id=SID,
                    run_id=side.runs[SID],
                    event_type="agent_start",
                    time=TIME,
                    data=b'{"i":%d}' % i,
                )
            )
            for i in range(5)
        )
    )
    [lines] = list(iter(side.server.next_event, None))
    encoder = LineEncoder(SID)
    for seq in (1, 9, 99, 10**12, 2**62 - 2, 2**62 + 5):
        fast, slow = bytearray(b"x"), bytearray(b"x")
        encoder.append_tails(fast, seq, lines.tails)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_records, "append_lines", None)
            encoder.append_tails(slow, seq, lines.tails)
        assert fast == slow
        expected = bytearray(b"x")
        for i in range(5):
            encoder.append(expected, seq + i, "agent_start", TIME, side.runs[SID], b'{"i":%d}' % i)
        assert fast == expected


def test_append_lines_refuses_tails_that_are_not_lengths_and_tails() -> None:
    assert _SPEEDUPS is not None
    for tails in (b"\x05\x00\x00\x00abc", b"\x01\x00", b"\xff\xff\xff\xff"):
        with pytest.raises(ValueError):
            _SPEEDUPS.append_lines(bytearray(), b"h", 1, bytearray(tails))
