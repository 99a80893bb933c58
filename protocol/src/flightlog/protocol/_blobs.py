"""Blob references: large base64 payloads of a record stored once, by digest.

Theory of operation
-------------------
A writer may take a JSON string out of a record's line when it is a base64 payload of
at least :data:`BLOB_MIN` characters (an image, audio, a document: plain base64, or a
``data:MEDIA/TYPE;base64,`` URL), store the decoded bytes once under their SHA-256, and
put a *blob reference* in the string's place, always written exactly so::

    {"$flightlog":"blob","sha256":"<64 hex>","media_type":"image/png","size":12345,"form":"base64"}

``size`` counts the decoded bytes; ``form`` is ``base64`` (the string was the payload)
or ``data_url`` (it was ``data:<media_type>;base64,<payload>``).  Only canonical base64
(what encoding the decoded bytes gives back, padding included) is taken, so resolving a
reference gives back the very string, and the line the very bytes, it replaced.  A
string is taken only where it is a JSON value (not an object's key, not inside an
escaped quote), and a line is changed only when it still parses as JSON after.

A reader without the blobs still reads every line: a reference is an ordinary JSON
object.  :func:`resolve` puts the payloads back where it can load them (and checks
their digests); :func:`references` lists what a line refers to, so that the blobs a
session needs can be told from the ones nobody refers to.

Pure: bytes in, bytes out; storing and loading are the caller's (``load``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Callable
from typing import Final, NamedTuple

import msgspec

__all__ = [
    "BLOB_DIR",
    "BLOB_LOCK",
    "BLOB_MARK",
    "BLOB_MIN",
    "Blob",
    "BlobRef",
    "extract",
    "extract_tails",
    "has_references",
    "may_hold_payload",
    "references",
    "resolve",
    "sniff_media_type",
]

#: The directory of a blob store, beside the session files (docs/format.md): each blob is
#: ``BLOB_DIR/sha256/<first 2 hex>/<64 hex>``.
BLOB_DIR: Final = ".flightlog-blobs"
#: The lock file of a blob store (``BLOB_DIR/lock``): a writer holds it shared from
#: storing a blob until the line that refers to it is written, a collection of the
#: blobs nobody refers to holds it exclusive while it removes them (docs/operations.md).
BLOB_LOCK: Final = "lock"
#: Characters a base64 string has at least to be stored as a blob (3 KiB decoded).
BLOB_MIN: Final = 4096
#: What a line holding a reference contains: a cheap test before any parsing.
BLOB_MARK: Final = b'"$flightlog":"blob"'

_CANDIDATE: Final = re.compile(
    rb'"(data:([a-z]+/[A-Za-z0-9.+-]+);base64,)?([A-Za-z0-9+/]{%d,}={0,2})"' % BLOB_MIN
)
_REFERENCE: Final = re.compile(
    rb'\{"\$flightlog":"blob","sha256":"([0-9a-f]{64})","media_type":"([A-Za-z0-9.+/-]+)",'
    rb'"size":([0-9]+),"form":"(base64|data_url)"\}'
)
_MARK: Final = re.compile(re.escape(BLOB_MARK))
# The cheap test before the scan: a payload of BLOB_MIN characters covers at least
# BLOB_MIN // _STRIDE - 1 consecutive bytes of every _STRIDE-th byte of the line, all of
# them base64 characters; prose, code and JSON structure almost never do.
_STRIDE: Final = 64
_B64_CHARS: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SAMPLE_TABLE: Final = bytes(0x61 if i in _B64_CHARS else 0x2E for i in range(256))
_SAMPLE_RUN: Final = b"a" * (BLOB_MIN // _STRIDE - 1)
_KEY_AFTER: Final = re.compile(rb"[ \t\r\n]*:")
_TAIL_LENGTH: Final = struct.Struct("=I")

# Magic numbers of the media agents send most, for plain base64 (a data URL says).
_MAGIC: Final = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"OggS", "audio/ogg"),
    (b"fLaC", "audio/flac"),
    (b"ID3", "audio/mpeg"),
    (b"PK\x03\x04", "application/zip"),
)


class Blob(NamedTuple):
    """A payload taken out of a line: its digest (hex), media type and bytes."""

    sha256: str
    media_type: str
    data: bytes


class BlobRef(NamedTuple):
    """A reference found in a line."""

    sha256: str
    media_type: str
    size: int


def sniff_media_type(data: bytes) -> str:
    """The media type of ``data`` by its magic number; ``application/octet-stream``."""
    for magic, media_type in _MAGIC:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] in (b"WEBP", b"WAVE"):
        return "image/webp" if data[8:12] == b"WEBP" else "audio/wav"
    if data[4:8] == b"ftyp":
        return "video/mp4"
    return "application/octet-stream"


def _reference(blob: Blob, form: bytes) -> bytes:
    return b'{"$flightlog":"blob","sha256":"%s","media_type":"%s","size":%d,"form":"%s"}' % (
        blob.sha256.encode(),
        blob.media_type.encode(),
        len(blob.data),
        form,
    )


def may_hold_payload(data: bytes | bytearray | msgspec.Raw) -> bool:
    """Whether ``data`` may hold a payload :func:`extract` takes: False is certain, and
    costs a strided copy of a 64th of the bytes."""
    sample = memoryview(data)[::_STRIDE].tobytes()
    return _SAMPLE_RUN in sample.translate(_SAMPLE_TABLE)


def extract(line: bytes, *, json_prefix: bytes = b"") -> tuple[bytes, list[Blob]]:
    """Take the base64 payloads of at least :data:`BLOB_MIN` characters out of the JSON
    text ``line``; the new text and the blobs, in order (``line`` itself and ``[]``
    when there is none).  ``json_prefix`` makes ``line`` one JSON value for the final
    check (a line's tail lacks its opening)."""
    if not may_hold_payload(line):
        return line, []
    blobs: list[Blob] = []

    def take(found: re.Match[bytes]) -> bytes:
        start = found.start()
        escapes = 0
        while start - escapes > 0 and line[start - escapes - 1] == 0x5C:  # backslash
            escapes += 1
        if escapes % 2 or _KEY_AFTER.match(line, found.end()):
            return found[0]  # inside another string, or an object's key
        text = found[3]
        try:
            data = binascii.a2b_base64(text, strict_mode=True)
        except binascii.Error:
            return found[0]
        if base64.b64encode(data) != text:
            return found[0]  # not canonical: it would not come back the same
        media_type = found[2].decode() if found[1] else sniff_media_type(data)
        blob = Blob(hashlib.sha256(data).hexdigest(), media_type, data)
        blobs.append(blob)
        return _reference(blob, b"data_url" if found[1] else b"base64")

    changed = _CANDIDATE.sub(take, line)
    if not blobs:
        return line, []
    try:
        msgspec.json.decode(json_prefix + changed)
    except msgspec.DecodeError:
        return line, []  # never write a line a reader would refuse
    return changed, blobs


def extract_tails(tails: bytearray) -> tuple[bytearray, list[Blob]]:
    """:func:`extract` for each line tail of a ``RecordLines`` (each behind its length,
    a native 4-byte unsigned int) of at least :data:`BLOB_MIN` bytes."""
    out = bytearray()
    blobs: list[Blob] = []
    at = 0
    view = memoryview(tails)
    try:
        while at < len(tails):
            (length,) = _TAIL_LENGTH.unpack_from(view, at)
            at += _TAIL_LENGTH.size
            tail = bytes(view[at : at + length])
            at += length
            if length >= BLOB_MIN:
                # ``,"type":...}\n``: one object once opened, without its newline.
                changed, found = extract(tail[:-1], json_prefix=b'{"seq":0')
                if found:
                    tail = changed + b"\n"
                    blobs.extend(found)
            out += _TAIL_LENGTH.pack(len(tail))
            out += tail
    finally:
        view.release()
    return (out, blobs) if blobs else (tails, [])


def has_references(data: bytes | msgspec.Raw) -> bool:
    """Whether ``data`` (bytes, or any buffer: a record's ``msgspec.Raw``) may hold a
    blob reference; without a copy."""
    return _MARK.search(data) is not None


def references(line: bytes) -> list[BlobRef]:
    """The blob references in ``line``, in order."""
    if BLOB_MARK not in line:
        return []
    return [
        BlobRef(found[1].decode(), found[2].decode(), int(found[3]))
        for found in _REFERENCE.finditer(line)
    ]


def resolve(line: bytes, load: Callable[[str], bytes | None]) -> bytes:
    """``line`` with each reference whose blob ``load(sha256)`` gives (and whose bytes
    have that digest and size) replaced by the string it stands for; a reference
    whose blob is missing or damaged stays as it is."""
    if BLOB_MARK not in line:
        return line

    def put_back(found: re.Match[bytes]) -> bytes:
        digest = found[1].decode()
        data = load(digest)
        if data is None or len(data) != int(found[3]):
            return found[0]
        if hashlib.sha256(data).hexdigest() != digest:
            return found[0]
        payload = base64.b64encode(data)
        if found[4] == b"data_url":
            return b'"data:%s;base64,%s"' % (found[2], payload)
        return b'"%s"' % payload

    return _REFERENCE.sub(put_back, line)
