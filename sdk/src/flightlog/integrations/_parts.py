"""Images, files and audio in the frameworks' content blocks as flightlog's parts.

One reading for every integration: LangChain's standard content blocks (its ``v1``
shape, ``{"type": "image", "base64" | "url" | "file_id": …, "mime_type": …}``, and
its older ``source_type`` shape), and the OpenAI shapes that LangChain accepts and the
OpenAI Agents SDK sends (chat-completions ``image_url``, ``input_audio``, ``file`` and
``video_url`` parts; Responses API ``input_image``, ``input_file`` and ``input_audio``
items).  docs/format.md section 4.2 says what the parts hold:

* an image sent as bytes or by URL is an ``image`` part: a ``data:`` URL as its media
  type and base64 (the bytes the model gets), any other URL as it is;
* audio, video, documents and other files, and an image known only by a provider's file
  id, are a ``file`` part with the same ``data`` rules, its file name and file id;
* a media type not given is guessed from the URL or file name, else ``image/*``,
  ``audio/*``, ``video/*`` or ``application/octet-stream``.
"""

from __future__ import annotations

import base64
import mimetypes
from collections.abc import Mapping
from typing import Any, Final

from flightlog.protocol import events

__all__ = ["TEXT_BLOCKS", "block_part", "data_url", "file_part"]

#: The block types whose ``text`` is what the model reads.
TEXT_BLOCKS: Final = frozenset({"text", "input_text", "output_text"})

_UNKNOWN: Final = {
    "image": "image/*",
    "audio": "audio/*",
    "video": "video/*",
    "file": "application/octet-stream",
}


def data_url(value: str) -> tuple[str, str] | None:
    """``(media type, base64)`` of a ``data:<media type>;base64,<payload>`` URL, else None."""
    if not value.startswith("data:"):
        return None
    head, comma, payload = value.partition(",")
    if not comma or not head.endswith(";base64"):
        return None
    return head[5:].split(";", 1)[0], payload


def file_part(
    kind: str,
    *,
    url: Any = None,
    data: Any = None,
    file_id: Any = None,
    media_type: Any = None,
    name: Any = None,
) -> events.ImagePart | events.FilePart | None:
    """The part of a ``kind`` (``image``, ``audio``, ``video``, ``file``) sent as the
    base64 ``data``, a ``url`` (a ``data:`` URL is its bytes) or a ``file_id``; None
    when it holds none of them."""
    url = url if isinstance(url, str) and url else None
    data = data if isinstance(data, str) and data else None
    file_id = file_id if isinstance(file_id, str) and file_id else None
    name = name if isinstance(name, str) and name else None
    media = media_type if isinstance(media_type, str) and media_type else None
    if url is not None and (inline := data_url(url)) is not None:
        media, data, url = media or inline[0] or None, inline[1], None
    if url is None and data is None and file_id is None:
        return None
    if media is None:
        where = url or name
        media = (mimetypes.guess_type(where)[0] if where else None) or _UNKNOWN[kind]
    if kind == "image" and file_id is None:
        return events.ImagePart(media_type=media, data=data or url or "")
    return events.FilePart(media_type=media, data=data or url or "", name=name, file_id=file_id)


def block_part(block: Mapping[str, Any]) -> Any:
    """A content block as flightlog's part: text, an image or another file; None for a
    block of another kind (which the integration keeps as it is)."""
    kind = block.get("type")
    if kind in TEXT_BLOCKS:
        return events.TextPart(text=str(block.get("text") or ""))
    if kind == "refusal":
        return events.TextPart(text=str(block.get("refusal") or ""))
    if kind == "text-plain":
        # LangChain's plain-text document: a file of text, not words of the message.
        text = str(block.get("text") or "").encode()
        media = block.get("mime_type") or "text/plain"
        return file_part("file", data=base64.b64encode(text).decode(), media_type=media)
    if kind in _UNKNOWN and not isinstance(block.get("file"), Mapping):
        return _standard(str(kind), block)
    return _openai(block)


def _standard(kind: str, block: Mapping[str, Any]) -> Any:
    extras = block.get("extras")
    metadata = block.get("metadata")
    name = block.get("filename") or next(
        (m.get("filename") for m in (extras, metadata) if isinstance(m, Mapping)), None
    )
    media = block.get("mime_type")
    source = block.get("source_type")
    if source is not None:  # the older shape: what "data", "url" or "id" hold
        if source == "text":
            return block_part({"type": "text-plain", "text": block.get("text"), "mime_type": media})
        return file_part(
            kind,
            url=block.get("url") if source == "url" else None,
            data=block.get("data") if source == "base64" else None,
            file_id=block.get("id") if source == "id" else None,
            media_type=media,
            name=name,
        )
    return file_part(
        kind,
        url=block.get("url"),
        data=block.get("base64"),
        file_id=block.get("file_id"),
        media_type=media,
        name=name,
    )


def _openai(block: Mapping[str, Any]) -> Any:
    kind = block.get("type")
    if kind == "image_url":
        image = block.get("image_url")
        return file_part("image", url=image.get("url") if isinstance(image, Mapping) else image)
    if kind == "input_image":
        return file_part("image", url=block.get("image_url"), file_id=block.get("file_id"))
    if kind == "video_url":
        video = block.get("video_url")
        return file_part("video", url=video.get("url") if isinstance(video, Mapping) else video)
    if kind == "input_audio":
        audio = block.get("input_audio")
        audio = audio if isinstance(audio, Mapping) else block
        media = f"audio/{audio['format']}" if audio.get("format") else None
        return file_part("audio", data=audio.get("data"), media_type=media)
    if kind in ("file", "input_file"):
        found = block.get("file")
        found = found if isinstance(found, Mapping) else block
        inline = found.get("file_data")
        decoded = data_url(inline) if isinstance(inline, str) else None
        return file_part(
            "file",
            url=found.get("file_url"),
            data=decoded[1] if decoded else inline,
            media_type=decoded[0] if decoded else None,
            file_id=found.get("file_id"),
            name=found.get("filename"),
        )
    return None
