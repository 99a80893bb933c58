"""A session's first line, from the meta a client asks for: what every writer checks.

A writer (flightlogd, the SDK's memory daemon) splices nothing into ``session_start``:
it encodes the client's meta.  Whatever the client sent, the line must be one every
reader accepts, and the meta the writer answers with must be the meta a reader finds.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ._errors import ErrorCode, FileFormatError, LocalProtocolError
from ._json import MAX_NESTING, nested_deeper_than
from ._lines import LineReader
from ._records import (
    SESSION_START,
    ForkStartData,
    Origin,
    Record,
    SessionStartData,
    encode_line,
    is_session_id,
)

__all__ = ["session_start_line"]


def session_start_line(
    session_id: str, time: str, meta: dict[str, Any], origin: Origin | None = None
) -> tuple[bytes, dict[str, Any]]:
    """The ``session_start`` line (with its ``\\n``) of a new session, and its meta as a
    reader reads it back.  ``origin`` names the session a fork comes from.

    Raises :class:`LocalProtocolError` (``bad_message``) for meta that cannot be
    written as JSON, nests more than ``MAX_NESTING - 2`` levels deep, makes a line a
    reader refuses, or has keys that JSON writes alike (``1`` and ``"1"``: a duplicate
    key in the file), and for an origin that names no session line (docs/format.md,
    "Forks": session and run ids of 32 lowercase hex digits, a path, a seq of 1 or more).
    """
    if origin is not None:
        _check_origin(origin)
    try:
        data = (
            SessionStartData(meta=meta)
            if origin is None
            else ForkStartData(meta=meta, origin=origin)
        )
        start = msgspec.json.encode(data)
    except (TypeError, ValueError, RecursionError, msgspec.MsgspecError) as exc:
        raise LocalProtocolError(
            f"meta cannot be written as JSON: {exc}", code=ErrorCode.BAD_MESSAGE
        ) from None
    if nested_deeper_than(start, MAX_NESTING):
        raise LocalProtocolError(
            f"meta nests more than {MAX_NESTING - 2} levels deep", code=ErrorCode.BAD_MESSAGE
        )
    line = encode_line(
        Record(session_id=session_id, seq=1, type=SESSION_START, time=time, data=msgspec.Raw(start))
    )
    try:
        header = LineReader()
        header.feed(line)
        header.next()
    except FileFormatError as exc:
        raise LocalProtocolError(
            f"meta cannot be written as JSON a reader accepts: {exc.reason}",
            code=ErrorCode.BAD_MESSAGE,
        ) from None
    # JSON writes every key as a string, so two keys that write alike would make a
    # duplicate key; the meta answered is the meta written.
    written: dict[str, Any] = msgspec.json.decode(start)["meta"]
    if _entries(written) != _entries(meta):
        raise LocalProtocolError(
            'meta has keys that JSON writes alike (such as 1 and "1")',
            code=ErrorCode.BAD_MESSAGE,
        )
    return line, written


def _check_origin(origin: Origin) -> None:
    wrong = None
    if not is_session_id(origin.session_id):
        wrong = "its session_id is not 32 lowercase hex digits"
    elif origin.run_id is not None and not is_session_id(origin.run_id):
        wrong = "its run_id is not 32 lowercase hex digits"
    elif not origin.path:
        wrong = "its path is empty"
    elif origin.seq < 1:
        wrong = f"its seq is {origin.seq}: lines start at 1"
    if wrong is not None:
        raise LocalProtocolError(
            f"origin names no session line: {wrong}", code=ErrorCode.BAD_MESSAGE
        )


def _entries(value: object) -> int:
    """The keys of every object in ``value``, nested ones too."""
    if isinstance(value, dict):
        return len(value) + sum(_entries(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_entries(item) for item in value)
    return 0
