"""``flightlog tail --all --after CURSOR``: every session from a cursor, then live.

The daemon's tail-all subscription is opened first, then every session under the data
root is replayed from the files after the cursor, then the live records follow; the two
are merged by (session, seq) in :class:`~._sessions.AllSessions`, so nothing written
while the replay ran is missed or printed twice.  On the way out (the daemon ended the
subscription, or Ctrl-C) the cursor to resume from is printed on stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from flightlog.protocol import (
    FileFormatError,
    Record,
)
from flightlog.protocol.wire import (
    default_root,
)
from flightlog.sdk import connect

from ._commands import (
    _CUT_SHORT,
    _END_REASONS,
    EXIT_NO_DAEMON,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    _blob_problems,
    _socket,
    _TailPrinter,
)
from ._exits import record_types
from ._render import Style, say
from ._sessions import AllSessions, Doorbell, Rescan, format_cursor, parse_cursor

__all__ = ["after_value", "tail_all_after"]


def after_value(text: str) -> int | dict[str, int]:
    """``tail --after``: a seq, or (with ``--all``) a cursor: ``SESSION_ID:SEQ,...``,
    ``start`` or ``""`` for every session from its start, or ``@FILE`` holding one."""
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return int(stripped)
    if stripped == "start":
        return {}
    if stripped.startswith("@"):
        try:
            with open(stripped[1:], encoding="utf-8") as fileobj:
                stripped = fileobj.read()
        except OSError as exc:
            raise argparse.ArgumentTypeError(
                f"cannot read the cursor file {stripped[1:]}: {exc.strerror or exc}"
            ) from None
    try:
        return parse_cursor(stripped)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a seq or a cursor: {exc}") from None


def _stop(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def tail_all_after(args: argparse.Namespace, style: Style, cursor: dict[str, int]) -> int:
    """Replay every session after ``cursor``, then follow them all live."""
    if not args.all or args.path is not None:
        raise CommandError("a cursor for --after goes with --all, without a PATH", EXIT_USAGE)
    types = record_types(args.type)
    run_prefix: str | None = args.run
    printer = _TailPrinter(args, style, with_path=True)
    printer.flush = True

    def wanted(record: Record) -> bool:
        if types is not None and record.type not in types:
            return False
        return run_prefix is None or (record.run_id or "").startswith(run_prefix)

    def on_error(path: str, exc: Exception) -> None:
        if isinstance(exc, FileFormatError):
            reason = f"line {exc.line}: {exc.reason}"
        else:
            reason = f"cannot read: {getattr(exc, 'strerror', None) or exc}"
        say(f"flightlog: {path}: {reason}; skipped", sys.stderr)

    signal.signal(signal.SIGTERM, _stop)
    client = connect(_socket(args), client_name="flightlog", reconnect_grace=args.reconnect_grace)
    # Unfiltered: the merge needs every seq; the filters apply when printing.
    tail = client.tail_all(follow=True).__enter__()

    def subscribed() -> tuple[Any, Any]:
        return tail, client.close

    root = default_root(os.environ, os.path.expanduser("~"))
    sessions = AllSessions([root], cursor, on_error)
    doorbell = Doorbell(subscribed, retry=None).start()
    try:
        for path, record in sessions.scan():
            # A blob the record still refers to, said before it (as a tail of one
            # session says it): a Ctrl-C once it is printed must not leave it unsaid.
            _blob_problems(sessions.problems)
            if wanted(record):
                printer.write(record, path)
        while True:
            item = doorbell.items.get()
            if isinstance(item, Rescan):
                for path, record in sessions.scan():
                    _blob_problems(sessions.problems)
                    if wanted(record):
                        printer.write(record, path)
                why = _END_REASONS.get(tail.end_reason, item.reason)
                sys.stderr.write(
                    style.dim(f"-- the daemon ended the subscription: {why} --") + "\n"
                )
                # As for tail --all: the sessions go on, a script must not take them as ended.
                return EXIT_NO_DAEMON if tail.end_reason in _CUT_SHORT else EXIT_OK
            for path, record in sessions.live(*item):
                _blob_problems(sessions.problems)
                if wanted(record):
                    printer.write(record, path)
    finally:
        doorbell.close()
        sys.stdout.flush()
        resume = format_cursor(sessions.cursor()) or "start"
        sys.stderr.write(style.dim(f"-- resume with: --after {resume} --") + "\n")
        sys.stderr.flush()
