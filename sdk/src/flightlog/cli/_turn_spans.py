"""The span of one turn of an agent loop, for ``flightlog export`` (:mod:`._spans`).

A :class:`Turn` is opened by ``turn_start``; the builder hands it each call of its turn
as the call ends (:meth:`Turn.count`) and, at ``turn_end`` or at its run's end, asks it
for its span (:meth:`Turn.span`).  Its tokens are the loop's count when ``turn_end``
has one, else the sum over its model calls; its price is summed like a run's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flightlog.sdk import Total

from ._span_data import INTERRUPTED, AttributeValue, Span, add_usage

__all__ = ["Turn", "add_cost"]


@dataclass
class Turn:
    """One open turn: what its span will carry once it ends."""

    index: int
    span_id: int
    start_ns: int
    session_id: str
    run_id: str
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    cost: Total = field(default_factory=Total)
    error: str | None = None
    failed_exec: str | None = None  # the call whose error is the turn's, if one is

    def summary(self, data: Mapping[str, Any]) -> None:
        """What ``turn_end`` says of the turn."""
        if isinstance(data.get("stop_reason"), str):
            self.attributes["flightlog.turn.stop_reason"] = data["stop_reason"]
        for name in ("message_count", "tool_call_count"):
            if isinstance(data.get(name), int):
                self.attributes[f"flightlog.turn.{name}"] = data[name]
        add_usage(self.attributes, data.get("usage"))  # the loop's own count, if it has one

    def count(
        self, kind: str, exec_id: str, attributes: Mapping[str, Any], error: str | None
    ) -> None:
        """Adds an ended call's tokens; a failed model call or a cancelled tool call fails
        the turn, unless a later attempt of the same call succeeds."""
        for key, value in attributes.items():
            if key.startswith("gen_ai.usage.") and isinstance(value, int):
                self.tokens[key] = self.tokens.get(key, 0) + value
        cancelled = attributes.get("flightlog.tool.disposition") == "cancelled"
        if error is not None and (kind == "model" or cancelled):
            self.error, self.failed_exec = error, exec_id
        elif error is None and self.failed_exec == exec_id:
            self.error = self.failed_exec = None

    def span(
        self, trace_id: int, parent_id: int, end: int, end_seq: int, *, interrupted: bool
    ) -> Span:
        """The turn's span, ended at ``end``; ``interrupted``: it has no ``turn_end``."""
        attributes: dict[str, AttributeValue] = {
            "gen_ai.conversation.id": self.session_id,
            "flightlog.run_id": self.run_id,
            "flightlog.turn.index": self.index,
            **self.attributes,
        }
        for key, total in self.tokens.items():
            attributes.setdefault(key, total)
        add_cost(attributes, self.cost)
        error = self.error
        if interrupted:
            attributes["error.type"] = INTERRUPTED
            error = f"{INTERRUPTED}: no turn_end (turn {self.index})"
        elif error is not None:
            attributes["error.type"] = "turn_error"
        return Span(
            name=f"turn {self.index}",
            trace_id=trace_id,
            span_id=self.span_id,
            parent_id=parent_id,
            kind="internal",
            start_ns=self.start_ns,
            end_ns=max(end, self.start_ns),
            attributes=attributes,
            error=error,
            end_seq=end_seq,
        )


def add_cost(attributes: dict[str, AttributeValue], cost: Total) -> None:
    """A run's or a turn's price: the sum of its priced calls, and how many were not."""
    if cost.sources:
        if cost.priced:
            attributes["flightlog.cost.amount"] = float(cost.amount)
            attributes["flightlog.cost.currency"] = cost.currency
        attributes["flightlog.cost.priced_calls"] = cost.priced
        attributes["flightlog.cost.unknown_calls"] = cost.unknown
