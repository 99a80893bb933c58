"""What the OpenAI Agents SDK's tracing processor keeps while it records: per trace,
its runs (tasks), agents and calls, and what a paused run leaves for the run that
resumes it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agents.tracing import Span

from flightlog.protocol import events

from ._recorder import RecordedRun

__all__ = ["Agent", "Paused", "Task", "Trace"]


@dataclass
class Agent:
    name: str
    #: The tool call that started it, for a sub-agent.
    parent_id: str | None
    output_type: str | None
    turn: int = 0
    #: Whether its current turn has had its ``turn_start`` and not yet its ``turn_end``.
    turn_open: bool = False
    #: Model calls of its current turn: every turn that runs to its end makes one.
    turn_models: int = 0
    #: Tool calls of its latest model response not yet matched to a tool span.
    pending: deque[tuple[str, str, dict[str, Any]]] = field(default_factory=deque)
    model_id: str | None = None
    failed_model_id: str | None = None
    output: Any = None
    error: str | None = None
    #: ``agent_end.reason`` when it failed: ``error``, ``max_turns`` or ``aborted``.
    reason: str = "error"
    #: Its agent span's data (the agent's, after a handoff), for the tools it offers.
    data: Any = None
    #: The name of each tool call met, by tool call id.
    names: dict[str, str] = field(default_factory=dict)
    #: The agent the run started with (``name`` is the one it handed off to).
    started_as: str = ""


@dataclass
class Task:
    """One ``Runner.run`` (the SDK's task span): a run of its own."""

    run: RecordedRun
    top: Agent | None = None
    usage: events.Usage | None = None
    #: Each tool span started and not yet ended: its call id and tool name.
    calls: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Model call spans started and not yet ended.
    models: dict[str, Span[Any]] = field(default_factory=dict)
    #: Tool calls whose span ended with no output and no error, and the ``turn_end``
    #: after them, held: the tool returned None (the run goes on), or the call waits for
    #: approval (the run pauses after it; see _settle).
    unanswered: list[tuple[events.Execution, str, str, dict[str, Any], str]] = field(
        default_factory=list
    )
    turn_end: events.TurnEnd | None = None


@dataclass
class Paused:
    """What a run paused for approval left for the run that resumes it."""

    #: The calls waiting for approval: tool call id, name, arguments.
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    #: The name of each tool call it met, by tool call id.
    names: dict[str, str] = field(default_factory=dict)


@dataclass
class Trace:
    trace_id: str
    path: str
    #: Runs resumed in a trace that has ended (``Runner.run`` of a ``RunState``): no
    #: trace end comes, so it ends with its last task.
    resumed: bool = False
    parents: dict[str, str | None] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    agents: dict[str, Agent] = field(default_factory=dict)
    tools: dict[str, events.Execution] = field(default_factory=dict)
    #: Its runs, by task span (None: spans outside any task span).
    tasks: dict[str | None, Task] = field(default_factory=dict)
