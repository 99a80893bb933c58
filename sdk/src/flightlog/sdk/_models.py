"""Small value types of the SDK."""

from __future__ import annotations

import msgspec

__all__ = ["CallRef"]


class CallRef(msgspec.Struct, frozen=True):
    """Names one model, tool or compaction call recorded in a session.

    An outside timeline stores these refs; the bodies stay in the session file.  The
    records of the call are those of run ``run_id`` whose ``execution`` has
    ``id == execution_id`` and ``attempt == attempt``.  It encodes with msgspec (JSON
    or MessagePack) as an object with these four fields.
    """

    session_id: str
    run_id: str
    execution_id: str
    attempt: int = 1
