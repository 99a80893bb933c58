"""``flightlog vacuum``: size and age limits on the session files, applied on demand.

The files are surveyed, planned and removed by :mod:`flightlog.sdk._retention`, the
code ``flightlogd`` runs for its own limits, so a dry run lists what either would
remove.  What this command adds: the daemon answering on the socket (asked once, if one
answers) says which sessions it holds for a writer or with a run open, and those are
protected; the limits apply to the files of all the PATHs together (one owner).  A
session whose last run has no ``run_close`` and that no writer holds (interrupted) is
not being written: outside the protected window it is removable like any other.
``--dry-run`` prints the plan; a real run carries out the same plan, made by the same
code.  A file that cannot be removed is reported and skipped, and the exit status
says so.  Then the blobs no remaining session refers to go (``collect_blobs``, from
every blob store the PATHs use); a dry run lists those the planned removals would
leave unreferenced.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

import msgspec

from flightlog.protocol import FlightlogError
from flightlog.protocol.wire import default_root
from flightlog.sdk import _retention
from flightlog.sdk.storage import (
    BlobRemoval,
    Limits,
    Removal,
    StoredFile,
    available,
    blob_stores,
    blob_use,
    collect_blobs,
    remove,
    survey,
)

from ._commands import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError, local_path
from ._listing import _held
from ._render import Style, one_line, say

__all__ = ["Removal", "add_vacuum_arguments", "cmd_vacuum", "plan", "vacuum_epilog"]

DEFAULT_PROTECT: Final = "1d"


def vacuum_epilog(exit_help: str) -> str:
    return f"""\
examples:
  flightlog vacuum --max-age 90d --dry-run        what a run would remove, and why
  flightlog vacuum --max-use 10G                  oldest first until they use at most 10 GiB
  flightlog vacuum --keep-free 20G --archive /mnt/old/flightlog
  flightlog vacuum --max-age 30d --json | jq -r .path
  flightlog vacuum --max-age 30d --archive-command /usr/local/bin/ship-session

Removes session files (*.jsonl) under the data root, or the PATHs, oldest last activity
first, until none is older than --max-age, they and their blobs use at most --max-use
and the filesystem keeps --keep-free available.  Never removes a session the daemon
holds for a writer or with a run open, nor one active within --protect (default
{DEFAULT_PROTECT}).  Each removal is printed with its path, size, last activity and
reason (max-age, max-use, keep-free).  Sizes take K, M, G, T (powers of 1024); ages s, m,
h, d.  Nothing is removed without a limit.  Exit status 5 when a file could not be
removed (it is reported).

{exit_help}
"""


def add_vacuum_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="PATH", nargs="*", help="session files or directories")
    parser.add_argument(
        "--max-use", metavar="SIZE", help="at most SIZE in session files and their blobs"
    )
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
    parser.add_argument(
        "--archive-command",
        metavar="CMD",
        help="hand each file to CMD (its path the last argument) and remove it once CMD "
        "exits with 0",
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would go; change nothing")
    parser.add_argument("--json", action="store_true", help="one JSON object per file")


def parse_size(text: str, option: str) -> int:
    """``10G``, ``512M``, ``100K``, ``2048`` (bytes): a number of bytes."""
    try:
        return _retention.parse_size(text)
    except ValueError as exc:
        raise CommandError(f"{option} takes {exc}", EXIT_USAGE) from None


def parse_age(text: str, option: str) -> timedelta:
    """``30s``, ``15m``, ``2h``, ``90d``: a duration."""
    try:
        return _retention.parse_age(text)
    except ValueError as exc:
        raise CommandError(f"{option} takes {exc}", EXIT_USAGE) from None


def plan(
    tops: Sequence[str], limits: Limits, *, socket: str, now: datetime, free: int | None
) -> list[Removal]:
    """The files a vacuum with ``limits`` removes, oldest first, each with its reason;
    the sessions the daemon on ``socket`` holds for a writer or with a run open are
    kept.  ``free`` is the filesystem's available bytes (needed with ``keep_free``)."""
    held = [s for s in _held(socket) if s.writer_pid is not None or s.run_id is not None]
    held_ids = {s.session_id for s in held}
    held_paths = {os.path.realpath(s.path) for s in held}

    def protected(f: StoredFile) -> bool:
        return (f.session_id != "" and f.session_id in held_ids) or os.path.realpath(
            f.path
        ) in held_paths

    files = survey(tops)
    blobs = None if (limits.max_use, limits.keep_free) == (None, None) else blob_use(files)
    return _retention.plan(files, limits, now=now, free=free, protected=protected, blobs=blobs)


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
    try:
        command = shlex.split(args.archive_command) if args.archive_command else None
    except ValueError as exc:
        raise CommandError(f"--archive-command: {exc}", EXIT_USAGE) from None
    if command is not None and args.archive is not None:
        raise CommandError("--archive and --archive-command: choose one", EXIT_USAGE)
    if args.archive is not None:
        try:
            archive = _check_archive(args.archive, tops, limits.keep_free)
        except OSError as exc:
            raise CommandError(
                f"--archive {args.archive}: {exc.strerror or exc}", EXIT_USAGE
            ) from None
    now = now or datetime.now(UTC)
    free = available(tops[0]) if limits.keep_free is not None and tops else None
    for removal in plan(tops, limits, socket=socket, now=now, free=free):
        if not args.dry_run:
            remove(removal, archive, command=command)
        yield removal, not args.dry_run


def cmd_vacuum(args: argparse.Namespace, style: Style) -> int:
    from ._commands import _socket

    if args.max_use is None and args.max_age is None and args.keep_free is None:
        raise CommandError("vacuum needs a limit: --max-use, --max-age or --keep-free", EXIT_USAGE)
    now = datetime.now(UTC)
    out = sys.stdout
    status = EXIT_OK
    count = total = 0
    gone: list[str] = []
    for removal, done in run_vacuum(args, _socket(args), now):
        if removal.error is not None:
            status = EXIT_REFUSED
        else:
            count += 1
            total += removal.size
            gone.append(removal.path)
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
        out.write(one_line(line) + "\n")
        out.flush()
    blob_count = blob_total = 0
    for blob in _collect(_tops(args), dry_run=args.dry_run, gone=gone):
        if blob.error is not None:
            status = EXIT_REFUSED
        else:
            blob_count += 1
            blob_total += blob.size
        if args.json:
            out.write(msgspec.json.encode(blob.as_json(done=not args.dry_run)).decode() + "\n")
        elif blob.error is not None:
            say(f"flightlog: {blob.path}: {blob.error}", sys.stderr)
        else:
            verb = "would remove" if args.dry_run else "removed"
            out.write(f"{verb}  {blob.path}  {_text_size(blob.size)}  unreferenced blob\n")
    if not args.json:
        verb = "would free" if args.dry_run else "freed"
        summary = f"{count} files, {verb} {_text_size(total)}"
        if blob_count:
            summary += f"; {blob_count} blobs, {verb} {_text_size(blob_total)}"
        out.write(style.dim(summary) + "\n")
    return status


def _collect(tops: Sequence[str], *, dry_run: bool, gone: list[str]) -> Iterator[BlobRemoval]:
    """The blobs no remaining session refers to, removed unless ``dry_run`` (then as if
    the files ``gone`` were removed); a store that could not be collected is an
    error entry."""
    for store in blob_stores(tops):
        try:
            yield from collect_blobs(store, dry_run=dry_run, exclude=set(gone))
        except (OSError, FlightlogError) as exc:
            reason = exc.message if isinstance(exc, FlightlogError) else str(exc)
            yield BlobRemoval(store, "", 0, 0, error=f"{reason}: its blobs kept")
