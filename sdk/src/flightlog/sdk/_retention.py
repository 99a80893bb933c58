"""Retention: which session files size and age limits remove, and removing one.

Both ``flightlog vacuum`` (on demand) and ``flightlogd`` (``--max-use``, ``--max-age``,
``--keep-free``, on a timer) use this module, so a dry run and the daemon decide alike.

Theory of operation
-------------------
**Survey.**  :func:`survey` lists every session file (``*.jsonl``) under the tops with
its size, blocks, mtime and owner, without reading it.  Its *last activity*, the later
of its mtime and the time of its last complete record, is read from the file's end
(:func:`last_activity`): a file is never read whole to decide its fate.

**Plan.**  :func:`plan` takes the files that are not *protected* (the caller says which:
a writer or an open run holds it, or its last activity is within ``protect``), oldest
last activity first, and removes each for the first limit it breaks, in this order:
``max-age`` (its last activity is older), ``max-use`` (its owner's files, protected ones
included, use more than ``max_use`` bytes), ``max-use-total`` (every owner's files
together use more than ``max_use_total``), ``keep-free`` (the filesystem has less than
``keep_free`` bytes available).  ``max_age`` and ``max_use`` apply to each owner's files
alone: one owner's files never count against, nor are removed for, another owner's
limit.  ``max_use_total`` and ``keep_free`` are the operator's global limits: the oldest
removable files go whoever owns them.

**Blobs count.**  With the blobs' use (:func:`blob_use`: what each file refers to, read
from the files of every store that holds blobs), an owner's use is its files and the
blobs it owns (those of its store), and a planned removal frees, besides its file, each
blob no file left refers to, as the collection that follows it frees them: a blob a
kept file shares is never counted as freed.  A blob no file refers to is not counted
(the collection takes it anyway).

**Remove.**  :func:`remove` is the one place a file goes.  It takes the file's ``flock``
(the daemon holds it while it writes the file, so a file being written is never
removed), checks that the path still names the planned file with the planned size and
mtime and that ``busy`` (the daemon's table) does not hold it, then deletes it with one
``unlink`` or archives it: within a filesystem ``link`` to the archive (it fails when the
name is taken), then ``unlink``; across filesystems a copy to a temporary name beside
the target, ``fsync``, ``link``, ``unlink`` of the temporary, then ``unlink`` of the
original.  A kill at any moment leaves each file whole in place, whole in the archive,
or both; a later run that finds the same content at the target finishes the move.  An
archive command gets the file's path as its last argument (the lock held meanwhile);
the file is removed only once the command exits with status 0.

**Blobs.**  Archiving to a directory first links or copies the blobs the file refers to
into the archive's own blob store (the store's place relative to the tree), so the
archived file reads whole; an archive command finds their paths in ``FLIGHTLOG_BLOBS``.
Once the files are gone, :func:`~flightlog.sdk._blobs.collect_blobs` removes the blobs
no remaining session refers to.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import filecmp
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from flightlog.protocol import FlightlogError, format_time, parse_time
from flightlog.protocol._blobs import BLOB_DIR

from ._blobs import References, _fsync_dir, find_blob_store, referred_blob_paths, stored_blobs
from ._compression import index_name, open_regular, session_files

__all__ = [
    "DEFAULT_PROTECT",
    "BlobUse",
    "Limits",
    "Removal",
    "StoredFile",
    "available",
    "blob_use",
    "last_activity",
    "parse_age",
    "parse_size",
    "plan",
    "remove",
    "survey",
]

_SIZE: Final = re.compile(r"(\d+(?:\.\d+)?)([KMGT]?)(?:i?B)?", re.IGNORECASE)
_SIZE_UNITS: Final = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE: Final = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_AGE_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: A session active within this long is never removed unless told otherwise.
DEFAULT_PROTECT: Final = timedelta(days=1)
_PARTIAL: Final = ".vacuum-partial"
_NEVER: Final = datetime.min.replace(tzinfo=UTC)
# Bytes read at a time from a file's end; the head of a line holds its envelope.
_BLOCK: Final = 64 * 1024
_HEAD: Final = 4096
_TIME: Final = re.compile(rb'"time":"([^"\\]*)"')
_SESSION_ID: Final = re.compile(rb'^\{"session_id":"([0-9A-Za-z_-]*)"')


def parse_size(text: str) -> int:
    """``10G``, ``512M``, ``100K``, ``2048`` (bytes): a number of bytes (powers of 1024).

    Raises :class:`ValueError` naming what it takes."""
    found = _SIZE.fullmatch(text.strip())
    if not found:
        raise ValueError(f"a size (2048, 100K, 512M, 10G, 1T), not {text!r}")
    return int(float(found.group(1)) * _SIZE_UNITS[found.group(2).lower()])


def parse_age(text: str) -> timedelta:
    """``30s``, ``15m``, ``2h``, ``90d``: a duration.  Raises :class:`ValueError`."""
    found = _AGE.fullmatch(text.strip())
    if not found:
        raise ValueError(f"an age (30s, 15m, 2h, 90d), not {text!r}")
    return timedelta(seconds=float(found.group(1)) * _AGE_UNITS[found.group(2)])


@dataclass(frozen=True)
class Limits:
    """What a vacuum keeps to; None: no such limit."""

    max_use: int | None = None
    max_age: timedelta | None = None
    keep_free: int | None = None
    protect: timedelta = DEFAULT_PROTECT
    #: The operator's global cap: every owner's files together.
    max_use_total: int | None = None

    @property
    def any(self) -> bool:
        limits = (self.max_use, self.max_age, self.keep_free, self.max_use_total)
        return limits != (None, None, None, None)


@dataclass
class StoredFile:
    """One session file as :func:`survey` found it."""

    path: str
    top: str  # the tree it was found under: an archive keeps the path relative to it
    size: int
    blocks: int  # bytes of disk it takes
    mtime_ns: int
    owner: int | None = None
    #: The later of its mtime and its last record's time (set by :func:`survey`).
    last_activity: datetime = _NEVER
    session_id: str = ""


@dataclass
class Removal:
    """One file a vacuum removes (or would), and why."""

    path: str
    top: str
    size: int
    mtime_ns: int
    last_activity: datetime
    reason: str
    freed: int  # bytes of disk its removal gives back
    owner: int | None = None
    archived_to: str | None = None
    error: str | None = None

    def as_json(self, now: datetime, *, done: bool) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "last_activity": format_time(self.last_activity),
            "age_seconds": round((now - self.last_activity).total_seconds(), 3),
            "reason": self.reason,
            "removed": done and self.error is None,
            "archived_to": self.archived_to,
            "error": self.error,
        }


# ------------------------------------------------------------------------- surveying


def survey(
    tops: Sequence[str], *, owner: Callable[[str], int | None] | None = None
) -> list[StoredFile]:
    """Every session file under ``tops`` (each once), with its last activity;
    ``owner`` maps a path to the uid it counts against (None: one owner for all)."""
    files: list[StoredFile] = []
    seen: set[str] = set()
    for top in tops:
        for path in session_files([top]):
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed
            found = StoredFile(
                path,
                top,
                st.st_size,
                st.st_blocks * 512,
                st.st_mtime_ns,
                owner(path) if owner is not None else None,
            )
            found.session_id, found.last_activity = last_activity(path, st.st_mtime)
            files.append(found)
    return files


def last_activity(path: str, mtime: float) -> tuple[str, datetime]:
    """A session file's ``session_id`` (from its first line; ``""`` if unreadable) and
    the later of ``mtime`` and the time of its last complete record, read from the end.

    Lines that do not parse are skipped backwards; an unfinished tail is not a record."""
    latest = datetime.fromtimestamp(mtime, UTC)
    try:
        fd = open_regular(path, follow_symlinks=False)
    except OSError:
        return "", latest
    try:
        head = os.pread(fd, 256, 0)
        found = _SESSION_ID.match(head)
        session_id = found.group(1).decode() if found else ""
        for line in _lines_backwards(fd, os.fstat(fd).st_size):
            stamp = _TIME.search(line)
            if stamp is None:
                continue
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                return session_id, max(latest, parse_time(stamp.group(1).decode()))
        return session_id, latest
    except OSError:
        return "", latest
    finally:
        os.close(fd)


def _lines_backwards(fd: int, size: int, most: int = 64) -> Iterator[bytes]:
    """The heads (first :data:`_HEAD` bytes) of the last ``most`` complete lines, last
    first.  Reads only the blocks it needs; a long line costs the reads of its length."""
    position = size
    held = b""  # the end of the file not yet given, from ``position``: ends with "\n"
    complete = False  # whether the last "\n" (the unfinished tail's start) was found
    given = 0
    while given < most:
        if position == 0:
            if complete and held:
                yield held[:_HEAD]  # the file's first line
            return
        start = max(0, position - _BLOCK)
        held = os.pread(fd, position - start, start) + held
        position = start
        if not complete:
            cut = held.rfind(b"\n")
            if cut == -1:
                held = b""  # all of it an unfinished tail
                continue
            complete = True
            held = held[: cut + 1]
        while given < most:
            cut = held.rfind(b"\n", 0, len(held) - 1)
            if cut == -1:
                break
            yield held[cut + 1 : cut + 1 + _HEAD]
            given += 1
            held = held[: cut + 1]
        if len(held) > _HEAD:  # the end of a long line: only its head is needed
            held = held[:_HEAD] + b"\n"


# ------------------------------------------------------------------------ blobs' use


#: A blob: its store, and its digest.
BlobKey = tuple[str, str]


@dataclass
class BlobUse:
    """The blobs the surveyed files refer to, for :func:`plan` to count: each one's
    size, the disk it takes and its owner, and which blobs each file refers to.  A
    stored blob no surveyed file refers to is not in ``blobs`` (``orphans`` counts
    them): the collection after a removal takes it whatever the plan says.  A store
    that could not be scanned whole is in ``uncounted``, with the reason, and none of
    its blobs counts (its collection keeps them all)."""

    blobs: dict[BlobKey, tuple[int, int, int | None]] = field(default_factory=dict)
    refers: dict[str, list[BlobKey]] = field(default_factory=dict)
    orphans: int = 0
    uncounted: dict[str, str] = field(default_factory=dict)


def blob_use(
    files: Sequence[StoredFile],
    *,
    references: References | None = None,
    owner: Callable[[str], int | None] | None = None,
) -> BlobUse:
    """What :class:`BlobUse` says of ``files``: the files of each store that holds blobs
    are scanned for references (through ``references``, which keeps what it read for
    the next call); ``owner`` maps a blob's path to the uid it counts against (None:
    one owner for all, as for the files)."""
    references = references or References()
    use = BlobUse()
    domains: dict[str, list[StoredFile]] = {}
    store_of: dict[str, str | None] = {}
    for f in files:
        directory = os.path.dirname(os.path.abspath(f.path))
        if directory not in store_of:
            store_of[directory] = find_blob_store(f.path)
        store = store_of[directory]
        if store is not None:
            domains.setdefault(store, []).append(f)
    for store, members in domains.items():
        try:
            stored = {digest: path for digest, path, _ in stored_blobs(store)}
            if not stored:
                continue
            refers: dict[str, list[BlobKey]] = {}
            for f in members:
                try:
                    digests = references.of(f.path)
                except FileNotFoundError:
                    digests = frozenset()  # removed since the survey: refers to nothing
                refers[f.path] = [(store, d) for d in sorted(digests) if d in stored]
            referred = {digest for keys in refers.values() for _, digest in keys}
            sizes = {}
            for digest in referred:
                st = os.stat(stored[digest], follow_symlinks=False)
                sizes[digest] = (st.st_size, st.st_blocks * 512)
        except (OSError, FlightlogError) as exc:
            use.uncounted[store] = str(exc)
            continue
        for digest, (size, blocks) in sizes.items():
            use.blobs[store, digest] = (size, blocks, owner(stored[digest]) if owner else None)
        use.refers.update(refers)
        use.orphans += len(stored) - len(referred)
    return use


# -------------------------------------------------------------------------- planning


def plan(
    files: Iterable[StoredFile],
    limits: Limits,
    *,
    now: datetime,
    free: int | None,
    protected: Callable[[StoredFile], bool] = lambda _: False,
    blobs: BlobUse | None = None,
) -> list[Removal]:
    """The files a vacuum with ``limits`` removes, oldest first, each with its reason.

    A file is kept when ``protected`` says so or its last activity is within
    ``limits.protect``.  ``free`` is the filesystem's available bytes (needed with
    ``keep_free``).  With ``blobs``, each owner's use counts its blobs, and a removal
    frees those no file left refers to.  See the module docstring for the order and
    the owners' rule."""
    files = list(files)
    blobs = blobs or BlobUse()
    use: dict[int | None, int] = {}
    for f in files:
        use[f.owner] = use.get(f.owner, 0) + f.size
    for size, _, owner in blobs.blobs.values():
        use[owner] = use.get(owner, 0) + size
    referrers: dict[BlobKey, int] = {}
    for f in files:
        for key in blobs.refers.get(f.path, ()):
            referrers[key] = referrers.get(key, 0) + 1
    total = sum(use.values())
    removable = [f for f in files if f.last_activity <= now - limits.protect and not protected(f)]
    removals: list[Removal] = []
    for f in sorted(removable, key=lambda f: (f.last_activity, f.path)):
        if limits.max_age is not None and f.last_activity < now - limits.max_age:
            reason = "max-age"
        elif limits.max_use is not None and use[f.owner] > limits.max_use:
            reason = "max-use"
        elif limits.max_use_total is not None and total > limits.max_use_total:
            reason = "max-use-total"
        elif limits.keep_free is not None and free is not None and free < limits.keep_free:
            reason = "keep-free"
        else:
            continue  # another owner's older files may still be over their limit
        removals.append(
            Removal(f.path, f.top, f.size, f.mtime_ns, f.last_activity, reason, f.blocks, f.owner)
        )
        use[f.owner] -= f.size
        total -= f.size
        if free is not None:
            free += f.blocks
        for key in blobs.refers.get(f.path, ()):
            referrers[key] -= 1
            if referrers[key] == 0:  # the collection that follows takes it
                size, disk, owner = blobs.blobs[key]
                use[owner] -= size
                total -= size
                if free is not None:
                    free += disk
    return removals


def available(path: str) -> int:
    """Bytes available to unprivileged users on ``path``'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# -------------------------------------------------------------------------- removing


def remove(
    removal: Removal,
    archive: str | None,
    *,
    busy: Callable[[str], bool] | None = None,
    command: Sequence[str] | None = None,
) -> None:
    """Remove (or archive) one planned file; sets ``removal.error`` instead of raising.

    The one place a session file goes: what must hold before it may go is checked here
    (its lock, its identity, ``busy``), under the file's ``flock``.  With ``command``,
    the file is handed to it first (its path the last argument) and removed only if
    it exits with status 0."""
    try:
        fd = open_regular(removal.path, follow_symlinks=False)
    except OSError as exc:
        removal.error = f"{exc.strerror or exc}: kept"
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            removal.error = "locked by a writer: kept"
            return
        st = os.fstat(fd)
        now_at = os.stat(removal.path, follow_symlinks=False)
        if (st.st_dev, st.st_ino) != (now_at.st_dev, now_at.st_ino) or (
            st.st_size,
            st.st_mtime_ns,
        ) != (removal.size, removal.mtime_ns):
            removal.error = "written since it was planned: kept"
            return
        if busy is not None and busy(removal.path):
            removal.error = "opened since it was planned: kept"
            return
        if command is not None:
            blobs = referred_blob_paths(removal.path)
            error = _run_archive_command([*command, removal.path], blobs)
            if error is not None:
                removal.error = f"{error}: kept"
                return
            removal.archived_to = shlex.join([*command, removal.path])
        elif archive is not None:
            relative = os.path.relpath(removal.path, removal.top)
            if relative == ".":
                relative = os.path.basename(removal.path)
            target = os.path.join(archive, relative)
            _archive_blobs(removal, archive)  # before the file: it never lacks them
            _link_or_copy(removal.path, target)
            removal.archived_to = target
        os.unlink(removal.path)
        with contextlib.suppress(FileNotFoundError):
            # flightlogd's index of it (written, like the file, under its lock).
            directory, name = os.path.split(removal.path)
            os.unlink(os.path.join(directory, index_name(name)))
        _fsync_dir(os.path.dirname(removal.path) or ".")
    except FileExistsError as exc:
        removal.error = f"{exc.filename}: already in the archive with other content: kept"
    except OSError as exc:
        removal.error = f"{exc.strerror or exc}: kept"
    finally:
        os.close(fd)  # releases the lock


#: Seconds an archive command may take for one file before it counts as failed.
ARCHIVE_COMMAND_TIMEOUT: Final = 3600.0


def _run_archive_command(argv: list[str], blobs: list[str]) -> str | None:
    """Run an archive command (``FLIGHTLOG_BLOBS`` in its environment: the paths of the
    blobs the file refers to, one a line); None when it exited with 0, else why not."""
    try:
        done = subprocess.run(
            argv,
            env={**os.environ, "FLIGHTLOG_BLOBS": "\n".join(blobs)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=ARCHIVE_COMMAND_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"the archive command took longer than {ARCHIVE_COMMAND_TIMEOUT:g} s"
    except OSError as exc:
        return f"the archive command could not run: {exc.strerror or exc}"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return f"the archive command exited with {done.returncode}" + (
            f" ({said[-1][:200]})" if said else ""
        )
    return None


def _archive_blobs(removal: Removal, archive: str) -> None:
    """Copy (or link) the blobs the file refers to into the archive's blob store, where
    a reader of the archived file finds them: at the place of the store's directory
    relative to the tree the file was found under (else the archive's top)."""
    blobs = referred_blob_paths(removal.path)
    if not blobs:
        return
    store = find_blob_store(removal.path)
    assert store is not None
    relative = os.path.relpath(os.path.dirname(store), removal.top)
    within = relative != "." and not relative.startswith("..") and os.path.isdir(removal.top)
    target_store = (
        os.path.join(archive, relative, BLOB_DIR) if within else (os.path.join(archive, BLOB_DIR))
    )
    for blob in blobs:
        digest = os.path.basename(blob)
        _link_or_copy(blob, os.path.join(target_store, "sha256", digest[:2], digest))


def _same_content(a: str, b: str) -> bool:
    return os.path.samefile(a, b) or filecmp.cmp(a, b, shallow=False)


def _remove_partials(directory: str, prefix: str) -> None:
    """Remove the copies a killed vacuum left unfinished (the caller holds the source's
    lock: no other vacuum is copying it)."""
    for stale in os.listdir(directory):
        if stale.startswith(prefix) and stale.endswith(_PARTIAL):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, stale))


def _make_dirs(directory: str) -> None:
    """``os.makedirs(directory, exist_ok=True)`` without its recursion (a call per
    missing directory): an archive of a session thousands of directories deep ran
    out of stack."""
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)


def _link_or_copy(source: str, target: str) -> None:
    """Put ``source``'s content at ``target`` (never overwriting), durably."""
    directory = os.path.dirname(target)
    _make_dirs(directory)
    prefix = f".{os.path.basename(target)}."
    try:
        os.link(source, target)
    except FileExistsError:
        if not _same_content(source, target):
            raise
        # An earlier run linked or copied it, then was stopped (perhaps before it
        # removed its copy: link() says EEXIST before EXDEV).
        _remove_partials(directory, prefix)
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP):
            raise
        _remove_partials(directory, prefix)
        temporary = os.path.join(directory, f"{prefix}{os.getpid()}{_PARTIAL}")
        try:
            with open(source, "rb") as src, open(temporary, "xb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
                dst.flush()
                os.fsync(dst.fileno())
            try:
                os.link(temporary, target)
            except FileExistsError:
                if not filecmp.cmp(source, target, shallow=False):
                    raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
    _fsync_dir(directory)
