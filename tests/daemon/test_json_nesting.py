"""The daemon's nesting bound agrees with a plain reading of the JSON, whatever the
strings hold (brackets, quotes and backslashes inside strings do not count)."""

from __future__ import annotations

import json
from typing import Any

import hypothesis.strategies as st
from hypothesis import given, settings

from flightlog.daemon._json import nested_deeper_than

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
