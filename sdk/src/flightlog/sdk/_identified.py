"""Records with an id of the caller's (``record(event, event_id=...)``).

The id travels in the record's frame (``RecordEvent.event_id``); the daemon writes a
record whose id the session does not hold yet, and drops, counts and acknowledges one
whose id it holds (docs/protocol.md, "Event ids").  Frames without an id keep the C
encoder's fast path; those with one are encoded by msgspec.
"""

from __future__ import annotations

from collections.abc import Callable

from flightlog.protocol import FrameEncoder, RecordEvent, check_event_id

__all__ = ["identified"]


def identified(
    encoder: FrameEncoder, event_id: str
) -> Callable[[str, str, str, str, bytes], bytes]:
    """An ``encode_record`` of ``encoder`` whose frames carry ``event_id``.  Raises
    :class:`~flightlog.protocol.LocalProtocolError` (``bad_event``) for an id that is
    not a string of 1 to 256 bytes."""
    check_event_id(event_id)

    def encode(session_id: str, run_id: str, event_type: str, time: str, data: bytes) -> bytes:
        return encoder.encode(
            RecordEvent(
                session_id=session_id,
                run_id=run_id,
                event_type=event_type,
                time=time,
                data=data,
                event_id=event_id,
            )
        )

    return encode
