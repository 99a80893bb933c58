"""The JSON check every server applies to record data and snapshots: what it refuses,
its nesting bound agreeing with a plain reading of the JSON whatever the strings hold
(brackets, quotes and backslashes inside strings do not count), its verdicts and
messages agreeing with its rules applied one by one whichever way it takes (a full
decode or passes over the bytes), and its cost, linear in the payload however deep it
nests."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import assume, given, settings

from flightlog.protocol import (
    LocalProtocolError,
    _json,
    _numbers,
    _structure,
)
from flightlog.protocol._json import DECODE_IN_FULL
from flightlog.protocol.format import (
    MAX_NESTING,
    check_json,
    check_numbers,
    nested_deeper_than,
)

# Strings full of what could fool a byte-level scan.
_tricky = st.text(alphabet='[]{}"\\ab', max_size=8)
_values = st.recursive(
    st.none() | st.integers() | _tricky,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_tricky, inner, max_size=3),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


def _nest(value: Any, levels: int) -> Any:
    for level in range(levels):
        value = [value] if level % 2 else {'k"[\\': value}
    return value


@settings(max_examples=500, deadline=None)
@given(_values, st.integers(0, 12), st.integers(0, 14))
def test_agrees_with_the_parsed_depth(value: Any, levels: int, limit: int) -> None:
    value = _nest(value, levels)
    data = json.dumps(value).encode()
    assert nested_deeper_than(data, limit) == (_depth(value) > limit)


def test_the_limit_itself_is_allowed() -> None:
    assert not nested_deeper_than(json.dumps(_nest(1, 256)).encode(), 256)
    assert nested_deeper_than(json.dumps(_nest(1, 257)).encode(), 256)


@pytest.mark.parametrize(
    ("data", "deeper"),
    [
        (b"{}", False),
        (b"[" * MAX_NESTING + b"]" * MAX_NESTING, False),
        (b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1), True),
        (b'{"a":"' + b"[" * 1000 + b'"}', False),  # brackets in a string
        (b'{"a":"\\"[[[[\\\\"' + b',"b":' + b"[" * 300 + b"]" * 300 + b"}", True),
        (b"[" + b"[]," * 5000 + b"[]]", False),  # many brackets, shallow
    ],
)
def test_nested_deeper_than(data: bytes, deeper: bool) -> None:
    msgspec.json.decode(data)  # every case is valid JSON
    assert nested_deeper_than(data, MAX_NESTING) is deeper


@pytest.mark.parametrize(
    "data",
    [
        b'{"a":\n1}',
        b'{"a":\r1}',
        b"{",
        b'{"a":"\xff"}',
        b'{"a":"\\ud800"}',
        b"[" * 300 + b"]" * 300,
    ],
)
def test_check_json_refuses(data: bytes) -> None:
    with pytest.raises(LocalProtocolError) as info:
        check_json(data, "data")
    assert info.value.code == "bad_event"


class _Counted(bytes):
    """A payload that counts the passes made over it (each method call is one)."""

    passes = 0

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name in _BYTES_METHODS:
            type(self).passes += 1
        return attribute


_BYTES_METHODS = {name for name in dir(bytes) if not name.startswith("__")}


def test_a_deep_16_mib_payload_is_checked_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 16's class 1: nested 254 deep, repeated up to 16 MiB, once cost one pass over
    # the remaining structure per level (254 of them).
    nest = b"[" * 254 + b"]" * 254
    payload = b"[" + b",".join([nest] * (16 * 1024 * 1024 // (len(nest) + 1))) + b"]"
    assert 16 * 1024 * 1024 - len(nest) < len(payload) <= 16 * 1024 * 1024
    summed: list[int] = []
    running_sum = _json.accumulate

    def counting_sum(steps: Any, *, initial: int) -> Any:
        summed.append(0)
        for depth in running_sum(steps, initial=initial):
            summed[-1] += 1
            yield depth

    monkeypatch.setattr(_json, "accumulate", counting_sum)
    _Counted.passes = 0
    check_json(_Counted(payload), "record data")  # 255 levels: within the bound
    # A handful of C passes over the payload, a search for the next quote and comma
    # per piece of its structure, and one running sum over its brackets.
    pieces = len(summed)
    assert pieces <= len(payload) // _structure._PIECE + 1
    assert _Counted.passes <= 8 + 2 * pieces
    assert sum(summed) == payload.count(b"[") + payload.count(b"]") + pieces
    with pytest.raises(LocalProtocolError, match="more than 254 levels"):
        check_json(payload, "record data", limit=254)
    assert sum(summed[pieces:]) <= len(payload)


def test_short_strings_outside_the_bound_take_pieces_of_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Split at every quote at once, 16 MiB of short strings held a bytes object for
    # every five bytes (282 MiB).
    data = b"[" + b'"ab",' * (16 * 1024 * 1024 // 5) + b"[" * 300 + b"]" * 301
    pieces: list[int] = []
    split = _structure.outside_strings

    def counted(data: bytes) -> Any:
        for piece in split(data):
            pieces.append(len(piece))
            yield piece

    monkeypatch.setattr(_json, "outside_strings", counted)
    assert nested_deeper_than(data, MAX_NESTING)
    assert len(pieces) > 1 and max(pieces) <= 2 * _structure._PIECE


# --- the verdicts: one full decode or passes, as the rules one by one ---------------------

_skip = msgspec.json.Decoder(msgspec.Raw).decode
_TOO_DEEP = "data nests arrays and objects more than {} levels deep"


def _by_the_rules(data: bytes, limit: int = MAX_NESTING) -> str | None:
    """The refusal of ``data`` by the check's rules applied one at a time, each with its
    own message (as the check applied them before it decoded in full), or None."""
    if b"\n" in data or b"\r" in data:
        return "data must be JSON on one line"
    try:
        _skip(data)
        data.decode()
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        return f"data is not valid UTF-8 JSON: {exc}"
    except RecursionError:
        return _TOO_DEEP.format(limit)
    if nested_deeper_than(data, limit):
        return _TOO_DEEP.format(limit)
    unreadable: list[tuple[str, msgspec.DecodeError]] = []

    def number(token: str) -> None:
        try:
            msgspec.json.decode(token)
        except msgspec.DecodeError as exc:
            unreadable.append((token, exc))

    json.loads(data, parse_int=number, parse_float=number)  # every number, in order
    try:
        msgspec.json.decode(data)  # what a reader does with it
    except msgspec.DecodeError:
        token, exc = unreadable[0]
        shown = token if len(token) <= 40 else f"{token[:20]}... ({len(token):,} characters)"
        return f"data holds a number no reader can read back, {shown}: {exc}"
    assert not unreadable
    return None


def _verdict(data: bytes, limit: int = MAX_NESTING) -> str | None:
    try:
        check_json(data, "data", limit=limit)
    except LocalProtocolError as exc:
        assert exc.code == "bad_event"
        return exc.message
    return None


def _both_ways(data: bytes, limit: int = MAX_NESTING) -> None:
    """The check agrees with the rules on ``data`` and, padded with JSON whitespace past
    :data:`DECODE_IN_FULL`, on the other way."""
    padded = data + b" " * (DECODE_IN_FULL + 1 - len(data))
    assert (len(data) <= DECODE_IN_FULL) is not (len(padded) <= DECODE_IN_FULL)
    assert _verdict(data, limit) == _by_the_rules(data, limit)
    assert _verdict(padded, limit) == _by_the_rules(padded, limit)


def _number() -> st.SearchStrategy[bytes]:
    """Numbers near every bound: digits around 210 and 309 before the point and 4,300 in
    an integer, exponents of one to five digits with signs and leading zeros."""
    digits = st.sampled_from([1, 2, 18, 20, 208, 209, 210, 211, 307, 308, 309, 310, 4300, 4301])
    integer = st.builds(
        lambda n, first: first + b"9" * (n - 1), digits, st.sampled_from([b"1", b"9"])
    )
    fraction = st.sampled_from([b"", b".0", b".5", b"." + b"0" * 400 + b"1", b".9"])
    exponent = st.sampled_from(
        [
            *(b"", b"e0", b"E9", b"e99", b"e099", b"e-99", b"e+99", b"e100", b"E+308"),
            *(b"e308", b"e309", b"e-400", b"e400", b"E+400", b"e0000400", b"e99999", b"e-99999"),
        ]
    )
    sign = st.sampled_from([b"", b"-"])
    zero = st.sampled_from([b"0", b"-0", b"0.0", b"-0e400", b"0e99999", b"0.0000e400"])
    built = st.builds(lambda s, i, f, e: s + i + f + e, sign, integer, fraction, exponent)
    return built | zero | st.sampled_from([b"1.7976931348623157e308", b"1.7976931348623159e308"])


# Strings full of what could fool a scan of bytes: digits and exponent marks, quotes
# and backslashes (escaped), brackets, non-ASCII and lone surrogates (escaped by
# json.dumps, raw when written with surrogatepass).
_text = st.text(
    alphabet=st.sampled_from(list('0129eE+-.[]{}"\\/ aé\u2028\U0001f600\ud800\udc00\x00\x1f'))
    | st.characters(),
    max_size=12,
)
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=25,
)


def _dumped(value: Any, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


_SNIPPETS = [
    b"\n", b"\r", b"\x00", b"\xff", b"\xed\xa0\x80", b"\xc3", b"\\", b'"', b'\\"',
    b"e", b"E+400", b"1e400", b"e999", b"9" * 310, b"[", b"]", b"{", b"}", b",", b"-0",
    b'"\\ud800"', b"\\u0000", b"\\udc00", b"\t", b" ",
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    _json_values,
    st.booleans(),
    st.lists(st.tuples(st.integers(0), st.sampled_from(_SNIPPETS), st.booleans()), max_size=3),
)
def test_generated_and_mutated_json_gets_the_rules_verdict(
    value: Any, ascii_only: bool, edits: list[tuple[int, bytes, bool]]
) -> None:
    data = _dumped(value, ascii_only)
    for position, snippet, replace in edits:
        at = position % (len(data) + 1)
        data = data[:at] + snippet + data[at + replace :]
    _both_ways(data)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_number(), min_size=1, max_size=3),
    st.sampled_from(["array", "object", "string", "bare"]),
)
def test_numbers_near_every_bound_get_the_rules_verdict(numbers: list[bytes], where: str) -> None:
    joined = b",".join(numbers)
    data = {
        "array": b"[" + joined + b"]",
        "object": b"{" + b",".join(b'"k%d":' % i + n for i, n in enumerate(numbers)) + b"}",
        "string": b'{"text":"' + joined + b'"}',
        "bare": numbers[0],
    }[where]
    _both_ways(data)


@pytest.mark.parametrize(
    "data",
    [
        b'{"a":1' + b"0" * 250 + b"e99}",  # 10**349 with a two-digit exponent
        b'{"a":1' + b"0" * 300 + b".5e50}",
        b'{"a":-' + b"9" * 209 + b"e99}",  # within the range: 10**308
        b'{"a":' + b"9" * 4301 + b"}",
        b'{"a":-1E+400}',
        b'{"a":"\\ud800"}',
        b'{"a":"\\udc00x"}',
        b'{"a":"\xed\xa0\x80"}',
        b'{"\xff":1}',
        b'{"a":"\x00"}',
        b'{"a":1}\x00',
        b'{"a":"\\"e400"}',
        b'{"a":"\\\\"}',
        b'{"a":"' + b"[" * 300 + b'"}',
        b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1),
        b"[" * MAX_NESTING + b"1e400" + b"]" * MAX_NESTING,
        b"[" * (MAX_NESTING + 1) + b"1e400" + b"]" * (MAX_NESTING + 1),
        b"[" * (MAX_NESTING + 1) + b"\xff" + b"]" * (MAX_NESTING + 1),
        b"[" * 5000 + b"]" * 5000,
        b"[" * 5000,
    ],
)
def test_adversarial_data_gets_the_rules_verdict(data: bytes) -> None:
    _both_ways(data)


def test_a_number_with_a_short_exponent_and_a_long_integer_part_is_refused() -> None:
    # The number check once looked only for three-digit exponents and 309 digits in a
    # run, and acknowledged this record that no reader can read.
    data = b'{"a":1' + b"0" * 250 + b"e99}"
    for padded in (data, data + b" " * DECODE_IN_FULL):
        with pytest.raises(LocalProtocolError, match="holds a number no reader can read back"):
            check_json(padded, "record data")


def _deep_payloads() -> list[bytes]:
    # Too deep for the stack of the thread the check runs in, either way it takes.
    return [b"[" * 50_000 + b"]" * 50_000, b"[" * 20_000 + b"]" * 20_000]


def test_data_too_deep_for_the_stack_is_refused_in_any_thread() -> None:
    assert [len(data) > DECODE_IN_FULL for data in _deep_payloads()] == [True, False]
    refusals: list[str] = []

    def check_all() -> None:
        for data in _deep_payloads():
            with pytest.raises(LocalProtocolError, match="more than 256 levels deep") as info:
                check_json(data, "record data")
            refusals.append(info.value.code)

    check_all()
    worker = threading.Thread(target=check_all)
    worker.start()
    worker.join()
    assert refusals == ["bad_event"] * 4


def test_data_within_the_bound_checked_from_a_deep_stack_is_a_bad_event() -> None:
    # msgspec's bound is the recursion limit from where it is called: a deep caller's
    # RecursionError is a refusal, never an exception of another kind.
    data = b"[" * 200 + b"]" * 200
    refused: list[LocalProtocolError] = []

    def descend(levels: int) -> None:
        if levels:
            descend(levels - 1)
            return
        for payload in (data, data + b" " * DECODE_IN_FULL):
            try:
                check_json(payload, "record data")
            except LocalProtocolError as exc:
                refused.append(exc)

    descend(sys.getrecursionlimit() - 150)
    assert refused and all(exc.code == "bad_event" for exc in refused)


def test_short_data_is_decoded_in_full_and_long_data_checked_in_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes: list[int] = []
    monkeypatch.setattr(_json, "fast_check_json", None)  # the Python path's own ways
    monkeypatch.setattr(
        _json, "_check_in_passes", lambda data, what, limit: passes.append(len(data))
    )
    short = b'{"a":[1,"b"]}' + b" " * (DECODE_IN_FULL - 13)
    check_json(short, "data")
    check_json(short + b" ", "data")
    assert passes == [DECODE_IN_FULL + 1]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_json_values.map(lambda value: _dumped(value, True)) | _number(), max_size=6),
    st.integers(1, 24),
)
def test_numbers_are_read_piece_by_piece_wherever_the_pieces_are_cut(
    items: list[bytes], piece: int
) -> None:
    data = b"[" + b",".join(items) + b"]"
    expected = _by_the_rules(data)
    assume(expected is None or "holds a number" in expected)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_structure, "_PIECE", piece)
        try:
            check_numbers(data, "data")
        except LocalProtocolError as exc:
            assert exc.message == expected
        else:
            assert expected is None


@pytest.mark.parametrize(
    ("last", "refused"), [(b"1e-400", False), (b"1e400", True)], ids=["in-range", "out-of-range"]
)
def test_numbers_of_16_mib_are_read_a_piece_at_a_time(
    monkeypatch: pytest.MonkeyPatch, last: bytes, refused: bool
) -> None:
    # Decoding this in full builds millions of floats; a string "e000" was enough to
    # make the number check do that.
    data = b'["e000",' + b"1.5," * (4 * 1024 * 1024 - 4) + last + b"]"
    assert len(data) > 16 * 1024 * 1024 - 16
    decoded: list[int] = []
    decode = _numbers._decode

    def counted(data: bytes) -> Any:
        decoded.append(len(data))
        return decode(data)

    monkeypatch.setattr(_numbers, "_decode", counted)
    if refused:
        with pytest.raises(LocalProtocolError, match="can read back, 1e400: Number out of range"):
            check_json(data, "record data")
    else:
        check_json(data, "record data")
    assert max(decoded) <= 2 * _structure._PIECE
    assert sum(decoded) <= 2 * len(data)
