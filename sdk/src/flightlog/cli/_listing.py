"""``flightlog sessions``: every session the caller may read, newest first.

Theory of operation
-------------------
Each session file under the data root (or the PATHs given) is read once, from its first
line to its last complete one, with the protocol's reader; only the records a listing
needs have their ``data`` decoded (the header's meta, run starts and closes, agent
starts, model calls' starts, ends and requests), every other line is taken by its
envelope alone.  A file that breaks the reading rules is listed with the records read
up to the break and the error, never dropped.

A session's *state* is ``damaged`` when its file breaks the reading rules, ``open`` when
the daemon says a writer holds it with a run open (asked once, if a daemon answers on
the socket), ``interrupted`` when one of its runs has no ``run_close`` and is not that
open one, else ``complete``.  Its tokens are the
sum over its model calls' ``usage``, and its cost their prices (:mod:`flightlog.sdk`'s
``price``, with genai-prices), ``unknown`` or a lower bound where a model is unknown.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from flightlog.protocol import (
    FileFormatError,
    parse_time,
)
from flightlog.protocol.wire import (
    SessionStatus,
    default_root,
)
from flightlog.sdk import ConnectError, DaemonError, Total, connect, price, read, responded
from flightlog.sdk import session_files as walk_sessions

from ._commands import EXIT_OK, EXIT_USAGE, CommandError, local_path
from ._find import _moment, meta_matches, parse_meta
from ._pricing import INSTALL_NOTE, can_price, sources_text
from ._render import Style, format_tokens, one_line, record_data, short

__all__ = [
    "SessionRow",
    "add_sessions_arguments",
    "cmd_sessions",
    "list_sessions",
    "sessions_epilog",
]

_STATES: Final = ("open", "complete", "interrupted", "damaged")
#: The record types whose data a listing reads.
_DECODED: Final = frozenset(
    {"run_start", "run_close", "agent_start", "model_request", "model_exec_start", "model_exec_end"}
)
_NAME_KEYS: Final = ("name", "title", "app")


def sessions_epilog(exit_help: str) -> str:
    return f"""\
examples:
  flightlog sessions                              every session, newest first
  flightlog sessions --state interrupted          the ones a crash left with an open run
  flightlog sessions --agent trip-planner --since 1d
  flightlog sessions --meta app=demo --json | jq -r .path

Lists every session file (*.jsonl) under the data root, or under the PATHs given: its
name (meta's name, title or app), last activity, runs, state (open: a writer holds it
with a run open; interrupted: a run has no run_close; damaged: the file breaks the
reading rules, read up to the break; complete), tokens and cost.  Cost
needs genai-prices (pip install 'flightlog-sdk[cost]'): "unknown" for a model it does
not know, "≥" before a total that leaves one out.

{exit_help}
"""


def add_sessions_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="PATH", nargs="*", help="session files or directories")
    parser.add_argument("--agent", metavar="NAME", help="only sessions where this agent ran")
    parser.add_argument("--state", choices=_STATES, help="only sessions in this state")
    parser.add_argument(
        "--since", metavar="TIME", help="last activity at or after TIME (RFC 3339, or 30m, 2h, 1d)"
    )
    parser.add_argument("--until", metavar="TIME", help="last activity before TIME (same forms)")
    parser.add_argument(
        "--meta",
        action="append",
        metavar="KEY=VALUE",
        help="only sessions whose meta has KEY equal to VALUE (repeatable)",
    )
    parser.add_argument("-n", "--limit", type=int, metavar="N", help="the N newest only")
    parser.add_argument("--json", action="store_true", help="one JSON object per session")


@dataclass
class SessionRow:
    """What ``flightlog sessions`` says of one session file."""

    path: str
    session_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    started: str | None = None
    last_activity: str | None = None
    runs: list[str] = field(default_factory=list)
    unclosed: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    cost: Total = field(default_factory=Total)
    open_run: str | None = None  # the run a writer holds open, as the daemon says
    error: str | None = None

    @property
    def interrupted(self) -> list[str]:
        """Its runs without ``run_close`` that no writer holds open."""
        return [run for run in self.unclosed if run != self.open_run]

    @property
    def state(self) -> str:
        if self.error is not None:
            return "damaged"
        if self.open_run is not None:
            return "open"
        return "interrupted" if self.unclosed else "complete"

    @property
    def name(self) -> str | None:
        for key in _NAME_KEYS:
            value = self.meta.get(key)
            if isinstance(value, str) and value:
                return value
        return None

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "session_id": self.session_id,
            "name": self.name,
            "meta": self.meta,
            "state": self.state,
            "started": self.started,
            "last_activity": self.last_activity,
            "runs": len(self.runs),
            "interrupted_runs": self.interrupted,
            "agents": self.agents,
            "models": self.models,
            "tokens": self.tokens,
            "cost": self.cost.as_json(),
            "error": self.error,
        }


class _Calls:
    """The model and provider of each model call of one file, and its price."""

    def __init__(self, row: SessionRow, pricing: bool) -> None:
        self.row = row
        self.pricing = pricing
        self.named: dict[tuple[str | None, str, int], tuple[str | None, str | None]] = {}

    def add(self, type: str, run_id: str | None, data: Mapping[str, Any]) -> None:
        execution = data.get("execution")
        if not isinstance(execution, Mapping):
            return
        attempt = execution.get("attempt")
        if not isinstance(attempt, int) or isinstance(attempt, bool):
            attempt = 1  # as execution_of reads it
        key = (run_id, str(execution.get("id")), attempt)
        model, provider = self.named.get(key, (None, None))
        if type == "model_request" and isinstance(config := data.get("config"), Mapping):
            model, provider = config.get("model") or model, config.get("provider") or provider
        elif type == "model_exec_start":
            model, provider = data.get("model") or model, data.get("provider") or provider
        elif type == "model_exec_end":
            message = data.get("message")
            if isinstance(message, Mapping):
                model = model or message.get("model")
                provider = provider or message.get("provider")
            self._used(data, model, provider)
        self.named[key] = (model, provider)

    def _used(self, end: Mapping[str, Any], model: Any, provider: Any) -> None:
        usage = end.get("usage")
        usage = usage if isinstance(usage, Mapping) else None
        if self.pricing:
            text_model = model if isinstance(model, str) else None
            text_provider = provider if isinstance(provider, str) else None
            self.row.cost.add(price(usage, text_model, text_provider, response=responded(end)))
        if usage is None:
            return
        for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"):
            count = usage.get(name)
            # A count that is not a number, or is below 0, is none (as for the price).
            if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                self.row.tokens[name] = self.row.tokens.get(name, 0) + count
        if isinstance(model, str) and model not in self.row.models:
            self.row.models.append(model)


def _summarize(path: str, pricing: bool) -> SessionRow:
    row = SessionRow(path)
    calls = _Calls(row, pricing)
    try:
        for record in read(path):
            row.last_activity = max(row.last_activity or record.time, record.time)
            if record.type == "session_start":
                row.session_id = record.session_id
                row.started = record.time
                meta = record_data(record).get("meta")
                row.meta = meta if isinstance(meta, dict) else {}
                continue
            if record.type not in _DECODED:
                continue
            data = record_data(record)
            if record.type == "run_start" and record.run_id:
                row.runs.append(record.run_id)
                row.unclosed.append(record.run_id)
            elif record.type == "run_close" and record.run_id in row.unclosed:
                row.unclosed.remove(record.run_id)
            elif record.type == "agent_start":
                agent = data.get("agent")
                if isinstance(agent, str) and agent not in row.agents:
                    row.agents.append(agent)
            else:
                calls.add(record.type, record.run_id, data)
    except FileFormatError as exc:
        row.error = f"line {exc.line}: {exc.reason}"
    except OSError as exc:
        row.error = exc.strerror or str(exc)
    return row


def _held(socket: str) -> list[SessionStatus]:
    """The sessions a daemon answering on ``socket`` lists; empty without one."""
    try:
        with connect(socket, client_name="flightlog") as client:
            return list(client.status().sessions)
    except (ConnectError, DaemonError, OSError):
        return []


def _open_runs(socket: str) -> dict[str, str]:
    """The session ids a daemon holds with a run open, and the run; empty without one."""
    return {s.session_id: s.run_id for s in _held(socket) if s.run_id is not None}


def list_sessions(
    paths: list[str], *, open_runs: Mapping[str, str] | None = None, pricing: bool = True
) -> Iterator[SessionRow]:
    """A :class:`SessionRow` for every session file of ``paths``, in the files' order."""
    for path in walk_sessions(paths):
        row = _summarize(path, pricing)
        open_run = (open_runs or {}).get(row.session_id)
        if open_run in row.unclosed:
            row.open_run = open_run
        yield row


def _matches(
    row: SessionRow, args: argparse.Namespace, since: Any, until: Any, meta: dict[str, str | None]
) -> bool:
    if args.agent is not None and args.agent not in row.agents:
        return False
    if args.state is not None and row.state != args.state:
        return False
    try:
        last = parse_time(row.last_activity) if row.last_activity else None
    except ValueError:  # a hand-damaged last line: no time to compare
        last = None
    if since is not None and (last is None or last < since):
        return False
    if until is not None and (last is None or last >= until):
        return False
    return meta_matches(row.meta, meta)


def cmd_sessions(args: argparse.Namespace, style: Style) -> int:
    from ._commands import _socket

    now = datetime.now(UTC)
    since = _moment(args.since, "--since", now) if args.since else None
    until = _moment(args.until, "--until", now) if args.until else None
    meta = parse_meta(args.meta)
    if args.limit is not None and args.limit < 1:
        raise CommandError("--limit takes a number of sessions, 1 or more", EXIT_USAGE)
    paths = [local_path(p) for p in args.paths] or [
        default_root(os.environ, os.path.expanduser("~"))
    ]
    missing = [p for p in paths if not os.path.exists(p)]
    if args.paths and missing:
        raise CommandError(f"{missing[0]}: no such file or directory", EXIT_USAGE)
    pricing = can_price()
    rows = [
        row
        for row in list_sessions(paths, open_runs=_open_runs(_socket(args)), pricing=pricing)
        if _matches(row, args, since, until, meta)
    ]
    rows.sort(key=lambda row: row.last_activity or "", reverse=True)
    if args.limit is not None:
        rows = rows[: args.limit]
    out = sys.stdout
    if args.json:
        for row in rows:
            out.write(msgspec.json.encode(row.as_json()).decode() + "\n")
        return EXIT_OK
    header = (
        f"{'LAST ACTIVITY':<20} {'STATE':<12} {'RUNS':>4} {'TOKENS':>8} {'COST':>10}  NAME / PATH"
    )
    out.write(style.bold(header) + "\n")
    for row in rows:
        tokens = row.tokens.get("input_tokens", 0) + row.tokens.get("output_tokens", 0)
        cost = row.cost.text() if pricing and row.cost.sources else "-"
        state = row.state
        paint = {"interrupted": style.yellow, "damaged": style.red, "open": style.cyan}.get(state)
        painted = paint(f"{state:<12}") if paint is not None else f"{state:<12}"
        when = (row.last_activity or "")[:19].replace("T", " ")
        label = f"{row.name}  {style.dim(row.path)}" if row.name else row.path
        figures = f"{len(row.runs):>4} {format_tokens(tokens):>8} {cost:>10}"
        out.write(one_line(f"{when:<20} {painted} {figures}  {short(label, 200)}") + "\n")
    if not pricing:
        out.write(style.dim(INSTALL_NOTE) + "\n")
    elif rows:
        every = Total()
        for row in rows:
            for source, count in row.cost.sources.items():
                every.sources[source] = every.sources.get(source, 0) + count
        if every.sources:
            out.write(one_line(style.dim(f"prices: {sources_text(every)}")) + "\n")
    return EXIT_OK
