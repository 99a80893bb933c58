"""The file format's machinery, sans I/O: lines in and out, the JSON and number checks,
the codec's markers, the run ledger.

``from flightlog.protocol import format`` and use ``format.LineReader``,
``format.RunLedger``; the records and the reader themselves are at
:mod:`flightlog.protocol`'s top level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy

__all__: list[str]
if TYPE_CHECKING:
    from ._check import CALL_END_TYPES as CALL_END_TYPES
    from ._check import CALL_START_TYPES as CALL_START_TYPES
    from ._check import ReusedExecutions as ReusedExecutions
    from ._codec import CLASS_KEY as CLASS_KEY
    from ._codec import MARKER_KEY as MARKER_KEY
    from ._codec import MAX_DEPTH as MAX_DEPTH
    from ._codec import OVERSIZED as OVERSIZED
    from ._codec import SNAPSHOT_ERROR_KEY as SNAPSHOT_ERROR_KEY
    from ._codec import TYPE_KEY as TYPE_KEY
    from ._codec import UNENCODABLE as UNENCODABLE
    from ._credentials import is_credential_key as is_credential_key
    from ._json import MAX_NESTING as MAX_NESTING
    from ._json import check_json as check_json
    from ._json import nested_deeper_than as nested_deeper_than
    from ._ledger import MAX_CLIENT_NAME as MAX_CLIENT_NAME
    from ._ledger import Entry as Entry
    from ._ledger import LedgerState as LedgerState
    from ._ledger import RunLedger as RunLedger
    from ._lines import END_OF_FILE as END_OF_FILE
    from ._lines import MAX_LINE_BYTES as MAX_LINE_BYTES
    from ._lines import NEED_DATA as NEED_DATA
    from ._lines import SUPPORTED_FORMAT_VERSIONS as SUPPORTED_FORMAT_VERSIONS
    from ._lines import LineReader as LineReader
    from ._lines import ReadState as ReadState
    from ._lines import parse_line as parse_line
    from ._meta import session_start_line as session_start_line
    from ._numbers import check_numbers as check_numbers
    from ._records import NEVER_WRITTEN_TYPES as NEVER_WRITTEN_TYPES
    from ._records import STRUCTURAL_TYPES as STRUCTURAL_TYPES
    from ._records import ForkStartData as ForkStartData
    from ._records import LineEncoder as LineEncoder
    from ._records import append_line as append_line
    from ._records import check_event_id as check_event_id
    from ._records import check_event_ids as check_event_ids
    from ._records import encode_line as encode_line
    from ._records import event_id_key as event_id_key
    from ._records import is_session_id as is_session_id
    from ._records import is_time as is_time
    from ._records import utc_time as utc_time
else:
    __all__, __getattr__, __dir__ = lazy(
        __name__,
        globals(),
        {
            "_check": ("CALL_END_TYPES", "CALL_START_TYPES", "ReusedExecutions"),
            "_codec": (
                "CLASS_KEY",
                "MARKER_KEY",
                "MAX_DEPTH",
                "OVERSIZED",
                "SNAPSHOT_ERROR_KEY",
                "TYPE_KEY",
                "UNENCODABLE",
            ),
            "_credentials": ("is_credential_key",),
            "_json": (
                "MAX_NESTING",
                "check_json",
                "nested_deeper_than",
            ),
            "_ledger": (
                "MAX_CLIENT_NAME",
                "Entry",
                "LedgerState",
                "RunLedger",
            ),
            "_lines": (
                "END_OF_FILE",
                "MAX_LINE_BYTES",
                "NEED_DATA",
                "SUPPORTED_FORMAT_VERSIONS",
                "LineReader",
                "ReadState",
                "parse_line",
            ),
            "_meta": ("session_start_line",),
            "_numbers": ("check_numbers",),
            "_records": (
                "NEVER_WRITTEN_TYPES",
                "STRUCTURAL_TYPES",
                "ForkStartData",
                "LineEncoder",
                "append_line",
                "check_event_id",
                "check_event_ids",
                "encode_line",
                "event_id_key",
                "is_session_id",
                "is_time",
                "utc_time",
            ),
        },
    )
