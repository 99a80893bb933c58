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

from dataclasses import dataclass, field
from typing import Any

import msgspec

from flightlog.protocol import (
    Execution,
)
from flightlog.protocol._calls import CallLedger, Calls, OpenCall, open_calls
from flightlog.protocol.events import TextPart, ToolExecEnd
from flightlog.protocol.wire import CheckpointLoaded

__all__ = [
    "CallLedger",
    "Calls",
    "OpenCall",
    "Resumption",
    "open_calls",
    "repair_event",
    "reply_calls",
]

#: The text of a repaired tool call's result.
REPAIR_TEXT = (
    "The tool call was interrupted (the agent stopped before it returned); "
    "no result was recorded. This result was written by flightlog's repair."
)


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


def reply_calls(reply: CheckpointLoaded) -> Calls | None:
    """The cut runs and open calls a daemon gathered, or None when it did not."""
    if not reply.calls_known:
        return None
    calls = [
        OpenCall(
            call.run_id,
            msgspec.convert(call.execution, Execution),
            call.seq,
            call.tool_call_id,
            call.name,
            call.arguments,
        )
        for call in reply.open_calls
    ]
    return list(reply.cut_runs), calls


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
