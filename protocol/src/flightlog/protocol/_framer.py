"""The frames of a run's records, and the account of what they could not carry:
:class:`RecordFramer`, sans I/O (see :mod:`._client`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from ._codec import Codec, EncodedEvent
from ._diagnostics import RunDiagnostics
from ._errors import ErrorCode, LocalProtocolError
from ._events import Event
from ._framing import FrameEncoder
from ._records import check_event_id, format_time, utc_time
from ._wire import RecordEvent

__all__ = ["RecordFramer"]


class RecordFramer:
    """Encodes events with ``codec`` into ``record`` frames of ``encoder``; keeps, per
    run, the events written with a marker or as a stub, for its ``run_close``."""

    def __init__(self, codec: Codec, encoder: FrameEncoder) -> None:
        self._codec = codec
        self._encoder = encoder
        #: Run id -> the events it recorded with markers or as stubs.
        self._diagnostics: dict[str, RunDiagnostics] = {}

    def frame(
        self,
        session_id: str,
        run_id: str,
        event: Event,
        time: datetime | str | None,
        event_id: str | None = None,
    ) -> bytes | None:
        """The frame recording ``event`` in the run, or None when it is never written
        (see :meth:`ClientConnection.record`); with ``event_id``, a frame that carries
        it (:func:`identified`)."""
        codec = self._codec
        encoded = codec.encode_event(event)
        if encoded is None:
            return None
        when = encoded.time if time is None else _event_time(encoded, time)
        encoder = self._encoder
        try:
            # The common case calls the method (not a bound method taken first, which
            # Python builds anew on every record).
            if event_id is None:
                frame = encoder.encode_record(session_id, run_id, encoded.type, when, encoded.data)
            else:
                frame = identified(encoder, event_id)(
                    session_id, run_id, encoded.type, when, encoded.data
                )
        except LocalProtocolError as exc:
            if exc.code != ErrorCode.FRAME_TOO_LARGE:
                raise
            # Too large to send: its stub is written instead, and run_close names it.
            encoded = codec.oversized(encoded, limit=encoder.max_frame_size)
            encode = encoder.encode_record if event_id is None else identified(encoder, event_id)
            try:
                frame = encode(session_id, run_id, encoded.type, when, encoded.data)
            except LocalProtocolError:
                raise exc from None
        if encoded.markers:
            execution = getattr(event, "execution", None)
            notes = self._diagnostics.get(run_id)
            if notes is None:
                notes = self._diagnostics[run_id] = RunDiagnostics()
            notes.add(encoded.type, getattr(execution, "id", None), encoded.markers)
        return frame

    def diagnosed(self, run_id: str) -> int:
        """How many events of the open run ``run_id`` were written with markers or as
        stubs."""
        notes = self._diagnostics.get(run_id)
        return 0 if notes is None else notes.events

    def closing(self, run_id: str) -> str | None:
        """The account of ``run_id`` for its ``run_close``, or None; forgotten here."""
        notes = self._diagnostics.pop(run_id, None)
        return None if notes is None else notes.text()


def _event_time(encoded: EncodedEvent, time: datetime | str | None) -> str:
    if time is None:
        # The moment the event happened at its source, not the moment it is written.
        return encoded.time
    if isinstance(time, datetime):
        return format_time(time)
    utc = utc_time(time)
    if utc is None:
        raise LocalProtocolError(
            f"time {time!r} is not an RFC 3339 time like 2026-11-29T20:00:00.000000Z",
            code=ErrorCode.BAD_EVENT,
        )
    return utc


def identified(
    encoder: FrameEncoder, event_id: str
) -> Callable[[str, str, str, str, bytes], bytes]:
    """An ``encode_record`` of ``encoder`` whose frames carry ``event_id``
    (``record(event, event_id=...)``: the daemon writes a record whose id the session
    does not hold yet, and drops, counts and acknowledges one whose id it holds;
    docs/protocol.md, "Event ids").  Frames without an id keep the C encoder's fast
    path; those with one are encoded by msgspec.  Raises :class:`LocalProtocolError`
    (``bad_event``) for an id that is not a string of 1 to 256 bytes."""
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
