"""The records of file format version 1: the line envelope and the structural records.

Every line of a session file is one :class:`Record`: ``session_id``, ``seq``, ``type``,
``time``, ``run_id`` and ``data``, in that order.  ``data`` is kept as raw JSON bytes
(:class:`msgspec.Raw` taken from JSON, never from MessagePack) so that records pass
through readers and the daemon without being decoded.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, date, datetime
from typing import Any, Final

import msgspec

from ._errors import LocalProtocolError

__all__ = [
    "AGENT_FACT_TYPES",
    "CHECKPOINT",
    "FORMAT_VERSION",
    "NEVER_WRITTEN_TYPES",
    "RECORD_TYPES",
    "RUN_CLOSE",
    "RUN_START",
    "SESSION_START",
    "STRUCTURAL_TYPES",
    "CheckpointData",
    "Record",
    "RunCloseData",
    "RunStartData",
    "SessionStartData",
    "append_line",
    "encode_line",
    "format_time",
    "is_session_id",
    "is_time",
    "new_id",
    "now",
    "parse_time",
]

FORMAT_VERSION: Final = 1

SESSION_START: Final = "session_start"
RUN_START: Final = "run_start"
CHECKPOINT: Final = "checkpoint"
RUN_CLOSE: Final = "run_close"

#: Records only the daemon writes, on behalf of create, begin_run, save_checkpoint and close.
STRUCTURAL_TYPES: Final = frozenset({SESSION_START, RUN_START, CHECKPOINT, RUN_CLOSE})

#: The agent facts a run may record (DESIGN.md section 2).
AGENT_FACT_TYPES: Final = frozenset(
    {
        "model_request",
        "model_exec_start",
        "model_exec_end",
        "message_end",
        "tool_queued",
        "tool_exec_start",
        "tool_invoke_start",
        "tool_invoke_end",
        "tool_exec_end",
        "agent_start",
        "agent_end",
        "turn_start",
        "turn_end",
        "retry",
        "retry_wait_start",
        "retry_wait_end",
        "context_prepare_start",
        "context_prepare_end",
        "context_projected",
        "context_compacted",
        "error",
        # Only with a length-recovery decision, and then without the message.
        "model_response",
    }
)

#: Events an agent loop emits that are never written to a session file.
NEVER_WRITTEN_TYPES: Final = frozenset(
    {"message_start", "message_update", "model_stream", "tool_exec_update"}
)

RECORD_TYPES: Final = STRUCTURAL_TYPES | AGENT_FACT_TYPES


class Record(msgspec.Struct, kw_only=True, frozen=True):
    """One line of a session file.

    ``data`` holds the record's payload as raw JSON; decode it with
    :meth:`decode_data`, or pass it on untouched.
    """

    session_id: str
    seq: int
    type: str
    time: str
    run_id: str | None = None
    data: msgspec.Raw = msgspec.Raw(b"{}")

    def decode_data(self, type: Any = Any) -> Any:
        """Decode ``data`` as ``type`` (default: plain JSON values).

        Raises :class:`msgspec.ValidationError` when ``data`` does not match ``type``.
        """
        return msgspec.json.decode(self.data, type=type)

    def to_builtins(self) -> dict[str, Any]:
        """The record as plain JSON values, ``data`` decoded."""
        return {
            "session_id": self.session_id,
            "seq": self.seq,
            "type": self.type,
            "time": self.time,
            "run_id": self.run_id,
            "data": self.decode_data(),
        }


class SessionStartData(msgspec.Struct, kw_only=True, frozen=True):
    """``data`` of ``session_start``, always seq 1."""

    format_version: int = FORMAT_VERSION
    meta: dict[str, Any] = {}


class RunStartData(msgspec.Struct, kw_only=True, frozen=True):
    """``data`` of ``run_start``: who opened the run."""

    pid: int = 0
    client: str = ""


class CheckpointData(msgspec.Struct, kw_only=True, frozen=True):
    """``data`` of ``checkpoint``: the codec-encoded snapshot."""

    snapshot: msgspec.Raw = msgspec.Raw(b"null")


class RunCloseData(msgspec.Struct, kw_only=True, frozen=True):
    """``data`` of ``run_close``: the run's sticky error text, or None."""

    error: str | None = None


_line_encoder: Final = msgspec.json.Encoder()


def encode_line(record: Record) -> bytes:
    """One complete line for ``record``, ending in ``\\n``."""
    buf = bytearray()
    append_line(buf, record)
    return bytes(buf)


def append_line(buf: bytearray, record: Record) -> None:
    """Append ``record`` as one line to ``buf``, without intermediate copies."""
    _line_encoder.encode_into(record, buf, len(buf))
    buf.extend(b"\n")


_TIME_RE: Final = re.compile(
    r"(\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d"
    r"(?:\.\d{1,9})?Z",
    re.ASCII,
)
_FRACTION_RE: Final = re.compile(r"(?:\.\d{1,9})?Z", re.ASCII)
_SESSION_ID_RE: Final = re.compile(r"[0-9a-f]{32}")
#: The first 19 characters of the last time :func:`is_time` accepted (a valid second).
_valid_second = "1970-01-01T00:00:00"


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds: ``2026-11-29T20:00:00.000000Z``.

    Raises :class:`LocalProtocolError` for a naive datetime (its zone is unknown).
    """
    if moment.tzinfo is None:
        raise LocalProtocolError("a naive datetime has no time zone; pass an aware one")
    m = moment.astimezone(UTC)
    # Not strftime: glibc's %Y does not zero-pad years before 1000.
    return (
        f"{m.year:04d}-{m.month:02d}-{m.day:02d}T"
        f"{m.hour:02d}:{m.minute:02d}:{m.second:02d}.{m.microsecond:06d}Z"
    )


def now() -> str:
    """The current time, formatted by :func:`format_time`."""
    return format_time(datetime.now(UTC))


def parse_time(text: str) -> datetime:
    """Parse a record time; raises :class:`ValueError` when it is not RFC 3339 UTC."""
    if not is_time(text):
        raise ValueError(f"not an RFC 3339 UTC time: {text!r}")
    head, _, frac = text[:-1].partition(".")
    micros = (frac + "000000")[:6]
    return datetime.strptime(f"{head}.{micros}", "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC)


def is_time(text: str) -> bool:
    """Whether ``text`` is a record time: RFC 3339, UTC, ``Z`` suffix, a real date."""
    global _valid_second
    # Consecutive times mostly share their second: once a time's first 19 characters
    # (date, hour, minutes, seconds) passed the whole check, another time with the
    # same ones only needs its fraction and ``Z`` checked.  Same result, a third of
    # the cost.
    if text[:19] == _valid_second:
        return _FRACTION_RE.fullmatch(text, 19) is not None
    # The pattern admits no leap second (RFC 3339 does; records do not) and checks
    # every field's range; only the 29th to 31st need the calendar.
    match = _TIME_RE.fullmatch(text)
    if match is None:
        return False
    year, month, day = match.group(1, 2, 3)
    if day > "28":
        try:
            date(int(year), int(month), int(day))
        except ValueError:
            return False
    _valid_second = text[:19]
    return True


def is_session_id(text: str) -> bool:
    """Whether ``text`` is a session or run id: 32 lowercase hex digits."""
    return _SESSION_ID_RE.fullmatch(text) is not None


def new_id() -> str:
    """A fresh random session or run id (uuid4 hex)."""
    return uuid.uuid4().hex
