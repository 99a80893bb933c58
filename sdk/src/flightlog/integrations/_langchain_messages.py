"""LangChain's messages as flightlog's: each kind as its message type, in place (a
system message in the conversation's course too), content blocks as parts (images,
files and audio as :mod:`._parts` reads them), and a run's input and final output."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from langchain_core.messages import BaseMessage

from flightlog.protocol import events

from ._parts import block_part

__all__ = ["final_output", "input_messages", "parts", "to_message", "tool_content"]

_CHUNKS: Final = {
    "AIMessageChunk": "ai",
    "HumanMessageChunk": "human",
    "ToolMessageChunk": "tool",
    "SystemMessageChunk": "system",
}

#: The roles of a ``(role, text)`` pair of a run's input, to their messages.
_ROLES: Final = {"user": "human", "human": "human", "system": "system"}


def parts(content: Any) -> list[Any]:
    """A message's content as flightlog's parts; a block of no known kind as it is."""
    if isinstance(content, str):
        return [events.TextPart(text=content)] if content else []
    found: list[Any] = []
    for block in content or []:
        if isinstance(block, str):
            found.append(events.TextPart(text=block))
            continue
        part = block_part(block) if isinstance(block, Mapping) else None
        found.append(block if part is None else part)
    return found


def tool_content(content: Any) -> list[Any]:
    if isinstance(content, str | list):
        return parts(content)
    return [events.TextPart(text=str(content))] if content is not None else []


def _said(content: Any) -> list[Any] | str:
    return content if isinstance(content, str) else parts(content)


def to_message(value: Any) -> Any:
    """A LangChain message as flightlog's message; other values as they are."""
    kind = getattr(value, "type", None)
    # A streamed response is a chunk (AIMessageChunk), its pieces added up.
    kind = _CHUNKS.get(kind, kind) if isinstance(kind, str) else kind
    content = getattr(value, "content", None)
    if kind == "human":
        return events.UserMessage(content=_said(content))
    if kind == "system":
        return events.SystemMessage(content=_said(content))
    if kind == "ai":
        found = parts(content)
        for call in getattr(value, "tool_calls", None) or []:
            found.append(
                events.ToolCallPart(
                    id=str(call.get("id") or ""),
                    name=str(call.get("name") or ""),
                    arguments=dict(call.get("args") or {}),
                )
            )
        metadata = getattr(value, "response_metadata", None) or {}
        return events.AssistantMessage(
            content=found,
            model=metadata.get("model_name") or metadata.get("model"),
            stop_reason=metadata.get("finish_reason") or metadata.get("stop_reason"),
            response_id=metadata.get("id"),
        )
    if kind == "tool":
        return events.ToolResultMessage(
            tool_call_id=str(getattr(value, "tool_call_id", "") or ""),
            name=str(getattr(value, "name", "") or ""),
            content=tool_content(content),
            is_error=getattr(value, "status", None) == "error",
        )
    return value


def input_messages(inputs: Any) -> list[Any]:
    """The messages a run was invoked with."""
    if isinstance(inputs, str):
        # invoke("…"): the question itself.
        return [events.UserMessage(content=inputs)]
    if isinstance(inputs, BaseMessage):
        return [to_message(inputs)]
    messages = inputs.get("messages") if isinstance(inputs, Mapping) else inputs
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        return []
    converted: list[Any] = []
    for item in messages:
        role = _ROLES.get(item[0]) if isinstance(item, tuple) and len(item) == 2 else None
        if role == "human":
            converted.append(events.UserMessage(content=str(item[1])))
        elif role == "system":
            converted.append(events.SystemMessage(content=str(item[1])))
        else:
            converted.append(to_message(item))
    return converted


def final_output(outputs: Any) -> Any:
    """A run's output: the structured response, else the last message's text."""
    if isinstance(outputs, Mapping):
        if outputs.get("structured_response") is not None:
            return outputs["structured_response"]
        messages = outputs.get("messages")
        if isinstance(messages, Sequence) and messages:
            last = messages[-1]
            content = getattr(last, "content", None)
            if isinstance(content, str):
                return content
            return to_message(last)
    content = getattr(outputs, "content", None)
    return content if isinstance(content, str) else outputs
