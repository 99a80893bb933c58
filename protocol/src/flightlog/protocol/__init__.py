"""flightlog's protocol, sans I/O: what agents and readers use.

The top level names the events (:mod:`flightlog.protocol.events`), the records and
their types, the codec, the reader and the errors.  The rest lives in three namespaces:
:mod:`~flightlog.protocol.wire` (messages, framing, both ends' connections),
:mod:`~flightlog.protocol.format` (lines, checks, the run ledger) and
:mod:`~flightlog.protocol.ring` (the shared-memory ring).

Each name's module is imported when the name is first used (:mod:`._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy

__all__: list[str]
if TYPE_CHECKING:
    from . import events as events
    from . import format as format
    from . import ring as ring
    from . import wire as wire
    from ._check import CheckReport as CheckReport
    from ._check import check as check
    from ._codec import Codec as Codec
    from ._codec import EncodedEvent as EncodedEvent
    from ._codec import decode_event as decode_event
    from ._codec import decode_value as decode_value
    from ._codec import default_codec as default_codec
    from ._codec import encode_event as encode_event
    from ._codec import encode_value as encode_value
    from ._errors import ConnectionLost as ConnectionLost
    from ._errors import DaemonError as DaemonError
    from ._errors import ErrorCode as ErrorCode
    from ._errors import FileFormatError as FileFormatError
    from ._errors import FlightlogError as FlightlogError
    from ._errors import LocalProtocolError as LocalProtocolError
    from ._errors import RecordingError as RecordingError
    from ._errors import RemoteProtocolError as RemoteProtocolError
    from ._events import Event as Event
    from ._events import Execution as Execution
    from ._reader import BinaryReadable as BinaryReadable
    from ._reader import Reader as Reader
    from ._reader import read_records as read_records
    from ._records import AGENT_FACT_TYPES as AGENT_FACT_TYPES
    from ._records import CHECKPOINT as CHECKPOINT
    from ._records import FORMAT_VERSION as FORMAT_VERSION
    from ._records import RECORD_TYPES as RECORD_TYPES
    from ._records import RUN_CLOSE as RUN_CLOSE
    from ._records import RUN_RESUME as RUN_RESUME
    from ._records import RUN_START as RUN_START
    from ._records import SESSION_START as SESSION_START
    from ._records import CheckpointData as CheckpointData
    from ._records import Origin as Origin
    from ._records import Record as Record
    from ._records import RunCloseData as RunCloseData
    from ._records import RunResumeData as RunResumeData
    from ._records import RunStartData as RunStartData
    from ._records import SessionStartData as SessionStartData
    from ._records import format_time as format_time
    from ._records import new_id as new_id
    from ._records import now as now
    from ._records import parse_time as parse_time
else:
    __all__, __getattr__, __dir__ = lazy(
        __name__,
        globals(),
        {
            "_codec": (
                "Codec",
                "EncodedEvent",
                "decode_event",
                "decode_value",
                "default_codec",
                "encode_event",
                "encode_value",
            ),
            "_errors": (
                "ConnectionLost",
                "DaemonError",
                "ErrorCode",
                "FileFormatError",
                "FlightlogError",
                "LocalProtocolError",
                "RecordingError",
                "RemoteProtocolError",
            ),
            "_events": ("Event", "Execution"),
            "_check": ("CheckReport", "check"),
            "_reader": ("BinaryReadable", "Reader", "read_records"),
            "_records": (
                "AGENT_FACT_TYPES",
                "CHECKPOINT",
                "FORMAT_VERSION",
                "RECORD_TYPES",
                "RUN_CLOSE",
                "RUN_RESUME",
                "RUN_START",
                "SESSION_START",
                "CheckpointData",
                "Origin",
                "Record",
                "RunCloseData",
                "RunResumeData",
                "RunStartData",
                "SessionStartData",
                "format_time",
                "new_id",
                "now",
                "parse_time",
            ),
        },
        submodules=("events", "format", "ring", "wire"),
    )
