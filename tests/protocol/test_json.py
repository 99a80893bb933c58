"""The JSON check every server applies to record data and snapshots: what it refuses,
its nesting bound agreeing with a plain reading of the JSON whatever the strings hold
(brackets, quotes and backslashes inside strings do not count), and its cost, linear
in the payload however deep it nests."""

from __future__ import annotations

import json
from typing import Any

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings

from flightlog.protocol import (
    MAX_NESTING,
    LocalProtocolError,
    _json,
    check_json,
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

    def counting_sum(steps: Any) -> Any:
        summed.append(0)
        for depth in running_sum(steps):
            summed[-1] += 1
            yield depth

    monkeypatch.setattr(_json, "accumulate", counting_sum)
    _Counted.passes = 0
    check_json(_Counted(payload), "record data")  # 255 levels: within the bound
    # A handful of C passes over the payload, then one running sum over its brackets.
    assert _Counted.passes <= 8
    assert summed == [payload.count(b"[") + payload.count(b"]")]
    with pytest.raises(LocalProtocolError, match="more than 254 levels"):
        check_json(payload, "record data", limit=254)
    assert len(summed) == 2 and summed[1] <= len(payload)
