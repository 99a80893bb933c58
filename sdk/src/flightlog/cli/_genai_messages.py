"""Recorded messages in the OpenTelemetry GenAI conventions' JSON shape, for the spans of
``flightlog export`` (:mod:`._spans`): roles and parts, no I/O."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["genai_message", "genai_parts", "json_text"]


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def genai_parts(parts: Any) -> list[dict[str, Any]]:
    """The parts of a message in the conventions' JSON shape."""
    if isinstance(parts, str):
        return [{"type": "text", "content": parts}]
    if not isinstance(parts, list):
        return [{"type": "text", "content": json_text(parts)}]
    converted: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("$type") if isinstance(part, dict) else None
        if kind == "text":
            converted.append({"type": "text", "content": part.get("text", "")})
        elif kind == "thinking":
            converted.append({"type": "reasoning", "content": part.get("thinking", "")})
        elif kind == "tool_call":
            converted.append(
                {
                    "type": "tool_call",
                    "id": part.get("id"),
                    "name": part.get("name"),
                    "arguments": part.get("arguments"),
                }
            )
        elif kind in ("image", "file"):
            converted.append({"type": "blob", "mime_type": part.get("media_type")})
        else:
            converted.append({"type": "text", "content": json_text(part)})
    return converted


def genai_message(message: Any, finish_reason: str | None = None) -> dict[str, Any]:
    """A recorded message in the conventions' shape (role, parts)."""
    kind = message.get("$type") if isinstance(message, dict) else None
    if kind in ("user", "system"):
        return {"role": kind, "parts": genai_parts(message.get("content"))}
    if kind == "assistant":
        converted: dict[str, Any] = {
            "role": "assistant",
            "parts": genai_parts(message.get("content")),
        }
        if finish_reason is not None:
            converted["finish_reason"] = finish_reason
        return converted
    if kind == "tool_result":
        return {
            "role": "tool",
            "parts": [
                {
                    "type": "tool_call_response",
                    "id": message.get("tool_call_id"),
                    "response": message.get("content"),
                }
            ],
        }
    return {"role": "user", "parts": genai_parts(message)}
