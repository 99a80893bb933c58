"""``flightlog find --text``: the match shown under a record (the search itself is
:mod:`flightlog.sdk._text`)."""

from __future__ import annotations

import re

import msgspec

from flightlog.protocol import Record
from flightlog.sdk.search import first_match, snippet

from ._render import Style, record_data

__all__ = ["match_json", "match_line"]


_Match = tuple[str, re.Match[str], int]


def _found_text(pattern: re.Pattern[str], record: Record, found: _Match | None) -> tuple[str, int]:
    if found is None:
        found = first_match(pattern, record_data(record))
    assert found is not None  # the record matched
    text, match, count = found
    return snippet(text, match), count


def match_line(
    pattern: re.Pattern[str], record: Record, style: Style, found: _Match | None = None
) -> str:
    """The line under a record that ``pattern`` matched: its first match in context
    (``found``, the search's, when it has it)."""
    context, count = _found_text(pattern, record, found)
    more = style.dim(f" (+{count - 1} more)") if count > 1 else ""
    return f"    {context}{more}\n"


def match_json(pattern: re.Pattern[str], record: Record, found: _Match | None = None) -> bytes:
    """A ``"match"`` member (and its comma) for the record's JSON line."""
    context, count = _found_text(pattern, record, found)
    return b'"match":' + msgspec.json.encode({"text": context, "count": count}) + b","
