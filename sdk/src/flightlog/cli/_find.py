"""``flightlog find``: the records that answer a question, across every session.

Theory of operation
-------------------
A question is a :class:`Query`: record types, a tool name, a model, failed or not, a
time range, session meta ``key=value`` pairs and a run.  Each file is read in large
blocks, and most lines are never decoded:

1. Line 1 is read with the protocol's :class:`~flightlog.protocol.Reader`: a file that
   is not a session is refused, and a meta filter that does not match skips the whole
   file.
2. **Prefilter, on bytes.**  Each filter that names a value says which quoted JSON
   string a matching line must contain (``"tool_exec_end"``, ``"get_weather"``); the
   first of them drives the scan: ``bytes.find`` jumps from one occurrence to the next,
   and only the line around it is looked at.  A line is decoded only when it holds
   every such string (and, for ``--error``, bytes that a failure of its type holds:
   ``true`` for ``is_error``, ``false`` for ``ok``, ``"error"``, ...).
3. **Then exactly**, on the decoded record (:func:`~flightlog.protocol.parse_line`, which
   also checks the file's session id): its type, run, time and data.

The prefilter can only let through too much, never too little: a value that appears in
a line for another reason is thrown out by step 3.  Only complete lines are read (an
unfinished tail is ignored, as every reader does); lines that the prefilter skips are
not checked: ``flightlog check`` verifies whole files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec

from flightlog.protocol import (
    FileFormatError,
    Reader,
    Record,
    default_root,
    encode_line,
    format_time,
    parse_line,
    parse_time,
)

from ._commands import EXIT_OK, EXIT_UNSOUND, EXIT_USAGE, CommandError, local_path
from ._render import Style, failed, record_data, tail_line
from ._sessions import session_files

__all__ = ["Query", "add_find_arguments", "cmd_find", "find_epilog", "search"]

_BLOCK: Final = 8 * 1024 * 1024
#: Bytes of which a failed record of a type holds at least one (see ``failed``); a
#: type that is always a failure has none to look for (None), and a type missing here
#: never reports one.
_FAILURE_BYTES: Final[dict[str, tuple[bytes, ...] | None]] = {
    "error": None,
    "retry": None,
    "model_exec_end": (b'"error"',),
    "context_prepare_end": (b'"error"',),
    "run_close": (b'"error"',),
    "agent_end": (b"false",),
    "tool_exec_end": (b"true", b'"refused"', b'"skipped"', b'"short_circuited"'),
    "tool_invoke_end": (b"true", b'"refused"', b'"skipped"', b'"short_circuited"'),
}
#: The record types whose data can name a model (``_models``).
_NAMES_MODEL: Final = frozenset(
    {"model_request", "model_exec_start", "model_exec_end", "model_response", "message_end"}
)
_RELATIVE: Final = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def find_epilog(exit_help: str) -> str:
    return f"""\
examples:
  flightlog find --type tool_exec_end --error --since 1h     every failed tool call of the last hour
  flightlog find --tool get_weather --json | jq .data.arguments
  flightlog find --model claude-x --type model_exec_end -n 20
  flightlog find --meta app=demo --since 2026-11-29T00:00:00Z --until 2026-11-30T00:00:00Z
  flightlog find --run 3f2a9c1e demo/                       one run, in the sessions of a directory

Looks in every session file (*.jsonl) under the data root, or in the PATHs given (files
or directories).  Filters combine with AND; --type and --meta may repeat.  Each line:
the session's path, the date and the record as `tail` shows it; --json prints the
record with a "path" member.  Lines are read but not verified: use `flightlog check`.

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
        "-n", "--limit", type=int, metavar="N", help="stop after N matching records"
    )
    parser.add_argument("--json", action="store_true", help="JSON lines with a path member")


@dataclass
class Query:
    """What ``find`` looks for; every filter that is set must match."""

    types: frozenset[str] | None = None
    tool: str | None = None
    model: str | None = None
    error: bool | None = None
    since: datetime | None = None
    until: datetime | None = None
    meta: dict[str, str] = field(default_factory=dict)
    run: str | None = None

    def needles(self) -> list[bytes]:
        """Quoted JSON strings every matching line holds, the most selective first."""
        needles: list[bytes] = []
        for value in (self.tool, self.model):
            if value is not None:
                needles.append(msgspec.json.encode(value))
        if self.run is not None:
            needles.append(b'"' + self.run.encode())
        if self.types is not None and len(self.types) == 1:
            needles.append(msgspec.json.encode(next(iter(self.types))))
        return needles

    def failure_bytes(self) -> tuple[bytes, ...] | None:
        """Bytes of which a matching line holds one, for ``--error``; None: no test."""
        if not self.error:
            return None
        wanted = self.types if self.types is not None else _FAILURE_BYTES.keys()
        found: list[bytes] = []
        for type in wanted:
            if type not in _FAILURE_BYTES:
                continue
            needles = _FAILURE_BYTES[type]
            if needles is None:
                return None
            found.extend(n for n in needles if n not in found)
        return tuple(found)

    def window(self) -> tuple[bytes | None, bytes | None] | None:
        """The time range by its seconds (``YYYY-MM-DDTHH:MM:SS``) for the prefilter."""
        if self.since is None and self.until is None:
            return None

        def second(moment: datetime | None) -> bytes | None:
            return None if moment is None else format_time(moment)[:19].encode()

        return second(self.since), second(self.until)

    def matches_meta(self, meta: dict[str, Any]) -> bool:
        return all(_meta_text(meta.get(key)) == value for key, value in self.meta.items())

    def matches(self, record: Record) -> bool:
        """The exact test, on a decoded record."""
        if not self.type_can_match(record.type):
            return False
        if self.run is not None and not (record.run_id or "").startswith(self.run):
            return False
        if (self.since is not None or self.until is not None) and not self._in_time(record):
            return False
        if self.tool is None and self.model is None and self.error is None:
            return True
        data = record_data(record)
        if self.tool is not None and not (
            record.type.startswith("tool_") and data.get("name") == self.tool
        ):
            return False
        if self.model is not None and self.model not in _models(data):
            return False
        return self.error is None or failed(record.type, data) == self.error

    def type_can_match(self, type: str) -> bool:
        """Whether a record of ``type`` can match, before its data is looked at."""
        if self.types is not None and type not in self.types:
            return False
        if self.tool is not None and not type.startswith("tool_"):
            return False
        if self.model is not None and type not in _NAMES_MODEL:
            return False
        return not self.error or type in _FAILURE_BYTES

    def _in_time(self, record: Record) -> bool:
        try:
            moment = parse_time(record.time)
        except ValueError:
            return False
        if self.since is not None and moment < self.since:
            return False
        return self.until is None or moment < self.until


def _meta_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _models(data: dict[str, Any]) -> list[Any]:
    config = data.get("config")
    message = data.get("message")
    return [
        data.get("model"),
        config.get("model") if isinstance(config, dict) else None,
        message.get("model") if isinstance(message, dict) else None,
    ]


@dataclass
class Found:
    """What :func:`search` hands out: a matching record and its session file."""

    path: str
    record: Record


def search(query: Query, paths: Sequence[str], *, on_error: Any = None) -> Iterator[Found]:
    """Every record under ``paths`` that ``query`` matches, file by file, in seq order.

    ``on_error(path, exc)`` hears about a file that cannot be read (:class:`OSError`)
    or breaks a reading rule (:class:`FileFormatError`); the search goes on with the
    next file.  Without ``on_error`` the error is raised.
    """
    for path in session_files(paths):
        try:
            for record in _search_file(query, path):
                yield Found(path, record)
        except (OSError, FileFormatError) as exc:
            if on_error is None:
                raise
            on_error(path, exc)


def _search_file(query: Query, path: str) -> Iterator[Record]:
    with open(path, "rb") as fileobj:
        reader = Reader(fileobj)
        header = reader.read_header()
        if not query.matches_meta(reader.meta):
            return
        if query.matches(header):
            yield header
        fileobj.seek(reader.offset)
        yield from _scan(query, fileobj, header.session_id)


def _scan(query: Query, fileobj: Any, session_id: str) -> Iterator[Record]:
    needles = query.needles()
    driver = needles[0] if needles else None
    others = needles[1:]
    failures = query.failure_bytes()
    window = query.window()
    offset = fileobj.tell()  # of the current block in the file
    rest = b""
    while block := fileobj.read(_BLOCK):
        block = rest + block
        end = block.rfind(b"\n") + 1  # only complete lines; the rest waits for more
        rest = block[end:]
        for start, stop in _candidates(block, end, driver):
            line = block[start:stop]
            if any(n not in line for n in others):
                continue
            if failures is not None and not any(member in line for member in failures):
                continue
            if window is not None and _outside(line, *window):
                continue
            type = _envelope_type(line)
            if type is not None and not query.type_can_match(type):
                continue
            try:
                record = parse_line(line, lineno=0, session_id=session_id, expected_seq=None)
            except FileFormatError as exc:
                # Lines are not counted while scanning: only an error needs its number.
                raise FileFormatError(_line_number(fileobj, offset + start), exc.reason) from None
            if query.matches(record):
                yield record
        offset += end


def _line_number(fileobj: Any, position: int) -> int:
    """The number of the line that starts at byte ``position`` of the file."""
    fileobj.seek(0)
    lines = 1
    while position > 0 and (chunk := fileobj.read(min(_BLOCK, position))):
        lines += chunk.count(b"\n")
        position -= len(chunk)
    return lines


def _envelope_type(line: bytes) -> str | None:
    """The record type, read from the line's bytes when the writer's compact envelope is
    there (``"type":"..."`` before ``"data"``), else None (the decoded record decides)."""
    at = line.find(b'"type":"')
    if at == -1:
        return None
    data = line.find(b'"data":')
    if data != -1 and data < at:
        return None
    end = line.find(b'"', at + 8)
    type = line[at + 8 : end]
    if end == -1 or b"\\" in type:  # an escape: let the decoder read it
        return None
    return type.decode("ascii", "replace")


def _outside(line: bytes, since: bytes | None, until: bytes | None) -> bool:
    """Whether the line's time is, by its second, surely outside [since, until): read
    from the envelope's bytes when the writer's compact form is there (else False, and
    the decoded record decides)."""
    at = line.find(b'"time":"')
    if at == -1:
        return False
    data = line.find(b'"data":')
    if data != -1 and data < at:
        return False
    second = line[at + 8 : at + 27]
    if b"\\" in second:
        return False
    return (since is not None and second < since) or (until is not None and second > until)


def _candidates(block: bytes, end: int, driver: bytes | None) -> Iterator[tuple[int, int]]:
    """(start, stop) of each line of ``block[:end]`` that holds ``driver`` (every line
    when it is None), without its ``\\n``."""
    if driver is None:
        start = 0
        while start < end:
            stop = block.index(b"\n", start)
            yield start, stop
            start = stop + 1
        return
    at = block.find(driver, 0, end)
    while at != -1:
        start = block.rfind(b"\n", 0, at) + 1
        stop = block.index(b"\n", at)
        yield start, stop
        at = block.find(driver, stop + 1, end)


# ---------------------------------------------------------------------------- command


def _moment(text: str, option: str, now: datetime) -> datetime:
    relative = _RELATIVE.fullmatch(text.strip())
    if relative:
        return now - timedelta(seconds=float(relative.group(1)) * _UNITS[relative.group(2)])
    try:
        return parse_time(text.strip())
    except ValueError:
        raise CommandError(
            f"{option} takes an RFC 3339 UTC time (2026-11-29T20:00:00Z) or an age "
            f"(30s, 15m, 2h, 1d), not {text!r}",
            EXIT_USAGE,
        ) from None


def build_query(args: argparse.Namespace, now: datetime | None = None) -> Query:
    """The :class:`Query` of ``find``'s arguments; raises :class:`CommandError` (usage)."""
    from ._commands import _record_types

    now = now or datetime.now(UTC)
    types = _record_types(args.type)
    meta: dict[str, str] = {}
    for item in args.meta or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"--meta takes KEY=VALUE, not {item!r}", EXIT_USAGE)
        meta[key] = value
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
        run=args.run,
    )


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
            sys.stderr.write(f"flightlog: {path}: line {exc.line}: {exc.reason}\n")
        else:
            unreadable = True
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            sys.stderr.write(f"flightlog: {path}: cannot read: {reason}\n")

    out = sys.stdout
    for count, found in enumerate(search(query, paths, on_error=on_error), 1):
        if args.json:
            # The line as in the file (data never decoded), with the path as first member.
            line = encode_line(found.record)
            out.buffer.write(b'{"path":' + msgspec.json.encode(found.path) + b"," + line[1:])
        else:
            record = found.record
            out.write(f"{style.bold(found.path)} {record.time[:10]} {tail_line(record, style)}\n")
        if args.limit is not None and count >= args.limit:
            break
    out.flush()
    out.buffer.flush()
    if unsound:
        return EXIT_UNSOUND
    return EXIT_USAGE if unreadable else EXIT_OK
