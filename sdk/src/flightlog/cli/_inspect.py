"""Understanding a session: its runs, their calls, and what is missing.

Theory of operation
-------------------
:class:`SessionSummary` takes a session's records one at a time, in file order
(:meth:`SessionSummary.add`), and keeps a small summary of each run and each call, never
the records themselves, so a file of any size is summarised in memory proportional to
its number of calls.

Starts and ends pair by run, execution id, attempt and kind (docs/format.md section 4.5): the
records of one call are those of one run whose ``execution`` has the same ``kind``,
``id`` and ``attempt``.  A retry keeps the id and adds one to the attempt, so each
attempt is a call of its own, linked to the next by the ``retry`` record.  A call
without its end record (``model_exec_end``, ``tool_exec_end``) is never read as a
success: its status is ``no end``, and :meth:`RunSummary.gaps` names it.  An execution
id used by two calls (a second start after the first one's end, or a start recorded
twice) is a gap as well: the calls cannot be told apart, so it is never merged silently.

A run's outcome comes from ``agent_end`` for an agent loop, or from its model calls'
``model_exec_end`` for standalone calls; ``run_close`` only says the recording scope
was closed.  A run without ``run_close`` was interrupted (or is still being written):
that is a gap too, and nothing is invented to fill it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from flightlog.protocol import (
    CHECKPOINT,
    RUN_CLOSE,
    RUN_START,
    SESSION_START,
    Record,
)
from flightlog.protocol.format import (
    ReusedExecutions,
)
from flightlog.sdk import responded

from ._render import duration, execution_of, format_args, message_text, record_data, short

__all__ = [
    "CallSummary",
    "CheckpointInfo",
    "RunSummary",
    "SessionSummary",
    "TimelineItem",
    "summarize_records",
]

# Records of a call that do not start its line in a timeline: they refer to it.
_NOT_A_CALL_START: Final = frozenset({"retry", "retry_wait_start", "retry_wait_end", "error"})


@dataclass
class CallSummary:
    """One attempt of one model, tool or compaction call within a run."""

    run_id: str | None
    kind: str
    id: str
    attempt: int
    first_seq: int
    first_time: str
    parent_id: str | None = None
    turn_index: int | None = None
    agent: str | None = None
    replaces: str | None = None
    reused_seq: int | None = None  # where a second call under this id starts
    types: list[str] = field(default_factory=list)
    start_time: str | None = None  # model_exec_start / tool_exec_start
    end_seq: int | None = None
    end_time: str | None = None
    # model calls
    model: str | None = None
    provider: str | None = None
    usage: dict[str, Any] | None = None
    stop_reason: str | None = None
    responded: bool = False  # its end says a response came back (flightlog.sdk.responded)
    # tool calls
    name: str | None = None
    tool_call_id: str | None = None  # the provider's id of the call, when it gave one
    arguments: Any = None
    disposition: str | None = None
    invoked: bool = False
    invoke_ended: bool = False
    # either
    result: str = ""
    error: str | None = None
    retried: bool = False
    retry_error: str | None = None
    shown: bool = False  # has its line in the run's timeline

    @property
    def ended(self) -> bool:
        return self.end_seq is not None

    @property
    def label(self) -> str:
        return self.id + (f"#{self.attempt}" if self.attempt != 1 else "")

    @property
    def status(self) -> str:
        """``ok``, ``failed``, ``cancelled`` (its run was cancelled before it ended),
        ``refused``/``skipped``/``short_circuited``/``repaired`` (tools), ``retried`` (no
        end of its own, but a retry follows), or ``no end``."""
        if not self.ended:
            if self.kind == "compaction" and "context_compacted" in self.types:
                return "ok"
            return "retried" if self.retried else "no end"
        if self.disposition == "repaired":
            return "repaired"  # not the tool's result: resume(repair=True) wrote it
        if self.disposition == "cancelled":
            return "cancelled"
        if self.error is not None:
            return "failed"
        if self.disposition not in (None, "ran"):
            return self.disposition
        return "ok"

    @property
    def failed(self) -> bool:
        if self.disposition == "repaired":
            return False  # cut, not failed: its end is a repair's, not the tool's
        return self.error is not None or (self.retried and not self.ended)

    @property
    def duration(self) -> float | None:
        if self.reused_seq is not None:
            return None  # two calls' records under one id: no one duration is theirs
        return duration(self.start_time or self.first_time, self.end_time)

    def missing(self) -> str | None:
        """What is missing of this call, or None when nothing is."""
        if self.kind == "model" and not self.ended:
            return "no model_exec_end"
        if self.kind == "tool" and not self.ended:
            return "no tool_exec_end"
        if self.kind == "tool" and self.invoked and not self.invoke_ended:
            return "tool_invoke_start without tool_invoke_end"
        return None

    def add(self, record: Record, data: Mapping[str, Any]) -> None:
        type = record.type
        self.types.append(type)
        execution = data.get("execution")
        if isinstance(execution, Mapping):
            if self.parent_id is None and isinstance(execution.get("parent_id"), str):
                self.parent_id = execution["parent_id"]
            if self.turn_index is None and isinstance(execution.get("turn_index"), int):
                self.turn_index = execution["turn_index"]
            if self.agent is None and isinstance(execution.get("agent"), str):
                self.agent = execution["agent"]
            if self.replaces is None and isinstance(execution.get("replaces"), str):
                self.replaces = execution["replaces"]
        match type:
            case "model_request":
                config = data.get("config")
                if isinstance(config, Mapping) and config.get("model"):
                    self.model = str(config["model"])
                if isinstance(config, Mapping) and config.get("provider"):
                    self.provider = str(config["provider"])
            case "model_exec_start":
                self.start_time = record.time
                if data.get("model"):
                    self.model = str(data["model"])
                if data.get("provider"):
                    self.provider = str(data["provider"])
            case "model_exec_end":
                self._end(record)
                message = data.get("message")
                self.responded = responded(data)
                if isinstance(data.get("usage"), Mapping):
                    self.usage = dict(data["usage"])
                if isinstance(message, Mapping):
                    if message.get("stop_reason"):
                        self.stop_reason = str(message["stop_reason"])
                    if not self.model and message.get("model"):
                        self.model = str(message["model"])
                    if not self.provider and message.get("provider"):
                        self.provider = str(message["provider"])
                self.result = message_text(message)
                self.disposition = str(data.get("disposition") or "ran")
                if data.get("error"):
                    self.error = str(data["error"])
            case "tool_queued" | "tool_exec_start" | "tool_invoke_start":
                self.name = str(data.get("name") or self.name or "?")
                if data.get("tool_call_id"):
                    self.tool_call_id = str(data["tool_call_id"])
                if "arguments" in data:
                    self.arguments = data["arguments"]
                if type == "tool_exec_start":
                    self.start_time = record.time
                if type == "tool_invoke_start":
                    self.invoked = True
            case "tool_invoke_end":
                self.invoke_ended = True
                self.name = self.name or str(data.get("name") or "?")
            case "tool_exec_end":
                self._end(record)
                self.name = self.name or str(data.get("name") or "?")
                self.disposition = str(data.get("disposition") or "ran")
                self.result = message_text({"content": data.get("content")})
                if data.get("is_error"):
                    self.error = self.result or "the tool reported an error"
                elif self.disposition != "ran" and data.get("reason"):
                    self.result = str(data["reason"])
            case "context_compacted":
                self._end(record)
            case "retry":
                self.retried = True
                if data.get("error"):
                    self.retry_error = str(data["error"])
            case "error":
                if self.error is None and data.get("message"):
                    self.error = str(data["message"])

    def _end(self, record: Record) -> None:
        self.end_seq = record.seq
        self.end_time = record.time

    def headline(self) -> str:
        """``get_weather(city="Paris")`` or ``gpt-x``: what the call was, in short
        (empty when the records do not say)."""
        if self.kind == "tool":
            return f"{self.name or '?'}({format_args(self.arguments, 50)})"
        if self.kind == "model":
            return self.model or ""
        return ""


@dataclass
class CheckpointInfo:
    seq: int
    time: str
    run_id: str | None
    size: int


@dataclass
class TimelineItem:
    """One line of a run's timeline in ``show``: a record worth showing, or a call."""

    seq: int
    time: str
    type: str
    data: dict[str, Any] | None = None
    call: CallSummary | None = None


@dataclass
class RunSummary:
    """One run: its boundaries, outcome, calls and what is missing."""

    run_id: str | None
    index: int
    start_seq: int | None = None
    start_time: str | None = None
    pid: int | None = None
    client: str | None = None
    started: bool = False
    close_seq: int | None = None
    close_time: str | None = None
    close_error: str | None = None
    agent_started: bool = False
    agent_end: dict[str, Any] | None = None
    last_seq: int = 0
    last_time: str | None = None
    records: int = 0
    turns: int = 0
    calls: dict[tuple[str, str, int], CallSummary] = field(default_factory=dict)
    checkpoints: list[CheckpointInfo] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    retries: list[tuple[int, str, str | None]] = field(default_factory=list)
    timeline: list[TimelineItem] = field(default_factory=list)

    @property
    def closed(self) -> bool:
        return self.close_seq is not None

    @property
    def status(self) -> str:
        """The run's outcome, from ``agent_end`` or its model calls, and its closing.

        ``completed`` / ``failed (reason)`` for a loop with ``agent_end``; ``calls ok`` /
        ``calls failed`` for standalone calls; ``no agent_end`` for a loop without one;
        suffixed with ``interrupted`` when there is no ``run_close``.
        """
        if self.agent_end is not None:
            if self.agent_end.get("ok", True):
                outcome = str(self.agent_end.get("reason") or "completed")
            else:
                reason = self.agent_end.get("reason") or "error"
                outcome = f"failed ({reason})"
        elif self.agent_started:
            outcome = "no agent_end"
        else:
            models = [c for c in self.calls.values() if c.kind == "model"]
            if not models:
                outcome = "no calls" if not self.calls else "tool calls only"
            elif any(c.status == "no end" for c in models):
                outcome = "no model_exec_end"
            elif models[-1].status in ("failed", "cancelled"):
                outcome = "calls failed"
            else:
                outcome = "calls ok"
        if self.close_error:
            outcome += ", closed with error"
        if not self.closed:
            outcome += ", no run_close"
        return outcome

    @property
    def ok(self) -> bool:
        """Whether the run is known to have succeeded: never guessed from a missing end."""
        if not self.closed or self.close_error:
            return False
        if self.agent_end is not None:
            return bool(self.agent_end.get("ok", True))
        if self.agent_started:
            return False
        return self.status in ("calls ok", "no calls", "tool calls only") and not self.gaps()

    def gaps(self) -> list[str]:
        """What is missing: no ``run_close``, no ``agent_end``, calls without their end."""
        found: list[str] = []
        if not self.started:
            found.append("records of a run that has no run_start")
        if not self.closed:
            found.append("no run_close: the run was interrupted, or is still being written")
        if self.agent_started and self.agent_end is None:
            found.append("no agent_end: the agent loop did not finish")
        for call in self.calls.values():
            if call.reused_seq is not None:
                found.append(
                    f"{call.kind} call {call.label}: its execution id is used again by another "
                    f"call (seq {call.reused_seq}); the two cannot be told apart"
                )
            missing = call.missing()
            if missing is None:
                continue
            if call.retried and not call.ended and missing.startswith("no "):
                continue  # a failed attempt its retry replaced: listed under retries
            what = f"{call.kind} call {call.label}"
            if call.kind == "tool":
                what += f" ({call.name})"
            elif call.model:
                what += f" ({call.model})"
            found.append(f"{what}: {missing} (seq {call.first_seq})")
        return found

    def replacement_of(self, call: CallSummary) -> CallSummary | None:
        """The call that re-issues ``call`` under a new id (``execution.replaces``)."""
        for other in self.calls.values():
            if other.replaces == call.id and other.kind == call.kind:
                return other
        return None

    def failed_calls(self) -> list[CallSummary]:
        return [call for call in self.calls.values() if call.failed]

    def usage(self) -> tuple[int, int]:
        """Input and output tokens over the run's model calls."""
        total_in = total_out = 0
        for call in self.calls.values():
            if call.usage:
                value_in = call.usage.get("input_tokens", 0)
                value_out = call.usage.get("output_tokens", 0)
                total_in += value_in if isinstance(value_in, int) else 0
                total_out += value_out if isinstance(value_out, int) else 0
        return total_in, total_out


# Records shown on their own line in a run's timeline (calls are shown once each).
_TIMELINE_TYPES: Final = frozenset(
    {
        "agent_start",
        "agent_end",
        "turn_start",
        "retry",
        "checkpoint",
        "error",
        "context_projected",
        "model_response",
        "run_close",
    }
)


class SessionSummary:
    """Summaries of a session's runs, built one record at a time; see the module doc."""

    def __init__(self) -> None:
        self.session_id: str | None = None
        self.format_version: int | None = None
        self.meta: dict[str, Any] = {}
        #: A fork's origin (``session_start``'s ``origin``: session_id, path, seq).
        self.origin: dict[str, Any] | None = None
        self.created: str | None = None
        self.records = 0
        self.last_seq = 0
        self.last_time: str | None = None
        self.runs: dict[str | None, RunSummary] = {}
        self.checkpoints = 0
        self.latest_checkpoint: CheckpointInfo | None = None
        self._reused = ReusedExecutions()

    def run_list(self) -> list[RunSummary]:
        return list(self.runs.values())

    def _run(self, run_id: str | None) -> RunSummary:
        run = self.runs.get(run_id)
        if run is None:
            run = self.runs[run_id] = RunSummary(run_id=run_id, index=len(self.runs) + 1)
        return run

    def add(self, record: Record) -> None:
        self.records += 1
        self.last_seq = record.seq
        self.last_time = record.time
        data = record_data(record)
        if record.type == SESSION_START:
            self.session_id = record.session_id
            self.created = record.time
            version = data.get("format_version")
            self.format_version = version if isinstance(version, int) else None
            meta = data.get("meta")
            self.meta = dict(meta) if isinstance(meta, Mapping) else {}
            origin = data.get("origin")
            self.origin = dict(origin) if isinstance(origin, Mapping) else None
            return
        if record.run_id is None and record.type != CHECKPOINT:
            return  # nothing else lives outside a run in format 1; tolerate it
        run = self._run(record.run_id)
        run.records += 1
        run.last_seq, run.last_time = record.seq, record.time
        type = record.type
        if type == RUN_START:
            run.started = True
            run.start_seq, run.start_time = record.seq, record.time
            pid, client = data.get("pid"), data.get("client")
            run.pid = pid if isinstance(pid, int) else None
            run.client = client if isinstance(client, str) else None
            return
        if type == RUN_CLOSE:
            run.close_seq, run.close_time = record.seq, record.time
            error = data.get("error")
            run.close_error = str(error) if error else None
        elif type == CHECKPOINT:
            info = CheckpointInfo(record.seq, record.time, record.run_id, len(bytes(record.data)))
            run.checkpoints.append(info)
            self.checkpoints += 1
            self.latest_checkpoint = info
        elif type == "agent_start":
            run.agent_started = True
        elif type == "agent_end":
            run.agent_end = dict(data)
        elif type == "turn_start":
            run.turns += 1
        elif type == "error" and data.get("message"):
            run.errors.append(short(str(data["message"]), 200))
        key = execution_of(data)
        if key is not None:
            call = run.calls.get(key)
            if call is None:
                kind, exec_id, attempt = key
                call = CallSummary(
                    run_id=record.run_id,
                    kind=kind,
                    id=exec_id,
                    attempt=attempt,
                    first_seq=record.seq,
                    first_time=record.time,
                )
                run.calls[key] = call
            if self._reused.add(record.run_id, type, *key) and call.reused_seq is None:
                call.reused_seq = record.seq
            if not call.shown and type not in _NOT_A_CALL_START:
                call.shown = True
                run.timeline.append(TimelineItem(record.seq, record.time, "call", call=call))
            call.add(record, data)
            if type == "retry":
                error = data.get("error")
                run.retries.append((record.seq, call.label, str(error) if error else None))
        if type in _TIMELINE_TYPES:
            run.timeline.append(TimelineItem(record.seq, record.time, type, data=dict(data)))

    def gaps(self) -> dict[str | None, list[str]]:
        return {run.run_id: gaps for run in self.runs.values() if (gaps := run.gaps())}


def summarize_records(records: Iterable[Record]) -> SessionSummary:
    """A :class:`SessionSummary` of ``records``; reading errors propagate from the iterable."""
    summary = SessionSummary()
    for record in records:
        summary.add(record)
    return summary
