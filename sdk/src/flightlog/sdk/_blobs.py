"""Reading blob references: the payloads a session's records refer to, put back.

flightlogd stores large base64 payloads once, by SHA-256, in a blob store beside the
session files, and writes a reference in their place (``flightlog.protocol._blobs``,
docs/format.md).  Readers find the store by walking up from the session file's
directory to the first ``.flightlog-blobs`` directory, and put each payload back where
they can load it (and its digest matches): a session reads as it was recorded.  A
reader without the store still reads every line, with the references as they are.

:func:`referenced_blobs` lists every digest the session files of some paths refer to,
:func:`stored_blobs` every blob of a store: a blob is never to be removed while one of
the sessions refers to it (retention takes the difference, scanning every session file
under the store's directory).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from typing import Final

import msgspec

from flightlog.protocol import FileFormatError, Reader, Record
from flightlog.protocol._blobs import BLOB_DIR, has_references, references, resolve

from ._compression import open_session_file

__all__ = [
    "BlobReader",
    "blob_problems",
    "find_blob_store",
    "referenced_blobs",
    "resolving",
    "stored_blobs",
]

_DIGEST: Final = re.compile(r"[0-9a-f]{64}")


def find_blob_store(session_path: str | os.PathLike[str]) -> str | None:
    """The blob store of the session file at ``session_path``: the first
    ``.flightlog-blobs`` directory from its directory up; None when there is none."""
    directory = os.path.dirname(os.path.abspath(session_path))
    while True:
        candidate = os.path.join(directory, BLOB_DIR)
        if os.path.isdir(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


class BlobReader:
    """Loads blobs from the store at ``store`` (None: no store, nothing loads)."""

    def __init__(self, store: str | None) -> None:
        self.store = store

    def path(self, digest: str) -> str | None:
        if self.store is None or not _DIGEST.fullmatch(digest):
            return None
        return os.path.join(self.store, "sha256", digest[:2], digest)

    def load(self, digest: str) -> bytes | None:
        """The blob's bytes, or None when it is not there (or cannot be read)."""
        path = self.path(digest)
        if path is None:
            return None
        try:
            with open(path, "rb") as fileobj:
                return fileobj.read()
        except OSError:
            return None


def resolving(
    records: Iterable[Record], session_path: str | os.PathLike[str], store: str | None = None
) -> Iterator[Record]:
    """``records`` of the session file at ``session_path``, each blob reference put
    back as the payload it stands for where the store (``store``, else the one found
    from the file) has it."""
    blobs: BlobReader | None = None if store is None else BlobReader(store)
    for record in records:
        if has_references(record.data):
            if blobs is None:
                blobs = BlobReader(find_blob_store(session_path))
            data = bytes(record.data)
            resolved = resolve(data, blobs.load)
            if resolved != data:
                record = msgspec.structs.replace(record, data=msgspec.Raw(resolved))
        yield record


def blob_problems(
    records: Iterable[Record], session_path: str | os.PathLike[str]
) -> tuple[list[str], int]:
    """What is wrong with the blobs the records refer to (a blob missing, of another
    size, or whose bytes do not have its digest), one sentence each naming the line;
    and how many references there were.  No store at all is one problem."""
    problems: list[str] = []
    blobs: BlobReader | None = None
    checked: dict[str, str | None] = {}
    count = 0
    for record in records:
        found = references(bytes(record.data)) if has_references(record.data) else []
        if not found:
            continue
        count += len(found)
        if blobs is None:
            blobs = BlobReader(find_blob_store(session_path))
        for ref in found:
            if ref.sha256 not in checked:
                checked[ref.sha256] = _verify(blobs, ref.sha256, ref.size)
            problem = checked[ref.sha256]
            if problem is not None:
                problems.append(f"line {record.seq}: blob {ref.sha256} {problem}")
    if count and blobs is not None and blobs.store is None:
        return [f"{count} blob references and no blob store ({BLOB_DIR}) above the file"], count
    return problems, count


def _verify(blobs: BlobReader, digest: str, size: int) -> str | None:
    data = blobs.load(digest)
    if data is None:
        return "is missing"
    if len(data) != size:
        return f"holds {len(data)} bytes, not {size}"
    if hashlib.sha256(data).hexdigest() != digest:
        return "does not match its digest"
    return None


def referenced_blobs(paths: Iterable[str | os.PathLike[str]]) -> set[str]:
    """The digests of every blob the session files (``*.jsonl``, compressed or not) of
    ``paths`` refer to: files, or directories searched at any depth.  A file that
    cannot be read raises (:class:`OSError`, :class:`FileFormatError`): nothing may be
    removed on the word of a scan that did not read everything."""
    from ._sql import session_files

    digests: set[str] = set()
    for path in session_files(paths):
        try:
            with open_session_file(path) as fileobj:
                for record in Reader(fileobj):
                    if has_references(record.data):
                        digests.update(ref.sha256 for ref in references(bytes(record.data)))
        except FileFormatError as exc:
            raise FileFormatError(exc.line, f"{path}: {exc.reason}") from None
    return digests


def stored_blobs(store: str | os.PathLike[str]) -> Iterator[tuple[str, str, int]]:
    """Every blob of the store at ``store`` (a ``.flightlog-blobs`` directory): its
    digest, path and size.  Temporary files of a store in progress are not blobs."""
    root = os.path.join(os.fspath(store), "sha256")
    if not os.path.isdir(root):
        return
    for prefix in sorted(os.listdir(root)):
        directory = os.path.join(root, prefix)
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            if _DIGEST.fullmatch(name) and name.startswith(prefix):
                path = os.path.join(directory, name)
                yield name, path, os.stat(path, follow_symlinks=False).st_size
