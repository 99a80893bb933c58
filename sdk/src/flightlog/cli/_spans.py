"""Session records as spans of the OpenTelemetry GenAI semantic conventions, without I/O.

Theory of operation
-------------------
:class:`SpanBuilder` is fed the records of one session file in seq order and returns,
for each record, the spans that record completes.  It imports nothing of OpenTelemetry:
a :class:`Span` is plain data that ``flightlog export`` hands to the OpenTelemetry SDK.

* A **run** is one trace, and its root span is ``invoke_agent`` (``invoke_agent NAME``
  with the agent's name).  It ends at ``run_close``, or, for a run that was interrupted
  (no ``run_close``), at the ``run_start`` of the next run in the file.
* A **turn** of the agent loop is a ``turn N`` span, the run's child, from ``turn_start``
  to ``turn_end``; the calls of its ``turn_index`` are its children.
* Each attempt of a **model call** is a ``chat`` span (``chat MODEL``, kind CLIENT), from
  ``model_request`` or ``model_exec_start`` to ``model_exec_end``.
* Each attempt of a **tool call** is an ``execute_tool`` span (``execute_tool NAME``),
  from ``tool_queued`` or ``tool_exec_start`` to ``tool_exec_end``.
* A call or a turn still open when its run ends has lost its end record: its span ends
  with the run, with status ERROR ``interrupted``.  It is never reported as a success.
* A **retry** (attempt 2 and on) links to the attempt it replaces; a tool call whose
  ``tool_call_id`` already ran in an earlier run of the session (re-issued after a
  resume) links to that earlier span.  A tool call nested in another tool call (a
  sub-agent) is that call's child; every other call is its turn's child (a sub-agent's
  call is in its calling tool's turn), or the run's when it is in no turn.

Ids are derived, never random: the trace id from (session id, run id) and each span id
from (session id, run id, execution kind, execution id, attempt), or a turn's from
(session id, run id, ``"turn"``, turn index).  Exporting the same
file twice sends the same ids, so a backend keeps one copy.

Every span carries ``Span.end_seq``, the seq of the record that completed it: a follower
that has sent every span up to seq N and restarts feeds the file again from its start
and drops the spans with ``end_seq <= N``.

Message content (``gen_ai.input.messages``, ``gen_ai.output.messages``,
``gen_ai.system_instructions``, tool arguments and results) is added only with
``content=True``: the conventions' opt-in.  Request headers and provider options are
never exported (the file has no credentials in them, and they are not conventions).
A model call's price (:mod:`._pricing`, genai-prices when installed) is in
``flightlog.cost.amount`` (USD), ``flightlog.cost.currency`` and ``flightlog.cost.source``
(the table and the model it matched), or ``flightlog.cost.unknown`` with the source
saying why; a run's span has the sum and ``flightlog.cost.priced_calls`` and
``flightlog.cost.unknown_calls``.
``gen_ai.input.messages`` is a model call's whole input, rebuilt across ``continues``
(:class:`flightlog.sdk.Transcript`); a request whose chain is broken keeps only its own
messages and says why in ``flightlog.prompt_error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from flightlog.protocol import Record
from flightlog.sdk import CallNotFound, Total, Transcript, responded

from ._genai_messages import genai_message, genai_parts, json_text
from ._pricing import Pricer
from ._render import record_data
from ._span_data import (
    INTERRUPTED,
    AttributeValue,
    Link,
    Span,
    SpanEvent,
    add_usage,
    record_ns,
    span_id,
    trace_id,
)
from ._turn_spans import Turn, add_cost

__all__ = ["AttributeValue", "Link", "Span", "SpanBuilder", "SpanEvent", "span_id", "trace_id"]


@dataclass
class _Call:
    kind: str
    exec_id: str
    attempt: int
    parent_exec: str | None
    start_ns: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    name: str | None = None
    tool_call_id: str | None = None
    turn: int | None = None  # the turn_index of the turn whose span is its parent


@dataclass
class _Run:
    run_id: str
    trace_id: int
    span_id: int
    start_ns: int
    attributes: dict[str, AttributeValue]
    calls: dict[tuple[str, str, int], _Call] = field(default_factory=dict)
    kinds: dict[str, tuple[str, int]] = field(default_factory=dict)  # exec id -> kind, attempt
    events: list[SpanEvent] = field(default_factory=list)
    retries: dict[tuple[str, str, int], dict[str, AttributeValue]] = field(default_factory=dict)
    agent_name: str | None = None
    agent_started: bool = False
    outcome: str | None = None  # the error of agent_end; "" when it ended well
    last_ns: int = 0
    cost: Total = field(default_factory=Total)
    turns: dict[int, Turn] = field(default_factory=dict)  # open turns, by turn_index
    turn_ids: dict[int, int] = field(default_factory=dict)  # turn_index -> span id
    turn_of: dict[str, int | None] = field(default_factory=dict)  # exec id -> turn_index


_MODEL_STARTS: Final = frozenset({"model_request", "model_exec_start"})
_TOOL_STARTS: Final = frozenset({"tool_queued", "tool_exec_start", "tool_invoke_start"})


class SpanBuilder:
    """Feeds on one session's records, in seq order; :meth:`add` returns finished spans.

    ``content`` adds message content (the conventions' opt-in); ``path`` is recorded as
    ``flightlog.session.path``.  Never raises on odd data: a field of an unexpected shape
    is left out of the span, and a record whose time no span can carry is skipped and
    named in :attr:`skipped` (the caller reports and clears it).
    """

    def __init__(self, *, content: bool = False, path: str | None = None) -> None:
        self.content = content
        self.path = path
        self.session_id: str | None = None
        self.meta: dict[str, Any] = {}
        self.run: _Run | None = None
        # tool_call_id -> the span that ran it, in an earlier run (re-issued calls).
        self._tool_calls: dict[str, tuple[int, int]] = {}
        #: Records skipped since the caller last cleared it: why, per record.
        self.skipped: list[str] = []
        self._pricer = Pricer()
        # With content: every model request's prompt, rebuilt across continues.
        self._transcript = Transcript() if content else None
        self._requested = False

    def add(self, record: Record) -> list[Span]:
        """The spans ``record`` completes (often none)."""
        if self._transcript is not None:
            self._requested = self._transcript.add(record)
        try:
            return self._add(record)
        except ValueError as exc:
            self.skipped.append(f"seq {record.seq} ({record.type}): {exc}; skipped")
            return []

    def _add(self, record: Record) -> list[Span]:
        if record.type == "session_start":
            self.session_id = record.session_id
            meta = record_data(record).get("meta")
            self.meta = meta if isinstance(meta, dict) else {}
            return []
        if self.session_id is None:
            self.session_id = record.session_id
        if record.type == "run_start":
            record_ns(record)  # a time no span carries skips it before the run it ends
            done = self._end_run(record, interrupted=True) if self.run is not None else []
            self._start_run(record)
            return done
        run = self.run
        if run is None or record.run_id != run.run_id:
            return []
        at = record_ns(record)
        run.last_ns = max(run.last_ns, at)
        data = record_data(record)
        match record.type:
            case "run_close":
                recording_error = data.get("error")
                if isinstance(recording_error, str):
                    run.attributes["flightlog.recording_error"] = recording_error
                return self._end_run(record, interrupted=False)
            case "agent_start":
                self._agent_start(run, data)
            case "agent_end":
                self._agent_end(run, data)
            case "error":
                run.events.append(self._error_event(data, at))
                if data.get("fatal") is True and run.turns:
                    run.turns[max(run.turns)].error = str(data.get("message") or "fatal error")
            case "turn_start":
                self._turn_start(run, data, at)
            case "turn_end":
                return self._turn_end(run, record, data, at)
            case "checkpoint":
                run.events.append(
                    SpanEvent("flightlog.checkpoint", at, {"flightlog.seq": record.seq})
                )
            case "retry":
                self._retry(run, data)
            case "model_exec_end" | "tool_exec_end":
                return self._end_call(run, record, data, at)
            case kind if kind in _MODEL_STARTS or kind in _TOOL_STARTS:
                self._start_call(run, record.type, data, at)
        return []

    # ------------------------------------------------------------------------ runs

    def _start_run(self, record: Record) -> None:
        assert self.session_id is not None
        run_id = record.run_id or ""
        data = record_data(record)
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.conversation.id": self.session_id,
            "flightlog.session_id": self.session_id,
            "flightlog.run_id": run_id,
        }
        if self.path is not None:
            attributes["flightlog.session.path"] = self.path
        if isinstance(data.get("client"), str) and data["client"]:
            attributes["flightlog.client"] = data["client"]
        if isinstance(data.get("pid"), int):
            attributes["process.pid"] = data["pid"]
        for key, value in self.meta.items():
            if isinstance(value, str | bool | int | float):
                attributes[f"flightlog.meta.{key}"] = value
        at = record_ns(record)
        self.run = _Run(
            run_id=run_id,
            trace_id=trace_id(self.session_id, run_id),
            span_id=span_id(self.session_id, run_id),
            start_ns=at,
            attributes=attributes,
            last_ns=at,
        )

    def _agent_start(self, run: _Run, data: Mapping[str, Any]) -> None:
        run.agent_started = True
        if isinstance(data.get("agent"), str):
            run.agent_name = data["agent"]
            run.attributes["gen_ai.agent.name"] = data["agent"]
        if self.content and isinstance(data.get("messages"), list):
            run.attributes["gen_ai.input.messages"] = json_text(
                [genai_message(message) for message in data["messages"]]
            )

    def _agent_end(self, run: _Run, data: Mapping[str, Any]) -> None:
        ok = data.get("ok", True) is not False
        error = data.get("error") or data.get("reason") or "the agent failed"
        run.outcome = "" if ok else str(error)
        if isinstance(data.get("reason"), str):
            run.attributes["flightlog.agent.reason"] = data["reason"]
        if isinstance(data.get("turns"), int):
            run.attributes["flightlog.agent.turns"] = data["turns"]
        add_usage(run.attributes, data.get("usage"))

    def _end_run(self, record: Record, *, interrupted: bool) -> list[Span]:
        run = self.run
        assert run is not None
        end = run.last_ns if interrupted else max(record_ns(record), run.start_ns)
        self.run = None
        spans = [
            self._call_span(run, call, end, INTERRUPTED, record.seq)
            for call in list(run.calls.values())
        ]
        spans += [
            turn.span(run.trace_id, run.span_id, end, record.seq, interrupted=True)
            for turn in run.turns.values()
        ]
        error: str | None
        if interrupted:
            error = f"{INTERRUPTED}: the run has no run_close"
        elif run.agent_started and run.outcome is None:
            error = f"{INTERRUPTED}: the run has no agent_end"
        else:
            error = run.outcome or None
        if error is not None:
            run.attributes["error.type"] = (
                INTERRUPTED if error.startswith(INTERRUPTED) else "agent_error"
            )
        add_cost(run.attributes, run.cost)
        name = f"invoke_agent {run.agent_name}" if run.agent_name else "invoke_agent"
        spans.append(
            Span(
                name=name,
                trace_id=run.trace_id,
                span_id=run.span_id,
                parent_id=None,
                kind="internal",
                start_ns=run.start_ns,
                end_ns=max(end, run.start_ns),
                attributes=run.attributes,
                error=error,
                events=run.events,
                end_seq=record.seq,
            )
        )
        return spans

    def _error_event(self, data: Mapping[str, Any], at: int) -> SpanEvent:
        attributes: dict[str, AttributeValue] = {
            "exception.message": str(data.get("message", "")),
            "flightlog.error.fatal": data.get("fatal") is True,
        }
        if isinstance(data.get("code"), str):
            attributes["exception.type"] = data["code"]
        return SpanEvent("exception", at, attributes)

    # ----------------------------------------------------------------------- turns

    def _turn_start(self, run: _Run, data: Mapping[str, Any], at: int) -> None:
        assert self.session_id is not None
        index = data.get("turn_index")
        if not isinstance(index, int) or isinstance(index, bool) or index in run.turns:
            return
        # A turn_index used again in one run (a second loop) gets an id of its own.
        again = (at,) if index in run.turn_ids else ()
        own = span_id(self.session_id, run.run_id, "turn", index, *again)
        run.turn_ids[index] = own
        run.turns[index] = Turn(index, own, at, self.session_id, run.run_id)

    def _turn_end(self, run: _Run, record: Record, data: Mapping[str, Any], at: int) -> list[Span]:
        index = data.get("turn_index")
        turn = run.turns.pop(index) if isinstance(index, int) and index in run.turns else None
        if turn is None:
            return []
        turn.summary(data)
        return [turn.span(run.trace_id, run.span_id, at, record.seq, interrupted=False)]

    # ----------------------------------------------------------------------- calls

    def _start_call(self, run: _Run, kind: str, data: Mapping[str, Any], at: int) -> None:
        execution = data.get("execution")
        if not isinstance(execution, dict) or not isinstance(execution.get("id"), str):
            return
        exec_kind = str(execution.get("kind", "model" if kind in _MODEL_STARTS else "tool"))
        attempt = execution.get("attempt", 1)
        attempt = attempt if isinstance(attempt, int) else 1
        key = (exec_kind, execution["id"], attempt)
        call = run.calls.get(key)
        if call is None:
            parent = execution.get("parent_id")
            call = _Call(
                kind=exec_kind,
                exec_id=execution["id"],
                attempt=attempt,
                parent_exec=parent if isinstance(parent, str) else None,
                start_ns=at,
            )
            run.calls[key] = call
            run.kinds[call.exec_id] = (exec_kind, attempt)
            turn = execution.get("turn_index")
            if isinstance(turn, int) and not isinstance(turn, bool):
                call.attributes["flightlog.execution.turn_index"] = turn
            else:
                turn = None
            if call.parent_exec is not None and call.parent_exec in run.turn_of:
                turn = run.turn_of[call.parent_exec]  # a sub-agent's call: its caller's turn
            call.turn = turn if turn in run.turn_ids else None
            run.turn_of[call.exec_id] = call.turn
        if kind == "model_request":
            self._model_request(call, data)
        elif kind == "model_exec_start":
            for field_name, attribute in (
                ("model", "gen_ai.request.model"),
                ("provider", "gen_ai.provider.name"),
            ):
                value = data.get(field_name)
                if isinstance(value, str) and attribute not in call.attributes:
                    call.attributes[attribute] = value
        else:
            self._tool_start(call, data)

    def _model_request(self, call: _Call, data: Mapping[str, Any]) -> None:
        attributes = call.attributes
        config = data.get("config")
        if isinstance(config, dict):
            for name, attribute in (
                ("model", "gen_ai.request.model"),
                ("provider", "gen_ai.provider.name"),
                ("temperature", "gen_ai.request.temperature"),
                ("max_tokens", "gen_ai.request.max_tokens"),
                ("top_p", "gen_ai.request.top_p"),
            ):
                value = config.get(name)
                if isinstance(value, str | int | float) and not isinstance(value, bool):
                    attributes[attribute] = value
            stop = config.get("stop")
            if isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
                attributes["gen_ai.request.stop_sequences"] = stop
        if not self.content:
            return
        messages, system = data.get("messages"), data.get("system")
        if self._transcript is not None and self._requested:
            # The full input, not the messages after those of the call it continues.
            try:
                prompt = self._transcript.latest()
            except CallNotFound as exc:
                attributes["flightlog.prompt_error"] = exc.message
            else:
                messages, system = prompt.messages, prompt.system
        if isinstance(messages, list):
            attributes["gen_ai.input.messages"] = json_text([genai_message(m) for m in messages])
        if isinstance(system, str):
            attributes["gen_ai.system_instructions"] = json_text(
                [{"type": "text", "content": system}]
            )
        tools = data.get("tools")
        if isinstance(tools, list) and tools:
            attributes["gen_ai.tool.definitions"] = json_text(
                [{"type": "function", **tool} for tool in tools if isinstance(tool, dict)]
            )

    def _tool_start(self, call: _Call, data: Mapping[str, Any]) -> None:
        if isinstance(data.get("name"), str):
            call.name = data["name"]
        if isinstance(data.get("tool_call_id"), str):
            call.tool_call_id = data["tool_call_id"]
        if self.content and "arguments" in data:
            # The actual arguments (tool_invoke_start) replace the requested ones.
            call.attributes["gen_ai.tool.call.arguments"] = json_text(data["arguments"])

    def _retry(self, run: _Run, data: Mapping[str, Any]) -> None:
        execution = data.get("execution")
        if not isinstance(execution, dict) or not isinstance(execution.get("id"), str):
            return
        attempt = execution.get("attempt", 1)
        if not isinstance(attempt, int):
            return
        attributes: dict[str, AttributeValue] = {"flightlog.link": "retry_of"}
        if isinstance(data.get("error"), str):
            attributes["flightlog.retry.error"] = data["error"]
        if isinstance(data.get("delay_seconds"), int | float):
            attributes["flightlog.retry.delay_seconds"] = float(data["delay_seconds"])
        run.retries[(str(execution.get("kind")), execution["id"], attempt + 1)] = attributes

    def _end_call(self, run: _Run, record: Record, data: Mapping[str, Any], at: int) -> list[Span]:
        execution = data.get("execution")
        if not isinstance(execution, dict) or not isinstance(execution.get("id"), str):
            return []
        kind = "model" if record.type == "model_exec_end" else "tool"
        attempt = execution.get("attempt", 1)
        attempt = attempt if isinstance(attempt, int) else 1
        key = (str(execution.get("kind", kind)), execution["id"], attempt)
        call = run.calls.get(key)
        if call is None:  # an end without its start: the span is the instant of the end
            self._start_call(
                run, "model_exec_start" if kind == "model" else "tool_exec_start", data, at
            )
            call = run.calls[key]
        if kind == "model":
            error = self._model_end(call, data)
            self._price(run, call, data)
        else:
            self._tool_start(call, data)
            error = self._tool_end(call, data)
        turn = run.turns.get(call.turn) if call.turn is not None else None
        if turn is not None:
            turn.count(call.kind, call.exec_id, call.attributes, error)
        return [self._call_span(run, call, at, error, record.seq)]

    def _model_end(self, call: _Call, data: Mapping[str, Any]) -> str | None:
        attributes = call.attributes
        add_usage(attributes, data.get("usage"))
        message = data.get("message")
        stop_reason: str | None = None
        if isinstance(message, dict):
            if isinstance(message.get("model"), str):
                attributes["gen_ai.response.model"] = message["model"]
            if isinstance(message.get("response_id"), str):
                attributes["gen_ai.response.id"] = message["response_id"]
            if isinstance(message.get("stop_reason"), str):
                stop_reason = message["stop_reason"]
                attributes["gen_ai.response.finish_reasons"] = [stop_reason]
            if self.content:
                attributes["gen_ai.output.messages"] = json_text(
                    [genai_message(message, stop_reason)]
                )
        error = data.get("error")
        if isinstance(error, str):
            attributes["error.type"] = "model_error"
            return error
        return None

    def _price(self, run: _Run, call: _Call, end: Mapping[str, Any]) -> None:
        """The call's price (``flightlog.cost.*``), added to its run's."""
        attributes = call.attributes
        model = attributes.get("gen_ai.request.model") or attributes.get("gen_ai.response.model")
        provider = attributes.get("gen_ai.provider.name")
        found = self._pricer(end.get("usage"), model, provider, response=responded(end))
        if found is None:
            return
        run.cost.add(found)
        turn = run.turns.get(call.turn) if call.turn is not None else None
        if turn is not None:
            turn.cost.add(found)
        attributes["flightlog.cost.source"] = found.source
        if found.amount is None:
            attributes["flightlog.cost.unknown"] = True
        else:
            attributes["flightlog.cost.amount"] = float(found.amount)
            attributes["flightlog.cost.currency"] = found.currency

    def _tool_end(self, call: _Call, data: Mapping[str, Any]) -> str | None:
        attributes = call.attributes
        disposition = data.get("disposition")
        if isinstance(disposition, str):
            attributes["flightlog.tool.disposition"] = disposition
        if isinstance(data.get("reason"), str):
            attributes["flightlog.tool.reason"] = data["reason"]
        if self.content and "content" in data:
            attributes["gen_ai.tool.call.result"] = json_text(data["content"])
        if data.get("is_error") is True:
            attributes["error.type"] = "tool_error"
            content = data.get("content")
            parts = genai_parts(content) if content else []
            text = " ".join(str(p.get("content", "")) for p in parts if p.get("type") == "text")
            return text or str(data.get("reason") or "the tool failed")
        return None

    def _call_span(self, run: _Run, call: _Call, end: int, error: str | None, end_seq: int) -> Span:
        assert self.session_id is not None
        run.calls.pop((call.kind, call.exec_id, call.attempt), None)
        own = span_id(self.session_id, run.run_id, call.kind, call.exec_id, call.attempt)
        attributes = call.attributes
        attributes["gen_ai.conversation.id"] = self.session_id
        attributes["flightlog.execution.id"] = call.exec_id
        attributes["flightlog.execution.attempt"] = call.attempt
        links: list[Link] = []
        if call.attempt > 1:
            retry_of = run.retries.pop((call.kind, call.exec_id, call.attempt), None)
            attributes.update((k, v) for k, v in (retry_of or {}).items() if k != "flightlog.link")
            links.append(
                Link(
                    run.trace_id,
                    span_id(self.session_id, run.run_id, call.kind, call.exec_id, call.attempt - 1),
                    {"flightlog.link": "retry_of"},
                )
            )
        parent_id = run.turn_ids[call.turn] if call.turn is not None else run.span_id
        if call.parent_exec is not None and call.parent_exec in run.kinds:
            parent_kind, parent_attempt = run.kinds[call.parent_exec]
            parent_span = span_id(
                self.session_id, run.run_id, parent_kind, call.parent_exec, parent_attempt
            )
            if parent_kind == "tool" and call.kind == "tool":
                parent_id = parent_span
            else:
                links.append(Link(run.trace_id, parent_span, {"flightlog.link": "requested_by"}))
        if call.kind == "model":
            model = attributes.get("gen_ai.request.model")
            attributes["gen_ai.operation.name"] = "chat"
            name = f"chat {model}" if isinstance(model, str) else "chat"
            kind: Literal["internal", "client"] = "client"
        else:
            attributes["gen_ai.operation.name"] = "execute_tool"
            attributes["gen_ai.tool.type"] = "function"
            if call.name is not None:
                attributes["gen_ai.tool.name"] = call.name
            if call.tool_call_id is not None:
                attributes["gen_ai.tool.call.id"] = call.tool_call_id
                earlier = self._tool_calls.get(call.tool_call_id)
                if earlier is not None and earlier[0] != run.trace_id:
                    attributes["flightlog.reissued"] = True
                    links.append(Link(*earlier, {"flightlog.link": "reissue_of"}))
                self._tool_calls.setdefault(call.tool_call_id, (run.trace_id, own))
            name = f"execute_tool {call.name}" if call.name else "execute_tool"
            kind = "internal"
        if error == INTERRUPTED:
            attributes["error.type"] = INTERRUPTED
            error = f"{INTERRUPTED}: no end record ({call.kind} call {call.exec_id})"
        return Span(
            name=name,
            trace_id=run.trace_id,
            span_id=own,
            parent_id=parent_id,
            kind=kind,
            start_ns=call.start_ns,
            end_ns=max(end, call.start_ns),
            attributes=attributes,
            error=error,
            links=links,
            end_seq=end_seq,
        )
