"""A run's writes: :class:`AsyncRunBase`, all of :class:`AsyncRun` but the session it
belongs to, which the client's module adds (so that this one need not import it).

``record()`` is every agent's hot path: the run hands the event to the
:class:`~flightlog.protocol.wire.ClientConnection` and the frames to the link, and takes
in the daemon's pushes at most once a millisecond (docs/benchmarks.md, scenario 3).
The sync twin of this module is generated from it by ``tests/sdk/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from time import monotonic_ns
from typing import Any, Final

from flightlog.protocol import (
    ErrorCode,
    Event,
    Execution,
    FlightlogError,
    RecordingError,
)
from flightlog.protocol.wire import RunStarted, sticky_of

from ._async_link import AsyncLink, AsyncResource
from ._exceptions import ConnectionLost
from ._models import CallRef
from ._resume import check_event_ids

__all__ = ["AsyncRunBase"]

#: Errors of one event (it cannot be encoded, or sent whole), not of the run: a batch
#: recorded in best effort goes on past them.
_ONE_EVENT_ERRORS: Final = frozenset(
    {ErrorCode.CODEC_ERROR, ErrorCode.BAD_EVENT, ErrorCode.FRAME_TOO_LARGE}
)


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class AsyncRunBase(AsyncResource):
    """Everything of :class:`AsyncRun` but its ``session``: the writes of the run
    ``started`` of the session ``session_id``, through ``link``.

    ``run_id`` is fresh for every run; ``seq`` is the seq of its ``run_start``.
    """

    def __init__(self, session_id: str, link: AsyncLink, started: RunStarted) -> None:
        self.session_id = session_id
        self.run_id = started.run_id
        self.seq = started.seq
        self._link = link
        self._conn = link.conn
        #: The session's sticky errors, kept after the session is closed.
        self._state = self._conn.session_state(self.session_id)
        self._unencodable: RecordingError | None = None
        #: Best effort: the events not recorded, and why the first was not.
        self.dropped = 0
        self._drop_reason: str | None = None

    @property
    def error(self) -> RecordingError | None:
        """The run's sticky error, or None.

        The error the daemon pushed for this run (or its session), or the first event
        the codec could not encode (strict), else the first checkpoint it could not
        encode.  ``run_close`` keeps it, and so does the run once its session is closed.
        """
        return sticky_of(self._state, self.run_id) or self._unencodable

    @property
    def diagnosed(self) -> int:
        """How many of the run's events were written with a marker in place of a value,
        or as the stub of an event too large to send; ``run_close`` names them."""
        return self._conn.diagnosed(self.run_id)

    async def record(
        self, event: Event, *, time: datetime | str | None = None, event_id: str | None = None
    ) -> None:
        """Record ``event``; returns once it is sent, without waiting for the daemon.

        The event is encoded here.  A value the codec cannot encode is written as a
        marker in its place, and an event larger than the daemon's maximum frame size
        as its stub; ``run_close`` names both, and nothing is raised.  A codec error
        is raised here (:class:`RecordingError`: the event is not recorded; code
        ``codec_error`` becomes the run's sticky :attr:`error`, raised by every later
        write of the run and written into ``run_close``, so the file shows that an
        event is missing; best effort drops the event instead, and goes on); events
        that are never written (token deltas, stream chunks, progress) are skipped.
        ``time`` overrides the event's own time (any RFC 3339 offset; written in UTC).
        ``event_id`` (a string of 1 to 256 bytes, the caller's) makes the record
        idempotent: the session holds it once however often it is recorded, also by a
        later process or after a daemon restart (a repeat is dropped and counted in
        ``run_close``); an invalid one raises :class:`LocalProtocolError` here.
        Raises the run's sticky :class:`RecordingError` once the daemon pushed one, and
        :class:`LocalProtocolError` for a closed run.

        Pushed errors are looked for at most once a millisecond (a syscall each time),
        so during a burst one surfaces from a record() up to a millisecond later.
        Requests (``save_checkpoint``, ``sync``, ``close`` …) take in every push that
        arrived before their answer.
        """
        link = self._link
        if monotonic_ns() >= link.poll_due:
            link.poll()
        try:
            try:
                data = self._conn.record(self.session_id, self.run_id, event, time, event_id)
            except ConnectionLost:
                if not link.reconnecting():
                    raise
                await link.ready()
                data = self._conn.record(self.session_id, self.run_id, event, time, event_id)
        except FlightlogError as exc:
            if link.best_effort:
                self._drop(exc, 1)
                return
            self._refused(exc)
            raise
        if data is not None:
            try:
                await link.send_records(self.session_id, (data,))
            except FlightlogError:
                # Sent or kept: a reconnect sends it again, a give-up counts it lost.
                if not link.best_effort:
                    raise

    def _refused(self, exc: FlightlogError) -> None:
        """Strict: an event the codec refused makes the run's error sticky."""
        if isinstance(exc, RecordingError) and exc.code == ErrorCode.CODEC_ERROR:
            self._conn.refuse_run(self.session_id, self.run_id, exc)

    def _drop(self, exc: FlightlogError, count: int) -> None:
        """Best effort: ``count`` events are not recorded; counted, kept for run_close."""
        self.dropped += count
        if self._drop_reason is None:
            self._drop_reason = f"{exc.code}: {exc.message}"
        self._link.count_dropped(exc, count)

    async def record_many(
        self, events: Iterable[Event], *, event_ids: Iterable[str | None] | None = None
    ) -> None:
        """Record ``events`` in order, as :meth:`record` does each, with one send.

        ``event_ids``, one per event (None for an event without one), makes each event
        idempotent as :meth:`record`'s ``event_id`` does.  A count that is not the
        events' or an invalid id raises :class:`LocalProtocolError` before anything is
        sent.  An event the codec cannot encode raises after the events before it were
        sent (sticky, as from :meth:`record`); the ones after it are not recorded.  Best
        effort drops that event alone (counted, as :meth:`record` does) and records the
        rest.
        """
        link = self._link
        if monotonic_ns() >= link.poll_due:
            link.poll()
        events = list(events)
        ids = check_event_ids(event_ids, len(events))
        frames: list[bytes] = []
        done = 0
        try:
            await link.ready()
            for event, event_id in zip(events, ids, strict=True):
                try:
                    data = self._conn.record(self.session_id, self.run_id, event, None, event_id)
                except FlightlogError as exc:
                    if not (link.best_effort and exc.code in _ONE_EVENT_ERRORS):
                        raise
                    self._drop(exc, 1)
                    data = None
                if data is not None:
                    frames.append(data)
                done += 1
        except FlightlogError as exc:
            if link.best_effort:
                self._drop(exc, len(events) - done)
            else:
                self._refused(exc)
                raise
        finally:
            if frames:
                try:
                    await link.send_records(self.session_id, frames)
                except FlightlogError:
                    if not link.best_effort:
                        raise

    def ref(self, execution: Execution) -> CallRef:
        """The :class:`CallRef` naming ``execution``'s call in this run."""
        return CallRef(self.session_id, self.run_id, execution.id, execution.attempt)

    async def save_checkpoint(self, snapshot: Any) -> int:
        """Append a checkpoint of ``snapshot`` (codec-encoded) and wait until it is durable.

        Returns its seq.  Raises the codec's :class:`RecordingError` (kept like one
        from :meth:`record`) and the run's sticky error.
        """
        self._link.poll()
        await self._link.ready()
        try:
            pending = self._conn.save_checkpoint(self.session_id, self.run_id, snapshot)
        except RecordingError as exc:
            if exc.code == ErrorCode.CODEC_ERROR and self._unencodable is None:
                self._unencodable = exc
            raise
        return await self._link.call(pending)

    async def aclose(self, error: str | None = None) -> None:
        """Write ``run_close`` and wait until it is durable; safe to call again.

        ``run_close`` carries the run's sticky error text, else ``error``, and the
        codec's error for a value it could not encode.  Raises the sticky
        :class:`RecordingError` after writing it: a run whose records failed does not
        close quietly.  The sync client called on a thread that runs an event loop does
        not wait for durability: it sends ``run_close`` and returns.
        """
        self._link.poll()
        await self._link.ready()
        if self._unencodable is not None:
            lost = f"{self._unencodable.code}: {self._unencodable.message}"
            error = lost if error is None else f"{error}; {lost}"
        if self.dropped:
            lost = f"{self.dropped} events not recorded, the first for {self._drop_reason}"
            error = lost if error is None else f"{error}; {lost}"
        pending = self._conn.close_run(self.session_id, self.run_id, error)
        if pending is not None:
            await self._link.call_unless_loop(pending)

    async def _close_for(self, exc: BaseException) -> None:
        await self.aclose(error=_error_text(exc))
