"""The optional C accelerators of the per-record path, and the switch that turns them off.

:mod:`._sender` (C) is the client's: the frame of a record and the client's end of
the ring, each the exact twin of its Python version (:data:`encode_record`,
:data:`CRingWriter`; tests/protocol/test_sender.py holds them equal).

:mod:`._speedups` (C, built with the package when a compiler is at hand) is the
daemon's, a fast *accept* path: each of its functions either says "certainly accepted,
and this is what the Python code makes of it" or "not sure", and on "not sure" the
Python code runs as if it were not there. It never refuses: the Python path stays the
single source of truth for refusals and their typed errors. So the accelerator changes
speed only; tests/protocol/test_speedups.py holds the two to that on random and
hostile input.

When the extensions are not built (no compiler) or ``FLIGHTLOG_NO_SPEEDUPS`` is set to
anything but ``0`` or nothing, every name here is None and only the Python path runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from typing import Any

__all__ = [
    "SPEEDUPS",
    "CRingWriter",
    "append_lines",
    "encode_record",
    "fast_check_json",
    "fast_is_time",
    "take_records",
]

#: ``(data, limit)``: True when ``data`` is certainly JSON ``check_json`` accepts.
fast_check_json: Callable[[bytes, int], bool] | None
#: ``(text)``: True when ``text`` is certainly a record time.
fast_is_time: Callable[[str], bool] | None
#: See :class:`~._server.ServerConnection` (``record_lines``).
take_records: (
    Callable[
        [bytearray, int, int, Mapping[str, Any], object, Set[str], int, int, Callable[..., Any]],
        tuple[int, list[Any]],
    ]
    | None
)
#: ``(buf, head, seq, tails)``: the lines of a ``RecordLines``, appended; how many.
append_lines: Callable[[bytearray, bytes, int, bytearray], int] | None

try:
    # Its import fails when FLIGHTLOG_NO_SPEEDUPS is set: the switch is read in C, so
    # that this package stays without os (tests/protocol/test_purity.py).
    from ._speedups import append_lines, take_records
    from ._speedups import check_json as fast_check_json
    from ._speedups import is_time as fast_is_time
except ImportError:
    fast_check_json = fast_is_time = take_records = append_lines = None

#: Whether the C accelerator is in use.
SPEEDUPS = fast_check_json is not None

#: ``(session_id, run_id, event_type, time, data, max_frame_size)``: the frame of that
#: ``RecordEvent``, as ``FrameEncoder.encode`` makes it; None when not sure.
encode_record: Callable[[str, str, str, str, bytes, int], bytes | None] | None
#: The client's end of a ring in C, with :class:`~._ring.RingWriter`'s methods.
CRingWriter: Any

try:
    from ._sender import RingWriter as CRingWriter
    from ._sender import encode_record
except ImportError:
    encode_record = CRingWriter = None
