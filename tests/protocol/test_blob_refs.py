"""Blob references (``flightlog.protocol._blobs``): a base64 payload taken out of a line
comes back as the very bytes; anything that is not a payload value stays as it is."""

from __future__ import annotations

import base64
import hashlib
import os
import struct

import msgspec
import pytest

from flightlog.protocol._blobs import (
    BLOB_MIN,
    BlobRef,
    extract,
    extract_tails,
    has_references,
    references,
    resolve,
    sniff_media_type,
)

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 24
PNG64 = base64.b64encode(PNG).decode()


def line(value: object) -> bytes:
    return msgspec.json.encode({"data": value})


def test_a_payload_is_taken_out_and_put_back_exactly() -> None:
    original = line({"$type": "image", "media_type": "image/png", "data": PNG64, "n": 1})
    changed, blobs = extract(original)
    assert [(b.sha256, b.media_type, b.data) for b in blobs] == [
        (hashlib.sha256(PNG).hexdigest(), "image/png", PNG)
    ]
    assert PNG64.encode() not in changed and len(changed) < 300
    assert msgspec.json.decode(changed)["data"]["data"] == {
        "$flightlog": "blob",
        "sha256": blobs[0].sha256,
        "media_type": "image/png",
        "size": len(PNG),
        "form": "base64",
    }
    assert references(changed) == [BlobRef(blobs[0].sha256, "image/png", len(PNG))]
    assert has_references(msgspec.Raw(changed)) and not has_references(original)
    assert resolve(changed, {blobs[0].sha256: PNG}.get) == original


def test_a_data_url_keeps_its_media_type_and_form() -> None:
    original = line([{"url": f"data:audio/x-wav;base64,{PNG64}"}, "after"])
    changed, blobs = extract(original)
    assert blobs[0].media_type == "audio/x-wav"
    assert b'"form":"data_url"' in changed
    assert resolve(changed, {blobs[0].sha256: PNG}.get) == original


def test_the_same_payload_twice_is_one_digest() -> None:
    changed, blobs = extract(line([PNG64, {"again": PNG64}]))
    assert len(blobs) == 2 and blobs[0].sha256 == blobs[1].sha256
    assert resolve(changed, {blobs[0].sha256: PNG}.get) == line([PNG64, {"again": PNG64}])


@pytest.mark.parametrize(
    "value",
    [
        "A" * (BLOB_MIN - 4),  # too short
        "QUJD" * BLOB_MIN + "QQ",  # not a multiple of four: not base64
        PNG64[:-4] + "AB==",  # padding that does not come back the same (not canonical)
        "hello world " * 1000,  # not base64 at all
    ],
)
def test_what_is_not_a_canonical_payload_stays(value: str) -> None:
    original = line(value)
    assert extract(original) == (original, [])


def test_a_key_and_an_escaped_quote_are_not_values() -> None:
    # An object's key, and base64 between escaped quotes inside another string.
    original = line({PNG64: 1, "text": f'say "{PNG64}" twice'})
    assert extract(original) == (original, [])


def test_resolve_keeps_a_reference_whose_blob_is_missing_or_damaged() -> None:
    changed, blobs = extract(line(PNG64))
    assert resolve(changed, {}.get) == changed
    assert resolve(changed, {blobs[0].sha256: PNG[:-1] + b"x"}.get) == changed
    assert resolve(changed, {blobs[0].sha256: PNG[:-1]}.get) == changed


def test_media_types_are_sniffed() -> None:
    assert sniff_media_type(b"\xff\xd8\xff\xe0") == "image/jpeg"
    assert sniff_media_type(b"RIFF\0\0\0\0WEBPVP8 ") == "image/webp"
    assert sniff_media_type(b"RIFF\0\0\0\0WAVEfmt ") == "audio/wav"
    assert sniff_media_type(b"%PDF-1.7") == "application/pdf"
    assert sniff_media_type(os.urandom(2) + b"\0" * 8) in ("application/octet-stream",)


def test_line_tails_are_rewritten_each_on_its_own() -> None:
    small = b',"type":"x","time":"t","run_id":"r","data":{"a":1}}\n'
    large = b',"type":"x","time":"t","run_id":"r","data":' + line(PNG64) + b"}\n"
    tails = bytearray()
    for tail in (small, large, small):
        tails += struct.pack("=I", len(tail)) + tail
    changed, blobs = extract_tails(tails)
    assert len(blobs) == 1
    parts = []
    at = 0
    while at < len(changed):
        (length,) = struct.unpack_from("=I", changed, at)
        parts.append(bytes(changed[at + 4 : at + 4 + length]))
        at += 4 + length
    assert parts[0] == parts[2] == small
    assert parts[1].endswith(b"}\n") and PNG64.encode() not in parts[1]
    assert resolve(parts[1], {blobs[0].sha256: PNG}.get) == large
    assert extract_tails(bytearray(struct.pack("=I", len(small)) + small))[1] == []
