"""is_time remembers the last second it accepted: exactly as strict as the full check."""

from __future__ import annotations

import re
from datetime import date

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from flightlog.protocol.format import (
    is_time,
)

# The definition, checked without the cache.
_FULL = re.compile(
    r"(\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d"
    r"(?:\.\d{1,9})?Z",
    re.ASCII,
)


def _reference(text: str) -> bool:
    match = _FULL.fullmatch(text)
    if match is None:
        return False
    try:
        date(*(int(part) for part in match.group(1, 2, 3)))
    except ValueError:
        return False
    return True


SECOND = "2026-11-29T20:00:41"

TAILS = [
    "Z",
    ".1Z",
    ".123456Z",
    ".123456789Z",
    ".1234567890Z",  # ten digits
    ".Z",
    "",
    ".123456",
    "z",
    ".123456z",
    "Z ",
    "Z\n",
    ".12345\n6Z",
    ".\u0663Z",  # an Arabic-Indic digit: str.isdigit() says yes, \d under ASCII says no
    ".\uff11Z",  # a fullwidth digit
    ".\u00b2Z",  # superscript two
    ".-1Z",
    ".+1Z",
    ". 1Z",
    "+00:00",
    ".123456ZZ",
    ".123456Z.1Z",
]


@pytest.mark.parametrize("tail", TAILS)
def test_a_cached_second_with_any_tail(tail: str) -> None:
    assert is_time(SECOND + ".5Z")  # the second is now cached
    assert is_time(SECOND + tail) is _reference(SECOND + tail)


@pytest.mark.parametrize(
    "text",
    [
        "2026-02-29T20:00:41.5Z",  # the cached second's time on a day that does not exist
        "2026-11-29T20:00:4.5Z",
        "2026-11-29T20:00:41",
        "2026-11-29T20:00:4",
        "",
        "2026-11-29T20:00:41Z"[:-2],
    ],
)
def test_near_misses_of_a_cached_second(text: str) -> None:
    assert is_time(SECOND + "Z")
    assert is_time(text) is _reference(text) is False


def test_a_refused_time_is_never_cached() -> None:
    assert not is_time("2026-02-30T20:00:00.1Z")
    assert not is_time("2026-02-30T20:00:00.2Z")
    assert not is_time("2026-11-29T24:00:00Z")
    assert not is_time("2026-11-29T24:00:00.1Z")


_digits = st.text(alphabet="0123456789", min_size=1, max_size=10)
_times = st.builds(
    lambda y, mo, d, h, mi, s, frac, z: f"{y}-{mo}-{d}T{h}:{mi}:{s}{frac}{z}",
    st.sampled_from(["2026", "2028", "0999", "2100"]),
    st.sampled_from(["01", "02", "04", "12", "13"]),
    st.sampled_from(["01", "28", "29", "30", "31"]),
    st.sampled_from(["00", "23", "24"]),
    st.sampled_from(["00", "59", "60"]),
    st.sampled_from(["00", "41", "60"]),
    st.one_of(st.just(""), _digits.map(lambda d: "." + d), st.text(max_size=4)),
    st.sampled_from(["Z", "", "z", "Z\n"]),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_times, st.text(max_size=30)), min_size=1, max_size=20))
def test_any_sequence_of_times_as_the_full_check(texts: list[str]) -> None:
    for text in texts:
        assert is_time(text) is _reference(text), text
