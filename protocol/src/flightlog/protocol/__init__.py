"""flightlog's protocol, sans I/O: what agents and readers use.

The top level names the events (:mod:`flightlog.protocol.events`), the records and
their types, the codec, the reader and the errors.  The rest lives in three namespaces:
:mod:`~flightlog.protocol.wire` (messages, framing, both ends' connections),
:mod:`~flightlog.protocol.format` (lines, checks, the run ledger) and
:mod:`~flightlog.protocol.ring` (the shared-memory ring).
"""

from __future__ import annotations

from . import events, format, ring, wire
from ._codec import (
    Codec,
    EncodedEvent,
    decode_event,
    decode_value,
    default_codec,
    encode_event,
    encode_value,
)
from ._errors import (
    ConnectionLost,
    DaemonError,
    ErrorCode,
    FileFormatError,
    FlightlogError,
    LocalProtocolError,
    RecordingError,
    RemoteProtocolError,
)
from ._events import Event, Execution
from ._reader import BinaryReadable, CheckReport, Reader, check, read_records
from ._records import (
    AGENT_FACT_TYPES,
    CHECKPOINT,
    FORMAT_VERSION,
    RECORD_TYPES,
    RUN_CLOSE,
    RUN_RESUME,
    RUN_START,
    SESSION_START,
    CheckpointData,
    Origin,
    Record,
    RunCloseData,
    RunResumeData,
    RunStartData,
    SessionStartData,
    format_time,
    new_id,
    now,
    parse_time,
)

__all__ = [
    "AGENT_FACT_TYPES",
    "CHECKPOINT",
    "FORMAT_VERSION",
    "RECORD_TYPES",
    "RUN_CLOSE",
    "RUN_RESUME",
    "RUN_START",
    "SESSION_START",
    "BinaryReadable",
    "CheckReport",
    "CheckpointData",
    "Codec",
    "ConnectionLost",
    "DaemonError",
    "EncodedEvent",
    "ErrorCode",
    "Event",
    "Execution",
    "FileFormatError",
    "FlightlogError",
    "LocalProtocolError",
    "Origin",
    "Reader",
    "Record",
    "RecordingError",
    "RemoteProtocolError",
    "RunCloseData",
    "RunResumeData",
    "RunStartData",
    "SessionStartData",
    "check",
    "decode_event",
    "decode_value",
    "default_codec",
    "encode_event",
    "encode_value",
    "events",
    "format",
    "format_time",
    "new_id",
    "now",
    "parse_time",
    "read_records",
    "ring",
    "wire",
]
