"""Reading blob references: the payloads a session's records refer to, put back.

flightlogd stores large base64 payloads once, by SHA-256, in a blob store beside the
session files, and writes a reference in their place (``flightlog.protocol._blobs``,
docs/format.md).  Readers find the store by walking up from the session file's
directory to the first ``.flightlog-blobs`` directory, and put each payload back where
they can load it (and its digest matches): a session reads as it was recorded.  A
reader without the store still reads every line, with the references as they are.

:func:`referenced_blobs` lists every digest the session files of some paths refer to,
:func:`stored_blobs` every blob of a store.

**Collecting.**  :func:`collect_blobs` removes the blobs of a store that no session file
of its *domain* refers to: the files at any depth under the store's directory, except
below a directory with a store of its own (their references resolve there).  It never
removes one a session refers to, nor one a writer has stored for a line not yet
written: flightlogd holds the store's lock file (``BLOB_LOCK``) shared from storing a
blob until the line that refers to it is written.  The collection scans every session
file of the domain without the lock, noting for each how far it read (the end of its
last complete line) and its identity; then it takes the lock exclusive, scans again
what changed since (the lines appended behind that point, or the whole of a file that
was replaced), and removes only what neither scan found, before letting go of the lock.
A line written before the exclusive lock was taken is seen by one of the two scans; a
writer that comes after finds the blob gone and stores it again.  Each blob goes with
one ``unlink``: a kill at any moment leaves every referred blob in place.  The scan
finds references in the raw bytes (compressed files decompressed), so a damaged line
keeps its blobs, and a file (or directory) that cannot be read stops the collection of
its store; a file removed while it is scanned refers to nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Final, NamedTuple

import msgspec

from flightlog.protocol import FileFormatError, Reader, Record
from flightlog.protocol._blobs import BLOB_DIR, BLOB_LOCK, has_references, references, resolve

from ._compression import (
    compressed_reader,
    is_compressed,
    open_regular,
    open_session_file,
    session_files,
    walk_session_files,
)

__all__ = [
    "BlobReader",
    "BlobRemoval",
    "References",
    "TailResolver",
    "blob_problems",
    "blob_stores",
    "collect_blobs",
    "find_blob_store",
    "referenced_blobs",
    "referred_blob_paths",
    "resolving",
    "stored_blobs",
]

_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
_CHUNK: Final = 1024 * 1024


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
            with os.fdopen(open_regular(path), "rb") as fileobj:
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
            record = _resolved(record, blobs)
        yield record


def _resolved(record: Record, blobs: BlobReader) -> Record:
    data = bytes(record.data)
    resolved = resolve(data, blobs.load)
    if resolved == data:
        return record
    return msgspec.structs.replace(record, data=msgspec.Raw(resolved))


class TailResolver:
    """Puts the payloads back in records that come with their session file's path (a
    tail through the daemon), from the store found from each path where the caller
    can read it, else from what the daemon sent (:meth:`wanted`, :meth:`loaded`); a
    record whose blobs it cannot load keeps its references."""

    #: Directories whose store is remembered (then forgotten all at once).
    MOST: Final = 1024
    #: Bytes of blobs the daemon sent that are kept for later records.
    KEPT: Final = 64 * 1024 * 1024

    def __init__(self) -> None:
        self._stores: dict[str, BlobReader] = {}
        self._sent: dict[str, bytes] = {}
        self._sent_bytes = 0
        #: Blobs asked for and not had, by the directory of the session asked for.
        self._failed: set[tuple[str, str]] = set()

    def __call__(self, path: str | None, record: Record) -> Record:
        if not path or not has_references(record.data):
            return record
        blobs = self._store(path)
        sent = self._sent
        data = bytes(record.data)
        resolved = resolve(data, lambda digest: blobs.load(digest) or sent.get(digest))
        if resolved == data:
            return record
        return msgspec.structs.replace(record, data=msgspec.Raw(resolved))

    def wanted(self, path: str | None, record: Record) -> list[str]:
        """The digests ``record`` refers to that no store the caller can read holds
        and that were not asked for yet: what to ask the daemon for."""
        if not path or not has_references(record.data):
            return []
        blobs = self._store(path)
        directory = os.path.dirname(path)
        found: list[str] = []
        for digest in dict.fromkeys(ref.sha256 for ref in references(bytes(record.data))):
            if digest in self._sent or (directory, digest) in self._failed:
                continue
            local = blobs.path(digest)
            if local is None or not (os.path.isfile(local) and os.access(local, os.R_OK)):
                found.append(digest)
        return found

    def loaded(self, path: str, digest: str, data: bytes | None) -> str | None:
        """What the daemon sent for blob ``digest`` of the session at ``path`` (None:
        nothing); a sentence when it is not a blob to put back."""
        if data is not None and hashlib.sha256(data).hexdigest() == digest:
            if self._sent_bytes + len(data) > self.KEPT:
                self._sent.clear()
                self._sent_bytes = 0
            self._sent[digest] = data
            self._sent_bytes += len(data)
            return None
        if len(self._failed) >= self.MOST:
            self._failed.clear()
        self._failed.add((os.path.dirname(path), digest))
        return None if data is None else f"{path}: blob {digest}: the daemon sent other bytes"

    def _store(self, path: str) -> BlobReader:
        directory = os.path.dirname(path)
        blobs = self._stores.get(directory)
        if blobs is None:
            if len(self._stores) >= self.MOST:
                self._stores.clear()
            blobs = self._stores[directory] = BlobReader(find_blob_store(path))
        return blobs


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


# ------------------------------------------------------------------------ collecting


@dataclass
class BlobRemoval:
    """One blob a collection removes (or would): no session of its store refers to it."""

    path: str
    sha256: str
    size: int
    freed: int  # bytes of disk its removal gives back
    error: str | None = None

    def as_json(self, *, done: bool) -> dict[str, Any]:
        return {
            "blob": self.sha256,
            "path": self.path,
            "size": self.size,
            "reason": "unreferenced",
            "removed": done and self.error is None,
            "error": self.error,
        }


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def blob_stores(tops: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The blob stores the session files under ``tops`` use: each store found in them,
    and the one above each top (its sessions' references resolve there)."""
    stores: dict[str, str] = {}
    for top in (os.path.abspath(t) for t in tops):
        found = [find_blob_store(os.path.join(top, "-") if os.path.isdir(top) else top)]
        # Its own stack, not os.walk's recursion (Python 3.11's), which a tree
        # thousands of directories deep (a session named d/d/.../x.jsonl) ran out of.
        pending = [top] if os.path.isdir(top) else []
        while pending:
            directory = pending.pop()
            try:
                with os.scandir(directory) as listing:
                    subdirs = sorted(e.name for e in listing if _is_dir(e))
            except OSError:
                continue
            if BLOB_DIR in subdirs:
                found.append(os.path.join(directory, BLOB_DIR))
            pending.extend(
                os.path.join(directory, name)
                for name in reversed(subdirs)
                if name != BLOB_DIR and not os.path.islink(os.path.join(directory, name))
            )
        for store in found:
            if store is not None:
                stores.setdefault(os.path.realpath(store), store)
    return list(stores.values())


def _domain_sessions(domain: str) -> Iterator[str]:
    """The session files whose references resolve to the store in ``domain`` (a
    subdirectory with a store of its own is another domain); a directory that cannot be
    listed raises (:class:`OSError`)."""

    def descend(directory: str) -> bool:
        return os.path.basename(directory) != BLOB_DIR and not os.path.isdir(
            os.path.join(directory, BLOB_DIR)
        )

    return walk_session_files(domain, onerror=_raise, descend=descend)


def _raise(error: OSError) -> None:
    raise error


class _Scanned(NamedTuple):
    """How far a scan read a session file, and the file it read."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    end: int | None  # a plain file: the offset after its last complete line read


def _scan(path: str, digests: set[str], before: _Scanned | None = None) -> _Scanned:
    """Add the digests the session file at ``path`` refers to to ``digests``: only what
    was appended since ``before`` when it is the same plain file, grown."""
    fileobj = os.fdopen(open_regular(path), "rb")
    with contextlib.ExitStack() as stack:
        stack.callback(fileobj.close)
        st = os.fstat(fileobj.fileno())
        same = before is not None and (before.dev, before.ino) == (st.st_dev, st.st_ino)
        if (
            same
            and before is not None
            and (before.size, before.mtime_ns)
            == (
                st.st_size,
                st.st_mtime_ns,
            )
        ):
            return before
        reader: IO[bytes] = fileobj
        start = 0
        if is_compressed(fileobj.read(4)):
            reader = stack.enter_context(compressed_reader(fileobj))
            end: int | None = None
        else:
            if same and before is not None and before.end is not None:
                start = before.end if st.st_size >= before.end else 0
            fileobj.seek(start)
            end = start
        held = b""
        while chunk := reader.read(_CHUNK):
            held += chunk
            cut = held.rfind(b"\n") + 1
            if cut:
                digests.update(ref.sha256 for ref in references(held[:cut]))
                held = held[cut:]
                if end is not None:
                    end += cut
        # An unfinished tail may be a line being written: its references count too.
        digests.update(ref.sha256 for ref in references(held))
        return _Scanned(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, end)


def _appended(before: _Scanned, after: _Scanned) -> bool:
    """Whether :func:`_scan` read ``after`` from where ``before`` ended (the same plain
    file, grown): what it found then still stands."""
    return (
        (before.dev, before.ino) == (after.dev, after.ino)
        and before.end is not None
        and after.end is not None
        and after.size >= before.end
    )


class References:
    """The digests each session file refers to, kept from one call to the next: a file
    unchanged since (identity, size, mtime) is not read again, a plain file grown is
    read only past where it was, any other (replaced, compressed) is read whole."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[_Scanned, frozenset[str]]] = {}

    def of(self, path: str) -> frozenset[str]:
        """What the session file at ``path`` refers to; raises :class:`OSError` (and
        :class:`MissingExtra`) when it cannot be read."""
        known = self._files.get(path)
        before = known[0] if known is not None else None
        found: set[str] = set()
        scanned = _scan(path, found, before)
        if known is not None and before is not None:
            if scanned is before:
                return known[1]
            if _appended(before, scanned):
                found |= known[1]
        digests = frozenset(found)
        self._files[path] = (scanned, digests)
        return digests

    def keep_only(self, paths: Collection[str]) -> None:
        """Forget every file but ``paths`` (those gone since)."""
        for path in self._files.keys() - set(paths):
            del self._files[path]


def referred_blob_paths(session_path: str) -> list[str]:
    """The paths of the blobs the session file at ``session_path`` refers to that its
    store holds."""
    store = BlobReader(find_blob_store(session_path))
    if store.store is None:
        return []
    digests: set[str] = set()
    _scan(session_path, digests)
    found = (store.path(digest) for digest in sorted(digests))
    return [path for path in found if path is not None and os.path.isfile(path)]


def collect_blobs(
    store: str, *, dry_run: bool = False, exclude: Collection[str] = ()
) -> list[BlobRemoval]:
    """Remove the blobs of ``store`` that no session file of its domain refers to (see
    the module docstring); with ``dry_run``, only list them, as if the files
    ``exclude`` names were gone.  Raises :class:`OSError` (and :class:`MissingExtra`)
    when a session file cannot be read: then nothing is removed."""
    stored = {digest: path for digest, path, _ in stored_blobs(store)}
    if not stored:
        return []
    domain = os.path.dirname(store)
    digests: set[str] = set()
    scanned: dict[str, _Scanned] = {}
    for path in _domain_sessions(domain):
        if path not in exclude:
            with contextlib.suppress(FileNotFoundError):  # removed since it was listed
                scanned[path] = _scan(path, digests)
    if all(digest in digests for digest in stored):
        return []
    if dry_run:
        return [_removal(d, p) for d, p in stored.items() if d not in digests]
    lock = os.open(
        os.path.join(store, BLOB_LOCK),
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # writers hold it only around a write
        for path in _domain_sessions(domain):
            with contextlib.suppress(FileNotFoundError):
                _scan(path, digests, scanned.get(path))
        removals: list[BlobRemoval] = []
        for digest, path in stored.items():
            if digest in digests:
                continue
            removal = _removal(digest, path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                removal.error = f"{exc.strerror or exc}: kept"
            removals.append(removal)
        for directory in {os.path.dirname(r.path) for r in removals if r.error is None}:
            _fsync_dir(directory)
        return removals
    finally:
        os.close(lock)


def _removal(digest: str, path: str) -> BlobRemoval:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return BlobRemoval(path, digest, 0, 0)
    return BlobRemoval(path, digest, st.st_size, st.st_blocks * 512)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
