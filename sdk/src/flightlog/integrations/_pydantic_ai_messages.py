"""pydantic-ai's messages, settings and tools as flightlog's events."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_ai import DeferredToolRequests, RunContext
from pydantic_ai.messages import ModelResponse
from pydantic_ai.tools import ToolDefinition

from flightlog.protocol import events

from ._parts import file_part

__all__ = [
    "agent_name",
    "assistant",
    "attempt_error",
    "config",
    "declaration",
    "deferred_end",
    "deferred_ends",
    "error_text",
    "request_messages",
    "system_prompt",
    "to_usage",
    "user_part",
]

#: The outcomes of a tool return that the model is shown as an error (pydantic-ai's
#: ``ERROR_OUTCOMES``).
_ERROR_OUTCOMES = ("failed", "retried", "error")

_SETTINGS = {"temperature": "temperature", "max_tokens": "max_tokens", "top_p": "top_p"}


def to_usage(usage: Any) -> events.Usage | None:
    if usage is None:
        return None
    return events.Usage(
        input_tokens=getattr(usage, "input_tokens", 0) or 0,
        output_tokens=getattr(usage, "output_tokens", 0) or 0,
        cache_read_tokens=getattr(usage, "cache_read_tokens", 0) or 0,
        cache_write_tokens=getattr(usage, "cache_write_tokens", 0) or 0,
    )


def config(
    model: str | None, provider: str | None, settings: Mapping[str, Any] | None
) -> events.CallConfig:
    settings = dict(settings or {})
    known = {field: settings.pop(key) for key, field in _SETTINGS.items() if key in settings}
    stop = settings.pop("stop_sequences", None) or []
    return events.CallConfig(
        model=model or "?",
        provider=provider,
        stop=[str(s) for s in stop],
        extra=settings,
        **known,
    )


def declaration(tool: ToolDefinition) -> events.ToolDeclaration:
    return events.ToolDeclaration(
        name=tool.name,
        description=tool.description or "",
        parameters=dict(tool.parameters_json_schema),
    )


def user_part(part: Any) -> Any:
    """A part of a user prompt as flightlog's part: text; an image by URL, or its bytes
    in base64 (an ``image`` part); audio, video, a document, or a file uploaded to the
    provider (a ``file`` part); anything else as it is (written with its class)."""
    if isinstance(part, str):
        return events.TextPart(text=part)
    kind = getattr(part, "kind", None)
    if kind == "text-content":
        return events.TextPart(text=str(part.content))
    if kind in _URLS:
        return file_part(_URLS[kind], url=part.url, media_type=part.media_type)
    if kind == "binary":
        found = next((k for k in _BINARY if getattr(part, f"is_{k}", False)), "file")
        return file_part(found, data=part.base64, media_type=part.media_type)
    if kind == "uploaded-file":
        return file_part("file", file_id=part.file_id, media_type=part.media_type)
    return part


#: pydantic-ai's file URLs, by kind, to the kind of file they are.
_URLS = {"image-url": "image", "audio-url": "audio", "video-url": "video", "document-url": "file"}
_BINARY = ("image", "audio", "video")


def system_prompt(messages: Sequence[Any]) -> str | None:
    """The system prompt a model gets with ``messages``: the system prompt parts of the
    whole history, then the instructions of its latest request (the integration keeps
    the parts it read, so that a continuing request reads only its new messages')."""
    parts = [
        part.content
        for message in messages
        for part in getattr(message, "parts", ())
        if getattr(part, "part_kind", None) == "system-prompt"
    ]
    instructions = next(
        (m.instructions for m in reversed(messages) if not isinstance(m, ModelResponse)), None
    )
    system = [*parts, *([str(instructions)] if instructions else [])]
    return "\n\n".join(system) if system else None


def request_messages(messages: Sequence[Any]) -> list[Any]:
    """The conversation in flightlog's messages (its system prompt is
    ``model_request.system``).

    Parts flightlog has no message for (files, native tool results) are kept as they are
    (written with their class).
    """
    out: list[Any] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            out.append(assistant(message))
            continue
        for part in getattr(message, "parts", ()):
            kind = getattr(part, "part_kind", None)
            if kind == "system-prompt":
                continue
            if kind == "user-prompt":
                content = part.content
                out.append(
                    events.UserMessage(
                        content=content
                        if isinstance(content, str)
                        else [user_part(p) for p in content]
                    )
                )
            elif kind == "retry-feedback":
                # pydantic-ai's feedback on a response it could not use: the model is
                # shown its text in the user's voice (a system one for "no_output").
                out.append(events.UserMessage(content=part.model_response()))
            elif kind == "tool-return":
                out.append(
                    events.ToolResultMessage(
                        tool_call_id=part.tool_call_id,
                        name=part.tool_name or "",
                        content=[events.TextPart(text=part.model_response_str())],
                        is_error=getattr(part, "outcome", None) in _ERROR_OUTCOMES,
                    )
                )
            elif kind == "retry-prompt":
                # Deprecated by pydantic-ai, still in older histories.
                out.append(
                    events.ToolResultMessage(
                        tool_call_id=part.tool_call_id,
                        name=part.tool_name or "",
                        content=[events.TextPart(text=part.model_response())],
                        is_error=True,
                    )
                )
            else:
                out.append(part)
    return out


def assistant(response: ModelResponse) -> events.AssistantMessage:
    content: list[Any] = []
    parts: Sequence[Any] = response.parts
    for part in parts:
        kind = getattr(part, "part_kind", None)
        if kind == "text":
            content.append(events.TextPart(text=part.content))
        elif kind == "thinking":
            content.append(events.ThinkingPart(thinking=part.content, signature=part.signature))
        elif kind == "tool-call":
            content.append(
                events.ToolCallPart(
                    id=part.tool_call_id, name=part.tool_name, arguments=part.args_as_dict()
                )
            )
        else:
            content.append(part)
    return events.AssistantMessage(
        content=content,
        model=response.model_name,
        provider=response.provider_name,
        stop_reason=response.finish_reason,
        response_id=response.provider_response_id,
    )


def deferred_end(
    execution: events.Execution, call: Any, reason: str, asked: Any = None
) -> events.ToolExecEnd:
    """The end of a call pydantic-ai handed back to the application: ``reason`` is
    ``approval`` (it waits for a person's approval) or the kind of a deferral
    (``external``: its result comes from outside the loop); ``asked`` its metadata."""
    return events.ToolExecEnd(
        execution=execution,
        tool_call_id=call.tool_call_id,
        name=call.tool_name,
        details=asked,
        disposition="deferred",
        reason=reason,
    )


def deferred_ends(output: Any, ended: set[str], execution: Any) -> tuple[list[events.Event], bool]:
    """The calls a run that ends with ``DeferredToolRequests`` hands back and no hook
    of the capability met (a tool that requires approval is never executed), each as
    its ``tool_exec_start`` and deferred ``tool_exec_end``; ``ended`` holds the tool
    call ids already ended, ``execution()`` makes each call's execution.  Also whether
    the run ended so (it pauses)."""
    if not isinstance(output, DeferredToolRequests):
        return [], False
    facts: list[events.Event] = []
    metadata = output.metadata or {}
    for calls, reason in ((output.calls, "external"), (output.approvals, "approval")):
        for call in calls:
            if call.tool_call_id in ended:
                continue
            made = execution()
            facts.append(
                events.ToolExecStart(
                    execution=made,
                    tool_call_id=call.tool_call_id,
                    name=call.tool_name,
                    arguments=call.args_as_dict(),
                )
            )
            facts.append(deferred_end(made, call, reason, metadata.get(call.tool_call_id)))
    return facts, True


def attempt_error(attempt: Any) -> str | None:
    """Why a fallback moved on from an attempt (its ``ModelRequestAttempt``)."""
    if attempt is None or isinstance(attempt, str):
        return attempt
    error = getattr(attempt, "error", None)
    if error:
        return str(error)
    model = getattr(attempt, "model_name", None) or "the model"
    return f"{getattr(attempt, 'outcome', 'rejected')}: the response of {model} was rejected"


def agent_name(ctx: RunContext[Any]) -> str:
    agent = ctx.agent
    return (agent.name if agent is not None else None) or "agent"


def error_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
