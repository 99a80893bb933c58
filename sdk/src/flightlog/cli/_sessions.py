"""Every session of a data root, replayed from the files then followed live: the SDK's
(:mod:`flightlog.sdk._cursor`), which ``tail --all --after`` and ``export`` use."""

from __future__ import annotations

from flightlog.sdk.search import (
    AllSessions,
    Doorbell,
    Rescan,
    SessionFile,
    format_cursor,
    parse_cursor,
    session_files,
)

__all__ = [
    "AllSessions",
    "Doorbell",
    "Rescan",
    "SessionFile",
    "format_cursor",
    "parse_cursor",
    "session_files",
]
