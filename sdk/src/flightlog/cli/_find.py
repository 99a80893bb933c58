"""``flightlog find``: the records that answer a question, across every session.

The search is the SDK's (:mod:`flightlog.sdk._find`, its theory of operation): this
module turns the command line into a :class:`~flightlog.sdk._find.Query` and prints
what it finds.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

import msgspec

from flightlog.protocol import (
    FileFormatError,
)
from flightlog.protocol.format import (
    encode_line,
)
from flightlog.protocol.wire import default_root
from flightlog.sdk.search import Found, Query, meta_matches, moment, search

from ._exits import EXIT_OK, EXIT_UNSOUND, EXIT_USAGE, CommandError, local_path, record_types
from ._render import Style, one_line, say, tail_line
from ._text import match_json, match_line

__all__ = [
    "Found",
    "Query",
    "add_find_arguments",
    "cmd_find",
    "find_epilog",
    "meta_matches",
    "parse_meta",
    "search",
]

_OUTPUT: Final = 256 * 1024


def find_epilog(exit_help: str) -> str:
    return f"""\
examples:
  flightlog find --type tool_exec_end --error --since 1h     every failed tool call of the last hour
  flightlog find --tool get_weather --json | jq .data.arguments
  flightlog find --model claude-x --type model_exec_end -n 20
  flightlog find --meta app=demo --since 2026-11-29T00:00:00Z --until 2026-11-30T00:00:00Z
  flightlog find --run 3f2a9c1e demo/                       one run, in the sessions of a directory
  flightlog find --text 'rate.?limit' -i --since 1d        what any message or result said
  flightlog find --agent researcher --type model_exec_end  the model calls one agent made
  flightlog find --under t3 --run 3f2a9c1e                  a tool call and all nested in it
  flightlog find --tree 5f0c2a9e --error                    failures in a session and below it
  flightlog find --data arguments.path=/etc/hostname

Looks in every session file (*.jsonl) under the data root, or in the PATHs given (files
or directories).  Filters combine with AND; --type, --meta and --data may repeat.
--meta and --data take a member's path (a key, or keys and list indexes joined by dots);
a value that is not a string is compared as its JSON.  Each line: the session's path,
the date and the record as `tail` shows it; --json prints the record with a "path"
member.  Lines are read but not verified: use `flightlog check`.

{exit_help}
"""


def add_find_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="PATH", nargs="*", help="session files or directories")
    parser.add_argument(
        "--type",
        action="append",
        metavar="T",
        help="only records of type T (repeatable, or comma-separated)",
    )
    parser.add_argument("--tool", metavar="NAME", help="only records of tool calls of this tool")
    parser.add_argument(
        "--model",
        metavar="MODEL",
        help="only records naming this model (requests, starts, responses)",
    )
    failure = parser.add_mutually_exclusive_group()
    failure.add_argument(
        "--error",
        action="store_true",
        help="only records that report a failure (failed calls and runs, errors, retries)",
    )
    failure.add_argument("--no-error", action="store_true", help="only records that do not")
    parser.add_argument(
        "--since", metavar="TIME", help="records at or after TIME (RFC 3339, or 30m, 2h, 1d ago)"
    )
    parser.add_argument("--until", metavar="TIME", help="records before TIME (same forms)")
    parser.add_argument(
        "--meta",
        action="append",
        metavar="KEY=VALUE",
        help="only sessions whose meta has KEY equal to VALUE (repeatable)",
    )
    parser.add_argument("--run", metavar="RUN", help="only records of this run (id or prefix)")
    parser.add_argument(
        "--data",
        action="append",
        metavar="PATH=VALUE",
        help="only records whose data member at PATH (key, or keys and indexes joined by "
        "dots: arguments.path) equals VALUE (repeatable)",
    )
    parser.add_argument(
        "--agent",
        metavar="NAME",
        help="only records written by this agent (its calls, and what it did between its "
        "agent_start and agent_end)",
    )
    parser.add_argument(
        "--under",
        metavar="EXECUTION",
        help="only the call of this execution id and everything nested in it (its sub-calls "
        "and sub-agents), in each run",
    )
    parser.add_argument(
        "--tree",
        metavar="SESSION",
        help="only this session and the sessions below it (meta parent_session or "
        "forked_from, at any depth)",
    )
    parser.add_argument(
        "--fork-of",
        metavar="SESSION",
        help="only the sessions forked from this one (meta forked_from, at any depth)",
    )
    parser.add_argument(
        "--text",
        metavar="REGEX",
        help="only records whose content matches REGEX (Python syntax), shown in context",
    )
    parser.add_argument("-i", "--ignore-case", action="store_true", help="--text ignores case")
    parser.add_argument(
        "-n", "--limit", type=int, metavar="N", help="stop after N matching records"
    )
    parser.add_argument("--json", action="store_true", help="JSON lines with a path member")


def parse_meta(items: Sequence[str] | None, option: str = "--meta") -> dict[str, str | None]:
    """``--meta KEY=VALUE`` (or ``option``) options as a dict; raises
    :class:`CommandError` (usage)."""
    meta: dict[str, str | None] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"{option} takes KEY=VALUE, not {item!r}", EXIT_USAGE)
        meta[key] = value
    return meta


# ---------------------------------------------------------------------------- command


def _moment(text: str, option: str, now: datetime) -> datetime:
    try:
        return moment(text, now)
    except ValueError as exc:
        raise CommandError(f"{option} takes {exc}", EXIT_USAGE) from None


def build_query(args: argparse.Namespace, now: datetime | None = None) -> Query:
    """The :class:`Query` of ``find``'s arguments; raises :class:`CommandError` (usage)."""
    now = now or datetime.now(UTC)
    types = record_types(args.type)
    meta = parse_meta(args.meta)
    if args.limit is not None and args.limit < 1:
        raise CommandError("--limit takes a number of records, 1 or more", EXIT_USAGE)
    return Query(
        types=frozenset(types) if types else None,
        tool=args.tool,
        model=args.model,
        error=True if args.error else False if args.no_error else None,
        since=_moment(args.since, "--since", now) if args.since else None,
        until=_moment(args.until, "--until", now) if args.until else None,
        meta=meta,
        data=parse_meta(args.data, "--data"),
        run=args.run,
        text=_pattern(args.text, args.ignore_case) if args.text is not None else None,
        agent=args.agent,
        under=args.under,
        tree=args.tree,
        fork_of=args.fork_of,
    )


def _pattern(text: str, ignore_case: bool) -> re.Pattern[str]:
    try:
        return re.compile(text, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise CommandError(f"--text takes a regular expression: {exc}", EXIT_USAGE) from None


def cmd_find(args: argparse.Namespace, style: Style) -> int:
    query = build_query(args)
    if args.paths:
        missing = [path for path in args.paths if not os.path.exists(local_path(path))]
        if missing:
            raise CommandError(f"{missing[0]}: no such file or directory", EXIT_USAGE)
        paths = [local_path(path) for path in args.paths]
    else:
        paths = [default_root(os.environ, os.path.expanduser("~"))]
    unsound = unreadable = False

    def on_error(path: str, exc: Exception) -> None:
        nonlocal unsound, unreadable
        if isinstance(exc, FileFormatError):
            unsound = True
            say(f"flightlog: {path}: line {exc.line}: {exc.reason}", sys.stderr)
        else:
            unreadable = True
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            say(f"flightlog: {path}: cannot read: {reason}", sys.stderr)

    def skipped(path: str, exc: OSError) -> None:
        say(f"flightlog: {path}: {exc.strerror}; skipped", sys.stderr)

    out = sys.stdout
    # --json lines are written in pieces of _OUTPUT bytes, and at the end of each file
    # (one write per line costs as much as finding it when stdout is unbuffered); to a
    # terminal, line by line.
    pending = bytearray()
    each_line = out.isatty()
    path, head = "", b""  # the last path, and the start of its lines in JSON
    for count, found in enumerate(search(query, paths, on_error=on_error, skipped=skipped), 1):
        if args.json:
            # The line as in the file (data never decoded), with the path as first member.
            if found.path != path:
                out.buffer.write(pending)
                pending.clear()
                path, head = found.path, b'{"path":' + msgspec.json.encode(found.path) + b","
            pending += head
            if query.text is not None:
                pending += match_json(query.text, found.record, found.match)
            pending += memoryview(encode_line(found.record))[1:]
            if each_line or len(pending) >= _OUTPUT:
                out.buffer.write(pending)
                pending.clear()
        else:
            record = found.record
            line = f"{style.bold(found.path)} {record.time[:10]} {tail_line(record, style)}"
            out.write(one_line(line) + "\n")
            if query.text is not None:
                out.write(match_line(query.text, record, style, found.match))
        if args.limit is not None and count >= args.limit:
            break
    out.buffer.write(pending)
    out.flush()
    out.buffer.flush()
    if unsound:
        return EXIT_UNSOUND
    return EXIT_USAGE if unreadable else EXIT_OK
