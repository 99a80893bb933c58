"""What a restarted agent needs to go on: the calls its cut runs left without an end.

:func:`open_calls` reads a session's records in order and pairs each model and tool
call's start with its end by ``(run_id, execution.id, execution.attempt,
execution.kind)`` (docs/format.md, section 4.5).  A call with a start and no end was
cut: the process died, or the daemon lost its end.  :func:`repair_event` is the
``tool_exec_end`` that :meth:`Session.resume` records for such a tool call with
``repair=True``: an error result with disposition ``repaired``, so that a history built
from the file pairs every tool call again, and nobody reads it as the tool's own result.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from flightlog.protocol import (
    RUN_CLOSE,
    RUN_START,
    Execution,
    Record,
)
from flightlog.protocol.events import (
    TextPart,
    ToolExecEnd,
)

__all__ = ["OpenCall", "Resumption", "open_calls", "repair_event"]

_STARTS = {
    "model_request": "model",
    "model_exec_start": "model",
    "tool_queued": "tool",
    "tool_exec_start": "tool",
}
_ENDS = {"model_exec_end": "model", "tool_exec_end": "tool"}

#: The text of a repaired tool call's result.
REPAIR_TEXT = (
    "The tool call was interrupted (the agent stopped before it returned); "
    "no result was recorded. This result was written by flightlog's repair."
)


@dataclass(frozen=True)
class OpenCall:
    """A model or tool call with a start and no end.

    ``execution`` is the call's Execution as recorded; ``tool_call_id`` and ``name``
    (tools) are the model's call id and the tool's name; ``seq`` is its first record's.
    """

    run_id: str
    execution: Execution
    seq: int
    tool_call_id: str | None = None
    name: str | None = None
    arguments: Any = None


@dataclass(frozen=True)
class Resumption:
    """What :meth:`Session.resume` found, and what it repaired.

    ``checkpoint`` is the latest checkpoint's snapshot (decoded by the codec), or None;
    ``cut_runs`` the runs left without ``run_close``; ``open_calls`` every call without
    an end (before any repair); ``repaired`` the tool calls a repair answered now.
    """

    checkpoint: Any
    cut_runs: list[str]
    open_calls: list[OpenCall]
    repaired: list[OpenCall] = field(default_factory=list)


def open_calls(records: Iterable[Record]) -> tuple[list[str], list[OpenCall]]:
    """The runs without ``run_close`` and the calls without an end, in file order."""
    runs: dict[str, None] = {}
    calls: dict[tuple[str, str, int, str], OpenCall] = {}
    ended: set[tuple[str, str, int, str]] = set()
    for record in records:
        run_id = record.run_id
        if run_id is None:
            continue
        if record.type == RUN_START:
            runs[run_id] = None
        elif record.type == RUN_CLOSE:
            runs.pop(run_id, None)
        kind = _STARTS.get(record.type) or _ENDS.get(record.type)
        if kind is None:
            continue
        data = record.decode_data()
        try:
            execution = msgspec.convert(data.get("execution"), Execution)
        except msgspec.ValidationError:
            continue
        key = (run_id, execution.id, execution.attempt, kind)
        if record.type in _ENDS:
            ended.add(key)
            calls.pop(key, None)
        elif key not in calls and key not in ended:
            calls[key] = OpenCall(
                run_id,
                execution,
                record.seq,
                data.get("tool_call_id"),
                data.get("name"),
                data.get("arguments"),
            )
    return list(runs), list(calls.values())


def repair_event(call: OpenCall) -> ToolExecEnd:
    """The ``tool_exec_end`` a repair records for an open tool call."""
    return ToolExecEnd(
        execution=call.execution,
        tool_call_id=call.tool_call_id or "",
        name=call.name or "",
        content=[TextPart(text=REPAIR_TEXT)],
        details={"repaired_seq": call.seq},
        is_error=True,
        disposition="repaired",
        reason="interrupted: flightlog wrote this result on resume(repair=True)",
    )
