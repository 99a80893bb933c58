"""What a restarted agent needs to go on: the calls its cut runs left without an end.

:func:`open_calls` reads a session's records in order and pairs each model and tool
call's start with its end by ``(run_id, execution.id, execution.attempt,
execution.kind)`` (docs/format.md, section 4.5).  A call with a start and no end was
cut: the process died, or the daemon lost its end.  :func:`repair_event` is the end
that :meth:`Session.resume` records for such a call with ``repair=True``, in the call's
own run (docs/format.md, "Repair"): for a tool call an error result with disposition
``repaired``, so that a history built from the file pairs every tool call again and
nobody reads it as the tool's own result; for a model call an error with disposition
``cancelled``.  :func:`repair_id` is its event id, the same however often a repair runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import msgspec

from flightlog.protocol import (
    Execution,
)
from flightlog.protocol._calls import CallLedger, Calls, OpenCall, open_calls
from flightlog.protocol.events import ModelExecEnd, TextPart, ToolExecEnd
from flightlog.protocol.format import check_event_ids
from flightlog.protocol.wire import CheckpointLoaded

__all__ = [
    "CallLedger",
    "Calls",
    "OpenCall",
    "Resumption",
    "check_event_ids",
    "open_calls",
    "repair_event",
    "repair_id",
    "repair_note",
    "reply_calls",
]

#: The error of a repaired model call's end.
REPAIR_MODEL_TEXT = (
    "interrupted: the agent stopped before the model call ended; flightlog's repair wrote this end"
)

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
    an end (before any repair); ``repaired`` the calls a repair answered now (model and
    tool calls), and ``repaired_runs`` the runs it closed.
    """

    checkpoint: Any
    cut_runs: list[str]
    open_calls: list[OpenCall]
    repaired: list[OpenCall] = field(default_factory=list)
    repaired_runs: list[str] = field(default_factory=list)


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


def repair_event(call: OpenCall) -> ToolExecEnd | ModelExecEnd:
    """The end a repair records for an open call: a ``tool_exec_end`` marked
    ``repaired`` for a tool call, a ``model_exec_end`` marked ``cancelled`` for a model
    call (a compaction's too, which pairs as a model call)."""
    if call.execution.kind != "tool":
        return ModelExecEnd(
            execution=call.execution, error=REPAIR_MODEL_TEXT, disposition="cancelled"
        )
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


def repair_id(call: OpenCall) -> str:
    """The event id of the end a repair records for ``call``: the same for every
    repair of the file, so that one cut short and run again writes each end once."""
    execution = call.execution
    key = f"{call.run_id}\0{execution.kind}\0{execution.attempt}\0{execution.id}"
    return "flightlog-repair-" + hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


def repair_note(calls: list[OpenCall]) -> str:
    """The ``run_close`` error of a run a repair closed, having answered ``calls``."""
    return (
        f"interrupted; closed by flightlog's repair, which answered {len(calls)} call(s) "
        "left without an end"
    )
