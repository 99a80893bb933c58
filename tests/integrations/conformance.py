"""The transcript conformance suite's normal form: what a model call was sent, as a
framework holds it and as flightlog rebuilds it, in one shape to compare.

Each side is turned into a :class:`Sent`: the system prompt (one string, or None) and
the conversation as plain dicts, one per message:

- ``{"user": [parts]}``, ``{"assistant": [parts]}``, ``{"tool": id, "name": name,
  "text": text, "error": bool}``;
- a part is ``{"text": t}``, ``{"thinking": t}`` or ``{"call": id, "name": name,
  "args": {...}}`` (arguments decoded from JSON where the framework holds them as text);
  anything else is kept as ``{"other": value}``, so that it never passes unnoticed.

The rules (docs/integrations.md, "Transcript conformance") are the same for every
framework, applied to both sides:

1. The system prompt is compared apart, as one string: the framework's system messages
   (pydantic-ai's system prompt parts, then the latest request's instructions; LangChain's
   leading system messages; the OpenAI Agents SDK's ``system_instructions`` and its
   input's leading system items) joined by a blank line, and ``Prompt.system`` with the
   rebuilt prompt's leading system messages.  A system message after another message
   is ``{"system": [parts]}`` in its place.
2. A message is one per role change: pydantic-ai's request parts are one message each;
   consecutive assistant messages are one (the OpenAI Agents SDK holds a response's text
   and each of its tool calls as separate items, chat-completions sends them as one).
3. A text given as a string and as a list of text parts are the same; empty text parts
   are dropped.
4. What a model is not sent is not compared: a response's model name, provider, finish
   reason, response id and usage, message ids, timestamps.
5. A tool result is its text (what the model reads), its call's id and tool name (the
   name of the call of that id, where the framework's result does not carry it), and
   whether it is an error.
6. An image or another file (a document, audio, video) is ``{"image" | "file": data,
   "type": media type, "name": file name, "id": file id}``: ``data`` is its base64, its
   URL, or empty when it is sent by a provider's file id; a ``data:`` URL is its media
   type and base64; a media type not given is guessed from the URL or the file name,
   else ``image/*``, ``audio/*``, ``video/*``, ``application/octet-stream``; audio and
   video are files, and so is an image sent by file id alone.  An image's ``detail``
   hint is not compared.
"""

from __future__ import annotations

import base64
import json
import mimetypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flightlog.sdk import Prompt

__all__ = [
    "PDF64",
    "PNG64",
    "WAV64",
    "Sent",
    "from_langchain",
    "from_openai_agents",
    "from_prompt",
    "from_pydantic_ai",
]


#: Small files the multimodal scenarios send (base64).
PNG64 = base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR").decode()
PDF64 = base64.b64encode(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n").decode()
WAV64 = base64.b64encode(b"RIFF\x24\x00\x00\x00WAVEfmt ").decode()


@dataclass(frozen=True)
class Sent:
    """What one model call was sent, in the normal form."""

    system: str | None
    messages: list[dict[str, Any]]


def _joined(texts: Sequence[str]) -> str | None:
    texts = [t for t in texts if t]
    return "\n\n".join(texts) if texts else None


def _text(text: str) -> list[dict[str, Any]]:
    return [{"text": text}] if text else []


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments else {}
        except ValueError:
            return {"arguments": arguments}
    return dict(arguments) if isinstance(arguments, Mapping) else arguments


_UNKNOWN = {
    "image": "image/*",
    "audio": "audio/*",
    "video": "video/*",
    "file": "application/octet-stream",
}


def media(
    kind: str,
    *,
    data: str | None = None,
    url: str | None = None,
    media_type: str | None = None,
    name: str | None = None,
    file_id: str | None = None,
) -> dict[str, Any]:
    """The normal form of an image or another file (rule 6)."""
    if url and url.startswith("data:") and ";base64," in url:
        head, _, data = url.partition(",")
        media_type, url = media_type or head[5:].split(";")[0], None
    if not media_type:
        where = url or name
        media_type = (mimetypes.guess_type(where)[0] if where else None) or _UNKNOWN[kind]
    key = "image" if kind == "image" and not file_id else "file"
    return {key: data or url or "", "type": media_type, "name": name, "id": file_id}


def _merged(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if "assistant" in message and out and "assistant" in out[-1]:
            out[-1] = {"assistant": [*out[-1]["assistant"], *message["assistant"]]}
        else:
            out.append(message)
    return out


def _sent(system: str | None, messages: list[dict[str, Any]]) -> Sent:
    lead = [system or ""]
    while messages and "system" in messages[0]:
        lead.append("".join(p.get("text", "") for p in messages.pop(0)["system"]))
    return Sent(system=_joined(lead), messages=_merged(messages))


# --- flightlog's side: a rebuilt prompt ----------------------------------------------


def _flightlog_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return _text(content)
    parts: list[dict[str, Any]] = []
    for part in content or []:
        kind = part.get("$type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts += _text(part["text"])
        elif kind == "thinking":
            parts.append({"thinking": part["thinking"]})
        elif kind == "tool_call":
            parts.append({"call": part["id"], "name": part["name"], "args": part["arguments"]})
        elif kind == "image":
            parts.append(
                {"image": part["data"], "type": part["media_type"], "name": None, "id": None}
            )
        elif kind == "file":
            parts.append(
                {
                    "file": part["data"],
                    "type": part["media_type"],
                    "name": part.get("name"),
                    "id": part.get("file_id"),
                }
            )
        else:
            parts.append({"other": part})
    return parts


def from_prompt(prompt: Prompt) -> Sent:
    """A prompt rebuilt from the file (flightlog's messages, as JSON values)."""
    out: list[dict[str, Any]] = []
    for message in prompt.messages:
        kind = message.get("$type") if isinstance(message, Mapping) else None
        if kind in ("user", "system"):
            out.append({kind: _flightlog_parts(message["content"])})
        elif kind == "assistant":
            out.append({"assistant": _flightlog_parts(message.get("content"))})
        elif kind == "tool_result":
            texts = [p["text"] for p in _flightlog_parts(message.get("content")) if "text" in p]
            out.append(
                {
                    "tool": message["tool_call_id"],
                    "name": message["name"],
                    "text": "".join(texts),
                    "error": message.get("is_error", False),
                }
            )
        else:
            out.append({"other": message})
    return _sent(prompt.system, out)


# --- pydantic-ai: the messages a FunctionModel is handed -------------------------------


def from_pydantic_ai(messages: Sequence[Any]) -> Sent:
    """pydantic-ai's ``ModelMessage`` list, as a model is handed it."""
    from pydantic_ai.messages import ERROR_OUTCOMES, ModelResponse

    system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            parts: list[dict[str, Any]] = []
            for part in message.parts:
                if part.part_kind == "text":
                    parts += _text(part.content)
                elif part.part_kind == "thinking":
                    parts.append({"thinking": part.content})
                elif part.part_kind == "tool-call":
                    parts.append(
                        {
                            "call": part.tool_call_id,
                            "name": part.tool_name,
                            "args": _args(part.args),
                        }
                    )
                else:
                    parts.append({"other": part})
            out.append({"assistant": parts})
            continue
        for part in message.parts:
            kind = part.part_kind
            if kind == "system-prompt":
                system.append(part.content)
            elif kind == "user-prompt":
                content = part.content
                if isinstance(content, str):
                    out.append({"user": _text(content)})
                else:
                    out.append({"user": [_pydantic_ai_user_part(p) for p in content]})
            elif kind == "tool-return":
                out.append(
                    {
                        "tool": part.tool_call_id,
                        "name": part.tool_name,
                        "text": part.model_response_str(),
                        "error": part.outcome in ERROR_OUTCOMES,
                    }
                )
            elif kind == "retry-feedback":
                # Shown to the model as its user (or, for "no_output", system) voice.
                out.append({"user": _text(part.model_response())})
            elif kind == "retry-prompt":
                out.append(
                    {
                        "tool": part.tool_call_id,
                        "name": part.tool_name or "",
                        "text": part.model_response(),
                        "error": True,
                    }
                )
            else:
                out.append({"other": part})
    instructions = next(
        (m.instructions for m in reversed(messages) if not isinstance(m, ModelResponse)), None
    )
    return _sent(_joined([*system, instructions or ""]), out)


def _pydantic_ai_user_part(part: Any) -> dict[str, Any]:
    if isinstance(part, str):
        return {"text": part}
    urls = {
        "image-url": "image",
        "audio-url": "audio",
        "video-url": "video",
        "document-url": "file",
    }
    if part.kind in urls:
        return media(urls[part.kind], url=part.url, media_type=part.media_type)
    if part.kind == "binary":
        kind = "image" if part.is_image else "file"
        return media(kind, data=part.base64, media_type=part.media_type)
    if part.kind == "uploaded-file":
        return media("file", file_id=part.file_id, media_type=part.media_type)
    return {"other": part}


# --- LangChain: the messages a chat model is handed ----------------------------------


def _langchain_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return _text(content)
    parts: list[dict[str, Any]] = []
    for block in content or []:
        if isinstance(block, str):
            parts += _text(block)
        elif isinstance(block, Mapping) and block.get("type") == "text":
            parts += _text(str(block.get("text") or ""))
        else:
            parts.append({"other": block})
    return parts


def _langchain_blocks(message: Any) -> list[dict[str, Any]]:
    """A user or system message's content as LangChain's own standard blocks read it."""
    parts: list[dict[str, Any]] = []
    for block in message.content_blocks:
        kind = block["type"]
        if kind == "text":
            parts += _text(block["text"])
        elif kind in ("image", "audio", "video", "file"):
            extras = block.get("extras") or {}
            parts.append(
                media(
                    kind,
                    data=block.get("base64"),
                    url=block.get("url"),
                    media_type=block.get("mime_type"),
                    name=block.get("filename") or extras.get("filename"),
                    file_id=block.get("file_id"),
                )
            )
        else:
            parts.append({"other": block})
    return parts


def from_langchain(messages: Sequence[Any]) -> Sent:
    """LangChain's ``BaseMessage`` list, as a chat model is handed it."""
    out: list[dict[str, Any]] = []
    for message in messages:
        kind = message.type
        if kind == "system":
            out.append({"system": _langchain_blocks(message)})
        elif kind == "human":
            out.append({"user": _langchain_blocks(message)})
        elif kind == "ai":
            parts = _langchain_parts(message.content)
            parts += [
                {"call": c["id"], "name": c["name"], "args": dict(c["args"])}
                for c in message.tool_calls
            ]
            out.append({"assistant": parts})
        elif kind == "tool":
            texts = [p["text"] for p in _langchain_parts(message.content) if "text" in p]
            out.append(
                {
                    "tool": message.tool_call_id,
                    "name": message.name or "",
                    "text": "".join(texts),
                    "error": message.status == "error",
                }
            )
        else:
            out.append({"other": message})
    return _sent(None, out)


# --- OpenAI Agents SDK: the input a model is handed -----------------------------------

_TEXTS = ("text", "input_text", "output_text")


def _openai_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return _text(content)
    parts: list[dict[str, Any]] = []
    for part in content or []:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXTS:
            parts += _text(str(part.get("text") or ""))
        elif kind == "refusal":
            parts += _text(str(part.get("refusal") or ""))
        elif kind == "input_image":
            parts.append(media("image", url=part.get("image_url"), file_id=part.get("file_id")))
        elif kind == "input_file":
            parts.append(
                media(
                    "file",
                    url=part.get("file_data") or part.get("file_url"),
                    name=part.get("filename"),
                    file_id=part.get("file_id"),
                )
            )
        elif kind == "input_audio":
            audio = part["input_audio"]
            parts.append(media("audio", data=audio["data"], media_type=f"audio/{audio['format']}"))
        else:
            parts.append({"other": part})
    return parts


def from_openai_agents(system_instructions: str | None, items: Sequence[Any]) -> Sent:
    """The OpenAI Agents SDK's model input: its system instructions and its Responses
    API input items (a string input is one user message)."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for item in items:
        item = dict(item)
        role, kind = item.get("role"), item.get("type")
        if role in ("system", "developer"):
            out.append({"system": _openai_parts(item.get("content"))})
        elif role == "user" and kind in (None, "message"):
            out.append({"user": _openai_parts(item.get("content"))})
        elif role == "assistant" and kind in (None, "message"):
            out.append({"assistant": _openai_parts(item.get("content"))})
        elif kind == "function_call":
            names[item["call_id"]] = item["name"]
            call = {"call": item["call_id"], "name": item["name"], "args": _args(item["arguments"])}
            out.append({"assistant": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            texts = [p["text"] for p in _openai_parts(output) if "text" in p]
            out.append(
                {
                    "tool": item["call_id"],
                    "name": names.get(item["call_id"], ""),
                    "text": "".join(texts),
                    "error": False,
                }
            )
        else:
            out.append({"other": item})
    return _sent(system_instructions or None, out)
