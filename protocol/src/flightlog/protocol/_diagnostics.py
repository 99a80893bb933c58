"""What a run's records carry in place of what they could not: named in its ``run_close``.

The codec never refuses an event for its content: a value it cannot encode becomes an
unencodable marker, and an event too large for a frame becomes a stub
(``docs/format.md`` section 7).  The event is kept, and so is the fact: each run keeps a
short account of the events that carry a marker or are a stub, and closing the run
writes it into ``run_close.error``, so a reader of the file learns what is not there
without searching every record.  The account is bounded: the first
:data:`MAX_EVENTS` events are named, then how many more.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_EVENTS", "RunDiagnostics"]

#: ``run_close`` names at most this many events with markers, then how many more.
MAX_EVENTS: Final = 8
# One event's account is cut to this many characters.
_MAX_LINE: Final = 600


class RunDiagnostics:
    """The events of one run that carry markers, or are stubs."""

    __slots__ = ("events", "lines")

    def __init__(self) -> None:
        #: How many events carry markers (or are stubs).
        self.events = 0
        self.lines: list[str] = []

    def add(self, event_type: str, execution_id: str | None, markers: tuple[str, ...]) -> None:
        """Count an event of ``event_type`` whose codec ``markers`` say what it carries."""
        self.events += 1
        if len(self.lines) < MAX_EVENTS:
            which = event_type if execution_id is None else f"{event_type} {execution_id}"
            line = f"{which}: {', '.join(markers)}"
            if len(line) > _MAX_LINE:
                line = line[: _MAX_LINE - 3] + "..."
            self.lines.append(line)

    def text(self) -> str:
        """The account written into ``run_close``."""
        more = self.events - len(self.lines)
        events = "1 event" if self.events == 1 else f"{self.events} events"
        text = f"codec_error: {events} written with $flightlog markers: " + "; ".join(self.lines)
        return f"{text}; and {more} more" if more else text


def joined(error: str | None, more: str | None) -> str | None:
    """``error`` and ``more``, either of which may be None, as one ``run_close`` text."""
    if more is None:
        return error
    return more if error is None else f"{error}; {more}"
