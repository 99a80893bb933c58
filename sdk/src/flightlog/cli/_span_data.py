"""The plain data of ``flightlog export``'s spans (:mod:`._spans`): spans, links, events,
their derived ids and times, and the conventions' usage attributes."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from flightlog.protocol import Record, parse_time

__all__ = [
    "INTERRUPTED",
    "AttributeValue",
    "Link",
    "Span",
    "SpanEvent",
    "add_usage",
    "record_ns",
    "span_id",
    "trace_id",
]

#: The error of a span whose end record is missing.
INTERRUPTED: Final = "interrupted"

AttributeValue: TypeAlias = str | bool | int | float | Sequence[str]


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x1f".join(("flightlog", *parts)).encode()).digest()


def trace_id(session_id: str, run_id: str) -> int:
    """The 128-bit trace id of a run: the same for every export of it."""
    return int.from_bytes(_digest("trace", session_id, run_id)[:16]) or 1


def span_id(session_id: str, run_id: str, *call: str | int) -> int:
    """The 64-bit id of a run's span (no ``call``) or of a call's span (kind, id, attempt)."""
    return int.from_bytes(_digest("span", session_id, run_id, *map(str, call))[:8]) or 1


@dataclass(frozen=True)
class Link:
    """A link to another span: a retry's failed attempt, a re-issued call's first run."""

    trace_id: int
    span_id: int
    attributes: dict[str, AttributeValue]


@dataclass(frozen=True)
class SpanEvent:
    """A span event: an error record, a checkpoint."""

    name: str
    time_ns: int
    attributes: dict[str, AttributeValue]


@dataclass
class Span:
    """One finished span, ready to be turned into an OpenTelemetry ``ReadableSpan``."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    kind: Literal["internal", "client"]
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    error: str | None = None  # None: status unset (the conventions' success)
    events: list[SpanEvent] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    end_seq: int = 0


#: OTLP carries times as unsigned 64-bit nanoseconds since 1970.
_MAX_NS = (1 << 64) - 1


def record_ns(record: Record) -> int:
    """``record``'s time in nanoseconds since 1970; ValueError when OTLP cannot carry
    it (before 1970, after 2554) or it is no time (a line of an old file)."""
    moment = parse_time(record.time)
    ns = int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000
    if not 0 <= ns <= _MAX_NS:
        raise ValueError(f"time {record.time} is outside what OTLP carries (1970 to 2554)")
    return ns


def add_usage(attributes: dict[str, AttributeValue], usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    for name, attribute in (
        ("input_tokens", "gen_ai.usage.input_tokens"),
        ("output_tokens", "gen_ai.usage.output_tokens"),
        ("cache_read_tokens", "gen_ai.usage.cache_read.input_tokens"),
        ("cache_write_tokens", "gen_ai.usage.cache_creation.input_tokens"),
    ):
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            attributes[attribute] = value
    if isinstance(usage.get("cost"), int | float) and not isinstance(usage["cost"], bool):
        attributes["flightlog.usage.cost"] = float(usage["cost"])
