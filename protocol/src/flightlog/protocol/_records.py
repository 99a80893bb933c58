"""The records of file format version 1: the line envelope and the structural records.

Every line of a session file is one :class:`Record`: ``session_id``, ``seq``, ``type``,
``time``, ``run_id`` and ``data``, in that order.  ``data`` is kept as raw JSON bytes
(:class:`msgspec.Raw` taken from JSON, never from MessagePack) so that records pass
through readers and the daemon without being decoded.
"""

from __future__ import annotations

import hashlib
import re
import struct
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

import msgspec

from ._accel import append_lines, fast_is_time
from ._errors import ErrorCode, LocalProtocolError

__all__ = [
    "AGENT_FACT_TYPES",
    "CHECKPOINT",
    "FORMAT_VERSION",
    "MAX_EVENT_ID",
    "NEVER_WRITTEN_TYPES",
    "RECORD_TYPES",
    "RUN_CLOSE",
    "RUN_RESUME",
    "RUN_START",
    "SESSION_START",
    "STRUCTURAL_TYPES",
    "CheckpointData",
    "ForkStartData",
    "LineEncoder",
    "Origin",
    "Record",
    "RunCloseData",
    "RunResumeData",
    "RunStartData",
    "SessionStartData",
    "append_line",
    "check_event_id",
    "check_event_ids",
    "encode_line",
    "event_id_key",
    "format_time",
    "is_session_id",
    "is_time",
    "new_id",
    "now",
    "parse_time",
    "utc_time",
]

FORMAT_VERSION: Final = 1

SESSION_START: Final = "session_start"
RUN_START: Final = "run_start"
CHECKPOINT: Final = "checkpoint"
RUN_CLOSE: Final = "run_close"
RUN_RESUME: Final = "run_resume"

#: Records only the daemon writes, on behalf of create, begin_run, save_checkpoint and close.
STRUCTURAL_TYPES: Final = frozenset({SESSION_START, RUN_START, CHECKPOINT, RUN_CLOSE, RUN_RESUME})

#: The agent facts a run may record (docs/format.md section 4).
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
    :meth:`decode_data`, or pass it on untouched.  ``event_id`` is the id its writer
    gave the event (``record(event, event_id=...)``), UNSET when none: a line without
    one has no such member.
    """

    session_id: str
    seq: int
    type: str
    time: str
    run_id: str | None = None
    event_id: str | msgspec.UnsetType = msgspec.UNSET
    data: msgspec.Raw = msgspec.Raw(b"{}")

    def decode_data(self, type: Any = Any) -> Any:
        """Decode ``data`` as ``type`` (default: plain JSON values).

        Raises :class:`msgspec.ValidationError` when ``data`` does not match ``type``.
        """
        return msgspec.json.decode(self.data, type=type)

    def to_builtins(self) -> dict[str, Any]:
        """The record as plain JSON values, ``data`` decoded."""
        plain = {
            "session_id": self.session_id,
            "seq": self.seq,
            "type": self.type,
            "time": self.time,
            "run_id": self.run_id,
        }
        if self.event_id is not msgspec.UNSET:
            plain["event_id"] = self.event_id
        plain["data"] = self.decode_data()
        return plain


#: The longest event id a writer may give, in UTF-8 bytes.
MAX_EVENT_ID: Final = 256


def check_event_id(event_id: object) -> str:
    """``event_id`` if it is an id a record may carry: a string of 1 to
    :data:`MAX_EVENT_ID` UTF-8 bytes.  Raises :class:`LocalProtocolError`
    (``bad_event``) otherwise."""
    if isinstance(event_id, str) and 0 < len(event_id.encode(errors="surrogatepass")) <= (
        MAX_EVENT_ID
    ):
        return event_id
    raise LocalProtocolError(
        f"an event id is a string of 1 to {MAX_EVENT_ID} bytes, not {str(event_id)[:40]!r}",
        code=ErrorCode.BAD_EVENT,
    )


def check_event_ids(event_ids: Iterable[str | None] | None, count: int) -> list[str | None]:
    """``event_ids`` as a list, one per event of ``count`` (None: all without one), each
    an id a record may carry or None.  Raises :class:`LocalProtocolError`
    (``bad_event``) for another count or an invalid id."""
    if event_ids is None:
        return [None] * count
    ids = list(event_ids)
    if len(ids) != count:
        raise LocalProtocolError(
            f"{len(ids)} event ids for {count} events: give one per event (None for none)",
            code=ErrorCode.BAD_EVENT,
        )
    for event_id in ids:
        if event_id is not None:
            check_event_id(event_id)
    return ids


def event_id_key(event_id: str) -> bytes:
    """What a writer keeps of an event id to know it again: 16 bytes whatever its length
    (a 128-bit BLAKE2b digest: two ids that differ share one by chance with odds of
    about 2**-128 a pair)."""
    return hashlib.blake2b(event_id.encode(errors="surrogatepass"), digest_size=16).digest()


class Origin(msgspec.Struct, kw_only=True, frozen=True):
    """Where a forked session comes from: the session it was forked from, and the point.

    ``session_id`` and ``path`` name the origin's file (``path`` as the forking client
    saw it, absolute); ``seq`` is the origin's last line the fork holds (lines 1 to
    ``seq`` are its history); ``run_id`` is the run that line belongs to, None for
    ``session_start``.
    """

    session_id: str
    path: str
    seq: int
    run_id: str | None = None


class SessionStartData(msgspec.Struct, kw_only=True, frozen=True):
    """``data`` of ``session_start``, always seq 1.

    ``origin`` is written only for a fork (:class:`ForkStartData`): every other
    ``session_start`` stays as it always was.
    """

    format_version: int = FORMAT_VERSION
    meta: dict[str, Any] = {}


class ForkStartData(SessionStartData, kw_only=True, frozen=True):
    """``data`` of a forked session's ``session_start``: its :class:`Origin` too."""

    origin: Origin


class RunStartData(msgspec.Struct, kw_only=True, frozen=True):
    """``data`` of ``run_start``: who opened the run.

    ``pid`` and ``client`` are what the agent says; ``peer_pid``, ``uid`` and ``gid``
    are what the kernel says of the writer's connection (``SO_PEERCRED``), None in
    files written before flightlogd recorded them."""

    pid: int = 0
    client: str = ""
    peer_pid: int | None = None
    uid: int | None = None
    gid: int | None = None


class RunResumeData(msgspec.Struct, kw_only=True, frozen=True):
    """``data`` of ``run_resume``: who continued a cut run, and what it held then.

    ``items`` is how many agent facts and checkpoints the run held before this line:
    the writer resends only what came after them.  ``repair`` (absent when false) says
    that a repair continues the run, to answer its open calls and close it.
    """

    pid: int = 0
    client: str = ""
    items: int = 0
    repair: bool | msgspec.UnsetType = msgspec.UNSET


class CheckpointData(msgspec.Struct, kw_only=True, frozen=True):
    """``data`` of ``checkpoint``: the codec-encoded snapshot."""

    snapshot: msgspec.Raw = msgspec.Raw(b"null")


class RunCloseData(msgspec.Struct, kw_only=True, frozen=True):
    """``data`` of ``run_close``: the run's sticky error text, or None; and, when the
    daemon dropped records of the run whose event id the session already held, how
    many (absent when none); ``repaired`` (absent when false): a repair closed it."""

    error: str | None = None
    duplicates: int | msgspec.UnsetType = msgspec.UNSET
    repaired: bool | msgspec.UnsetType = msgspec.UNSET


_encode_json: Final = msgspec.json.Encoder().encode


def _type_part(record_type: str) -> bytes:
    return b',"type":' + _encode_json(record_type) + b',"time":'


# The bytes between a line's seq and its time, for the types every writer uses.
_TYPE_PARTS: Final = {kind: _type_part(kind) for kind in RECORD_TYPES}
_NO_RUN_PART: Final = b',"run_id":null,"data":'


class LineEncoder:
    """Writes the lines of one session's records; every writer of a session file uses it.

    A line is assembled from the envelope's fixed pieces: the ``session_id`` part is
    encoded once, a ``type`` part once per record type, a ``run_id`` part once per run;
    only ``seq`` and ``time`` are encoded per line and ``data`` is copied as it is.  The
    bytes are exactly what msgspec writes for the :class:`Record` (its field order, its
    string escaping), which a guard test checks.  ``data`` must be the JSON text of
    one object: it is not checked here (the daemon checks what clients send).
    """

    __slots__ = ("_head", "_run", "session_id")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._head = b'{"session_id":' + _encode_json(session_id) + b',"seq":'
        self._run: tuple[str | None, bytes] = (None, _NO_RUN_PART)

    def append(
        self,
        buf: bytearray,
        seq: int,
        record_type: str,
        time: str,
        run_id: str | None,
        data: bytes | msgspec.Raw,
        event_id: str | None = None,
    ) -> None:
        """Append one complete line, ending in ``\\n``, to ``buf``; with ``event_id``,
        its ``event_id`` member before ``data``."""
        type_part = _TYPE_PARTS.get(record_type)
        if type_part is None:
            type_part = _type_part(record_type)
        cached_id, run_part = self._run
        if cached_id != run_id:
            run_part = b',"run_id":' + _encode_json(run_id) + b',"data":'
            self._run = (run_id, run_part)
        if event_id is not None:
            run_part = run_part[:-8] + b',"event_id":' + _encode_json(event_id) + b',"data":'
        buf += b"%b%d%b%b%b%b}\n" % (
            self._head,
            seq,
            type_part,
            _encode_json(time),
            run_part,
            data,
        )

    def append_tails(self, buf: bytearray, seq: int, tails: bytearray) -> int:
        """Append the lines whose parts after the seq are ``tails`` (each behind its
        length, a native 4-byte unsigned int: a ``RecordLines``), numbered from
        ``seq``, to ``buf``; returns how many."""
        if append_lines is not None and seq < 1 << 62:
            return append_lines(buf, self._head, seq, tails)
        count, at = 0, 0
        while at < len(tails):
            (length,) = _TAIL_LENGTH.unpack_from(tails, at)
            at += _TAIL_LENGTH.size
            buf += b"%b%d%b" % (self._head, seq + count, bytes(tails[at : at + length]))
            at += length
            count += 1
        return count


_TAIL_LENGTH: Final = struct.Struct("=I")

# The encoder of the last session append_line() wrote for: callers write one
# session's lines in a row.
_last_encoder = LineEncoder("")


def encode_line(record: Record) -> bytes:
    """One complete line for ``record``, ending in ``\\n``."""
    buf = bytearray()
    append_line(buf, record)
    return bytes(buf)


def append_line(buf: bytearray, record: Record) -> None:
    """Append ``record`` as one line to ``buf`` (through :class:`LineEncoder`)."""
    global _last_encoder
    encoder = _last_encoder
    if encoder.session_id != record.session_id:
        encoder = _last_encoder = LineEncoder(record.session_id)
    event_id = record.event_id
    encoder.append(
        buf,
        record.seq,
        record.type,
        record.time,
        record.run_id,
        record.data,
        None if event_id is msgspec.UNSET else event_id,
    )


_TIME_RE: Final = re.compile(
    r"(\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d"
    r"(?:\.\d{1,9})?Z",
    re.ASCII,
)
_FRACTION_RE: Final = re.compile(r"\.\d{1,9}Z|Z", re.ASCII)
# Any RFC 3339 date-time: "T" or "t" (or a space, which RFC 3339 allows), and "Z", "z"
# or a numeric offset.
_RFC3339_RE: Final = re.compile(
    r"(\d{4}-\d\d-\d\d)[Tt ](\d\d:\d\d:\d\d)(\.\d{1,9})?(?:[Zz]|([+-])(\d\d):(\d\d))",
    re.ASCII,
)
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
    """Parse an RFC 3339 time (any offset) to an aware UTC datetime.

    Raises :class:`ValueError` when it is not RFC 3339.
    """
    utc = utc_time(text)
    if utc is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    text = utc
    head, _, frac = text[:-1].partition(".")
    micros = (frac + "000000")[:6]
    return datetime.strptime(f"{head}.{micros}", "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC)


def is_time(text: str) -> bool:
    """Whether ``text`` is a record time: RFC 3339, UTC, ``Z`` suffix, a real date in
    the years 0001 to 9999 (what ``datetime``, and so every reader, represents)."""
    global _valid_second
    if fast_is_time is not None and fast_is_time(text):
        return True
    # Consecutive times mostly share their second: once a time's first 19 characters
    # (date, hour, minutes, seconds) passed the whole check, another time with the
    # same ones only needs its fraction and ``Z`` checked.  Same result, a third of
    # the cost.  (``startswith`` makes no slice: docs/benchmarks.md.)
    if text.startswith(_valid_second):
        return _FRACTION_RE.fullmatch(text, 19) is not None
    # The pattern admits no leap second (RFC 3339 does; records do not) and checks
    # every field's range; only the 29th to 31st need the calendar.
    match = _TIME_RE.fullmatch(text)
    if match is None:
        return False
    year, month, day = match.group(1, 2, 3)
    if year == "0000":  # before what datetime, and so every reader, represents
        return False
    if day > "28":
        try:
            date(int(year), int(month), int(day))
        except ValueError:
            return False
    _valid_second = text[:19]
    return True


def utc_time(text: str) -> str | None:
    """``text``, any RFC 3339 time, as a record time in UTC; None when it is not one.

    ``2026-11-29T21:00:00.5+01:00`` becomes ``2026-11-29T20:00:00.5Z``: the offset is
    applied to the seconds and the fraction digits are kept as they are.
    """
    if is_time(text):
        return text
    match = _RFC3339_RE.fullmatch(text)
    if match is None:
        return None
    day, clock, fraction, sign, hours, minutes = match.groups()
    try:
        moment = datetime.fromisoformat(f"{day}T{clock}")
    except ValueError:
        return None
    if sign is not None:
        if int(hours) > 23 or int(minutes) > 59:
            return None
        offset = timedelta(hours=int(hours), minutes=int(minutes))
        try:
            moment = moment - offset if sign == "+" else moment + offset
        except OverflowError:  # an offset that moves it before 0001 or after 9999
            return None
    head = (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T"
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    )
    result = f"{head}{fraction or ''}Z"
    return result if is_time(result) else None


def is_session_id(text: str) -> bool:
    """Whether ``text`` is a session or run id: 32 lowercase hex digits."""
    return _SESSION_ID_RE.fullmatch(text) is not None


def new_id() -> str:
    """A fresh random session or run id (uuid4 hex)."""
    return uuid.uuid4().hex
