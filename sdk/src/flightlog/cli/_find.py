"""``flightlog find``: the records that answer a question, across every session.

Theory of operation
-------------------
A question is a :class:`Query`: record types, a tool name, a model, failed or not, a
time range, session meta ``key=value`` pairs and a run.  Each file is read in large
blocks, and most lines are never decoded:

1. Line 1 is read with the protocol's :class:`~flightlog.protocol.Reader`: a file that
   is not a session is refused, and a meta filter that does not match skips the whole
   file.
2. **Prefilter, on bytes** (:class:`_Prefilter`).  Each filter says what bytes a
   matching line must hold: the quoted JSON string of a tool, a model, a run prefix or
   a single type (``"get_weather"``); a ``"type"`` member naming a type the question
   allows (``--tool`` allows ``tool_*``, ``--model`` the types that name one, several
   ``--type`` those); for a time range, a ``"time"`` member whose
   value starts with a second inside the range, or is not in the writer's form
   (``2026-11-29T20:00:00.123456Z``); for ``--error``, a member that can report a
   failure with a value other than the one that says "none" (``"is_error"`` not
   followed by ``:false``).  The first of them drives the scan through the block
   (``bytes.find`` or a regular expression with a literal prefix, both in C), so most
   lines are never looked at one by one; the others are tested on each line it finds.
3. **Then exactly**, on the decoded record (:func:`~flightlog.protocol.format.parse_line`, which
   also checks the file's session id): its type, run and time, and of its ``data``
   only the members a filter reads (:class:`_Data`, a typed decode that skips the
   rest; a member of another shape sends the record to a plain decode).

The prefilter may let through a line that does not match, never drop one that does:
a JSON string is spelled the way the writer spells it (msgspec: raw UTF-8, ``\\"``,
``\\\\`` and the five short escapes) unless it holds a ``\\u`` or ``\\/`` escape, so
a line holding one of these skips the byte tests and goes to step 3; keys are
looked for without the colon or with a look-ahead that lets anything unusual through
(whitespace, a duplicate member, a value in another form).  Only complete lines are read
(an unfinished tail is ignored, as every reader does); lines that the prefilter skips
are not checked: ``flightlog check`` verifies whole files.
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
    format_time,
    parse_time,
)
from flightlog.protocol.format import (
    encode_line,
    parse_line,
)
from flightlog.protocol.wire import (
    default_root,
)

from ._commands import EXIT_OK, EXIT_UNSOUND, EXIT_USAGE, CommandError, local_path
from ._render import Style, failed, one_line, record_data, say, tail_line
from ._sessions import session_files
from ._text import JOINED_PARTS, byte_test, first_match, match_json, match_line

__all__ = ["Query", "add_find_arguments", "cmd_find", "find_epilog", "search"]

_BLOCK: Final = 8 * 1024 * 1024
_OUTPUT: Final = 256 * 1024
#: For each record type that can report a failure (see ``failed``): patterns of which a
#: failed record of the type holds at least one.  Each names the member that reports it,
#: not followed by the value that says "no failure" (so whitespace, another spelling
#: or any other value lets the line through); ``"retry"`` is the type itself.
_FAILED_CALL: Final = (rb'"is_error"(?!:(?:false|null))', rb'"disposition"(?!:(?:"ran"|null))')
_FAILURE_PATTERNS: Final[dict[str, tuple[bytes, ...]]] = {
    "error": (rb'"error"(?!:null)',),
    "retry": (rb'"retry"',),
    "model_exec_end": (rb'"error"(?!:null)',),
    "context_prepare_end": (rb'"error"(?!:null)',),
    "run_close": (rb'"error"(?!:null)',),
    "agent_end": (rb'"ok"(?!:true)',),
    "tool_exec_end": _FAILED_CALL,
    "tool_invoke_end": _FAILED_CALL,
}
#: A ``\u`` or ``\/`` escape: a line that holds one may spell a string otherwise than
#: the writer does, so it skips the byte tests.
_ESCAPE: Final = re.compile(rb"\\[u/]")
#: A time in the writer's form, as the rest of a ``"time"`` member.  Its digits are
#: not checked (quicker): a time with other characters there is no time at all.
_WRITER_TIME: Final = rb':".{10}T.{8}(?:\.\d{1,9})?Z"'
#: The same, as a string: its seconds and its fraction.
_WRITER_TIME_TEXT: Final = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z", re.ASCII
)
#: The record types whose data can name a model (``_models``).
_NAMES_MODEL: Final = frozenset(
    {"model_request", "model_exec_start", "model_exec_end", "model_response", "message_end"}
)
#: No line holds it: the test of a question no record can answer.
_NOTHING: Final = re.compile(rb"(?!)")
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
  flightlog find --text 'rate.?limit' -i --since 1d        what any message or result said

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
        "--text",
        metavar="REGEX",
        help="only records whose content matches REGEX (Python syntax), shown in context",
    )
    parser.add_argument("-i", "--ignore-case", action="store_true", help="--text ignores case")
    parser.add_argument(
        "-n", "--limit", type=int, metavar="N", help="stop after N matching records"
    )
    parser.add_argument("--json", action="store_true", help="JSON lines with a path member")


class _HasModel(msgspec.Struct):
    model: Any = None


class _Data(msgspec.Struct):
    """The members of a record's ``data`` that the filters read, each with the value
    ``dict.get`` gives when it is missing (or the one that means the same): decoding
    only these skips the rest of ``data`` without building it."""

    name: Any = None
    model: Any = None
    config: _HasModel | None = None
    message: _HasModel | None = None
    error: Any = None
    is_error: Any = None
    disposition: Any = "ran"
    ok: Any = True

    def plain(self) -> dict[str, Any]:
        """As the plain JSON values :meth:`Query.matches` reads."""
        config, message = self.config, self.message
        return {
            "name": self.name,
            "model": self.model,
            "config": None if config is None else {"model": config.model},
            "message": None if message is None else {"model": message.model},
            "error": self.error,
            "is_error": self.is_error,
            "disposition": self.disposition,
            "ok": self.ok,
        }


_data_decoder: Final = msgspec.json.Decoder(_Data)


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
    text: re.Pattern[str] | None = None

    def __post_init__(self) -> None:
        self._since = None if self.since is None else _instant_text(format_time(self.since))
        self._until = None if self.until is None else _instant_text(format_time(self.until))
        self._second = ""  # the seconds of the last record time known to be valid

    def tests(self) -> list[bytes | re.Pattern[bytes]]:
        """What every matching line holds, unless it has a ``\\u`` or ``\\/`` escape: a
        string (its bytes), or a match of a pattern; the most selective first."""
        tests: list[bytes | re.Pattern[bytes]] = []
        if self.text is not None and (literal := byte_test(self.text)) is not None:
            tests.append(literal)
        for value in (self.tool, self.model):
            if value is not None:
                tests.append(msgspec.json.encode(value))
        if self.run is not None:
            tests.append(msgspec.json.encode(self.run)[:-1])  # without the closing quote
        if self.types is not None and len(self.types) == 1:
            # The type itself: quicker to look for, and rarely anywhere else.
            tests.append(msgspec.json.encode(next(iter(self.types))))
        elif (types := self._type_pattern()) is not None:
            tests.append(types)
        if self.since is not None or self.until is not None:
            tests.append(self._time_pattern())
        if self.error:
            tests.append(self._failure_pattern())
        return tests

    def _type_pattern(self) -> re.Pattern[bytes] | None:
        """A ``"type"`` member whose value is a type that can match, or is spelled so
        that another pattern would not tell (whitespace); None when every type can."""
        if self.types is not None:
            allowed = sorted(type for type in self.types if self.type_can_match(type))
        elif self.model is not None or self.error:
            possible = _NAMES_MODEL if self.model is not None else _FAILURE_PATTERNS.keys()
            allowed = sorted(type for type in possible if self.type_can_match(type))
        elif self.tool is not None:
            return re.compile(rb'"type"(?!:"(?!tool_))')
        else:
            return None
        if not allowed:
            return _NOTHING
        values = b"|".join(re.escape(msgspec.json.encode(type)[1:]) for type in allowed)
        return re.compile(b'"type"(?!:"(?!(?:' + values + b")))")

    def _time_pattern(self) -> re.Pattern[bytes]:
        """A ``"time"`` member whose value is, by its second, inside [since, until], or
        is not in the writer's form (any other, or whitespace, lets the line through)."""

        def second(moment: datetime | None) -> str | None:
            return None if moment is None else format_time(moment)[:19]

        inside = _between(second(self.since), second(self.until)).encode()
        return re.compile(b'"time"(?::"(?:' + inside + b")|(?!" + _WRITER_TIME + b"))")

    def _failure_pattern(self) -> re.Pattern[bytes]:
        """What a line that reports a failure holds, for ``--error``."""
        wanted = sorted(self.types if self.types is not None else _FAILURE_PATTERNS)
        found: list[bytes] = []
        for type in wanted:
            for pattern in _FAILURE_PATTERNS.get(type, ()):
                if pattern not in found:
                    found.append(pattern)
        return re.compile(b"|".join(found)) if found else _NOTHING

    def matches_meta(self, meta: dict[str, Any]) -> bool:
        return meta_matches(meta, self.meta)

    def matches(self, record: Record) -> bool:
        """The exact test, on a decoded record."""
        if not self._matches(record):
            return False
        return self.text is None or first_match(self.text, record_data(record)) is not None

    def _matches(self, record: Record) -> bool:
        if self.tool is None and self.model is None and self.error is None:
            return self._accepts(record.type, record.time, record.run_id, {})
        try:
            data = _data_decoder.decode(record.data).plain()
        except (msgspec.DecodeError, UnicodeDecodeError, ValueError, RecursionError):
            data = record_data(record)  # a member of another shape: as plain JSON
        return self._accepts(record.type, record.time, record.run_id, data)

    def _accepts(self, type: str, time: str, run_id: str | None, data: dict[str, Any]) -> bool:
        if not self.type_can_match(type):
            return False
        if self.run is not None and not (run_id or "").startswith(self.run):
            return False
        if (self.since is not None or self.until is not None) and not self._in_time(time):
            return False
        if self.tool is not None and data.get("name") != self.tool:
            return False
        if self.model is not None and self.model not in _models(data):
            return False
        return self.error is None or failed(type, data) == self.error

    def type_can_match(self, type: str) -> bool:
        """Whether a record of ``type`` can match, before its data is looked at."""
        if self.types is not None and type not in self.types:
            return False
        if self.tool is not None and not type.startswith("tool_"):
            return False
        if self.model is not None and type not in _NAMES_MODEL:
            return False
        return not self.error or type in _FAILURE_PATTERNS

    def _in_time(self, time: str) -> bool:
        instant = self._instant(time)
        if instant is None:
            try:
                instant = _instant_text(format_time(parse_time(time)))
            except ValueError:
                return False
        if self._since is not None and instant < self._since:
            return False
        return self._until is None or instant < self._until

    def _instant(self, time: str) -> str | None:
        """A time in the writer's form as text that sorts as the moment
        :func:`~flightlog.protocol.parse_time` reads (its seconds, then the first six
        digits of its fraction); None for another form, or seconds that are no date."""
        match = _WRITER_TIME_TEXT.fullmatch(time)
        if match is None:
            return None
        second, fraction = match.groups()
        if second != self._second:
            try:
                datetime.fromisoformat(second)
            except ValueError:
                return None
            self._second = second
        return second + ((fraction or "") + "000000")[:6]


def _instant_text(text: str) -> str:
    """``format_time``'s text as :meth:`Query._instant` gives it."""
    return text[:19] + text[20:26]


def _between(low: str | None, high: str | None) -> str:
    """A pattern of the seconds (``YYYY-MM-DDTHH:MM:SS``) from ``low`` to ``high``, both
    included; None is no bound."""
    if low is None and high is None:
        return _any(_SECOND_FORM)
    if low is None:
        return _beyond(high or "", up=False)
    if high is None:
        return _beyond(low, up=True)
    if low > high:
        return "(?!)"
    same = 0
    while same < len(low) and low[same] == high[same]:
        same += 1
    if same == len(low):
        return re.escape(low)
    first, last = int(low[same]), int(high[same])
    rest = same + 1
    options = [low[same] + _beyond(low[rest:], up=True)]
    if last - first > 1:
        options.append(f"[{first + 1}-{last - 1}]" + _any(low[rest:]))
    options.append(high[same] + _beyond(high[rest:], up=False))
    return re.escape(low[:same]) + "(?:" + "|".join(options) + ")"


_SECOND_FORM: Final = "0000-00-00T00:00:00"


def _any(form: str) -> str:
    """Any text of the form of ``form``: a digit where it has one, else its character."""
    return "".join(r"\d" if char.isdigit() else re.escape(char) for char in form)


def _beyond(bound: str, *, up: bool) -> str:
    """A pattern of the texts of ``bound``'s form from it up (``up``) or down."""
    if not bound:
        return ""
    head, rest = bound[0], bound[1:]
    if not head.isdigit():
        return re.escape(head) + _beyond(rest, up=up)
    options = [head + _beyond(rest, up=up)]
    digit = int(head)
    if up and digit < 9:
        options.append(f"[{digit + 1}-9]" + _any(rest))
    if not up and digit > 0:
        options.append(f"[0-{digit - 1}]" + _any(rest))
    return "(?:" + "|".join(options) + ")"


def parse_meta(items: Sequence[str] | None) -> dict[str, str]:
    """``--meta KEY=VALUE`` options as a dict; raises :class:`CommandError` (usage)."""
    meta: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"--meta takes KEY=VALUE, not {item!r}", EXIT_USAGE)
        meta[key] = value
    return meta


def meta_matches(meta: dict[str, Any], wanted: dict[str, str]) -> bool:
    """Whether session ``meta`` has each of ``wanted``'s keys with that value (a value
    that is not a string compared as its JSON)."""
    return all(_meta_text(meta.get(key)) == value for key, value in wanted.items())


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
    prefilter = _Prefilter(query.tests(), always=query.text is not None)
    for path in session_files(paths):
        try:
            for record in _search_file(query, prefilter, path):
                yield Found(path, record)
        except (OSError, FileFormatError) as exc:
            if on_error is None:
                raise
            on_error(path, exc)


def _search_file(query: Query, prefilter: _Prefilter, path: str) -> Iterator[Record]:
    with open(path, "rb") as fileobj:
        reader = Reader(fileobj)
        header = reader.read_header()
        if not query.matches_meta(reader.meta):
            return
        if query.matches(header):
            yield header
        fileobj.seek(reader.offset)
        yield from _scan(query, prefilter, fileobj, header.session_id)


def _scan(query: Query, prefilter: _Prefilter, fileobj: Any, session_id: str) -> Iterator[Record]:
    offset = fileobj.tell()  # of the current block in the file
    rest = b""
    while block := fileobj.read(_BLOCK):
        block = rest + block
        end = block.rfind(b"\n") + 1  # only complete lines; the rest waits for more
        rest = block[end:]
        for start, stop in prefilter.lines(block, end):
            line = block[start:stop]
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


def _first(test: bytes | re.Pattern[bytes], block: bytes, start: int, end: int) -> int:
    """Where ``test`` is first found in ``block[start:end]``; -1 if nowhere."""
    if isinstance(test, bytes):
        return block.find(test, start, end)
    match = test.search(block, start, end)
    return -1 if match is None else match.start()


class _Prefilter:
    """Step 2 of the theory of operation: the lines of a block that may match."""

    def __init__(self, tests: list[bytes | re.Pattern[bytes]], *, always: bool = False) -> None:
        # The lines decoded whatever the tests say: another writer's escapes, and for
        # --text the lines that join text parts (_text's theory of operation).
        self._always = (_ESCAPE, JOINED_PARTS) if always else (_ESCAPE,)
        self._driver = tests[0] if tests else None
        # Tested within one line each: as patterns, one call whatever the test.
        self._others = [
            re.compile(re.escape(test)) if isinstance(test, bytes) else test for test in tests[1:]
        ]

    def lines(self, block: bytes, end: int) -> Iterator[tuple[int, int]]:
        """(start, stop) of each line of ``block[:end]`` that may match, in order,
        without its ``\\n``."""
        if len(self._always) == 1 and block.find(b"\\", 0, end) == -1:
            return self._tested(block, end)
        escaped = list(self._escaped(block, end))
        if not escaped:
            return self._tested(block, end)
        return iter(sorted({*escaped, *self._tested(block, end)}))

    def _tested(self, block: bytes, end: int) -> Iterator[tuple[int, int]]:
        driver, others = self._driver, self._others
        if driver is None:
            start = 0
            while start < end:
                stop = block.index(b"\n", start)
                yield start, stop
                start = stop + 1
            return
        at = _first(driver, block, 0, end)
        while at != -1:
            start = block.rfind(b"\n", 0, at) + 1
            stop = block.index(b"\n", at)
            for test in others:
                if test.search(block, start, stop) is None:
                    break
            else:
                yield start, stop
            at = _first(driver, block, stop + 1, end)

    def _escaped(self, block: bytes, end: int) -> Iterator[tuple[int, int]]:
        """The lines of ``block[:end]`` decoded whatever the tests say."""
        for pattern in self._always:  # one by one: each has a literal prefix to scan for
            match = pattern.search(block, 0, end)
            while match is not None:
                start = block.rfind(b"\n", 0, match.start()) + 1
                stop = block.index(b"\n", match.start())
                yield start, stop
                match = pattern.search(block, stop + 1, end)


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
        run=args.run,
        text=_pattern(args.text, args.ignore_case) if args.text is not None else None,
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

    out = sys.stdout
    # --json lines are written in pieces of _OUTPUT bytes, and at the end of each file
    # (one write per line costs as much as finding it when stdout is unbuffered); to a
    # terminal, line by line.
    pending = bytearray()
    each_line = out.isatty()
    path, head = "", b""  # the last path, and the start of its lines in JSON
    for count, found in enumerate(search(query, paths, on_error=on_error), 1):
        if args.json:
            # The line as in the file (data never decoded), with the path as first member.
            if found.path != path:
                out.buffer.write(pending)
                pending.clear()
                path, head = found.path, b'{"path":' + msgspec.json.encode(found.path) + b","
            pending += head
            if query.text is not None:
                pending += match_json(query.text, found.record)
            pending += memoryview(encode_line(found.record))[1:]
            if each_line or len(pending) >= _OUTPUT:
                out.buffer.write(pending)
                pending.clear()
        else:
            record = found.record
            line = f"{style.bold(found.path)} {record.time[:10]} {tail_line(record, style)}"
            out.write(one_line(line) + "\n")
            if query.text is not None:
                out.write(match_line(query.text, record, style))
        if args.limit is not None and count >= args.limit:
            break
    out.buffer.write(pending)
    out.flush()
    out.buffer.flush()
    if unsound:
        return EXIT_UNSOUND
    return EXIT_USAGE if unreadable else EXIT_OK
