"""The agent-side event model: what an agent loop, or an adapter for one, hands to ``record()``.

The vocabulary follows the AgentGo kernel's session recorder.  There is one event class
per record type of docs/format.md section 4, and one for each event a loop emits that is never
written (``message_start``, ``message_update``, ``model_stream``, ``tool_exec_update``), so
an adapter can hand over everything and let the codec decide what reaches the file.

Each event class carries an explicit string tag equal to its record type
(:func:`event_type`).  Its ``time`` comes from the source, when the event happened, not
from the moment it is written; the codec moves it into the record envelope.

Every fact that belongs to a call carries ``execution``: an :class:`Execution` naming the
model, tool or compaction call.  A retry keeps the execution id and adds one to
``attempt``; nested work points at its parent with ``parent_id``.  Starts and ends pair
by run, execution id, attempt and kind; a missing end is never read as success.

Messages and parts are tagged with ``"$type"`` (``"user"``, ``"assistant"``,
``"tool_result"``, ``"system"``; ``"text"``, ``"thinking"``, ``"tool_call"``, ``"image"``,
``"file"``).  Fields that
hold messages, results or details are typed ``Any``: an application may put its own
message types there once it has registered them with the codec.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, TypeAlias
from uuid import uuid4

import msgspec

from ._records import now

__all__ = [
    "EVENT_CLASSES",
    "AgentEnd",
    "AgentStart",
    "AssistantMessage",
    "CallConfig",
    "ChatMessage",
    "ContextCompacted",
    "ContextPrepareEnd",
    "ContextPrepareStart",
    "ContextProjected",
    "Disposition",
    "Error",
    "Event",
    "Execution",
    "ExecutionKind",
    "FilePart",
    "ImagePart",
    "MessageEnd",
    "MessageStart",
    "MessageUpdate",
    "ModelDisposition",
    "ModelExecEnd",
    "ModelExecStart",
    "ModelRequest",
    "ModelResponse",
    "ModelStream",
    "Part",
    "Retry",
    "RetryWaitEnd",
    "RetryWaitStart",
    "SystemMessage",
    "TextPart",
    "ThinkingPart",
    "ToolCallPart",
    "ToolDeclaration",
    "ToolExecEnd",
    "ToolExecStart",
    "ToolExecUpdate",
    "ToolInvokeEnd",
    "ToolInvokeStart",
    "ToolQueued",
    "ToolResultMessage",
    "TurnEnd",
    "TurnStart",
    "Usage",
    "UserMessage",
    "event_type",
    "new_execution_id",
]

ExecutionKind: TypeAlias = Literal["model", "tool", "compaction"]

#: What became of a requested tool call.
Disposition: TypeAlias = Literal[
    "ran", "refused", "skipped", "short_circuited", "repaired", "cancelled", "deferred"
]

#: What became of a model call: it ran to its end (with a response or an error), or its
#: run was cancelled before it did.
ModelDisposition: TypeAlias = Literal["ran", "cancelled"]


# --- values ---------------------------------------------------------------------------


def new_execution_id() -> str:
    """A fresh execution id, unique within any run: 16 random hex digits (from a uuid4).

    For a call the framework gives no id of its own; a retry keeps its execution's id
    (:meth:`Execution.next_attempt`).
    """
    return uuid4().hex[:16]


class Execution(msgspec.Struct, kw_only=True, frozen=True):
    """One model, tool or compaction call.

    ``id`` is unique within its run; ``attempt`` starts at 1 and a retry keeps the id and
    adds one (:meth:`next_attempt`).  ``parent_id`` names the execution this one is nested
    in; ``turn_index`` the loop turn it belongs to.  ``agent`` names the agent that made
    the call (after a handoff, or in a sub-agent).  ``replaces`` is the id of a failed call
    this one re-issues under a new id (a framework's own retry, a fallback model), where a
    retry that keeps the id is not possible.
    """

    id: str
    kind: ExecutionKind
    attempt: Annotated[int, msgspec.Meta(ge=1)] = 1
    parent_id: str | None = None
    turn_index: int | None = None
    agent: str | None = None
    replaces: str | None = None

    def next_attempt(self) -> Execution:
        """The same execution, one attempt later: what a retry records."""
        return msgspec.structs.replace(self, attempt=self.attempt + 1)


class Usage(msgspec.Struct, kw_only=True, frozen=True):
    """Token counts of a model call, and its cost when the provider says."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: float | None = None


class ToolDeclaration(msgspec.Struct, kw_only=True, frozen=True):
    """A tool as offered to the model: its name, description and JSON Schema parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = {}


class CallConfig(msgspec.Struct, kw_only=True, frozen=True):
    """The resolved configuration of one model call, after middleware.

    ``extra`` holds provider-specific options.  Credentials (``api_key`` and similar keys)
    are removed from it by the codec before anything is written.
    """

    model: str
    provider: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    stop: list[str] = []
    extra: dict[str, Any] = {}


# --- messages ---------------------------------------------------------------------------


class TextPart(msgspec.Struct, kw_only=True, frozen=True, tag_field="$type", tag="text"):
    """Plain text."""

    text: str


class ThinkingPart(msgspec.Struct, kw_only=True, frozen=True, tag_field="$type", tag="thinking"):
    """The model's reasoning; ``signature`` is the provider's opaque proof of it."""

    thinking: str
    signature: str | None = None
    redacted: bool = False


class ToolCallPart(msgspec.Struct, kw_only=True, frozen=True, tag_field="$type", tag="tool_call"):
    """A tool call the model asks for."""

    id: str
    name: str
    arguments: dict[str, Any] = {}


class ImagePart(msgspec.Struct, kw_only=True, frozen=True, tag_field="$type", tag="image"):
    """An image: ``data`` is base64 of the bytes, or a URL."""

    media_type: str
    data: str


class FilePart(msgspec.Struct, kw_only=True, frozen=True, tag_field="$type", tag="file"):
    """Any other file the model is sent (a document, audio, video), or an image known
    only by a provider's file id: ``data`` is base64 of the bytes, a URL, or empty when
    the file is sent by ``file_id``; ``name`` is its file name when one is sent."""

    media_type: str
    data: str = ""
    name: str | None = None
    file_id: str | None = None


Part: TypeAlias = TextPart | ThinkingPart | ToolCallPart | ImagePart | FilePart


class UserMessage(msgspec.Struct, kw_only=True, frozen=True, tag_field="$type", tag="user"):
    """What the user (or the application on the user's behalf) says."""

    content: list[Part] | str


class AssistantMessage(
    msgspec.Struct, kw_only=True, frozen=True, tag_field="$type", tag="assistant"
):
    """A model's reply, complete or partial."""

    content: list[Part] = []
    model: str | None = None
    provider: str | None = None
    stop_reason: str | None = None
    response_id: str | None = None


class ToolResultMessage(
    msgspec.Struct, kw_only=True, frozen=True, tag_field="$type", tag="tool_result"
):
    """The result of one tool call, as the model will see it."""

    tool_call_id: str
    name: str
    content: list[Part] = []
    is_error: bool = False


class SystemMessage(msgspec.Struct, kw_only=True, frozen=True, tag_field="$type", tag="system"):
    """A system (or developer) message sent in the conversation's course, where the
    framework put it; the leading system prompt is ``model_request.system``."""

    content: list[Part] | str


#: The protocol's own conversation messages (named so as not to clash with wire messages).
ChatMessage: TypeAlias = UserMessage | AssistantMessage | ToolResultMessage | SystemMessage


# --- events -----------------------------------------------------------------------------


class Event(msgspec.Struct, kw_only=True, frozen=True, tag_field="type"):
    """Base class of all events; ``time`` is when it happened (RFC 3339 UTC)."""

    time: str = msgspec.field(default_factory=now)

    @property
    def record_type(self) -> str:
        """The record type this event is written as (its tag)."""
        return event_type(type(self))


# Lifecycle of one agent loop invocation.


class AgentStart(Event, kw_only=True, frozen=True, tag="agent_start"):
    """The loop starts; ``messages`` are the new input messages it starts with.

    ``parent_id`` is set for a sub-agent: the execution id of the tool call that started
    it; its ``agent_end`` carries the same ``parent_id``.
    """

    agent: str | None = None
    messages: list[Any] = []
    parent_id: str | None = None


class AgentEnd(Event, kw_only=True, frozen=True, tag="agent_end"):
    """The loop ends: ``ok``, or not and why.

    ``reason`` is a short word (``"completed"``, ``"max_turns"``, ``"aborted"``,
    ``"error"``); ``error`` the error text when it failed.  ``output`` is the run's final
    output (text, or a structured value); ``agent`` and ``parent_id`` are those of its
    ``agent_start``.
    """

    ok: bool = True
    reason: str | None = None
    error: str | None = None
    turns: int = 0
    usage: Usage | None = None
    output: Any = None
    agent: str | None = None
    parent_id: str | None = None


class TurnStart(Event, kw_only=True, frozen=True, tag="turn_start"):
    """A turn starts: one model call and the tool calls it asks for."""

    turn_index: int = 0


class TurnEnd(Event, kw_only=True, frozen=True, tag="turn_end"):
    """A turn ends.  A summary only, never the loop's full state."""

    turn_index: int = 0
    stop_reason: str | None = None
    message_count: int = 0
    tool_call_count: int = 0
    usage: Usage | None = None


class Error(Event, kw_only=True, frozen=True, tag="error"):
    """An error the loop reports; ``fatal`` when it ends the loop."""

    message: str
    code: str | None = None
    fatal: bool = False
    execution: Execution | None = None
    details: Any = None


# Context preparation before a model call.


class ContextPrepareStart(Event, kw_only=True, frozen=True, tag="context_prepare_start"):
    """Preparing the context for the next model call starts."""

    execution: Execution | None = None
    turn_index: int | None = None
    message_count: int = 0


class ContextPrepareEnd(Event, kw_only=True, frozen=True, tag="context_prepare_end"):
    """Preparing the context ends, with ``error`` when it failed."""

    execution: Execution | None = None
    message_count: int = 0
    token_estimate: int | None = None
    error: str | None = None


class ContextProjected(Event, kw_only=True, frozen=True, tag="context_projected"):
    """The history was projected onto what the model will see (pruned, transformed)."""

    execution: Execution | None = None
    source_count: int = 0
    message_count: int = 0
    token_estimate: int | None = None
    strategy: str | None = None


class ContextCompacted(Event, kw_only=True, frozen=True, tag="context_compacted"):
    """Older messages were replaced by a summary (an execution of kind compaction)."""

    execution: Execution
    summary: Any = None
    compacted_count: int = 0
    kept_count: int = 0
    tokens_before: int | None = None
    tokens_after: int | None = None


# Model calls.


class ModelRequest(Event, kw_only=True, frozen=True, tag="model_request"):
    """What is sent to the model: messages, tools and the resolved per-call config.

    Credentials never reach a record: the codec removes ``api_key`` and similar keys
    from ``config.extra`` and ``headers``.  ``continues`` names an earlier model call of
    the session (this run or an earlier one) whose messages this request starts with:
    ``messages`` then holds only the messages after those (so a long loop does not write
    its history again each turn); with ``with_response``, that call's response (the
    message of its ``model_exec_end``) comes between the two, and is not written again.
    """

    execution: Execution
    messages: list[Any] = []
    tools: list[ToolDeclaration] = []
    config: CallConfig | None = None
    system: str | None = None
    headers: dict[str, Any] = {}
    continues: str | None = None
    with_response: bool = False


class ModelExecStart(Event, kw_only=True, frozen=True, tag="model_exec_start"):
    """A model call starts."""

    execution: Execution
    model: str | None = None
    provider: str | None = None


class ModelExecEnd(Event, kw_only=True, frozen=True, tag="model_exec_end"):
    """A model call ends: its response ``message``, or the partial message and ``error``.

    ``provider_state`` is what the provider hands back to continue (response ids,
    encrypted reasoning, cache handles).  ``disposition`` is ``"cancelled"`` when the
    call's run was cancelled (a task cancelled, a timeout) before the call ended: then
    ``error`` says so and ``message`` is what came, if anything.
    """

    execution: Execution
    message: Any = None
    error: str | None = None
    usage: Usage | None = None
    provider_state: dict[str, Any] = {}
    disposition: ModelDisposition = "ran"

    @property
    def ok(self) -> bool:
        """Whether the call succeeded."""
        return self.error is None


class ModelResponse(Event, kw_only=True, frozen=True, tag="model_response"):
    """The loop's view of a model response.

    Written only when it carries a ``length_recovery`` decision (what the loop does
    about a response cut off at the token limit), and then without ``message``.
    """

    execution: Execution
    message: Any = None
    length_recovery: str | None = None
    stop_reason: str | None = None


class ModelStream(Event, kw_only=True, frozen=True, tag="model_stream"):
    """A raw streaming chunk from the provider.  Never written."""

    execution: Execution
    chunk: Any = None


# Messages.


class MessageStart(Event, kw_only=True, frozen=True, tag="message_start"):
    """A message starts streaming.  Never written."""

    message: Any = None
    execution: Execution | None = None


class MessageUpdate(Event, kw_only=True, frozen=True, tag="message_update"):
    """A partial snapshot of a streaming message and its delta.  Never written."""

    message: Any = None
    delta: str | None = None
    execution: Execution | None = None


class MessageEnd(Event, kw_only=True, frozen=True, tag="message_end"):
    """A message is committed to the conversation."""

    message: Any
    execution: Execution | None = None


# Tool calls.


class ToolQueued(Event, kw_only=True, frozen=True, tag="tool_queued"):
    """The model asked for a tool call; it waits to run."""

    execution: Execution
    tool_call_id: str
    name: str
    arguments: dict[str, Any] = {}


class ToolExecStart(Event, kw_only=True, frozen=True, tag="tool_exec_start"):
    """Handling of a requested tool call starts (middleware, authorization, invocation)."""

    execution: Execution
    tool_call_id: str
    name: str
    arguments: dict[str, Any] = {}


class ToolInvokeStart(Event, kw_only=True, frozen=True, tag="tool_invoke_start"):
    """The tool itself is invoked, with the actual arguments after middleware."""

    execution: Execution
    tool_call_id: str
    name: str
    arguments: dict[str, Any] = {}


class ToolInvokeEnd(Event, kw_only=True, frozen=True, tag="tool_invoke_end"):
    """The tool invocation returned (or raised: ``is_error``)."""

    execution: Execution
    tool_call_id: str
    name: str
    content: list[Any] = []
    details: Any = None
    is_error: bool = False


class ToolExecUpdate(Event, kw_only=True, frozen=True, tag="tool_exec_update"):
    """Progress or a preview of a running tool.  Never written."""

    execution: Execution
    tool_call_id: str
    name: str
    partial: Any = None


class ToolExecEnd(Event, kw_only=True, frozen=True, tag="tool_exec_end"):
    """Handling of a tool call ends: its result and what became of it.

    ``disposition`` is ``"ran"`` when the tool was invoked, otherwise ``"refused"``
    (authorization said no), ``"skipped"`` or ``"short_circuited"`` (middleware answered
    without invoking it), ``"repaired"`` (not a genuine result: the call was cut and
    ``Session.resume(repair=True)`` wrote this error in its place), or ``"cancelled"``
    (the tool was invoked and its run was cancelled before it returned: ``is_error``,
    with the cancellation as its content), or ``"deferred"`` (the call was handed back
    to the application without a result: it waits for a person's approval or for a
    result from outside the loop, and the run pauses; its result, once given, comes in
    a later run under the same ``tool_call_id``); ``reason`` says why.
    """

    execution: Execution
    tool_call_id: str
    name: str
    content: list[Any] = []
    details: Any = None
    is_error: bool = False
    disposition: Disposition = "ran"
    reason: str | None = None


# Retries.


class Retry(Event, kw_only=True, frozen=True, tag="retry"):
    """A failed attempt will be retried as ``execution.next_attempt()``."""

    execution: Execution
    error: str | None = None
    delay_seconds: float = 0.0


class RetryWaitStart(Event, kw_only=True, frozen=True, tag="retry_wait_start"):
    """The loop waits before the next attempt."""

    execution: Execution
    delay_seconds: float = 0.0


class RetryWaitEnd(Event, kw_only=True, frozen=True, tag="retry_wait_end"):
    """The wait before the next attempt is over (or was cancelled)."""

    execution: Execution
    cancelled: bool = False


def event_type(cls: type[Event]) -> str:
    """The record type of an event class: its explicit string tag."""
    tag = cls.__struct_config__.tag
    if cls is Event or not isinstance(tag, str):
        raise TypeError(f"{cls.__qualname__} is not a concrete event class")
    return tag


def _event_classes() -> dict[str, type[Event]]:
    classes: dict[str, type[Event]] = {}
    pending = list(Event.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ == __name__:
            classes[event_type(cls)] = cls
    return dict(sorted(classes.items()))


#: Record type to event class, for every event this module defines.
EVENT_CLASSES: Final[Mapping[str, type[Event]]] = MappingProxyType(_event_classes())
