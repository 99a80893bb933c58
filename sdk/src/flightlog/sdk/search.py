"""Finding records across session files: the one search behind ``flightlog find`` and
:func:`flightlog.sdk.find`, its matching rules, the text search, and the reading of
every session from a cursor behind ``tail --all`` and ``tail_all(after=...)``.

``from flightlog.sdk import search`` and use ``search.Query``, ``search.search``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._find import Found, search
from ._match import failed, meta_matches, moment, record_data
from ._query import Query
from ._text import first_match, snippet

if TYPE_CHECKING:
    from ._cursor import (
        AllSessions,
        Doorbell,
        Rescan,
        SessionFile,
        format_cursor,
        parse_cursor,
        session_files,
    )

_CURSOR = (
    "AllSessions",
    "Doorbell",
    "Rescan",
    "SessionFile",
    "format_cursor",
    "parse_cursor",
    "session_files",
)


def __getattr__(name: str) -> Any:
    # The cursor's names (tail --all) are imported on first use: find starts without them.
    if name not in _CURSOR:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _cursor

    value = getattr(_cursor, name)
    globals()[name] = value
    return value


__all__ = [
    "AllSessions",
    "Doorbell",
    "Found",
    "Query",
    "Rescan",
    "SessionFile",
    "failed",
    "first_match",
    "format_cursor",
    "meta_matches",
    "moment",
    "parse_cursor",
    "record_data",
    "search",
    "session_files",
    "snippet",
]
