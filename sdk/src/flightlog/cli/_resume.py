"""``flightlog resume``: what a program needs to continue a session, its repair, its fork.

Theory of operation
-------------------
A session is read as ``show`` reads it: from its file when this process may read it,
else through the daemon (a file only the daemon's user may read, or one under the
daemon's data root on another path; the socket is the access check), into a
:class:`~._inspect.SessionSummary` (the runs without ``run_close``, the calls without
an end, the latest checkpoint) and, through the SDK's rebuild API
(:meth:`flightlog.sdk.Transcript.read`, which follows a fork's origin, read the same
way), its conversation: the prompt of its last top-level model call, the response and the tool
results recorded for it.  A tool call of that conversation with no result is
*unpaired*: a provider refuses such a history ("tool_use ids without tool_result").

A session a writer holds (the daemon says so, asked once before the file is read) is
read as it stood then: up to the daemon's last line, so that its open run, the calls
left open and the conversation all describe one moment; its open run is not *cut*, and
its unpaired tool calls may still get their results.  Without a writer, the
conversation is still read up to the line the rest was read to.

``--repair`` writes through the daemon.  ``Session.resume(repair=True)`` mends every cut
run: the calls each left open are answered in their own run; a tool call the
conversation still holds without a result (the model asked for it, and the agent died
before it started, or in an earlier cut run) is answered in a run of its own, by a
``tool_exec_end`` marked the same way (``disposition`` ``repaired``, an error, never
the tool's result).  Nothing else is written.

``--fork NEW`` creates NEW with an ``origin`` in its ``session_start`` (docs/format.md,
"Forks"): the origin's path and session id, and its last line the fork holds.  The fork
holds no copy of the conversation: the rebuild reads the origin up to that line, then
the fork.  The checkpoint in force at that line is saved again in the fork's first run,
so that ``load_checkpoint`` on the fork returns it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from flightlog.protocol import CHECKPOINT, ErrorCode, Execution, FileFormatError, Origin, Record
from flightlog.protocol.events import TextPart, ToolExecEnd
from flightlog.protocol.wire import SessionStatus
from flightlog.sdk import (
    CallNotFound,
    Client,
    Conversation,
    DaemonError,
    OriginNotFound,
    Session,
    Transcript,
    connect,
    origin_of,
)

from ._commands import (
    EXIT_GAPS,
    EXIT_OK,
    EXIT_UNSOUND,
    EXIT_USAGE,
    CommandError,
    _socket,
    daemon_path,
    open_source,
)
from ._inspect import CallSummary, SessionSummary
from ._listing import _held
from ._render import Style, message_text, one_line, short
from ._views import message_role

__all__ = ["add_resume_arguments", "cmd_resume", "resume_epilog"]

_CLIENT_NAME: Final = "flightlog resume"
#: The text of the result a repair writes for a tool call that never started.
REPAIR_TEXT: Final = (
    "The tool call was interrupted (the agent stopped before it ran or returned); "
    "no result was recorded. This result was written by flightlog resume --repair."
)
#: Seconds --repair tries again while the daemon names as the session's writer a
#: process that has exited (killed a moment ago: its hang-up not read yet).
GONE_WRITER_WAIT: Final = 5.0


def resume_epilog(exit_help: str) -> str:
    return f"""\
examples:
  flightlog resume demo/session.jsonl               the checkpoint, conversation, open calls
  flightlog resume demo/session.jsonl --json        the same for a program (one object)
  flightlog resume crashed.jsonl --repair           answer every unpaired tool call
  flightlog resume demo/session.jsonl --fork demo/retry.jsonl --at-run 3f2a9c1e
  flightlog resume demo/session.jsonl --fork demo/b.jsonl --at-checkpoint
  flightlog resume demo/session.jsonl --fork demo/c.jsonl --at-seq 120

Reads the file directly when it can, else through the daemon (as show does).  An
unpaired tool call (the model asked for it, no result was recorded) makes a history a
provider refuses: --repair writes, through the daemon, an error result marked
"repaired" for each (never the tool's own result), so the conversation pairs every
tool call again; refused (session_busy, exit 5) while a writer holds the session.
A session a writer holds is read as the daemon had written it when asked: its open
run is not cut, and its unpaired tool calls may still get results (exit 0).
--fork NEW starts a session that names this one as its origin, at the end of a run
(--at-run), after a line (--at-seq), at a checkpoint (--at-checkpoint: the latest, or
the one at SEQ), else at the end of the file; the conversation is rebuilt from the
origin up to that point, and the checkpoint in force there is saved in NEW.
Exit status 3: tool calls are left unpaired (without --repair), no writer holding it.

{exit_help}
"""


def add_resume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="the session file")
    parser.add_argument("--json", action="store_true", help="one JSON object, for programs")
    parser.add_argument(
        "--repair", action="store_true", help="answer every unpaired tool call (via the daemon)"
    )
    parser.add_argument("--fork", metavar="NEW", help="start session NEW from a point of PATH")
    point = parser.add_mutually_exclusive_group()
    point.add_argument("--at-run", metavar="RUN", help="with --fork: at the end of this run")
    point.add_argument("--at-seq", metavar="SEQ", type=int, help="with --fork: after this line")
    point.add_argument(
        "--at-checkpoint",
        metavar="SEQ",
        nargs="?",
        type=int,
        const=0,
        help="with --fork: at a checkpoint (the latest, or the one at SEQ)",
    )


# ---------------------------------------------------------------------- the state


@dataclass
class _State:
    """A session as a program that continues it sees it."""

    path: str
    local: bool  # read from the file (else through the daemon)
    summary: SessionSummary
    origin: Origin | None
    checkpoint: Record | None
    conversation: Conversation | None
    broken: str | None  # why the conversation cannot be rebuilt
    failure: FileFormatError | None
    writer: SessionStatus | None = None  # the daemon's word on the writer holding it

    @property
    def cut_runs(self) -> list[str]:
        """The runs without ``run_close`` that no writer holds open."""
        held = self.writer.run_id if self.writer is not None else None
        return [
            run.run_id
            for run in self.summary.run_list()
            if run.run_id and not run.closed and run.run_id != held
        ]

    @property
    def open_calls(self) -> list[CallSummary]:
        return [
            call
            for run in self.summary.run_list()
            for call in run.calls.values()
            if not call.ended and call.kind in ("model", "tool") and not call.retried
        ]

    @property
    def unpaired(self) -> list[tuple[str, str]]:
        return self.conversation.unpaired if self.conversation is not None else []


def _records(path: str, args: argparse.Namespace, upto: int | None = None) -> Iterator[Record]:
    """The records of the session at ``path``, as ``show`` reads them (the file, else
    through the daemon), up to line ``upto`` when given; raises :class:`OSError` when
    neither can (a fork's origin)."""
    try:
        with open_source(path, args) as source:
            for record in source.records:
                if upto is not None and record.seq > upto:
                    return
                yield record
    except (CommandError, DaemonError) as exc:
        raise OSError(exc.message) from None


def _writers(args: argparse.Namespace) -> dict[str, SessionStatus]:
    """The sessions a writer holds, by session id, as a daemon answering says."""
    return {s.session_id: s for s in _held(_socket(args)) if s.writer_pid is not None}


def _load(path: str, args: argparse.Namespace) -> _State:
    summary = SessionSummary()
    origin: Origin | None = None
    checkpoint: Record | None = None
    failure: FileFormatError | None = None
    # Asked before the file is read: a session a writer holds is read up to the line
    # the daemon had written then, so that its open run is the one the daemon named.
    writers = _writers(args)
    writer: SessionStatus | None = None
    with open_source(path, args) as source:
        label, local = source.label, source.reader is not None
        try:
            for record in source.records:
                if writer is not None and record.seq > writer.last_seq:
                    break
                summary.add(record)
                if record.seq == 1:
                    origin = origin_of(record)
                    writer = writers.get(record.session_id)
                elif record.type == CHECKPOINT:
                    checkpoint = record
        except FileFormatError as exc:
            if summary.session_id is None:
                raise
            failure = exc
        except OSError as exc:
            raise CommandError(f"{path}: cannot read: {exc.strerror or exc}", EXIT_USAGE) from None
    conversation: Conversation | None = None
    broken: str | None = None
    # The conversation is read up to the line the rest was (a writer may have added
    # lines since); a fork's origin, up to the line the fork names.
    bounds = iter([summary.last_seq])
    try:
        transcript = Transcript.read(
            label, opener=lambda where: _records(where, args, next(bounds, None))
        )
        conversation = transcript.conversation()
    except (CallNotFound, OriginNotFound) as exc:
        broken = exc.message
    except FileFormatError as exc:
        broken = f"line {exc.line}: {exc.reason}"
    except OSError as exc:
        broken = f"cannot be read: {exc.strerror or exc}"
    return _State(label, local, summary, origin, checkpoint, conversation, broken, failure, writer)


# ----------------------------------------------------------------------- output


def _snapshot(record: Record | None) -> Any:
    if record is None:
        return None
    return msgspec.json.decode(record.data).get("snapshot")


def _call_json(call: CallSummary) -> dict[str, Any]:
    return {
        "run_id": call.run_id,
        "kind": call.kind,
        "id": call.id,
        "attempt": call.attempt,
        "seq": call.first_seq,
        "name": call.name if call.kind == "tool" else call.model,
        "tool_call_id": call.tool_call_id,
        "arguments": call.arguments,
    }


def _origin_json(origin: Origin | None) -> dict[str, Any] | None:
    return msgspec.to_builtins(origin) if origin is not None else None


def _as_json(state: _State, repaired: list[tuple[str, str]], truncated: int) -> dict[str, Any]:
    summary, conversation = state.summary, state.conversation
    prompt = conversation.prompt if conversation is not None else None
    checkpoint = state.checkpoint
    return {
        "path": state.path,
        "session_id": summary.session_id,
        "origin": _origin_json(state.origin),
        "last_seq": summary.last_seq,
        "checkpoint": None
        if checkpoint is None
        else {
            "seq": checkpoint.seq,
            "run_id": checkpoint.run_id,
            "time": checkpoint.time,
            "snapshot": _snapshot(checkpoint),
        },
        "writer": None
        if state.writer is None
        else {
            "pid": state.writer.writer_pid,
            "run_id": state.writer.run_id,
            "last_seq": state.writer.last_seq,
        },
        "cut_runs": state.cut_runs,
        "open_calls": [_call_json(call) for call in state.open_calls],
        "conversation": None
        if conversation is None or prompt is None
        else {
            "call": prompt.call,
            "attempt": prompt.attempt,
            "run_id": prompt.run_id,
            "system": prompt.system,
            "tools": prompt.tools,
            "messages": conversation.messages,
            "answered": conversation.response is not None,
        },
        "conversation_error": state.broken,
        "unpaired": [{"tool_call_id": i, "name": n} for i, n in state.unpaired],
        "repaired": [{"tool_call_id": i, "name": n} for i, n in repaired],
        "truncated_bytes": truncated,
        "error": None
        if state.failure is None
        else f"line {state.failure.line}: {state.failure.reason}",
    }


def _out(text: str = "") -> None:
    sys.stdout.write(one_line(text) + "\n")


def _print(state: _State, repaired: list[tuple[str, str]], truncated: int, style: Style) -> None:
    summary = state.summary
    _out(f"{style.bold('session')} {summary.session_id or '?'}  {state.path}")
    if state.origin is not None:
        origin = state.origin
        _out(
            f"  forked from {origin.path} at line {origin.seq} "
            f"(session {origin.session_id[:8]}, run {(origin.run_id or '-')[:8]})"
        )
    checkpoint = state.checkpoint
    if checkpoint is None:
        _out(f"{style.bold('checkpoint')}  none")
    else:
        _out(
            f"{style.bold('checkpoint')}  line {checkpoint.seq}"
            f" · run {(checkpoint.run_id or '')[:8]} · {checkpoint.time}"
        )
        _out("  " + short(msgspec.json.encode(_snapshot(checkpoint)).decode(), 200))
    writer = state.writer
    if writer is not None:
        held = f"run {writer.run_id[:8]} open" if writer.run_id else "no run open"
        _out(
            f"{style.bold('writer')}  pid {writer.writer_pid} holds this session ({held}), "
            f"read up to its line {writer.last_seq}: its calls may still end"
        )
    _out(
        f"{style.bold('cut runs')}  "
        + (", ".join(f"{run_id[:8]} (no run_close)" for run_id in state.cut_runs) or "none")
    )
    calls = state.open_calls
    _out(style.bold("open calls") + ("  none" if not calls else ""))
    for call in calls:
        name = call.name if call.kind == "tool" else call.model
        extra = f" {call.tool_call_id}" if call.tool_call_id else ""
        _out(
            f"  {call.kind} {call.label} {name or ''}{extra}  "
            f"(line {call.first_seq}, run {(call.run_id or '')[:8]})"
        )
    _print_conversation(state, style)
    if truncated:
        _out(f"removed an unfinished last line of {truncated} bytes (a write cut short)")
    for call_id, name in repaired:
        _out(style.green(f"repaired  tool call {call_id} ({name}): an error result, marked"))
    if state.unpaired:
        listed = ", ".join(f"{call_id} ({name})" for call_id, name in state.unpaired)
        _out(style.red(f"unpaired tool calls  {listed}"))
        if writer is None:
            _out(f"  a provider refuses this history: flightlog resume {state.path} --repair")
        else:
            _out(
                f"  pid {writer.writer_pid} may still record their results "
                "(--repair is refused while it holds the session)"
            )
    if state.failure is not None:
        _out(style.red(f"NOT SOUND: line {state.failure.line}: {state.failure.reason}"))


def _print_conversation(state: _State, style: Style) -> None:
    conversation = state.conversation
    if state.broken is not None:
        _out(f"{style.bold('conversation')}  " + style.red(f"cannot be rebuilt: {state.broken}"))
        return
    prompt = conversation.prompt if conversation is not None else None
    if conversation is None or prompt is None:
        _out(f"{style.bold('conversation')}  none (no model call)")
        return
    messages = conversation.messages
    answered = "and its response" if conversation.response is not None else "(no response)"
    _out(
        f"{style.bold('conversation')}  {len(messages)} messages: the prompt of model call "
        f"{prompt.call} (run {(prompt.run_id or '')[:8]}) {answered}"
        + (f", tool results {len(conversation.results)}" if conversation.results else "")
    )
    if prompt.system is not None:
        _out(f"  {style.cyan('system')}: {short(prompt.system, 100)}")
    for message in messages:
        _out(f"  {message_role(message, style)}: {short(message_text(message), 100)}")


# ----------------------------------------------------------------------- repair


def _repair_event(call_id: str, name: str, state: _State) -> ToolExecEnd:
    """A repair for a tool call no cut run left open: under a call of its own, nested
    in the model call that asked for it."""
    conversation = state.conversation
    prompt = conversation.prompt if conversation is not None else None
    return ToolExecEnd(
        execution=Execution(
            id=f"repair-{call_id}", kind="tool", parent_id=prompt.call if prompt else None
        ),
        tool_call_id=call_id,
        name=name,
        content=[TextPart(text=REPAIR_TEXT)],
        details={"repaired": "never started, or left open by an earlier run"},
        is_error=True,
        disposition="repaired",
        reason="interrupted: flightlog resume --repair wrote this result",
    )


def _repair(state: _State, args: argparse.Namespace) -> tuple[list[tuple[str, str]], int]:
    """Write the repairs; returns the tool calls answered (``(tool_call_id, name)``) and
    the bytes of the unfinished last line the daemon removed when it opened the file."""
    _repairable(state)
    with connect(args.socket, client_name=_CLIENT_NAME) as client:
        # Refused (session_busy, naming the holder) while a writer holds the session;
        # waits for the daemon to finish writing what a writer that is gone sent.
        session = _open_as_writer(client, state, args)
        try:
            # Read again as its writer: what the one before sent is all written now.
            state = _load(state.path, args)
            _repairable(state)
            before = state.unpaired
            resumed = session.resume(repair=True)
            done = {call.tool_call_id or "" for call in resumed.repaired}
            after = _load(state.path, args)
            left = after.unpaired
            if left:
                _record_repairs(session, after, left)
        finally:
            session.close()
    answered = done | {call_id for call_id, _ in left}
    repaired = [(call_id, name) for call_id, name in before if call_id in answered]
    return repaired, session.truncated_bytes


def _open_as_writer(client: Client, state: _State, args: argparse.Namespace) -> Session:
    """Open the session to write to it.  Refused (``session_busy``) while a writer holds
    it, unless the daemon names a process that has exited: then its hang-up has not
    been read yet, and the open is tried again for :data:`GONE_WRITER_WAIT` seconds."""
    deadline = time.monotonic() + GONE_WRITER_WAIT
    while True:
        try:
            return client.open(daemon_path(state.path))
        except DaemonError as exc:
            if exc.code != ErrorCode.SESSION_BUSY:
                raise
            held = _writers(args).get(state.summary.session_id or "")
            pid = held.writer_pid if held is not None else None
            if pid is None or _alive(pid):
                raise
            if time.monotonic() > deadline:
                raise DaemonError(
                    f"{exc.message}; pid {pid} has exited, but its connection is still "
                    "open (a process it started may hold it)",
                    code=exc.code,
                ) from None
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not: it has exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _repairable(state: _State) -> None:
    if state.broken is not None:
        raise CommandError(
            f"{state.path}: cannot repair a conversation that cannot be rebuilt: {state.broken}",
            EXIT_UNSOUND,
        )


def _record_repairs(session: Session, state: _State, left: list[tuple[str, str]]) -> None:
    with session.begin_run() as run:
        run.record_many([_repair_event(call_id, name, state) for call_id, name in left])


# ------------------------------------------------------------------------- fork


def _fork_point(state: _State, args: argparse.Namespace) -> int:
    summary = state.summary
    if args.at_seq is not None:
        if not 1 <= args.at_seq <= summary.last_seq:
            raise CommandError(
                f"--at-seq {args.at_seq}: {state.path} has lines 1 to {summary.last_seq}",
                EXIT_USAGE,
            )
        return int(args.at_seq)
    if args.at_run is not None:
        runs = [r for r in summary.run_list() if r.run_id and r.run_id.startswith(args.at_run)]
        if len(runs) != 1:
            known = ", ".join((r.run_id or "")[:8] for r in summary.run_list() if r.run_id)
            what = "no run" if not runs else f"{len(runs)} runs"
            raise CommandError(
                f"--at-run {args.at_run!r} names {what} of {state.path} (runs: {known or 'none'})",
                EXIT_USAGE,
            )
        return runs[0].last_seq
    if args.at_checkpoint is not None:
        seqs = [c.seq for run in summary.run_list() for c in run.checkpoints]
        if args.at_checkpoint == 0 and seqs:
            return max(seqs)
        if args.at_checkpoint in seqs:
            return int(args.at_checkpoint)
        listed = ", ".join(map(str, seqs)) or "none"
        raise CommandError(
            f"--at-checkpoint: no such checkpoint in {state.path} (checkpoints at lines: {listed})",
            EXIT_USAGE,
        )
    return summary.last_seq


def _origin_path(state: _State, fork: str) -> str:
    """The origin's path as the fork names it: absolute where this process read it, or
    was given it so; a path under the daemon's data root (read through the daemon)
    relative to the fork's directory there (docs/format.md, "Forks")."""
    if state.local:
        return os.path.realpath(state.path)
    if os.path.isabs(state.path):
        return state.path
    if os.path.isabs(daemon_path(fork)):
        raise CommandError(
            f"{state.path}: read through the daemon, under its data root: fork it to a "
            "relative NEW (under the same root), or give PATH as an absolute path",
            EXIT_USAGE,
        )
    return os.path.relpath(state.path, os.path.dirname(fork) or ".")


def _fork(state: _State, args: argparse.Namespace) -> str:
    """Create the fork; returns its path as the daemon resolved it."""
    if state.failure is not None:
        raise CommandError(
            f"{state.path}: cannot fork a file that breaks the reading rules "
            f"(line {state.failure.line}: {state.failure.reason})",
            EXIT_UNSOUND,
        )
    seq = _fork_point(state, args)
    checkpoint: Record | None = None
    run_id: str | None = None
    for record in _records(state.path, args):
        if record.seq > seq:
            break
        run_id = record.run_id
        if record.type == CHECKPOINT:
            checkpoint = record
    origin = Origin(
        session_id=state.summary.session_id or "",
        path=_origin_path(state, args.fork),
        seq=seq,
        run_id=run_id,
    )
    with connect(args.socket, client_name=_CLIENT_NAME) as client:
        session = client.create(args.fork, meta=state.summary.meta, origin=origin)
        try:
            if checkpoint is not None:
                with session.begin_run() as run:
                    run.save_checkpoint(_snapshot(checkpoint))
        finally:
            session.close()
        return session.path


# ---------------------------------------------------------------------- command


def cmd_resume(args: argparse.Namespace, style: Style) -> int:
    pointed = args.at_run is not None or args.at_seq is not None or args.at_checkpoint is not None
    if pointed and args.fork is None:
        raise CommandError("--at-run, --at-seq and --at-checkpoint go with --fork NEW", EXIT_USAGE)
    if args.fork is not None and args.repair:
        raise CommandError(
            "--repair and --fork go apart: repair PATH first, or resume NEW --repair",
            EXIT_USAGE,
        )
    state = _load(args.path, args)
    repaired: list[tuple[str, str]] = []
    truncated = 0
    if args.repair:
        repaired, truncated = _repair(state, args)
        state = _load(args.path, args)
    elif args.fork is not None:
        state = _load(_fork(state, args), args)
    if args.json:
        sys.stdout.write(msgspec.json.encode(_as_json(state, repaired, truncated)).decode() + "\n")
    else:
        _print(state, repaired, truncated, style)
    if state.failure is not None:
        return EXIT_UNSOUND
    return EXIT_GAPS if state.unpaired and state.writer is None else EXIT_OK
