"""LangChain's usage, tools, system prompts and LangGraph interrupts as flightlog's values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flightlog.protocol import events

__all__ = [
    "added",
    "declaration",
    "interrupts",
    "is_interrupt",
    "provider_state",
    "system_prompt",
    "to_usage",
]


def to_usage(usage: Any) -> events.Usage | None:
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("input_token_details") or {}
    return events.Usage(
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cache_read_tokens=int(details.get("cache_read") or 0),
        cache_write_tokens=int(details.get("cache_creation") or 0),
    )


def added(total: events.Usage | None, usage: events.Usage | None) -> events.Usage | None:
    if usage is None:
        return total
    if total is None:
        return usage
    return events.Usage(
        input_tokens=total.input_tokens + usage.input_tokens,
        output_tokens=total.output_tokens + usage.output_tokens,
        cache_read_tokens=total.cache_read_tokens + usage.cache_read_tokens,
        cache_write_tokens=total.cache_write_tokens + usage.cache_write_tokens,
    )


def provider_state(message: Any) -> dict[str, Any]:
    metadata = getattr(message, "response_metadata", None)
    if isinstance(metadata, Mapping) and metadata.get("id"):
        return {"response_id": metadata["id"]}
    return {}


def declaration(tool: Any) -> events.ToolDeclaration:
    function = tool.get("function", tool) if isinstance(tool, Mapping) else {}
    return events.ToolDeclaration(
        name=str(function.get("name") or "?"),
        description=str(function.get("description") or ""),
        parameters=dict(function.get("parameters") or {}),
    )


def is_interrupt(error: BaseException) -> bool:
    # LangGraph's GraphInterrupt, without importing LangGraph for a LangChain-only user.
    return any(kind.__name__ == "GraphInterrupt" for kind in type(error).__mro__)


def interrupts(error: BaseException) -> dict[str, Any]:
    """What a GraphInterrupt's interrupts asked, by interrupt id."""
    asked = error.args[0] if error.args and isinstance(error.args[0], Sequence) else ()
    return {
        str(getattr(one, "id", index)): getattr(one, "value", one)
        for index, one in enumerate(asked)
    }


def system_prompt(messages: Sequence[Any]) -> tuple[str | None, int]:
    """The system prompt of a chat model's ``messages`` (its leading system messages'
    texts, joined by a blank line), and how many messages it takes."""
    texts: list[str] = []
    for message in messages:
        if getattr(message, "type", None) != "system":
            break
        content = getattr(message, "content", "")
        if not isinstance(content, str):
            content = "".join(
                str(block.get("text") or "") if isinstance(block, Mapping) else str(block)
                for block in content or []
                if isinstance(block, str)
                or (isinstance(block, Mapping) and block.get("type") == "text")
            )
        texts.append(content)
    return ("\n\n".join(texts) if texts else None), len(texts)
