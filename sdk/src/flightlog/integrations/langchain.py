"""Record LangChain and LangGraph runs: ``config={"callbacks": [FlightlogCallbackHandler()]}``.

Install with ``pip install 'flightlog-sdk[langchain]'``.  A run is recorded when it is
given the handler (no environment variable turns recording on: LangChain would know of
this handler only once this module is imported, which nothing does for the user).

Each top-level invocation (a graph's ``invoke``, an agent's, a chain's, a chat model's
called on its own) becomes one run of the session ``langchain/<thread id>.jsonl`` (the
``thread_id`` of a LangGraph conversation, else the invocation's run id), so a
conversation continued on the same thread goes on in the same file;
``FlightlogCallbackHandler(path=...)`` names the session instead.

What is recorded: ``agent_start`` (the input messages), each chat model call
(``model_request`` with the messages, tools and parameters, ``model_exec_start``,
``model_exec_end`` with the response message and its usage, or the error, and
``message_end``), one turn per model call of the top-level agent, each tool call
(``tool_exec_start`` with its tool call id and arguments, ``tool_exec_end`` with its
result or error), and ``agent_end`` with the final output (the last message's text, or
the ``structured_response``; a graph paused by ``interrupt()`` ends with reason
``interrupted`` and the interrupts' values).  A model call made again after a failed
one (``with_retry``, a fallback) ``replaces`` it.  An agent invoked from inside a tool
is a sub-agent nested under that tool call.  Chains and graph nodes in between are not
recorded: they are structure, not calls.

Recording never breaks the run: see :mod:`flightlog.integrations._recorder`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult

from flightlog.protocol import events

from ._langchain_messages import final_output, input_messages, to_message, tool_content
from ._langchain_values import (
    added,
    declaration,
    interrupts,
    is_interrupt,
    provider_state,
    system_prompt,
    to_usage,
)
from ._recorder import (
    Hooks,
    RecordedRun,
    Recorder,
    cancelled_model_end,
    cancelled_tool_end,
    nearest,
)

__all__ = ["FlightlogCallbackHandler"]

_CONFIG_KEYS = {"ls_temperature": "temperature", "ls_max_tokens": "max_tokens"}


@dataclass
class _Agent:
    name: str
    parent_id: str | None
    turn: int = 0
    #: Whether its current turn has had its ``turn_start`` and not yet its ``turn_end``.
    turn_open: bool = False
    #: Tool calls made in its current turn.
    turn_tools: int = 0
    #: The usage of its model calls, summed.
    usage: events.Usage | None = None
    model_id: str | None = None
    failed_model_id: str | None = None


@dataclass
class _Root:
    run: RecordedRun
    agent: _Agent
    #: Every run id of the invocation, to the run it belongs to (its parent).
    parents: dict[UUID, UUID | None] = field(default_factory=dict)
    #: Sub-agents and the top-level agent, by the chain run that is the agent.
    agents: dict[UUID, _Agent] = field(default_factory=dict)
    models: dict[UUID, events.Execution] = field(default_factory=dict)
    tools: dict[UUID, tuple[events.Execution, str, str]] = field(default_factory=dict)
    #: The subgraphs run inside (a graph used as a node: an agent of a multi-agent
    #: graph), by their chain run, to their name: the agent of the calls inside.
    graphs: dict[UUID, str] = field(default_factory=dict)
    #: Each chain run's name and LangGraph checkpoint namespace, to find subgraphs.
    names: dict[UUID, tuple[str, str | None]] = field(default_factory=dict)
    #: What a LangGraph ``interrupt()`` asked, by the interrupt's id: the run pauses.
    interrupts: dict[str, Any] = field(default_factory=dict)


class FlightlogCallbackHandler(Hooks, BaseCallbackHandler):
    """A callback handler that records each top-level run into a flightlog session.

    ``path`` is the session file (default ``langchain/<thread id or run id>.jsonl``);
    ``meta`` goes into its ``session_start``; ``recorder`` is the best-effort recorder
    (default: the process's shared one, on ``$FLIGHTLOG_SOCKET``).
    """

    # Called in order on the loop thread for async runs, not from an executor.
    run_inline = True

    where = "a LangChain callback"

    def __init__(
        self,
        *,
        path: str | None = None,
        meta: Mapping[str, Any] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        Hooks.__init__(self, path=path, meta=meta, recorder=recorder)
        self._roots: dict[UUID, _Root] = {}
        #: Each run id of an invocation being recorded, to its root's run id.
        self._root_of: dict[UUID, UUID] = {}

    def _root_for(self, run_id: UUID) -> _Root | None:
        root_id = self._root_of.get(run_id)
        return self._roots.get(root_id) if root_id is not None else None

    def _root(self, run_id: UUID, parent_run_id: UUID | None) -> _Root | None:
        root_id = self._root_of.get(parent_run_id) if parent_run_id is not None else None
        if root_id is None:
            return None
        root = self._roots.get(root_id)
        if root is not None:
            self._root_of[run_id] = root_id
            root.parents[run_id] = parent_run_id
        return root

    def _agent_of(self, root: _Root, run_id: UUID | None) -> _Agent:
        return nearest(root.agents, root.parents, run_id) or root.agent

    def _caller(self, root: _Root, run_id: UUID | None) -> str:
        """The agent a call made under ``run_id`` belongs to: its (sub-)agent's, or the
        subgraph's it runs in."""
        while run_id is not None:
            agent = root.agents.get(run_id)
            if agent is not None:
                return agent.name
            graph = root.graphs.get(run_id)
            if graph is not None:
                return graph
            run_id = root.parents.get(run_id)
        return root.agent.name

    def _tool_above(self, root: _Root, run_id: UUID | None) -> events.Execution | None:
        while run_id is not None:
            if run_id in root.agents:
                return None
            tool = root.tools.get(run_id)
            if tool is not None:
                return tool[0]
            run_id = root.parents.get(run_id)
        return None

    # --- chains: the invocation, and sub-agents --------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._safely(self._chain_start, serialized, inputs, run_id, parent_run_id, metadata, kwargs)

    def _chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: dict[str, Any] | None,
        kwargs: dict[str, Any],
    ) -> None:
        name = str(kwargs.get("name") or (serialized or {}).get("name") or "chain")
        # Every node of a graph starts a chain with the whole state: its messages are
        # converted only for an agent's start, so a step costs the same at step 1,000.
        if parent_run_id is None or parent_run_id not in self._root_of:
            self._begin(run_id, name, input_messages(inputs), metadata)
            return
        root = self._root(run_id, parent_run_id)
        if root is None:
            return
        # A node of a subgraph runs in a checkpoint namespace nested in the one of the
        # node that runs the subgraph ("inner:<task>|agent:<task>"): the chain it starts
        # under, in the outer namespace, is the subgraph.
        namespace = (metadata or {}).get("langgraph_checkpoint_ns")
        namespace = namespace if isinstance(namespace, str) else None
        root.names[run_id] = (name, namespace)
        parent_name, parent_namespace = root.names.get(parent_run_id, (None, None))
        if namespace and "|" in namespace and parent_name and parent_namespace != namespace:
            root.graphs.setdefault(parent_run_id, parent_name)
        # The first chain inside a tool call is an agent used as a tool: a sub-agent.
        tool = self._tool_above(root, parent_run_id)
        if tool is not None:
            agent = _Agent(name=name, parent_id=tool.id)
            root.agents[run_id] = agent
            root.run.record(
                events.AgentStart(agent=name, messages=input_messages(inputs), parent_id=tool.id)
            )

    def _begin(
        self, run_id: UUID, name: str, messages: list[Any], metadata: dict[str, Any] | None
    ) -> _Root:
        """A top-level invocation: a run of its own, and its agent."""
        thread = (metadata or {}).get("thread_id")
        path = self.path or f"langchain/{thread or run_id}.jsonl"
        top = _Agent(name=name, parent_id=None)
        root = _Root(run=self.recorder.begin(path, meta=self.meta), agent=top)
        root.agents[run_id] = top
        self._roots[run_id] = root
        self._root_of[run_id] = run_id
        root.run.record(events.AgentStart(agent=name, messages=messages))
        return root

    def on_chain_end(
        self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self._safely(self._chain_end, outputs, run_id, None)

    def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._safely(self._chain_end, None, run_id, error)

    def _chain_end(self, outputs: Any, run_id: UUID, error: BaseException | None) -> None:
        root = self._root_for(run_id)
        if root is None:
            return
        if error is not None and is_interrupt(error):
            # A node paused the graph (human in the loop): not a failure of the run.
            root.interrupts.update(interrupts(error))
            error = None
            if run_id not in root.agents:
                return
        agent = root.agents.get(run_id)
        if agent is None:
            return
        self._agent_end(root, run_id, agent, final_output(outputs), error)

    def _agent_end(
        self, root: _Root, run_id: UUID, agent: _Agent, output: Any, error: BaseException | None
    ) -> None:
        """``agent_end`` of ``agent``; the invocation's run closes with its top agent."""
        text = _error_text(error) if error is not None else None
        reason = "completed" if error is None else "error"
        if error is None and root.interrupts and agent is root.agent:
            reason, output = "interrupted", list(root.interrupts.values())
        root_id = self._root_of.get(run_id)
        if run_id == root_id:
            # LangChain says nothing of a call its run was cancelled in: each still open
            # ends here, as cancelled.
            self._end_open_calls(root)
            if error is not None and not isinstance(error, Exception):
                reason = "aborted"
            self._turn_end(root, agent)
        root.run.record(
            events.AgentEnd(
                ok=error is None,
                reason=reason,
                error=text,
                turns=agent.turn,
                usage=agent.usage,
                output=output if error is None else None,
                agent=agent.name,
                parent_id=agent.parent_id,
            )
        )
        if run_id == root_id:
            del self._roots[run_id]
            for other in [r for r, top in self._root_of.items() if top == root_id]:
                del self._root_of[other]
            root.run.close(text)

    def _turn_end(self, root: _Root, agent: _Agent) -> None:
        if agent.turn_open:
            agent.turn_open = False
            root.run.record(events.TurnEnd(turn_index=agent.turn, tool_call_count=agent.turn_tools))

    def _end_open_calls(self, root: _Root) -> None:
        for model_run in list(root.models):
            execution = root.models.pop(model_run)
            root.run.record(cancelled_model_end(execution))
        for execution, call_id, name in root.tools.values():
            root.run.record(cancelled_tool_end(execution, call_id, name))
        root.tools.clear()

    # --- chat models ------------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._safely(
            self._model_start, serialized, messages, run_id, parent_run_id, metadata, kwargs
        )

    def _model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: dict[str, Any] | None,
        kwargs: dict[str, Any],
    ) -> None:
        root = self._root(run_id, parent_run_id)
        if root is None:
            if parent_run_id is not None and parent_run_id in self._root_of:
                return
            # A chat model invoked on its own (invoke, batch, stream): its own run.
            name = str(kwargs.get("name") or (serialized or {}).get("name") or "chat_model")
            asked = [to_message(m) for batch in messages for m in batch]
            root = self._begin(run_id, name, asked, metadata)
        agent = self._agent_of(root, parent_run_id)
        metadata = metadata or {}
        params = dict(kwargs.get("invocation_params") or {})
        model = str(
            metadata.get("ls_model_name")
            or params.get("model")
            or params.get("model_name")
            or params.get("_type")
            or "?"
        )
        provider = metadata.get("ls_provider")
        facts: list[events.Event] = []
        if agent is root.agent and agent.failed_model_id is None:
            # A turn per model call; a call made again after a failed one (with_retry,
            # a fallback) is the same turn's.
            self._turn_end(root, agent)
            agent.turn += 1
            agent.turn_open, agent.turn_tools = True, 0
            facts.append(events.TurnStart(turn_index=agent.turn))
        execution = events.Execution(
            id=events.new_execution_id(),
            kind="model",
            parent_id=agent.parent_id,
            turn_index=agent.turn,
            agent=self._caller(root, parent_run_id),
            replaces=agent.failed_model_id,
        )
        root.models[run_id] = execution
        agent.model_id = execution.id
        tools = [declaration(tool) for tool in params.pop("tools", None) or []]
        known = {
            field: metadata[key]
            for key, field in _CONFIG_KEYS.items()
            if isinstance(metadata.get(key), int | float)
        }
        stop = params.pop("stop", None) or []
        sent = [m for batch in messages for m in batch]
        system, lead = system_prompt(sent)
        continuation = root.run.continuation(agent.name, agent.parent_id is not None)
        continues, with_response, new = continuation.request(execution.id, sent)
        # The leading system messages are the request's system prompt, not messages.
        new = new[max(0, lead - (len(sent) - len(new))) :]
        root.run.record(
            *facts,
            events.ModelRequest(
                execution=execution,
                messages=[to_message(m) for m in new],
                tools=tools,
                config=events.CallConfig(
                    model=model,
                    provider=str(provider) if provider else None,
                    stop=[str(s) for s in stop],
                    extra=params,
                    **known,
                ),
                system=system,
                continues=continues,
                with_response=with_response,
            ),
            events.ModelExecStart(
                execution=execution, model=model, provider=str(provider) if provider else None
            ),
        )

    def on_llm_end(
        self, response: LLMResult, *, run_id: UUID, parent_run_id: UUID | None = None, **kw: Any
    ) -> None:
        self._safely(self._model_end, response, run_id, None)

    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._safely(self._model_end, None, run_id, error)

    def _model_end(
        self, response: LLMResult | None, run_id: UUID, error: BaseException | None
    ) -> None:
        root = self._root_for(run_id)
        if root is None:
            return
        execution = root.models.pop(run_id, None)
        if execution is None:
            return
        agent = self._agent_of(root, root.parents.get(run_id))
        message: BaseMessage | None = None
        if response is not None and response.generations and response.generations[0]:
            message = getattr(response.generations[0][0], "message", None)
        converted = to_message(message) if message is not None else None
        text = _error_text(error) if error is not None else None
        usage = to_usage(getattr(message, "usage_metadata", None))
        agent.usage = added(agent.usage, usage)
        state = provider_state(message)
        if error is not None and not isinstance(error, Exception):
            # Cancelled (a task cancelled, a timeout, Ctrl-C) while the model was asked.
            end = cancelled_model_end(execution, converted, usage=usage, provider_state=state)
        else:
            end = events.ModelExecEnd(
                execution=execution,
                message=converted,
                error=text,
                usage=usage,
                provider_state=state,
            )
        if message is not None and error is None:
            # Its model_exec_end records it: the next request need not write it again.
            continuation = root.run.continuation(agent.name, agent.parent_id is not None)
            continuation.respond(execution.id, message)
        root.run.record(end)
        agent.failed_model_id = execution.id if error is not None else None
        if converted is not None and error is None:
            root.run.record(events.MessageEnd(message=converted, execution=execution))
        if run_id in root.agents:
            self._agent_end(root, run_id, agent, final_output(message), error)
        else:
            del self._root_of[run_id]

    # --- tools ------------------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._safely(self._tool_start, serialized, input_str, run_id, parent_run_id, inputs, kwargs)

    def _tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        run_id: UUID,
        parent_run_id: UUID | None,
        inputs: dict[str, Any] | None,
        kwargs: dict[str, Any],
    ) -> None:
        root = self._root(run_id, parent_run_id)
        if root is None:
            return
        agent = self._agent_of(root, parent_run_id)
        agent.turn_tools += 1
        name = str(kwargs.get("name") or (serialized or {}).get("name") or "tool")
        call_id = str(kwargs.get("tool_call_id") or "")
        execution = events.Execution(
            id=events.new_execution_id(),
            kind="tool",
            parent_id=agent.model_id or agent.parent_id,
            turn_index=agent.turn,
            agent=self._caller(root, parent_run_id),
        )
        root.tools[run_id] = (execution, call_id, name)
        arguments = dict(inputs) if isinstance(inputs, Mapping) else {"input": input_str}
        root.run.record(
            events.ToolExecStart(
                execution=execution, tool_call_id=call_id, name=name, arguments=arguments
            )
        )

    def on_tool_end(
        self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self._safely(self._tool_end, output, run_id, None)

    def on_tool_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._safely(self._tool_end, None, run_id, error)

    def _tool_end(self, output: Any, run_id: UUID, error: BaseException | None) -> None:
        root = self._root_for(run_id)
        if root is None or run_id not in root.tools:
            return
        execution, call_id, name = root.tools.pop(run_id)
        if error is not None and is_interrupt(error):
            # The tool asked a person (interrupt()): it did not fail, it did not answer,
            # the run pauses; resumed, LangGraph runs it again from its start.
            root.run.record(
                events.ToolExecEnd(
                    execution=execution,
                    tool_call_id=call_id,
                    name=name,
                    content=[],
                    details=list(interrupts(error).values()),
                    disposition="deferred",
                    reason="interrupted",
                )
            )
            return
        if error is not None and not isinstance(error, Exception):
            # Cancelled (a task cancelled, a timeout, Ctrl-C) while the tool ran.
            root.run.record(cancelled_tool_end(execution, call_id, name))
            return
        failed = error is not None or getattr(output, "status", None) == "error"
        if error is not None:
            content: list[Any] = [events.TextPart(text=_error_text(error))]
        else:
            content = tool_content(getattr(output, "content", output))
        root.run.record(
            events.ToolExecEnd(
                execution=execution,
                tool_call_id=call_id,
                name=name,
                content=content,
                details=getattr(output, "artifact", None),
                is_error=failed,
            )
        )


def _error_text(exc: BaseException | None) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
