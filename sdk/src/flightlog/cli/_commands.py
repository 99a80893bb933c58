"""The subcommands of ``flightlog``: each takes the parsed arguments and a :class:`Style`
and returns the exit status.

Failures travel as exceptions (:class:`CommandError` for those the command explains
itself, the SDK's errors for the rest) and become a message and a status in one place,
:func:`flightlog.cli.run`.

Where records come from:

* ``tail -f`` reads through the daemon (``client.tail``), which delivers what is in the
  file and then what is written live, without gaps or duplicates.  Without ``-f``,
  ``tail`` reads like ``show``.
* ``show`` and ``inspect`` read the file directly when they can, and through the daemon
  when they cannot (a file only the daemon's user may read, or one under the daemon's
  data root on another path): the socket is the access check (docs/operations.md).
* ``check`` reads the file directly only: it verifies bytes, including the unfinished
  tail the daemon never sends.

A relative PATH is looked up in the current directory first and then under the data
root (``$FLIGHTLOG_ROOT``, else ``$XDG_STATE_HOME/flightlog``), as the daemon resolves it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Final, TextIO

import msgspec

from flightlog.protocol import (
    FileFormatError,
    Reader,
    Record,
)
from flightlog.protocol.format import (
    encode_line,
)
from flightlog.protocol.wire import (
    default_socket_path,
)
from flightlog.sdk import (
    CallNotFound,
    ConnectError,
    ConnectionLost,
    DaemonError,
    ErrorCode,
    Transcript,
    connect,
)
from flightlog.sdk import check as check_file
from flightlog.sdk.storage import open_session_file, resolving

from ._exits import (
    EXIT_CODES,
    EXIT_DIFFERENT,
    EXIT_GAPS,
    EXIT_INTERRUPTED,
    EXIT_NO_DAEMON,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNSOUND,
    EXIT_USAGE,
    CommandError,
    installed_version,
    local_path,
)
from ._exits import record_types as _record_types
from ._inspect import SessionSummary
from ._render import (
    Style,
    format_bytes,
    format_duration,
    one_line,
    record_data,
    say,
    short,
    tail_line,
)
from ._views import call_details, inspect_lines, origin_lines, prompt_lines, show_lines

__all__ = [
    "EXIT_CODES",
    "EXIT_DIFFERENT",
    "EXIT_GAPS",
    "EXIT_INTERRUPTED",
    "EXIT_NO_DAEMON",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNSOUND",
    "EXIT_USAGE",
    "CommandError",
    "cmd_check",
    "cmd_inspect",
    "cmd_show",
    "cmd_tail",
    "daemon_path",
    "installed_version",
    "local_path",
]

_CLIENT_NAME: Final = "flightlog"


# -------------------------------------------------------------------------- output


def _out(text: str = "", file: TextIO | None = None) -> None:
    """Print ``text`` as one line: what a record brings in cannot break it."""
    (file or sys.stdout).write(one_line(text) + "\n")


def _err(text: str) -> None:
    say(text, sys.stderr)


def _blob_problems(problems: collections.deque[str]) -> None:
    """Say what a tail through the daemon could not put back (each reference is kept)."""
    while problems:
        _err(f"flightlog: {problems.popleft()}; the reference is kept")


# --------------------------------------------------------------------------- paths


def _socket(args: argparse.Namespace) -> str:
    return args.socket or default_socket_path(os.environ, os.getuid())


def daemon_path(path: str) -> str:
    """PATH as the daemon should see it: a relative path that exists in the current
    directory becomes absolute; any other stays as given (the daemon resolves relative
    paths under its data root)."""
    if not os.path.isabs(path) and os.path.lexists(path):
        return os.path.realpath(path)
    return path


# ----------------------------------------------------------------- reading records


class Source:
    """The records of one session, from its file or through the daemon.

    ``label`` is the path to show; ``reader`` the file's :class:`Reader` when reading
    directly (it knows the unfinished tail), else None.
    """

    def __init__(self, label: str, records: Iterator[Record], reader: Reader | None) -> None:
        self.label = label
        self.records = records
        self.reader = reader


@contextlib.contextmanager
def open_source(path: str, args: argparse.Namespace) -> Iterator[Source]:
    """Open PATH for reading: the file if this process may read it, else the daemon."""
    local = local_path(path)
    stack = contextlib.ExitStack()
    try:
        fileobj = stack.enter_context(open_session_file(local))
    except IsADirectoryError:
        raise CommandError(f"{path}: is a directory, not a session file", EXIT_USAGE) from None
    except (FileNotFoundError, PermissionError) as exc:
        reason = "no such file" if isinstance(exc, FileNotFoundError) else "permission denied"
        try:
            client = connect(_socket(args), client_name=_CLIENT_NAME)
        except ConnectError:
            raise CommandError(
                f"{path}: {reason}, and no daemon listens on {_socket(args)} to read it through",
                EXIT_USAGE,
            ) from None
        with client, client.tail(daemon_path(path), after=0, follow=False) as tail:
            yield Source(path, iter(tail), None)
        _blob_problems(tail.problems)
        return
    except OSError as exc:
        raise CommandError(f"{path}: cannot read: {exc.strerror or exc}", EXIT_USAGE) from None
    with stack:
        reader = Reader(fileobj)
        yield Source(local, resolving(reader, local), reader)


def _unfinished_tail_note(source: Source) -> str | None:
    reader = source.reader
    if reader is None or not reader.tail_size:
        return None
    return (
        f"unfinished tail: the last {format_bytes(reader.tail_size)} have no newline "
        "(an interrupted write, or one in progress); readers ignore it"
    )


def _match_run(summary: SessionSummary, wanted: str) -> str | None:
    """The run id ``wanted`` names (a run id or a unique prefix of one)."""
    matches = [run_id for run_id in summary.runs if run_id and run_id.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(run_id[:8] for run_id in summary.runs if run_id) or "none"
        raise CommandError(f"no run {wanted!r} in this session (runs: {known})", EXIT_USAGE)
    raise CommandError(f"{wanted!r} names {len(matches)} runs; give more of the id", EXIT_USAGE)


# ---------------------------------------------------------------------------- tail


class _TailPrinter:
    """Writes tailed records: readable lines with a date marker, or raw JSONL."""

    def __init__(self, args: argparse.Namespace, style: Style, *, with_path: bool) -> None:
        self.json = args.json
        self.style = style
        self.flush = args.follow or with_path
        self.with_path = with_path
        self.date: str | None = None
        self.count = 0

    def write(self, record: Record, path: str | None = None) -> None:
        self.count += 1
        if self.json:
            line = encode_line(record).decode()
            if self.with_path:
                # One JSON object per line, still: the path rides along as a field.
                line = msgspec.json.encode({"path": path, **record.to_builtins()}).decode() + "\n"
            sys.stdout.write(line)
        else:
            date = record.time[:10]
            if date != self.date:
                self.date = date
                _out(self.style.dim(f"-- {date} (UTC) --"))
            line = tail_line(record, self.style)
            _out(f"{self.style.bold(path or '')} {line}" if self.with_path else line)
        if self.flush:
            sys.stdout.flush()


_END_REASONS: Final[dict[str | None, str]] = {
    "session_closed": "the writer closed the session",
    "shutting_down": "the daemon is shutting down",
    "unsubscribed": "unsubscribed",
    None: "the daemon closed the connection (it stopped, or was stopped)",
}

#: Ends of a follow that leave the session open: following again later goes on.
_CUT_SHORT: Final = frozenset({"shutting_down", None})


class _RunFilter:
    """``--run``: records whose run id starts with the prefix; remembers a match."""

    def __init__(self, prefix: str | None) -> None:
        self.prefix = prefix
        self.matched = False

    def __call__(self, record: Record) -> bool:
        if self.prefix is None:
            return True
        if (record.run_id or "").startswith(self.prefix):
            self.matched = True
            return True
        return False

    def require_match(self, path: str) -> None:
        if self.prefix is not None and not self.matched:
            raise CommandError(f"no run {self.prefix!r} in {path}", EXIT_USAGE)


def cmd_tail(args: argparse.Namespace, style: Style) -> int:
    types = _record_types(args.type)
    if args.all:
        if args.path is not None:
            raise CommandError("give a PATH or --all, not both", EXIT_USAGE)
    elif args.path is None:
        raise CommandError("tail needs a PATH (or --all for every session)", EXIT_USAGE)
    if args.after < 0:
        raise CommandError("--after takes a seq, 0 or more", EXIT_USAGE)
    target: str = args.path or ""
    run_filter = _RunFilter(args.run)
    printer = _TailPrinter(args, style, with_path=args.all)

    def wanted(record: Record) -> bool:
        # The run first: a record of the run filtered out by type still matches --run.
        in_run = run_filter(record)
        return in_run and (types is None or record.type in types)

    if not (args.follow or args.all):
        # What is in the file: read it directly when this user may, else through the
        # daemon (open_source decides), whether or not a daemon runs.
        with open_source(target, args) as source:
            for record in source.records:
                if wanted(record) and record.seq > args.after:
                    printer.write(record)
        run_filter.require_match(target)
        return EXIT_OK
    # A whole run id filters in the daemon; a prefix of one filters here.
    server_run = args.run if args.run is not None and len(args.run) == 32 else None
    with connect(
        _socket(args), client_name=_CLIENT_NAME, reconnect_grace=args.reconnect_grace
    ) as client:
        if args.all:
            tail_all = client.tail_all(follow=True, types=types, run_id=server_run)
            # A daemon that goes away may close the connection before it ends the tail.
            with contextlib.suppress(ConnectionLost), tail_all:
                for path, record in tail_all:
                    _blob_problems(tail_all.problems)
                    if wanted(record):
                        printer.write(record, path)
            why = _END_REASONS.get(tail_all.end_reason, str(tail_all.end_reason))
            _err(style.dim(f"-- the daemon ended the subscription: {why} --"))
            return EXIT_NO_DAEMON if tail_all.end_reason in _CUT_SHORT else EXIT_OK
        tail = client.tail(
            daemon_path(target),
            after=args.after,
            follow=True,
            types=types,
            run_id=server_run,
        )
        last_seq = args.after
        try:
            with contextlib.suppress(ConnectionLost), tail:
                for record in tail:
                    _blob_problems(tail.problems)
                    last_seq = record.seq
                    if wanted(record):
                        printer.write(record)
        except DaemonError as exc:
            if exc.code == ErrorCode.PATH_REFUSED and os.path.isfile(local_path(target)):
                raise CommandError(
                    f"{target}: the daemon does not write this path (it is outside its "
                    "data root and --allow roots), so there is nothing live to follow; "
                    "without -f, tail reads the file directly",
                    EXIT_REFUSED,
                ) from None
            raise
    why = _END_REASONS.get(tail.end_reason, str(tail.end_reason))
    _err(style.dim(f"-- end of {target}: {why} (last seq {last_seq}) --"))
    if tail.end_reason in _CUT_SHORT:
        # The session goes on without this follow: a script must not take it as ended.
        return EXIT_NO_DAEMON
    run_filter.require_match(target)
    return EXIT_OK


# ---------------------------------------------------------------------------- show


def _parse_call(text: str) -> tuple[str, int | None]:
    exec_id, sep, attempt = text.rpartition(":")
    if sep and exec_id and attempt.isdigit():
        return exec_id, int(attempt)
    return text, None


def cmd_show(args: argparse.Namespace, style: Style) -> int:
    summary = SessionSummary()
    call_id, call_attempt = _parse_call(args.call) if args.call else (None, None)
    call_records: list[Record] = []
    failure: FileFormatError | None = None
    # Other commands (demo) call this with a namespace of their own: no --prompt there.
    wants_prompt, wants_json = getattr(args, "prompt", False), getattr(args, "json", False)
    if wants_prompt and call_id is None:
        raise CommandError("--prompt needs --call ID: the model call whose prompt", EXIT_USAGE)
    if wants_json and not wants_prompt:
        raise CommandError("--json goes with --call ID --prompt", EXIT_USAGE)
    transcript = Transcript() if wants_prompt else None
    with open_source(args.path, args) as source:
        try:
            for record in source.records:
                summary.add(record)
                if transcript is not None:
                    transcript.add(record)
                elif call_id is not None and _is_call_record(record, call_id, call_attempt):
                    call_records.append(record)
        except FileFormatError as exc:
            failure = exc
        tail_note = _unfinished_tail_note(source)
        label = source.label
    if summary.session_id is None and failure is not None:
        raise failure
    run_id = _match_run(summary, args.run) if args.run else None
    if transcript is not None and call_id is not None:
        _show_prompts(transcript, call_id, call_attempt, run_id, args, style)
    elif call_id is not None:
        if run_id is not None:
            call_records = [r for r in call_records if r.run_id == run_id]
        if not call_records:
            what = call_id + (f":{call_attempt}" if call_attempt else "")
            raise CommandError(f"no call {what!r} in {args.path}", EXIT_USAGE)
        _show_call(summary, call_records, style)
    else:
        runs = [summary.runs[run_id]] if run_id is not None else None
        if runs is None:
            for line in origin_lines(summary, label, style):
                _out(line)
        for line in show_lines(summary, label, style, runs):
            _out(line)
    if tail_note:
        _out(style.yellow(tail_note))
    if failure is not None:
        _out(style.red(f"NOT SOUND: line {failure.line}: {failure.reason}"))
        _out("(the timeline above ends at the last readable line)")
        return EXIT_UNSOUND
    return EXIT_OK


def _show_prompts(
    transcript: Transcript,
    call_id: str,
    attempt: int | None,
    run_id: str | None,
    args: argparse.Namespace,
    style: Style,
) -> None:
    """``--prompt``: each matching model request's prompt, rebuilt (one JSON object a
    line with ``--json``)."""
    shown = 0
    try:
        for prompt in transcript.prompts(call_id, attempt=attempt, run=run_id):
            if args.json:
                sys.stdout.write(msgspec.json.encode(prompt.to_builtins()).decode() + "\n")
            else:
                if shown:
                    _out()
                for line in prompt_lines(prompt, style):
                    _out(line)
            shown += 1
    except CallNotFound as exc:
        raise CommandError(f"{args.path}: {exc.message}", EXIT_UNSOUND) from None
    if not shown:
        what = call_id + (f":{attempt}" if attempt else "")
        raise CommandError(f"no model call {what!r} in {args.path}", EXIT_USAGE)


def _is_call_record(record: Record, call_id: str, attempt: int | None) -> bool:
    if record.run_id is None or record.type in ("run_start", "run_close", "checkpoint"):
        return False
    if f'"{call_id}"'.encode() not in bytes(record.data):  # cheap test before decoding
        return False
    data = record_data(record)
    execution = data.get("execution")
    if not isinstance(execution, dict):
        return False
    # An execution id, or the provider's tool call id (what the model and its logs say).
    if execution.get("id") != call_id and data.get("tool_call_id") != call_id:
        return False
    return attempt is None or execution.get("attempt", 1) == attempt


def _show_call(summary: SessionSummary, records: list[Record], style: Style) -> None:
    groups: dict[tuple[str | None, str, str, int], list[Record]] = {}
    for record in records:
        execution = record_data(record)["execution"]
        key = (
            record.run_id,
            str(execution.get("kind")),
            str(execution.get("id")),
            int(execution.get("attempt", 1)),
        )
        groups.setdefault(key, []).append(record)
    first = True
    for (run_id, kind, exec_id, attempt), group in groups.items():
        run = summary.runs.get(run_id)
        call = run.calls.get((kind, exec_id, attempt)) if run else None
        if not first:
            _out()
        first = False
        title = f"{kind} call {exec_id} attempt {attempt}"
        where = f"run {run.index} {(run_id or '')[:8]}" if run else "run ?"
        _out(style.bold(title) + f"  ({where}, seq {group[0].seq}..{group[-1].seq})")
        if call is not None:
            facts = [f"status {call.status}", call.headline()]
            if call.duration is not None:
                facts.append(format_duration(call.duration))
            if call.error:
                facts.append(style.red(f"error: {short(call.error, 100)}"))
            _out("  " + " · ".join(fact for fact in facts if fact))
        for line in call_details(group, style):
            _out("  " + line)


# ------------------------------------------------------------------- check, inspect


def cmd_check(args: argparse.Namespace, style: Style) -> int:
    unsound = unreadable = False
    for path in args.paths:
        local = local_path(path)
        try:
            report = check_file(local)
        except OSError as exc:
            unreadable = True
            _out(f"{path}: " + style.red(f"cannot read: {exc.strerror or exc}"))
            continue
        if report.sound:
            runs = _plural(report.runs, "run")
            if report.open_runs:
                runs += f" ({len(report.open_runs)} without run_close)"
            _out(
                f"{path}: "
                + style.green("sound")
                + f", {_plural(report.records, 'record')} (last seq {report.last_seq}), "
                f"{runs}, {_plural(report.checkpoints, 'checkpoint')}"
            )
        else:
            unsound = True
            _out(f"{path}: " + style.red(f"NOT SOUND: line {report.error_line}: {report.error}"))
            _out(
                f"{path}: the first {report.records:,} records ({report.valid_bytes:,} bytes) "
                "are readable"
            )
        if report.unfinished_tail:
            _out(
                f"{path}: "
                + style.yellow(f"unfinished tail of {report.tail_bytes:,} bytes")
                + " (an interrupted write, or one in progress): readers ignore it, "
                "the next open for writing truncates it; not an error"
            )
        for warning in report.warnings:
            _out(f"{path}: " + style.yellow(f"warning: {warning}"))
    if unsound:
        return EXIT_UNSOUND
    return EXIT_USAGE if unreadable else EXIT_OK


def cmd_inspect(args: argparse.Namespace, style: Style) -> int:
    summary = SessionSummary()
    failure: FileFormatError | None = None
    with open_source(args.path, args) as source:
        try:
            for record in source.records:
                summary.add(record)
        except FileFormatError as exc:
            failure = exc
        tail_note = _unfinished_tail_note(source)
        label = source.label
    if summary.session_id is None and failure is not None:
        raise failure
    for line in inspect_lines(summary, label, style):
        _out(line)
    if tail_note:
        _out()
        _out(style.yellow(tail_note))
    if failure is not None:
        _out()
        _out(style.red(f"NOT SOUND: line {failure.line}: {failure.reason}"))
        _out("(what is above was read before that line; nothing after it was)")
        return EXIT_UNSOUND
    return EXIT_GAPS if summary.gaps() else EXIT_OK


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")
