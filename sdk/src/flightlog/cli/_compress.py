"""``flightlog compress``: compress session files that nobody writes, on demand.

Each session file (``*.jsonl``) of the PATHs, or of the data root with ``--all``, is
compressed in place (:mod:`flightlog.sdk._compression`: the same path, one zstd frame of
the same bytes, replaced by a rename).  A file is left as it is while a writer holds it:
its lock is taken (flightlogd holds it while a descriptor is open), and a session the
daemon lists as held by a writer (its descriptor may be closed while idle) is skipped.
"""

from __future__ import annotations

import argparse
import os
import sys

import msgspec

from flightlog.protocol import FlightlogError
from flightlog.protocol.wire import default_root
from flightlog.sdk import session_files
from flightlog.sdk.storage import Compressed, FileBusy, compress_path

from ._commands import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError, local_path
from ._listing import _held
from ._render import Style, one_line, say

__all__ = ["add_compress_arguments", "cmd_compress", "compress_epilog"]


def compress_epilog(exit_help: str) -> str:
    return f"""\
examples:
  flightlog compress demo/chat-1.jsonl          compress one session
  flightlog compress --all                      every session of the data root
  zstdcat demo/chat-1.jsonl | jq .type          the stock tools read the result

A compressed session keeps its path; every flightlog reader reads it as before, and
opening it to continue it (the daemon's open) restores its plain form first.  A session
that a writer holds is left as it is.  Exit status 5 when a file could not be compressed.

{exit_help}
"""


def add_compress_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="PATH", nargs="*", help="session files or directories")
    parser.add_argument(
        "--all", action="store_true", help="every session under the data root ($FLIGHTLOG_ROOT)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per file")


def cmd_compress(args: argparse.Namespace, style: Style) -> int:
    from ._commands import _socket

    if bool(args.paths) == bool(args.all):
        raise CommandError("compress takes PATHs or --all (not both)", EXIT_USAGE)
    tops = [local_path(p) for p in args.paths] or [
        default_root(os.environ, os.path.expanduser("~"))
    ]
    for top in tops:
        if args.paths and not os.path.exists(top):
            raise CommandError(f"{top}: no such file or directory", EXIT_USAGE)
    held = {os.path.realpath(s.path) for s in _held(_socket(args)) if s.writer_pid is not None}
    status, count, before, after = EXIT_OK, 0, 0, 0

    def not_regular(path: str, exc: OSError) -> None:
        _report(args, path, None, None, exc.strerror or str(exc))

    for path in session_files(tops, skipped=not_regular):
        result: Compressed | None = None
        error = skipped = None
        try:
            if os.path.realpath(path) in held:
                raise FileBusy(path)
            result = compress_path(path)
        except FileBusy:
            skipped = "held by a writer"
        except (OSError, FlightlogError) as exc:
            error = str(exc) if isinstance(exc, FlightlogError) else exc.strerror or str(exc)
            status = EXIT_REFUSED
        if result is not None:
            count, before, after = count + 1, before + result.before, after + result.after
        _report(args, path, result, error, skipped)
    if not args.json:
        ratio = f" ({before / after:.1f}x)" if after else ""
        sys.stdout.write(
            style.dim(f"{count} files compressed, {before} -> {after} bytes{ratio}") + "\n"
        )
    return status


def _report(
    args: argparse.Namespace,
    path: str,
    result: Compressed | None,
    error: str | None,
    skipped: str | None,
) -> None:
    if args.json:
        entry: dict[str, object] = {"path": path}
        if result is not None:
            entry.update(compressed=True, before=result.before, after=result.after)
        else:
            entry.update(compressed=False, reason=error or skipped or "compressed already")
        sys.stdout.write(msgspec.json.encode(entry).decode() + "\n")
    elif error is not None:
        say(f"flightlog: {path}: {error}", sys.stderr)
    elif skipped is not None:
        sys.stdout.write(one_line(f"skipped     {path}  {skipped}") + "\n")
    elif result is not None:
        sys.stdout.write(
            one_line(f"compressed  {path}  {result.before} -> {result.after} bytes") + "\n"
        )
    sys.stdout.flush()
