"""The file format's machinery, sans I/O: lines in and out, the JSON and number checks,
the codec's markers, the run ledger.

``from flightlog.protocol import format`` and use ``format.LineReader``,
``format.RunLedger``; the records and the reader themselves are at
:mod:`flightlog.protocol`'s top level.
"""

from __future__ import annotations

from ._codec import (
    CLASS_KEY,
    MARKER_KEY,
    MAX_DEPTH,
    OVERSIZED,
    SNAPSHOT_ERROR_KEY,
    TYPE_KEY,
    UNENCODABLE,
)
from ._credentials import is_credential_key
from ._json import *  # noqa: F403
from ._json import __all__ as _json_all
from ._ledger import *  # noqa: F403
from ._ledger import __all__ as _ledger_all
from ._lines import *  # noqa: F403
from ._lines import __all__ as _lines_all
from ._meta import session_start_line
from ._numbers import check_numbers
from ._reader import CALL_END_TYPES, CALL_START_TYPES, ReusedExecutions
from ._records import (
    NEVER_WRITTEN_TYPES,
    STRUCTURAL_TYPES,
    ForkStartData,
    LineEncoder,
    append_line,
    check_event_id,
    check_event_ids,
    encode_line,
    event_id_key,
    is_session_id,
    is_time,
    utc_time,
)

__all__ = [
    "CALL_END_TYPES",
    "CALL_START_TYPES",
    "CLASS_KEY",
    "MARKER_KEY",
    "MAX_DEPTH",
    "NEVER_WRITTEN_TYPES",
    "OVERSIZED",
    "SNAPSHOT_ERROR_KEY",
    "STRUCTURAL_TYPES",
    "TYPE_KEY",
    "UNENCODABLE",
    "ForkStartData",
    "LineEncoder",
    "ReusedExecutions",
    "append_line",
    "check_event_id",
    "check_event_ids",
    "check_numbers",
    "encode_line",
    "event_id_key",
    "is_credential_key",
    "is_session_id",
    "is_time",
    "session_start_line",
    "utc_time",
    *_json_all,
    *_ledger_all,
    *_lines_all,
]
