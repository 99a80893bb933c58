"""``flightlog vacuum``: size and age limits on the session files, applied on demand.

Theory of operation
-------------------
**Plan.**  Every session file (``*.jsonl``) under the data root or the PATHs is listed
with :func:`~._listing.list_sessions` (no pricing); its *last activity* is the later of
its last record's time and its mtime.  A file is *protected*, never removed, when the
daemon (asked once, if one answers) holds it open for a writer or says a run of it is
open, or when its last activity is within ``--protect`` of now.  A session whose last
run has no ``run_close`` and that no writer holds (interrupted) is not being written:
outside the protected window it is removable like any other.  The removable files are
taken oldest first; each is removed for the first limit it breaks, in this order:
``max-age`` (its last activity is older than ``--max-age``), ``max-use`` (the files
listed, protected ones included, use more than ``--max-use`` bytes), ``keep-free``
(the filesystem of the first PATH has less than ``--keep-free`` bytes available, by
``statvfs``).  The first file that breaks none ends the plan.  ``--dry-run`` prints the
plan; a real run carries out the same plan, made by the same code.

**Remove.**  Just before a file goes, its size and mtime are compared with the plan's:
a file written since is kept and reported.  Deleting is one ``unlink``.  Archiving keeps
the file's path relative to the PATH it was found under and never overwrites: within a
filesystem, ``link`` to the archive (it fails when the name is taken), then ``unlink``;
across filesystems, a copy to a temporary name beside the target, ``fsync``, ``link``
to the target, ``unlink`` of the temporary, then ``unlink`` of the original.  A kill at
any moment leaves each file whole in place, whole in the archive, or both; a later run
that finds the same content at the target finishes the move.  A file that cannot be
removed is reported and skipped, and the exit status says so.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import filecmp
import os
import re
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec

from flightlog.protocol import (
    format_time,
    parse_time,
)
from flightlog.protocol.wire import (
    default_root,
)

from ._commands import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError, local_path
from ._listing import _held, list_sessions
from ._render import Style, say

__all__ = ["Removal", "add_vacuum_arguments", "cmd_vacuum", "plan", "vacuum_epilog"]

_SIZE: Final = re.compile(r"(\d+(?:\.\d+)?)([KMGT]?)(?:i?B)?", re.IGNORECASE)
_SIZE_UNITS: Final = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE: Final = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_AGE_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DEFAULT_PROTECT: Final = "1d"
_PARTIAL: Final = ".vacuum-partial"


def vacuum_epilog(exit_help: str) -> str:
    return f"""\
examples:
  flightlog vacuum --max-age 90d --dry-run        what a run would remove, and why
  flightlog vacuum --max-use 10G                  oldest first until they use at most 10 GiB
  flightlog vacuum --keep-free 20G --archive /mnt/old/flightlog
  flightlog vacuum --max-age 30d --json | jq -r .path

Removes session files (*.jsonl) under the data root, or the PATHs, oldest last activity
first, until none is older than --max-age, they use at most --max-use and the filesystem
keeps --keep-free available.  Never removes a session the daemon holds for a writer or
with a run open, nor one active within --protect (default {DEFAULT_PROTECT}).  Each
removal is printed with its path, size, last activity and reason (max-age, max-use,
keep-free).  Sizes take K, M, G, T (powers of 1024); ages s, m, h, d.  Nothing is removed
without a limit.  Exit status 5 when a file could not be removed (it is reported).

{exit_help}
"""


def add_vacuum_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="PATH", nargs="*", help="session files or directories")
    parser.add_argument("--max-use", metavar="SIZE", help="at most SIZE in session files")
    parser.add_argument("--max-age", metavar="AGE", help="no session inactive for longer")
    parser.add_argument("--keep-free", metavar="SIZE", help="keep SIZE available on the disk")
    parser.add_argument(
        "--protect",
        metavar="AGE",
        default=DEFAULT_PROTECT,
        help="never remove a session active within AGE (default: %(default)s)",
    )
    parser.add_argument(
        "--archive", metavar="DIR", help="move the files into DIR (same relative path)"
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would go; change nothing")
    parser.add_argument("--json", action="store_true", help="one JSON object per file")


def parse_size(text: str, option: str) -> int:
    """``10G``, ``512M``, ``100K``, ``2048`` (bytes): a number of bytes."""
    found = _SIZE.fullmatch(text.strip())
    if not found:
        raise CommandError(
            f"{option} takes a size (2048, 100K, 512M, 10G, 1T), not {text!r}", EXIT_USAGE
        )
    return int(float(found.group(1)) * _SIZE_UNITS[found.group(2).lower()])


def parse_age(text: str, option: str) -> timedelta:
    """``30s``, ``15m``, ``2h``, ``90d``: a duration."""
    found = _AGE.fullmatch(text.strip())
    if not found:
        raise CommandError(f"{option} takes an age (30s, 15m, 2h, 90d), not {text!r}", EXIT_USAGE)
    return timedelta(seconds=float(found.group(1)) * _AGE_UNITS[found.group(2)])


@dataclass(frozen=True)
class Limits:
    max_use: int | None = None
    max_age: timedelta | None = None
    keep_free: int | None = None
    protect: timedelta = timedelta(days=1)


@dataclass
class Removal:
    """One file a vacuum removes (or would), and why."""

    path: str
    top: str  # the PATH it was found under: the archive keeps the path relative to it
    size: int
    mtime_ns: int
    last_activity: datetime
    reason: str
    freed: int  # bytes of disk its removal gives back
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


@dataclass
class _File:
    path: str
    top: str
    size: int
    blocks: int
    mtime_ns: int
    last_activity: datetime
    protected: bool


def _files(tops: Sequence[str], socket: str, protect: timedelta, now: datetime) -> list[_File]:
    held = _held(socket)
    writing = [s for s in held if s.writer_pid is not None or s.run_id is not None]
    held_ids = {s.session_id for s in writing}
    held_paths = {os.path.realpath(s.path) for s in writing}
    open_runs = {s.session_id: s.run_id for s in held if s.run_id is not None}
    files: list[_File] = []
    seen: set[str] = set()
    for top in tops:
        for row in list_sessions([top], open_runs=open_runs, pricing=False):
            real = os.path.realpath(row.path)
            if real in seen:
                continue
            seen.add(real)
            try:
                st = os.stat(row.path)
            except OSError:
                continue  # gone since it was listed
            last = datetime.fromtimestamp(st.st_mtime, UTC)
            if row.last_activity is not None:
                with contextlib.suppress(ValueError):
                    last = max(last, parse_time(row.last_activity))
            protected = (
                row.open_run is not None
                or (row.session_id != "" and row.session_id in held_ids)
                or real in held_paths
                or last > now - protect
            )
            files.append(
                _File(
                    row.path, top, st.st_size, st.st_blocks * 512, st.st_mtime_ns, last, protected
                )
            )
    return files


def plan(
    tops: Sequence[str], limits: Limits, *, socket: str, now: datetime, free: int | None
) -> list[Removal]:
    """The files a vacuum with ``limits`` removes, oldest first, each with its reason.

    ``free`` is the filesystem's available bytes (needed with ``keep_free``)."""
    files = _files(tops, socket, limits.protect, now)
    use = sum(f.size for f in files)
    removals: list[Removal] = []
    for f in sorted((f for f in files if not f.protected), key=lambda f: f.last_activity):
        if limits.max_age is not None and f.last_activity < now - limits.max_age:
            reason = "max-age"
        elif limits.max_use is not None and use > limits.max_use:
            reason = "max-use"
        elif limits.keep_free is not None and free is not None and free < limits.keep_free:
            reason = "keep-free"
        else:
            break
        removals.append(
            Removal(f.path, f.top, f.size, f.mtime_ns, f.last_activity, reason, f.blocks)
        )
        use -= f.size
        if free is not None:
            free += f.blocks
    return removals


# --------------------------------------------------------------------------- removing


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _same_content(a: str, b: str) -> bool:
    return os.path.samefile(a, b) or filecmp.cmp(a, b, shallow=False)


def _link_or_copy(source: str, target: str) -> None:
    """Put ``source``'s content at ``target`` (never overwriting), durably."""
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    try:
        os.link(source, target)
    except FileExistsError:
        if not _same_content(source, target):
            raise
        return  # an earlier run linked or copied it, then was stopped
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP):
            raise
        prefix = f".{os.path.basename(target)}."
        for stale in os.listdir(directory):  # a copy a killed vacuum left unfinished
            if stale.startswith(prefix) and stale.endswith(_PARTIAL):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, stale))
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


def _remove(removal: Removal, archive: str | None) -> None:
    """Remove (or archive) one planned file; sets ``removal.error`` instead of raising."""
    try:
        st = os.stat(removal.path)
        if st.st_size != removal.size or st.st_mtime_ns != removal.mtime_ns:
            removal.error = "written since it was planned: kept"
            return
        if archive is not None:
            relative = os.path.relpath(removal.path, removal.top)
            if relative == ".":
                relative = os.path.basename(removal.path)
            target = os.path.join(archive, relative)
            _link_or_copy(removal.path, target)
            removal.archived_to = target
        os.unlink(removal.path)
        _fsync_dir(os.path.dirname(removal.path) or ".")
    except FileExistsError as exc:
        removal.error = f"{exc.filename}: already in the archive with other content: kept"
    except OSError as exc:
        removal.error = f"{exc.strerror or exc}: kept"


# ---------------------------------------------------------------------------- command


def _text_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "K", "M", "G"):
        if value < 1024:
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}T"


def _text_age(age: timedelta) -> str:
    seconds = age.total_seconds()
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f}{unit}"
    return f"{seconds:.0f}s"


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(
        max_use=parse_size(args.max_use, "--max-use") if args.max_use is not None else None,
        max_age=parse_age(args.max_age, "--max-age") if args.max_age is not None else None,
        keep_free=parse_size(args.keep_free, "--keep-free") if args.keep_free is not None else None,
        protect=parse_age(args.protect, "--protect"),
    )


def _available(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _tops(args: argparse.Namespace) -> list[str]:
    tops = [local_path(p) for p in args.paths] or [
        default_root(os.environ, os.path.expanduser("~"))
    ]
    missing = [p for p in tops if not os.path.exists(p)]
    if args.paths and missing:
        raise CommandError(f"{missing[0]}: no such file or directory", EXIT_USAGE)
    return [os.path.abspath(p) for p in tops if os.path.exists(p)]


def _check_archive(archive: str, tops: Sequence[str], keep_free: int | None) -> str:
    archive = os.path.abspath(archive)
    for top in tops:
        if os.path.isdir(top) and os.path.commonpath([archive, top]) == top:
            raise CommandError(f"--archive {archive} is inside {top}: choose another", EXIT_USAGE)
    os.makedirs(archive, exist_ok=True)
    if keep_free is not None and tops and os.stat(archive).st_dev == os.stat(tops[0]).st_dev:
        raise CommandError(
            "--keep-free with an --archive on the same filesystem frees nothing", EXIT_USAGE
        )
    return archive


def run_vacuum(
    args: argparse.Namespace, socket: str, now: datetime | None = None
) -> Iterator[tuple[Removal, bool]]:
    """Plan, then (unless ``--dry-run``) remove: each removal, and whether it was done."""
    limits = _limits(args)
    tops = _tops(args)
    archive = None
    if args.archive is not None:
        try:
            archive = _check_archive(args.archive, tops, limits.keep_free)
        except OSError as exc:
            raise CommandError(
                f"--archive {args.archive}: {exc.strerror or exc}", EXIT_USAGE
            ) from None
    now = now or datetime.now(UTC)
    free = _available(tops[0]) if limits.keep_free is not None and tops else None
    for removal in plan(tops, limits, socket=socket, now=now, free=free):
        if not args.dry_run:
            _remove(removal, archive)
        yield removal, not args.dry_run


def cmd_vacuum(args: argparse.Namespace, style: Style) -> int:
    from ._commands import _socket

    if args.max_use is None and args.max_age is None and args.keep_free is None:
        raise CommandError("vacuum needs a limit: --max-use, --max-age or --keep-free", EXIT_USAGE)
    now = datetime.now(UTC)
    out = sys.stdout
    status = EXIT_OK
    count = total = 0
    for removal, done in run_vacuum(args, _socket(args), now):
        if removal.error is not None:
            status = EXIT_REFUSED
        else:
            count += 1
            total += removal.size
        if args.json:
            out.write(msgspec.json.encode(removal.as_json(now, done=done)).decode() + "\n")
            continue
        if removal.error is not None:
            say(f"flightlog: {removal.path}: {removal.error}", sys.stderr)
            continue
        verb = "archived" if removal.archived_to else "removed" if done else "would remove"
        age = _text_age(now - removal.last_activity)
        line = f"{verb}  {removal.path}  {_text_size(removal.size)}  {age} old  {removal.reason}"
        if removal.archived_to:
            line += f"  -> {removal.archived_to}"
        out.write(line + "\n")
        out.flush()
    if not args.json:
        verb = "would free" if args.dry_run else "freed"
        out.write(style.dim(f"{count} files, {verb} {_text_size(total)}") + "\n")
    return status
