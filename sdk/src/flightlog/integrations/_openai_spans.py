"""The OpenAI Agents SDK's span data as flightlog's events: what a model call's span
says was sent (chat-completions messages or Responses API items) in flightlog's
messages, with the system prompt apart and tool arguments decoded, and its response."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from flightlog.protocol import events

from ._parts import TEXT_BLOCKS, block_part

__all__ = [
    "ModelFacts",
    "custom",
    "decoded",
    "kind",
    "model_facts",
    "output",
    "request",
    "system_of",
    "to_usage",
]

ModelFacts: TypeAlias = tuple[
    str | None, list[Any], events.AssistantMessage | None, events.Usage | None, dict[str, Any]
]


def kind(data: Any) -> str:
    """A span's kind: its data's type, or for the SDK's own custom spans what they say."""
    found = str(getattr(data, "type", ""))
    if found == "custom":
        return str(custom(data).get("sdk_span_type") or getattr(data, "name", "custom"))
    return found


def custom(data: Any) -> Mapping[str, Any]:
    # The SDK's own custom spans (task, turn) say what they hold in their export.
    exported = data.export()
    found = exported.get("data") if isinstance(exported, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def to_usage(usage: Any) -> events.Usage | None:
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("input_tokens_details")
    cached = usage.get("cached_input_tokens")
    if cached is None and isinstance(details, Mapping):
        cached = details.get("cached_tokens")
    return events.Usage(
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cache_read_tokens=int(cached or 0),
        cache_write_tokens=int(usage.get("cache_write_input_tokens") or 0),
    )


def output(text: str, output_type: str | None) -> Any:
    if output_type in (None, "str"):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def decoded(text: Any) -> dict[str, Any]:
    """Tool call arguments as an object: decoded from their JSON text."""
    if isinstance(text, Mapping):
        return dict(text)
    try:
        value = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}


def model_facts(data: Any) -> ModelFacts:
    """Model, input, response message, usage and provider state of a model call's span."""
    if kind(data) == "response":
        return _response_facts(data)
    model = getattr(data, "model", None)
    messages = list(getattr(data, "input", None) or [])
    usage = to_usage(getattr(data, "usage", None))
    message = None
    state: dict[str, Any] = {}
    for item in getattr(data, "output", None) or []:
        if "output" in item:  # a streamed call's output: a Responses API response
            message = _response_message(item)
            state = {"response_id": item["id"]} if item.get("id") else {}
            continue
        content: list[Any] = []
        text = item.get("content")
        if isinstance(text, str) and text:
            content.append(events.TextPart(text=text))
        if item.get("refusal"):
            content.append(events.TextPart(text=str(item["refusal"])))
        for call in item.get("tool_calls") or []:
            function = call.get("function") or {}
            content.append(
                events.ToolCallPart(
                    id=str(call.get("id") or ""),
                    name=str(function.get("name") or ""),
                    arguments=decoded(function.get("arguments")),
                )
            )
        message = events.AssistantMessage(content=content, model=model)
    return model, messages, message, usage, state


def _response_facts(data: Any) -> ModelFacts:
    response = getattr(data, "response", None)
    raw_input = getattr(data, "input", None)
    messages = list(raw_input) if isinstance(raw_input, list) else []
    if response is None:
        return None, messages, None, None, {}
    dumped = response.model_dump()
    return (
        dumped.get("model"),
        messages,
        _response_message(dumped),
        to_usage(dumped.get("usage")),
        {"response_id": dumped.get("id")},
    )


def _response_message(response: Mapping[str, Any]) -> events.AssistantMessage:
    """A Responses API response (as JSON values) as flightlog's assistant message."""
    content: list[Any] = []
    for item in response.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    content.append(events.TextPart(text=part.get("text") or ""))
                elif part.get("type") == "refusal":
                    content.append(events.TextPart(text=part.get("refusal") or ""))
        elif kind == "function_call":
            content.append(
                events.ToolCallPart(
                    id=str(item.get("call_id") or ""),
                    name=str(item.get("name") or ""),
                    arguments=decoded(item.get("arguments")),
                )
            )
        else:
            content.append(item)
    return events.AssistantMessage(
        content=content, model=response.get("model"), response_id=response.get("id")
    )


def system_of(data: Any) -> tuple[str | None, int]:
    """The system prompt a model call's span says was sent (the chat-completions
    messages' leading system or developer messages, or a response's instructions), and
    how many of the span's input items it takes."""
    if kind(data) == "response":
        response = getattr(data, "response", None)
        instructions = getattr(response, "instructions", None)
        return (instructions if isinstance(instructions, str) and instructions else None), 0
    texts = []
    for item in getattr(data, "input", None) or []:
        if not isinstance(item, Mapping) or item.get("role") not in _SYSTEM:
            break
        texts.append("".join(_texts(item.get("content"))))
    return ("\n\n".join(texts) if texts else None), len(texts)


_SYSTEM = ("system", "developer")


def request(items: Sequence[Any], names: dict[str, str]) -> list[Any]:
    """Chat-completions messages or Responses API input items as flightlog's messages:
    tool calls with their arguments decoded, tool results named after their call
    (``names``: tool call id to tool name, kept up to date from the calls met here),
    system and developer messages as system messages in place (the leading ones that
    are the system prompt, :func:`system_of`, are left out by the caller); items
    flightlog has no message for are kept as they are."""
    out: list[Any] = []
    for item in items:
        if not isinstance(item, Mapping):
            out.append(item)
            continue
        role, type_ = item.get("role"), item.get("type")
        if role in _SYSTEM and type_ in (None, "message"):
            content = item.get("content")
            out.append(
                events.SystemMessage(
                    content=content if isinstance(content, str) else _parts(content)
                )
            )
        elif role == "user" and type_ in (None, "message"):
            content = item.get("content")
            out.append(
                events.UserMessage(content=content if isinstance(content, str) else _parts(content))
            )
        elif role == "assistant" and type_ in (None, "message"):
            parts = _parts(item.get("content"))
            if item.get("refusal"):
                parts.append(events.TextPart(text=str(item["refusal"])))
            for call in item.get("tool_calls") or []:
                function = call.get("function") or {}
                parts.append(
                    _call(names, call.get("id"), function.get("name"), function.get("arguments"))
                )
            out.append(events.AssistantMessage(content=parts))
        elif role == "tool":
            out.append(_result(names, item.get("tool_call_id"), item.get("content")))
        elif type_ == "function_call":
            call = _call(names, item.get("call_id"), item.get("name"), item.get("arguments"))
            out.append(events.AssistantMessage(content=[call]))
        elif type_ == "function_call_output":
            out.append(_result(names, item.get("call_id"), item.get("output")))
        else:
            out.append(dict(item))
    return out


def _call(names: dict[str, str], call_id: Any, name: Any, arguments: Any) -> events.ToolCallPart:
    part = events.ToolCallPart(
        id=str(call_id or ""), name=str(name or ""), arguments=decoded(arguments)
    )
    names[part.id] = part.name
    return part


def _result(names: dict[str, str], call_id: Any, content: Any) -> events.ToolResultMessage:
    found = str(call_id or "")
    return events.ToolResultMessage(
        tool_call_id=found, name=names.get(found, ""), content=_parts(content)
    )


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [
        str(p.get("text") or "")
        for p in content or []
        if isinstance(p, Mapping) and p.get("type") in TEXT_BLOCKS
    ]


def _parts(content: Any) -> list[Any]:
    if content is None:
        return []
    if isinstance(content, str):
        return [events.TextPart(text=content)] if content else []
    parts: list[Any] = []
    for part in content if isinstance(content, list) else [content]:
        found = block_part(part) if isinstance(part, Mapping) else None
        parts.append(part if found is None else found)
    return parts
