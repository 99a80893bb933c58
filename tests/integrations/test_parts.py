"""``_parts``: the frameworks' content blocks as flightlog's parts (docs/format.md 4.2).

The conformance suite (test_conformance.py) holds each framework's shapes end to end;
these hold the rules a reader relies on, block by block."""

from __future__ import annotations

import pytest

from flightlog.integrations._parts import block_part, data_url, file_part
from flightlog.protocol import events


def test_a_data_url_is_its_media_type_and_base64() -> None:
    assert data_url("data:image/png;base64,iVBO") == ("image/png", "iVBO")
    assert data_url("data:text/plain,hello") is None  # not base64: a URL like another
    assert data_url("https://example.com/a.png") is None
    block = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}
    assert block_part(block) == events.ImagePart(media_type="image/png", data="iVBO")


@pytest.mark.parametrize(
    ("block", "part"),
    [
        (
            {"type": "image_url", "image_url": "https://example.com/sky.jpg"},
            events.ImagePart(media_type="image/jpeg", data="https://example.com/sky.jpg"),
        ),
        (
            {"type": "image", "url": "https://example.com/sky"},
            events.ImagePart(media_type="image/*", data="https://example.com/sky"),
        ),
        (
            {"type": "input_image", "file_id": "file-1"},
            events.FilePart(media_type="image/*", file_id="file-1"),
        ),
        (
            {"type": "audio", "base64": "UklG"},
            events.FilePart(media_type="audio/*", data="UklG"),
        ),
        (
            {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
            events.FilePart(media_type="video/mp4", data="https://example.com/v.mp4"),
        ),
        (
            {"type": "input_file", "file_data": "JVBER", "filename": "a.pdf"},
            events.FilePart(media_type="application/pdf", data="JVBER", name="a.pdf"),
        ),
        (
            {"type": "file", "source_type": "id", "id": "file-2"},
            events.FilePart(media_type="application/octet-stream", file_id="file-2"),
        ),
        (
            {"type": "text-plain", "text": "hi", "mime_type": "text/markdown"},
            events.FilePart(media_type="text/markdown", data="aGk="),
        ),
        ({"type": "refusal", "refusal": "no"}, events.TextPart(text="no")),
    ],
)
def test_each_shape_as_its_part(block: dict[str, object], part: object) -> None:
    assert block_part(block) == part


def test_a_block_of_no_known_kind_is_left_as_it_is() -> None:
    # None: the integration writes the block itself (with its class, or as JSON).
    assert block_part({"type": "reasoning", "summary": []}) is None
    assert block_part({"type": "image"}) is None  # neither bytes, URL nor file id
    assert file_part("file") is None
