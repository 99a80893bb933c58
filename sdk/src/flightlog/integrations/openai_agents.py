"""Record OpenAI Agents SDK runs: ``add_trace_processor(FlightlogProcessor())``.

Install with ``pip install 'flightlog-sdk[openai-agents]'``.  Each ``Runner.run`` (its
task span) becomes one run of the session ``openai-agents/<group id>.jsonl`` (the
``RunConfig.group_id`` of a conversation, else the trace id), so the runs of a
conversation, and those under one ``trace()``, go on in the same file (runs at once,
each in the session next to it); ``FlightlogProcessor(path=...)`` names the session
instead.

The processor reads the SDK's spans.  A model call (a generation or response span) is
recorded when it ends, with the times the span measured: ``model_request`` (the input
messages and the model settings), ``model_exec_start``, ``model_exec_end`` (the response
message, usage, or the error) and ``message_end``; a call the runner makes again after a
failed one (its retry of a 429) ``replaces`` it.  A tool call (a function span) is
recorded when it starts and when it ends, with the tool call id and arguments taken from
the model's response; a handoff is recorded as the tool call the model made for it, and
the calls after it carry the new agent's name.  An agent used as a tool is a sub-agent
nested under that tool call.  Each turn of the first agent is a turn; ``agent_end``
carries the final output (the last model message's text, decoded from JSON when the
agent has an output type) and the run's usage, or the error (``reason`` ``max_turns``,
a guardrail's tripwire); a run cancelled inside a call has that call ended as cancelled
when its trace ends, and ``reason`` ``aborted``.

Not recorded: the input messages in ``agent_start`` (the first ``model_request`` holds
them), a model call cut short by a crash (when its span starts it holds only the model
and its settings, see docs/integrations.md), and anything when
``RunConfig.trace_include_sensitive_data`` is off, which empties the spans.

Recording never breaks the agent: see :mod:`flightlog.integrations._recorder`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from agents.tracing import Span, Trace, TracingProcessor

from flightlog.protocol import events, now

from ._openai_spans import custom, decoded, model_facts, output, request, system_of, to_usage
from ._openai_spans import kind as span_kind
from ._openai_state import Agent as _Agent
from ._openai_state import Paused as _Paused
from ._openai_state import Task as _Task
from ._openai_state import Trace as _Trace
from ._recorder import (
    CANCELLED,
    Hooks,
    Recorder,
    cancelled_tool_end,
    nearest,
)

__all__ = ["FlightlogProcessor"]

#: How many ended traces the processor remembers the session of, for resumed runs.
_ENDED_TRACES = 256


class FlightlogProcessor(Hooks, TracingProcessor):
    """A tracing processor that records every trace into a flightlog session.

    ``path`` is the session file (default ``openai-agents/<group id or trace id>.jsonl``);
    ``meta`` goes into its ``session_start``; ``recorder`` is the best-effort recorder
    (default: the process's shared one, on ``$FLIGHTLOG_SOCKET``).
    """

    where = "an OpenAI Agents SDK span"

    def __init__(
        self,
        *,
        path: str | None = None,
        meta: Mapping[str, Any] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        Hooks.__init__(self, path=path, meta=meta, recorder=recorder)
        self._traces: dict[str, _Trace] = {}
        #: The session of each trace that ended lately, for a run resumed in it.
        self._ended: OrderedDict[str, str] = OrderedDict()
        #: Per session, what a paused run left for the run that resumes it, whose
        #: spans say no more: the calls waiting for approval, the names of its calls.
        self._paused: OrderedDict[str, _Paused] = OrderedDict()

    # --- the processor interface: every call is safe -----------------------------------

    def on_trace_start(self, trace: Trace) -> None:
        self._safely(self._trace_start, trace)

    def on_trace_end(self, trace: Trace) -> None:
        self._safely(self._trace_end, trace)

    def on_span_start(self, span: Span[Any]) -> None:
        self._safely(self._span_start, span)

    def on_span_end(self, span: Span[Any]) -> None:
        self._safely(self._span_end, span)

    def shutdown(self) -> None:
        """Close the runs of traces still open (the process is exiting)."""
        with self._lock:
            traces, self._traces = list(self._traces.values()), {}
        for state in traces:
            for task in state.tasks.values():
                task.run.close("the tracing processor was shut down")

    def force_flush(self) -> None:
        """Nothing to flush: every record went to the daemon when it was made."""

    # --- traces -------------------------------------------------------------------------

    def _trace_start(self, trace: Trace) -> None:
        group = getattr(trace, "group_id", None)
        path = self.path or f"openai-agents/{group or trace.trace_id}.jsonl"
        self._traces[trace.trace_id] = _Trace(trace_id=trace.trace_id, path=path)

    def _trace_end(self, trace: Trace) -> None:
        state = self._traces.pop(trace.trace_id, None)
        if state is None:
            return
        for task_id in list(state.tasks):
            self._task_end(state, task_id)
        self._ended[trace.trace_id] = state.path
        while len(self._ended) > _ENDED_TRACES:
            self._ended.popitem(last=False)

    def _resumed(self, span: Span[Any]) -> _Trace:
        # A run resumed from a RunState (after a tool approval) goes on in the trace it
        # was cut from, which had ended: the processor hears of no new trace.
        trace_id = span.trace_id
        path = self._ended.get(trace_id) or self.path or f"openai-agents/{trace_id}.jsonl"
        state = self._traces[trace_id] = _Trace(trace_id=trace_id, path=path, resumed=True)
        return state

    # --- tasks: each Runner.run of the trace is a run ---------------------------------

    def _task_of(self, state: _Trace, span_id: str | None) -> _Task:
        task = _enclosing(state, span_id) or state.tasks.get(None)
        if task is None:
            task = state.tasks[None] = self._task_start(state)
        return task

    def _task_start(self, state: _Trace) -> _Task:
        # Runs of one trace at once (asyncio.gather under one trace()) each take a
        # session of their own: the recorder opens the one next to the trace's.
        return _Task(run=self.recorder.begin(state.path, meta=self.meta))

    def _task_end(self, state: _Trace, task_id: str | None) -> None:
        task = state.tasks.pop(task_id, None)
        if task is None:
            return
        top = task.top
        cut = top is not None and top.turn > 0 and top.turn_models == 0
        if task.models or task.calls or cut:
            # The run ended inside a call, or in a turn before its model call (its task
            # was cancelled, a stream cancelled): the SDK ends those spans later, if ever;
            # each call is ended here, as cancelled.
            self._cancelled(state, task)
            if top is not None and top.error is None:
                top.error, top.reason = CANCELLED, "aborted"
        paused = self._settle(state, task, paused=top is not None and top.error is None)
        if top is not None and top.turn_open:
            # Its turn span ends after the trace, if ever: the turn ends with the run.
            top.turn_open = False
            task.run.record(events.TurnEnd(turn_index=top.turn))
        if top is not None:
            task.run.record(
                events.AgentEnd(
                    ok=top.error is None,
                    reason=top.reason if top.error is not None else _ended_as(paused),
                    error=top.error,
                    turns=top.turn,
                    usage=task.usage,
                    output=top.output,
                    # The agent of its agent_start; the calls after a handoff carry the
                    # agent that went on (execution.agent).
                    agent=top.started_as,
                )
            )
        task.run.close(top.error if top is not None else None)
        if state.resumed and not state.tasks:
            self._traces.pop(state.trace_id, None)

    def _settle(self, state: _Trace, task: _Task, *, paused: bool = False) -> bool:
        """Write the held ends of the tools that gave no output, and the ``turn_end``
        after them: as run (the loop went on), or, when the run ends ``paused`` after
        them, as deferred, waiting for approval (``needs_approval``: the SDK ends such
        a call's span with nothing); whether any was deferred."""
        held, task.unanswered = task.unanswered, []
        facts: list[events.Event] = []
        for execution, call_id, name, arguments, time in held:
            facts.append(
                events.ToolExecEnd(
                    execution=execution,
                    tool_call_id=call_id,
                    name=name,
                    disposition="deferred" if paused else "ran",
                    reason="approval" if paused else None,
                    time=time,
                )
            )
            if paused:
                left = self._paused.setdefault(state.path, _Paused())
                left.calls.append((call_id, name, arguments))
                left.names.update(task.top.names if task.top is not None else {})
                self._paused.move_to_end(state.path)
                while len(self._paused) > _ENDED_TRACES:
                    self._paused.popitem(last=False)
        if task.turn_end is not None:
            facts.append(task.turn_end)
            task.turn_end = None
        if facts:
            task.run.record(*facts)
        return paused and bool(held)

    def _cancelled(self, state: _Trace, task: _Task) -> None:
        for span in list(task.models.values()):
            self._model_call(state, span, cancelled=True)
        for span_id in list(task.calls):
            execution = state.tools[span_id]
            call_id, name = task.calls.pop(span_id)
            task.run.record(cancelled_tool_end(execution, call_id, name))

    # --- spans --------------------------------------------------------------------------

    def _span_start(self, span: Span[Any]) -> None:
        data = span.span_data
        kind = span_kind(data)
        state = self._traces.get(span.trace_id)
        if state is None and kind == "task":
            state = self._resumed(span)
        if state is None:
            return
        state.parents[span.span_id] = span.parent_id
        state.kinds[span.span_id] = kind
        if kind == "task" and _enclosing(state, span.parent_id) is None:
            # A task inside another (an agent used as a tool) is part of that one's run.
            state.tasks[span.span_id] = self._task_start(state)
        elif kind == "agent":
            self._agent_start(state, span)
        elif kind == "turn":
            agent = self._agent_of(state, span.parent_id)
            task = self._task_of(state, span.parent_id)
            if agent is not None:
                self._settle(state, task)
                agent.turn = int(custom(data).get("turn") or agent.turn + 1)
                agent.turn_models = 0
                if agent is task.top:
                    agent.turn_open = True
                    task.run.record(
                        events.TurnStart(turn_index=agent.turn, time=_at(span.started_at))
                    )
        elif kind in ("function", "handoff"):
            self._tool_start(state, span)
        elif kind in ("generation", "response"):
            self._task_of(state, span.parent_id).models[span.span_id] = span

    def _span_end(self, span: Span[Any]) -> None:
        state = self._traces.get(span.trace_id)
        if state is None:
            return
        data = span.span_data
        kind = state.kinds.get(span.span_id) or span_kind(data)
        self._failure(state, span, kind)
        if kind in ("generation", "response"):
            if self._task_of(state, span.parent_id).models.pop(span.span_id, None) is not None:
                # A call its run was cancelled in ends its span with no error, and with
                # neither the response nor its usage, which every answered call has.
                self._model_call(state, span, cancelled=span.error is None and _unanswered(data))
        elif kind in ("function", "handoff"):
            self._tool_end(state, span)
        elif kind == "turn":
            agent = self._agent_of(state, span.parent_id)
            task = self._task_of(state, span.parent_id)
            if agent is task.top and agent is not None and agent.turn_open:
                agent.turn_open = False
                end = events.TurnEnd(
                    turn_index=agent.turn,
                    usage=to_usage(custom(data).get("usage")),
                    time=_at(span.ended_at),
                )
                if task.unanswered:
                    task.turn_end = end  # after the held tool ends
                else:
                    task.run.record(end)
        elif kind == "task" and span.span_id in state.tasks:
            state.tasks[span.span_id].usage = to_usage(custom(data).get("usage"))
            self._task_end(state, span.span_id)
        elif kind == "agent":
            self._agent_end(state, span)

    def _failure(self, state: _Trace, span: Span[Any], kind: str) -> None:
        # What fails the agent: an error on its own span or one between it and its calls
        # (a turn's, where the SDK puts an input guardrail's), a guardrail's tripwire.
        # A call's error is not the agent's: the model sees a failed tool's error.
        if kind in ("generation", "response", "function", "handoff"):
            return
        error = reason = None
        if kind == "guardrail" and getattr(span.span_data, "triggered", False):
            error = f"Guardrail tripwire triggered: {span.span_data.name}"
        elif span.error is not None:
            error = _span_error(span)
            detail = span.error.get("data")
            if isinstance(detail, Mapping) and "max_turns" in detail:
                reason = "max_turns"
        if error is None:
            return
        agent = self._agent_of(state, span.span_id) or self._task_of(state, span.span_id).top
        if agent is not None and agent.error is None:
            agent.error, agent.reason = error, reason or "error"

    def _agent_of(self, state: _Trace, span_id: str | None) -> _Agent | None:
        return nearest(state.agents, state.parents, span_id)

    def _tool_above(self, state: _Trace, span_id: str | None) -> events.Execution | None:
        # The tool call a span runs inside, unless an agent span comes first.
        while span_id is not None:
            if span_id in state.agents:
                return None
            tool = state.tools.get(span_id)
            if tool is not None:
                return tool
            span_id = state.parents.get(span_id)
        return None

    def _agent_start(self, state: _Trace, span: Span[Any]) -> None:
        data = span.span_data
        tool = self._tool_above(state, span.parent_id)
        agent = _Agent(
            name=data.name,
            parent_id=tool.id if tool is not None else None,
            output_type=getattr(data, "output_type", None),
            data=data,
            started_as=data.name,
        )
        state.agents[span.span_id] = agent
        task = self._task_of(state, span.parent_id)
        if tool is not None:
            task.run.record(
                events.AgentStart(agent=agent.name, parent_id=tool.id, time=_at(span.started_at))
            )
        elif task.top is None:
            task.top = agent
            left = self._paused.get(state.path) if state.resumed else None
            if left is not None:
                # The tool results it sends answer calls the paused run met.
                agent.names.update(left.names)
            task.run.record(events.AgentStart(agent=agent.name, time=_at(span.started_at)))
        else:
            # A handoff: the next agent goes on in the same loop, with its own turns.
            agent.turn = task.top.turn
            task.top.name = agent.name
            task.top.output_type = agent.output_type
            task.top.data = data
            state.agents[span.span_id] = task.top

    def _agent_end(self, state: _Trace, span: Span[Any]) -> None:
        agent = state.agents.get(span.span_id)
        if agent is None:
            return
        if agent.parent_id is not None:
            self._task_of(state, span.span_id).run.record(
                events.AgentEnd(
                    ok=agent.error is None,
                    reason="completed" if agent.error is None else agent.reason,
                    error=agent.error,
                    turns=agent.turn,
                    output=agent.output,
                    agent=agent.name,
                    parent_id=agent.parent_id,
                    time=_at(span.ended_at),
                )
            )

    def _model_call(self, state: _Trace, span: Span[Any], *, cancelled: bool = False) -> None:
        agent = self._agent_of(state, span.parent_id)
        data = span.span_data
        execution = events.Execution(
            id=events.new_execution_id(),
            kind="model",
            parent_id=agent.parent_id if agent is not None else None,
            turn_index=agent.turn if agent is not None else None,
            agent=agent.name if agent is not None else None,
            replaces=agent.failed_model_id if agent is not None else None,
        )
        self._settle(state, self._task_of(state, span.parent_id))
        model, messages, message, usage, provider_state = model_facts(data)
        system, lead = system_of(data)
        sent = len(messages)
        error = CANCELLED if cancelled else _span_error(span) if span.error is not None else None
        config = dict(getattr(data, "model_config", None) or {})
        continues, with_response = None, False
        names = agent.names if agent is not None else {}
        if agent is not None:
            run = self._task_of(state, span.parent_id).run
            continuation = run.continuation(agent.name, agent.parent_id is not None)
            continues, with_response, messages = continuation.request(
                execution.id, messages, answer=lambda item: _replied(request([item], {}))
            )
            if message is not None and error is None:
                # Its model_exec_end records it: the next request need not write it
                # again when it sends it back as it came (the model's name aside).
                continuation.respond(execution.id, _replied([message]))
                # The results of its tool calls are named after them, also when the
                # request that sends them leaves the response out.
                names.update(
                    (p.id, p.name) for p in message.content if isinstance(p, events.ToolCallPart)
                )
        # The leading system messages are the request's system prompt, not messages.
        messages = messages[max(0, lead - (sent - len(messages))) :]
        facts: list[events.Event] = [
            events.ModelRequest(
                execution=execution,
                messages=request(messages, names),
                tools=[events.ToolDeclaration(name=n) for n in _tools(agent)],
                config=events.CallConfig(model=model or "?", extra=config),
                system=system,
                continues=continues,
                with_response=with_response,
                time=_at(span.started_at),
            ),
            events.ModelExecStart(execution=execution, model=model, time=_at(span.started_at)),
            events.ModelExecEnd(
                execution=execution,
                message=message,
                error=error,
                usage=usage,
                provider_state=provider_state,
                disposition="cancelled" if cancelled else "ran",
                time=_at(span.ended_at),
            ),
        ]
        if message is not None and error is None:
            facts.append(
                events.MessageEnd(message=message, execution=execution, time=_at(span.ended_at))
            )
        task = self._task_of(state, span.parent_id)
        task.run.record(*facts)
        if cancelled and task.top is not None and task.top.error is None:
            task.top.error, task.top.reason = CANCELLED, "aborted"
        if agent is None:
            return
        agent.model_id = execution.id
        agent.turn_models += 1
        agent.failed_model_id = execution.id if error is not None else None
        if message is None:
            return
        calls = [p for p in message.content if isinstance(p, events.ToolCallPart)]
        agent.pending.extend((c.id, c.name, c.arguments) for c in calls)
        text = "".join(p.text for p in message.content if isinstance(p, events.TextPart))
        if not calls and error is None:
            agent.output = output(text, agent.output_type)

    def _tool_start(self, state: _Trace, span: Span[Any]) -> None:
        agent = self._agent_of(state, span.parent_id)
        data = span.span_data
        if span_kind(data) == "handoff":
            name, arguments = "", {"from": data.from_agent, "to": data.to_agent}
            wanted = None
        else:
            name, arguments = data.name, {}
            wanted = data.name
        call_id = ""
        matched = False
        if agent is not None:
            for index, (pending_id, pending_name, pending_args) in enumerate(agent.pending):
                if pending_name == wanted or (wanted is None and "transfer" in pending_name):
                    del agent.pending[index]
                    # What the model sent (a handoff's arguments too: often {}).
                    call_id, name, arguments = pending_id, pending_name, pending_args
                    matched = True
                    break
        left = self._paused.get(state.path)
        awaiting = left.calls if left is not None else []
        if not matched and wanted is not None:
            # A call a paused run left waiting for approval, run by the resumed run:
            # the same call (its tool call id), with the arguments its span was given.
            asked = decoded(data.input) if data.input else None
            for index, (waiting_id, waiting_name, waiting_args) in enumerate(awaiting):
                if waiting_name == wanted and asked in (None, waiting_args):
                    del awaiting[index]
                    call_id, name, arguments = waiting_id, waiting_name, waiting_args
                    break
        execution = events.Execution(
            id=events.new_execution_id(),
            kind="tool",
            parent_id=(agent.model_id or agent.parent_id) if agent is not None else None,
            turn_index=agent.turn if agent is not None else None,
            agent=agent.name if agent is not None else None,
        )
        task = self._task_of(state, span.parent_id)
        state.tools[span.span_id] = execution
        task.calls[span.span_id] = (call_id, name or "handoff")
        task.run.record(
            events.ToolExecStart(
                execution=execution,
                tool_call_id=call_id,
                name=name or "handoff",
                arguments=arguments,
                time=_at(span.started_at),
            )
        )

    def _tool_end(self, state: _Trace, span: Span[Any]) -> None:
        execution = state.tools.get(span.span_id)
        task = self._task_of(state, span.parent_id)
        if execution is None or span.span_id not in task.calls:
            return
        data = span.span_data
        call_id, name = task.calls.pop(span.span_id)
        details: Any = None
        if span_kind(data) == "handoff":
            # What the model sees as the handoff tool's result (the SDK's transfer
            # message), and the agents it went between.
            seen = json.dumps({"assistant": data.to_agent})
            content: list[Any] = [events.TextPart(text=seen)]
            details = {"from": data.from_agent, "to": data.to_agent}
        elif data.output is None and span.error is None:
            # No output, no error: returned None, or waits for approval (see _settle).
            arguments = decoded(data.input) if data.input else {}
            task.unanswered.append((execution, call_id, name, arguments, _at(span.ended_at)))
            return
        elif data.output is None:
            content = []
        else:
            # The model sees the output as text; a structured one is kept in details too.
            output = data.output
            content = [events.TextPart(text=output if isinstance(output, str) else str(output))]
            if not isinstance(output, str | int | float | bool):
                details = output
        error = _span_error(span) if span.error is not None else None
        if error is not None and not content:
            content = [events.TextPart(text=error)]
        task.run.record(
            events.ToolExecEnd(
                execution=execution,
                tool_call_id=call_id,
                name=name,
                content=content,
                details=details,
                is_error=error is not None,
                time=_at(span.ended_at),
            )
        )


def _ended_as(paused: bool) -> str:
    """``agent_end.reason`` of a run that did not fail: it paused, or it completed."""
    return "interrupted" if paused else "completed"


def _replied(messages: list[Any]) -> Any:
    """A response as a request sends it back: an assistant message's content (a
    response's message also names its model and response id, which are not sent)."""
    (message,) = messages
    if not isinstance(message, events.AssistantMessage):
        return None
    return message.content


def _enclosing(state: _Trace, span_id: str | None) -> _Task | None:
    """The task a span runs in: its own, or its nearest ancestor's."""
    return nearest(state.tasks, state.parents, span_id)


def _at(time: str | None) -> str:
    # A span's own time (RFC 3339 with an offset, which the SDK writes in UTC).
    return time or now()


def _tools(agent: _Agent | None) -> list[str]:
    """The names of the tools ``agent`` offers (its span has no more of them)."""
    tools = getattr(agent.data, "tools", None) if agent is not None else None
    return [str(name) for name in tools or []]


def _unanswered(data: Any) -> bool:
    """Whether a model call's span holds nothing of a response: not its usage, which the
    SDK sets as soon as the response is in, nor the response."""
    if span_kind(data) == "response":
        return getattr(data, "response", None) is None
    return not getattr(data, "usage", None) and not getattr(data, "output", None)


def _span_error(span: Span[Any]) -> str:
    error: Mapping[str, Any] = span.error or {}
    message = str(error.get("message") or "error")
    detail = error.get("data")
    if isinstance(detail, Mapping) and detail.get("error"):
        message = f"{message}: {detail['error']}"
    return message
