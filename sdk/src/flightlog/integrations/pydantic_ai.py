"""Record pydantic-ai agents: ``Agent(..., capabilities=[Flightlog()])``.

Install with ``pip install 'flightlog-sdk[pydantic-ai]'``.  Each agent run becomes one
run of the session ``pydantic-ai/<conversation id>.jsonl`` (under the daemon's data
root), so a conversation continued with ``message_history`` goes on in the same file;
``Flightlog(path=...)`` names the session instead.

What is recorded, per run: ``agent_start`` (the prompt), one turn per model request
step, each model attempt (``model_request`` with the messages, tools and settings sent,
``model_exec_start``, ``model_exec_end`` with the response and its usage, and
``message_end``), another attempt of the same step (a fallback model) as a ``retry`` and
the same execution one attempt later, each tool call (``tool_exec_start``,
``tool_exec_end`` with its result or error; a call that re-asks a tool after
``ModelRetry`` ``replaces`` the failed one), and ``agent_end`` with the final output and
the run's usage.  A run cancelled or left halfway ends as ``aborted``, the model call
it cut as cancelled, and a streamed response left before its end is not a success.  An
agent run from inside a tool of a recorded agent (an agent used as a
tool) is recorded in the same run, nested under that tool call, when it has the
capability too.

Records go out where the agent hands control away (see ``Flightlog._hold``): about two
sends per step, each record with its own time.

Recording never breaks the agent: see :mod:`flightlog.integrations._recorder`.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import (
    WrapModelRequestHandler,
    WrapRunHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.output import OutputContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import ToolDefinition

from flightlog.protocol import events

from ._pydantic_ai_messages import (
    agent_name,
    assistant,
    attempt_error,
    config,
    declaration,
    deferred_end,
    deferred_ends,
    error_text,
    request_messages,
    to_usage,
    user_part,
)
from ._recorder import (
    CANCELLED,
    Continuation,
    RecordedRun,
    Recorder,
    cancelled_model_end,
    cancelled_tool_end,
    default_recorder,
)

__all__ = ["Flightlog"]

_UNFINISHED = (
    "the response is {state}: its stream was left or cut before the model finished, or the "
    "run stopped before acting on it"
)


@dataclasses.dataclass
class _Parent:
    """The recorded run a tool of a recorded agent runs in: where a sub-agent records."""

    run: RecordedRun
    tool_execution_id: str


_parent: contextvars.ContextVar[_Parent | None] = contextvars.ContextVar(
    "flightlog_pydantic_ai_parent", default=None
)


@dataclasses.dataclass
class Flightlog(AbstractCapability[Any]):
    """The capability that records an agent's runs into a flightlog session.

    ``path`` is the session file (default ``pydantic-ai/<conversation id>.jsonl``);
    ``meta`` goes into its ``session_start``; ``recorder`` is the best-effort recorder
    (default: the process's shared one, on ``$FLIGHTLOG_SOCKET``).
    """

    path: str | None = None
    meta: Mapping[str, Any] | None = None
    recorder: Recorder | None = None

    # Per run (see for_run): never shared between runs.
    _run: RecordedRun | None = dataclasses.field(default=None, init=False, repr=False)
    _agent: str | None = dataclasses.field(default=None, init=False, repr=False)
    #: The key of the run's ``agent_end`` among the ends its recorded run owes.
    _key: str = dataclasses.field(default="", init=False, repr=False)
    _parent_id: str | None = dataclasses.field(default=None, init=False, repr=False)
    _turn: int = dataclasses.field(default=0, init=False, repr=False)
    _turn_tools: int = dataclasses.field(default=0, init=False, repr=False)
    _model_execution: events.Execution | None = dataclasses.field(
        default=None, init=False, repr=False
    )
    _model_error: str | None = dataclasses.field(default=None, init=False, repr=False)
    #: Earlier attempts of the latest model call whose failure no hook of ours heard of.
    _unexplained: list[events.Execution] = dataclasses.field(
        default_factory=list, init=False, repr=False
    )
    #: Whether the latest model call's end is still to be recorded.
    _model_open: bool = dataclasses.field(default=False, init=False, repr=False)
    #: The tool calls that failed and are not yet re-asked: their tool name and
    #: execution id, by tool call id.
    _failed_tools: dict[str, tuple[str, str]] = dataclasses.field(
        default_factory=dict, init=False, repr=False
    )
    #: The tool call ids of the calls handed back to the application (deferred).
    _deferred: set[str] = dataclasses.field(default_factory=set, init=False, repr=False)
    #: The system prompt parts of the messages sent so far, and how many were read.
    _system_parts: list[str] = dataclasses.field(default_factory=list, init=False, repr=False)
    _system_read: int = dataclasses.field(default=0, init=False, repr=False)
    # Facts held back until the agent next hands control away (see _hold).
    _held: list[events.Event] = dataclasses.field(default_factory=list, init=False, repr=False)
    _tools_running: int = dataclasses.field(default=0, init=False, repr=False)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # not built from an agent spec file

    async def for_run(self, ctx: RunContext[Any]) -> Flightlog:
        return Flightlog(path=self.path, meta=self.meta, recorder=self.recorder)

    # --- the run ------------------------------------------------------------------------

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        recorder = self.recorder or default_recorder()
        parent = _parent.get()
        self._agent = agent_name(ctx)
        self._key = f"agent {ctx.run_id}"
        if parent is not None:
            self._run, self._parent_id = parent.run, parent.tool_execution_id
        else:
            path = self.path or f"pydantic-ai/{ctx.conversation_id or ctx.run_id}.jsonl"
            self._run = recorder.begin(path, meta=self.meta)
        self._safely(self._agent_start, ctx)
        try:
            result = await handler()
        except BaseException as exc:
            self._safely(self._agent_failed, exc)
            raise
        self._safely(self._agent_end, result)
        return result

    def _agent_start(self, ctx: RunContext[Any]) -> None:
        prompt = ctx.prompt
        messages: list[Any] = []
        if isinstance(prompt, str):
            messages.append(events.UserMessage(content=prompt))
        elif prompt is not None:
            messages.append(events.UserMessage(content=[user_part(p) for p in prompt]))
        self._record(
            events.AgentStart(agent=self._agent, messages=messages, parent_id=self._parent_id)
        )
        if self._run is not None:
            self._run.owe(self._key, self._aborted)

    def _aborted(self) -> events.AgentEnd:
        # What the run owes if it is closed before the agent ends (the process exits).
        return events.AgentEnd(
            ok=False,
            reason="aborted",
            error=CANCELLED,
            turns=self._turn,
            agent=self._agent,
            parent_id=self._parent_id,
        )

    def _unwind(self) -> list[events.Event]:
        """The ends owed inside this agent (its calls, as cancelled; nested agents), and
        its turn's end: what must precede its ``agent_end``."""
        owed = self._run.owed(above=self._key) if self._run is not None else []
        if self._run is not None:
            self._run.paid(self._key)
        self._model_open = False
        return [*owed, *self._turn_end()]

    def _turn_end(self) -> list[events.Event]:
        if self._turn and self._parent_id is None:
            return [events.TurnEnd(turn_index=self._turn, tool_call_count=self._turn_tools)]
        return []

    def _agent_end(self, result: AgentRunResult[Any]) -> None:
        usage = result.usage
        # A run that ends with DeferredToolRequests pauses: the calls it hands back end
        # as deferred (those that need approval never reach a hook of ours).
        deferred, paused = deferred_ends(result.output, self._deferred, self._tool_execution)
        self._record(
            *deferred,
            *self._unwind(),
            events.AgentEnd(
                ok=True,
                reason="interrupted" if paused else "completed",
                turns=self._turn,
                usage=to_usage(usage),
                output=result.output,
                agent=self._agent,
                parent_id=self._parent_id,
            ),
        )
        self._close(None)

    def _agent_failed(self, exc: BaseException) -> None:
        # A call still open was cut by the run's end: the model request runs in a task of
        # its own, cancelled after the run's; so are tools, whose ends come after it.
        cancelled = not isinstance(exc, Exception)
        self._record(
            *self._unwind(),
            events.AgentEnd(
                ok=False,
                reason="aborted" if cancelled else "error",
                error=error_text(exc),
                turns=self._turn,
                agent=self._agent,
                parent_id=self._parent_id,
            ),
        )
        self._close(error_text(exc))

    def _close(self, error: str | None) -> None:
        run, self._run = self._run, None
        if run is not None and self._parent_id is None:
            run.close(error)

    # --- model requests -----------------------------------------------------------------

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        self._safely(self._turn_start)
        try:
            return await handler(request_context)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Cancelled (a task cancelled, a timeout) while the model was asked.
                self._safely(self._model_cancelled)
            raise

    def _turn_start(self) -> None:
        # Sent with the turn's first model call, in one send.
        self._explain(None)
        self._hold(*self._turn_end())
        self._turn += 1
        self._turn_tools = 0
        self._model_execution = None
        if self._parent_id is None:
            self._hold(events.TurnStart(turn_index=self._turn))

    async def prepare_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        self._safely(self._model_start, request_context)
        return request_context

    def _model_start(self, request: ModelRequestContext) -> None:
        previous = self._model_execution
        if previous is not None and request.attempt > previous.attempt:
            # Another attempt at the same step (a fallback model): the same call, retried.
            if self._model_open and self._paid_model(previous):
                # A capability moved on from it (ModelFallback) before any hook of ours
                # heard why: the response that answers, or the error that ends the step,
                # lists the attempts that failed, and the retry is written then.
                self._unexplained.append(previous)
                if self._run is not None:
                    self._run.owe(
                        ("retry", *_key(previous)), lambda: events.Retry(execution=previous)
                    )
            else:
                self._hold(events.Retry(execution=previous, error=self._model_error))
            execution = msgspec.structs.replace(previous, attempt=request.attempt)
        else:
            execution = events.Execution(
                id=events.new_execution_id(),
                kind="model",
                attempt=request.attempt,
                parent_id=self._parent_id,
                turn_index=self._turn,
                agent=self._agent,
            )
        self._model_execution = execution
        self._model_error = None
        self._model_open = True
        if self._run is not None:
            self._run.owe(_key(execution), lambda: cancelled_model_end(execution))
        model = request.model
        name = getattr(model, "model_name", None)
        provider = getattr(model, "system", None)
        parameters = request.model_request_parameters
        tools = [
            declaration(tool) for tool in [*parameters.function_tools, *parameters.output_tools]
        ]
        split = self._continuation().request(execution.id, request.messages)
        system = self._system(request.messages, fresh=split.continues is None)
        messages = request_messages(split.new)
        self._record(
            events.ModelRequest(
                execution=execution,
                messages=messages,
                tools=tools,
                config=config(name, provider, request.model_settings),
                system=system,
                continues=split.continues,
                with_response=split.with_response,
            ),
            events.ModelExecStart(execution=execution, model=name, provider=provider),
        )

    def _system(self, messages: Sequence[Any], *, fresh: bool) -> str | None:
        """The system prompt the model gets with ``messages``: the system prompt parts of
        the whole history (read once each: a request continuing the one before adds
        only its new messages'), then the instructions of its latest request."""
        if fresh or self._system_read > len(messages):
            self._system_parts, self._system_read = [], 0
        for message in messages[self._system_read :]:
            for part in getattr(message, "parts", ()):
                if getattr(part, "part_kind", None) == "system-prompt":
                    self._system_parts.append(part.content)
        self._system_read = len(messages)
        instructions = next(
            (m.instructions for m in reversed(messages) if not isinstance(m, ModelResponse)),
            None,
        )
        system = [*self._system_parts, *([str(instructions)] if instructions else [])]
        return "\n\n".join(system) if system else None

    async def after_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        response: ModelResponse,
    ) -> ModelResponse:
        self._safely(self._model_end, response)
        return response

    def _model_end(self, response: ModelResponse) -> None:
        execution = self._model_execution
        if execution is None or not self._paid_model(execution):
            return
        self._explain(getattr(response, "failed_attempts", None))
        message = assistant(response)
        # Its model_exec_end records it: the next request need not write it again.
        self._continuation().respond(execution.id, response)
        end = events.ModelExecEnd(
            execution=execution,
            message=message,
            usage=to_usage(response.usage),
            provider_state=(
                {"response_id": response.provider_response_id}
                if response.provider_response_id
                else {}
            ),
        )
        state = getattr(response, "state", "complete")
        if state != "complete":
            # A stream its reader left, or cut (or a response over a usage limit): the
            # message is what came, and the call did not succeed; its run stopped it.
            self._record(
                msgspec.structs.replace(
                    end,
                    error=_UNFINISHED.format(state=state),
                    disposition="cancelled" if state == "interrupted" else "ran",
                )
            )
            return
        facts = (end, events.MessageEnd(message=message, execution=execution))
        if response.tool_calls:
            # Sent when the first tool starts (or the output is validated, or the run ends).
            self._hold(*facts)
        else:
            self._record(*facts)

    async def on_model_request_error(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        error: Exception,
    ) -> ModelResponse:
        self._safely(self._model_failed, error)
        raise error

    def _model_failed(self, error: Exception) -> None:
        execution = self._model_execution
        if execution is None or not self._paid_model(execution):
            return
        # A fallback that ran out of models: its group lists each model's error (its
        # attempts, once the agent has filled them in).
        grouped = [error_text(e) for e in getattr(error, "exceptions", ())]
        self._explain(getattr(error, "attempts", None) or grouped)
        self._model_error = error_text(error)
        self._record(events.ModelExecEnd(execution=execution, error=self._model_error))

    def _explain(self, attempts: Sequence[Any] | None) -> None:
        """Write the retries of the attempts a fallback moved on from, with their errors
        from ``attempts`` (pydantic-ai's ``ModelRequestAttempt`` of each, in order)."""
        attempts = attempts or ()
        retries = []
        for failed in self._unexplained:
            if self._run is not None:
                self._run.paid(("retry", *_key(failed)))
            found = attempts[failed.attempt - 1] if failed.attempt <= len(attempts) else None
            retries.append(events.Retry(execution=failed, error=attempt_error(found)))
        self._unexplained = []
        self._hold(*retries)

    def _model_cancelled(self) -> None:
        execution = self._model_execution
        if execution is None or not self._paid_model(execution):
            return
        self._model_error = CANCELLED
        self._record(cancelled_model_end(execution))

    def _paid_model(self, execution: events.Execution) -> bool:
        """Whether the model call's end is still to be written (and now is)."""
        if not self._model_open:
            return False
        self._model_open = False
        return self._run is None or self._run.paid(_key(execution))

    # --- tool calls ---------------------------------------------------------------------

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        execution = self._safely(self._tool_start, ctx, call, args)
        if execution is None or self._run is None:
            return await handler(args)
        token = _parent.set(_Parent(self._run, execution.id))
        try:
            result = await handler(args)
        except BaseException as exc:
            self._safely(self._tool_failed, execution, call, exc)
            raise
        finally:
            _parent.reset(token)
        self._safely(self._tool_end, execution, call, result)
        return result

    def _tool_execution(self, replaces: str | None = None) -> events.Execution:
        self._turn_tools += 1
        model = self._model_execution
        return events.Execution(
            id=events.new_execution_id(),
            kind="tool",
            parent_id=model.id if model is not None else self._parent_id,
            turn_index=self._turn,
            agent=self._agent,
            replaces=replaces,
        )

    def _tool_start(self, ctx: RunContext[Any], call: ToolCallPart, args: Any) -> events.Execution:
        # pydantic-ai re-asks the model after ModelRetry: the new call replaces the
        # failed one, under a new tool call id.
        execution = self._tool_execution(self._replaced(call) if ctx.retry else None)
        arguments = args if isinstance(args, dict) else {"args": args}
        self._record(
            events.ToolExecStart(
                execution=execution,
                tool_call_id=call.tool_call_id,
                name=call.tool_name,
                arguments=arguments,
            )
        )
        self._tools_running += 1
        if self._run is not None:
            name, call_id = call.tool_name, call.tool_call_id
            self._run.owe(_key(execution), lambda: cancelled_tool_end(execution, call_id, name))
        return execution

    def _replaced(self, call: ToolCallPart) -> str | None:
        """The failed call ``call`` re-asks: the one under its tool call id, else the
        earliest failed call of the same tool (calls beside it that succeeded are not)."""
        failed = self._failed_tools.pop(call.tool_call_id, None)
        if failed is None:
            earliest = next(
                (key for key, (name, _) in self._failed_tools.items() if name == call.tool_name),
                None,
            )
            failed = self._failed_tools.pop(earliest) if earliest is not None else None
        return failed[1] if failed is not None else None

    def _tool_end(self, execution: events.Execution, call: ToolCallPart, result: Any) -> None:
        content = [events.TextPart(text=result)] if isinstance(result, str) else [result]
        self._tool_done(
            events.ToolExecEnd(
                execution=execution,
                tool_call_id=call.tool_call_id,
                name=call.tool_name,
                content=content,
            )
        )

    def _tool_failed(
        self, execution: events.Execution, call: ToolCallPart, exc: BaseException
    ) -> None:
        self._failed_tools[call.tool_call_id] = (call.tool_name, execution.id)
        if not isinstance(exc, Exception):
            # Cancelled: the run ended, or a tool beside it raised.
            self._tool_done(cancelled_tool_end(execution, call.tool_call_id, call.tool_name))
            return
        if isinstance(exc, CallDeferred | ApprovalRequired):
            # Handed back to the application: the run pauses, the call has no result.
            self._deferred.add(call.tool_call_id)
            reason = "approval" if isinstance(exc, ApprovalRequired) else exc.kind
            self._tool_done(deferred_end(execution, call, reason, exc.metadata))
            return
        self._tool_done(
            events.ToolExecEnd(
                execution=execution,
                tool_call_id=call.tool_call_id,
                name=call.tool_name,
                content=[events.TextPart(text=error_text(exc))],
                is_error=True,
            )
        )

    def _tool_done(self, end: events.Event) -> None:
        execution = getattr(end, "execution", None)
        if self._run is not None and execution is not None and not self._run.paid(_key(execution)):
            return  # ended already, as cancelled, by the run's end
        self._tools_running -= 1
        if self._tools_running:
            # Other tools still run, and may run long: this one's end goes out now.
            self._record(end)
        else:
            # Sent with the next model request (or the output's validation, or the end).
            self._hold(end)

    # --- output -------------------------------------------------------------------------

    async def before_output_validate(
        self, ctx: RunContext[Any], *, output_context: OutputContext, output: Any
    ) -> Any:
        # Output validators and functions are the agent's own code, and may run long.
        self._safely(self._record)
        return output

    # --- plumbing -----------------------------------------------------------------------

    def _hold(self, *facts: events.Event) -> None:
        """Keep ``facts`` (their times taken now) for the next send.

        Facts are held only while the agent runs pydantic-ai's own code between two
        hand-offs; every point where it hands control away (a model request about to be
        sent, a tool or output validation about to run, the run's end) sends them, so
        a ``kill -9`` there loses nothing recorded before it.
        """
        self._held.extend(facts)

    def _continuation(self) -> Continuation:
        run, key = self._run, (self._agent, self._parent_id is not None)
        return run.continuation(*key) if run is not None else Continuation()

    def _record(self, *facts: events.Event) -> None:
        # What one hook says goes out in one send, after the facts held back.
        if self._held:
            facts, self._held = (*self._held, *facts), []
        if self._run is not None and facts:
            self._run.record(*facts)

    def _safely(self, action: Any, *args: Any) -> Any:
        # Hooks run inside the agent: an error of ours is counted, never raised.
        try:
            return action(*args)
        except Exception as exc:
            (self.recorder or default_recorder()).problem(exc, "a pydantic-ai hook")
            return None


def _key(execution: events.Execution) -> tuple[str, int]:
    """A call's key among the ends its run owes."""
    return execution.id, execution.attempt
