"""The text of ``flightlog show`` and ``flightlog inspect``, from a :class:`SessionSummary`.

Each function returns lines; the command writes them.  Colour comes from a
:class:`Style`, which is plain text off a terminal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any, Final

from flightlog.protocol import FlightlogError, Record
from flightlog.sdk import Prompt, read

from ._inspect import CallSummary, RunSummary, SessionSummary, TimelineItem
from ._pricing import INSTALL_NOTE, Pricer, price_text, sources_text
from ._render import (
    Style,
    clock,
    duration,
    format_bytes,
    format_duration,
    format_tokens,
    format_usage,
    message_text,
    record_data,
    short,
    summarize,
)

__all__ = [
    "call_details",
    "inspect_lines",
    "message_role",
    "origin_lines",
    "prompt_lines",
    "session_header",
    "show_lines",
]

#: How many origins ``show`` follows back: a longer chain is a loop.
_MAX_FORKS: Final = 64


def _when(time: str | None) -> str:
    """``2026-11-29 20:00:00Z`` from a record time."""
    if not time:
        return "?"
    return f"{time[:10]} {time[11:19]}Z"


def _short_id(run_id: str | None) -> str:
    return run_id[:8] if run_id else "(no run)"


def session_header(
    summary: SessionSummary, path: str, style: Style, pricer: Pricer | None = None
) -> list[str]:
    """The session's identity, size and cost, for ``show`` and ``inspect``."""
    lines = [f"{style.bold('session')} {summary.session_id or '?'}  {path}"]
    facts = [f"created {_when(summary.created)}", f"format {summary.format_version}"]
    if summary.meta:
        facts.append("meta " + short(json.dumps(summary.meta, ensure_ascii=False), 60))
    lines.append("  " + " · ".join(facts))
    if summary.origin is not None:
        lines.append("  " + _origin_line(summary.origin, path, style))
    runs = len(summary.runs)
    counts = [
        f"{summary.records:,} records (seq 1..{summary.last_seq})",
        f"{runs} run" + ("" if runs == 1 else "s"),
        f"{summary.checkpoints} checkpoint" + ("" if summary.checkpoints == 1 else "s"),
    ]
    lines.append("  " + " · ".join(counts))
    lines.extend("  " + line for line in _cost_lines(summary, pricer or Pricer(), style))
    return lines


def _cost_lines(summary: SessionSummary, pricer: Pricer, style: Style) -> list[str]:
    """The session's cost and where its prices come from (nothing without usage)."""
    calls = [call for run in summary.run_list() for call in run.calls.values()]
    total = pricer.total(calls)
    if pricer.missing:
        return [style.dim(INSTALL_NOTE)] if any(call.usage for call in calls) else []
    if not total.sources:
        return []
    counted = f"{total.priced} model call" + ("" if total.priced == 1 else "s") + " priced"
    if total.unknown:
        counted += f", {total.unknown} not"
    return [f"cost {total.text()} ({counted})", f"prices: {sources_text(total)}"]


def _origin_path(origin: dict[str, Any], path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(path)), str(origin.get("path")))


def origin_lines(summary: SessionSummary, path: str, style: Style, depth: int = 0) -> Iterator[str]:
    """A fork's history: the timeline of its origin up to the line it was forked at
    (and of that one's origin first), for ``show``; nothing for a session that is not
    a fork, or whose origin cannot be read (its header says so)."""
    origin = summary.origin
    if origin is None or depth >= _MAX_FORKS:
        return
    where = _origin_path(origin, path)
    seq = origin.get("seq")
    history = SessionSummary()
    try:
        for record in read(where):
            if not isinstance(seq, int) or record.seq > seq:
                break
            history.add(record)
    except (OSError, FlightlogError):
        return
    if history.session_id != origin.get("session_id"):
        return
    yield from origin_lines(history, where, style, depth + 1)
    yield style.bold(f"── the origin, up to line {seq}: {where}")
    yield from show_lines(history, where, style)
    yield style.bold(f"── the fork: {path}")


def _origin_line(origin: dict[str, Any], path: str, style: Style) -> str:
    """Where a fork comes from, and whether that file still holds it."""
    where = _origin_path(origin, path)
    text = (
        f"forked from {origin.get('path')} at line {origin.get('seq')} "
        f"(session {str(origin.get('session_id'))[:8]}, run {str(origin.get('run_id'))[:8]})"
    )
    try:
        start = next(iter(read(where)))
    except (OSError, FlightlogError, StopIteration):
        return text + style.red(" · the origin cannot be read")
    if start.session_id != origin.get("session_id"):
        return text + style.red(f" · that file is now session {start.session_id[:8]}")
    return text + f" · history: flightlog show {where}"


def _run_title(run: RunSummary, style: Style, pricer: Pricer) -> str:
    status = run.status
    painted = style.green(status) if run.ok else style.red(status)
    bits = [f"{style.bold(f'run {run.index}')} {_short_id(run.run_id)}", _when(run.start_time)]
    if run.client or run.pid:
        bits.append(f"{run.client or '?'} pid {run.pid}")
    bits.append(painted)
    elapsed = duration(run.start_time, run.close_time or run.last_time)
    if elapsed is not None:
        bits.append(format_duration(elapsed))
    tokens_in, tokens_out = run.usage()
    if tokens_in or tokens_out:
        bits.append(f"{format_tokens(tokens_in)}→{format_tokens(tokens_out)} tok")
    cost = pricer.total(run.calls.values())
    if cost.sources:
        bits.append(f"cost {cost.text()}")
    return "  ".join(bits)


def _call_line(
    call: CallSummary, style: Style, pricer: Pricer, main_agent: str | None = None
) -> str:
    status = call.status
    label = f"{call.kind:<5} {call.label}"
    bits = [style.yellow(label), call.headline()]
    if call.tool_call_id and call.tool_call_id != call.id:
        bits.append(f"[{call.tool_call_id}]")  # the provider's id: show --call takes it too
    if call.agent and call.agent != main_agent:
        bits.append(f"@{call.agent}")
    if call.replaces:
        bits.append(f"(replaces {call.replaces})")
    if call.kind == "model" and call.usage:
        bits.append(format_usage(call.usage))
    found = pricer.call(call)
    if found is not None:
        bits.append(price_text(found) if found.known else style.yellow(price_text(found)))
    elapsed = call.duration
    if elapsed is not None:
        bits.append(format_duration(elapsed))
    if call.stop_reason:
        bits.append(f"stop={call.stop_reason}")
    if status == "ok":
        if call.result:
            bits.append(("→ " if call.kind == "tool" else "") + f'"{short(call.result, 60)}"')
    elif status == "failed":
        bits.append(style.red(f"FAILED: {short(call.error or '', 60)}"))
    elif status == "retried":
        error = call.retry_error or "failed"
        bits.append(style.red(f"FAILED: {short(error, 60)}"))
    elif status == "cancelled":
        bits.append(style.yellow("CANCELLED: its run ended before it did"))
    elif status == "no end":
        missing = call.missing() or "no end"
        bits.append(style.red(f"NO END ({missing}): never read as a success"))
    else:  # refused, skipped, short_circuited
        bits.append(style.yellow(status + (f": {short(call.result, 60)}" if call.result else "")))
    return "  ".join(bit for bit in bits if bit)


def _turn_cost(run: RunSummary, turn: Any, pricer: Pricer) -> str:
    cost = pricer.total(c for c in run.calls.values() if c.turn_index == turn)
    return f"  cost {cost.text()}" if cost.sources else ""


def _item_line(item: TimelineItem, style: Style, run: RunSummary, pricer: Pricer) -> str:
    data: dict[str, Any] = item.data or {}
    match item.type:
        case "agent_start":
            return summarize("agent_start", data)
        case "agent_end":
            text = "agent end: " + summarize("agent_end", data)
            return style.green(text) if data.get("ok", True) else style.red(text)
        case "turn_start":
            turn = data.get("turn_index")
            return style.bold(f"turn {turn}") + _turn_cost(run, turn, pricer)
        case "retry":
            return style.yellow(summarize("retry", data))
        case "checkpoint":
            return f"checkpoint seq {item.seq}"
        case "error":
            return style.red("error: " + summarize("error", data))
        case "run_close":
            text = summarize("run_close", data)
            return style.red(text) if data.get("error") else text
    return f"{item.type}: {summarize(item.type, data)}"


def show_lines(
    summary: SessionSummary, path: str, style: Style, runs: Iterable[RunSummary] | None = None
) -> Iterator[str]:
    """The timeline of ``flightlog show``: runs, turns, model and tool calls, and
    their cost (each model call's, each turn's, each run's and the session's)."""
    pricer = Pricer()
    yield from session_header(summary, path, style, pricer)
    for run in summary.run_list() if runs is None else runs:
        yield ""
        yield _run_title(run, style, pricer)
        in_turn = False
        # Sub-agents (agent_start with a parent_id) are indented one step per level,
        # and their turns nest inside the step.
        depth = 0
        main_agent: str | None = None
        for item in run.timeline:
            sub_agent = bool(item.data and item.data.get("parent_id"))
            if item.type == "agent_start" and not sub_agent and main_agent is None:
                agent = (item.data or {}).get("agent")
                main_agent = agent if isinstance(agent, str) else None
            if item.type == "agent_end" and sub_agent:
                depth = max(depth - 1, 0)
            if item.type == "turn_start":
                in_turn = True
            elif item.type in ("run_close", "checkpoint") or (
                item.type == "agent_end" and not sub_agent
            ):
                in_turn = False
            nested = in_turn and item.type != "turn_start"
            if item.call is not None and item.call.parent_id is not None:
                nested = True
            indent = "  " + "    " * depth + ("  " if nested else "")
            text = (
                _call_line(item.call, style, pricer, main_agent)
                if item.call is not None
                else _item_line(item, style, run, pricer)
            )
            yield f"  {style.dim(clock(item.time))}{indent}{text}"
            if item.type == "agent_start" and sub_agent:
                depth += 1
        gaps = run.gaps()
        if gaps:
            for gap in gaps:
                yield "  " + style.red(f"gap: {gap}")


def inspect_lines(summary: SessionSummary, path: str, style: Style) -> Iterator[str]:
    """Each run with its status, cost and gaps, failed calls and retries, the latest
    checkpoint."""
    pricer = Pricer()
    yield from session_header(summary, path, style, pricer)
    latest = summary.latest_checkpoint
    if latest is not None:
        yield (
            f"  latest checkpoint: seq {latest.seq}, run {_short_id(latest.run_id)}, "
            f"{_when(latest.time)}, {format_bytes(latest.size)}"
        )
    else:
        yield "  latest checkpoint: none"
    for run in summary.run_list():
        yield ""
        yield _run_title(run, style, pricer)
        yield f"  run id   {run.run_id}"
        if run.started:
            yield f"  started  seq {run.start_seq}, {_when(run.start_time)}"
        if run.closed:
            closed = f"seq {run.close_seq} (run_close), {_when(run.close_time)}"
            if run.close_error:
                closed += ", " + style.red(f"error: {short(run.close_error, 100)}")
            yield f"  closed   {closed}"
        else:
            yield "  closed   " + style.red(f"no run_close (last record seq {run.last_seq})")
        if run.agent_end is not None:
            yield f"  outcome  agent_end: {summarize('agent_end', run.agent_end)}"
        elif run.agent_started:
            yield "  outcome  " + style.red("no agent_end")
        calls = list(run.calls.values())
        models = [c for c in calls if c.kind == "model"]
        tools = [c for c in calls if c.kind == "tool"]
        repaired = [c for c in tools if c.disposition == "repaired"]
        yield (
            f"  calls    {len(models)} model ({sum(c.failed for c in models)} failed), "
            f"{len(tools)} tool ({sum(c.failed for c in tools)} failed"
            + (f", {len(repaired)} repaired" if repaired else "")
            + f"), {len(run.retries)} retries, {run.turns} turns"
        )
        for call in repaired:
            what = " ".join(x for x in ("tool", call.label, call.headline()) if x)
            yield "  repaired " + style.yellow(
                f"{what} (seq {call.first_seq}): cut without a result; the error result "
                "after it was written by resume(repair=True), not by the tool"
            )
        for call in run.failed_calls():
            error = call.error or call.retry_error or "failed"
            follow = _next_attempt(run, call)
            what = " ".join(x for x in (call.kind, call.label, call.headline()) if x)
            text = f"{what}: {short(error, 80)}"
            text += f" (seq {call.first_seq})"
            if follow is not None:
                text += f"; retried as {follow.label}: {follow.status}"
            elif (replacement := run.replacement_of(call)) is not None:
                text += f"; re-issued as {replacement.label}: {replacement.status}"
            yield "  failed   " + style.red(text)
        for seq, label, retry_error in run.retries:
            after = f" after: {short(retry_error, 80)}" if retry_error else ""
            yield f"  retry    seq {seq}: {label}{after}"
        if run.checkpoints:
            last = run.checkpoints[-1]
            yield (
                f"  checkpt  {len(run.checkpoints)}, latest seq {last.seq} "
                f"({format_bytes(last.size)})"
            )
        for error in run.errors:
            yield "  error    " + style.red(short(error, 100))
        gaps = run.gaps()
        if gaps:
            for gap in gaps:
                yield "  gap      " + style.red(gap)
        else:
            yield "  gaps     " + style.green("none")


def _next_attempt(run: RunSummary, call: CallSummary) -> CallSummary | None:
    return run.calls.get((call.kind, call.id, call.attempt + 1))


def call_details(records: list[Record], style: Style) -> Iterator[str]:
    """Every record of one call, with its full data: ``flightlog show --call``."""
    for record in records:
        data = record_data(record)
        title = f"seq {record.seq}  {record.type}  {_when(record.time)}"
        yield style.bold(title)
        text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
        for line in text.splitlines():
            yield "  " + line


def _indented(text: str, prefix: str) -> Iterator[str]:
    lines = text.splitlines() or [""]
    yield prefix + lines[0]
    pad = " " * len(prefix)
    for line in lines[1:]:
        yield pad + line


def prompt_lines(prompt: Prompt, style: Style) -> Iterator[str]:
    """A rebuilt prompt, whole: ``flightlog show --call ID --prompt``."""
    title = f"model call {prompt.call} attempt {prompt.attempt}"
    where = f"run {_short_id(prompt.run_id)}, line {prompt.line}"
    if prompt.agent:
        where += f", agent {prompt.agent}"
    yield style.bold(title) + f"  ({where})"
    config = prompt.config if isinstance(prompt.config, dict) else {}
    settings = [f"{key} {value}" for key, value in config.items() if value not in (None, [], {})]
    if settings:
        yield "config: " + " · ".join(settings)
    tools = [str(t.get("name")) for t in prompt.tools if isinstance(t, dict)]
    if tools:
        yield f"tools: {', '.join(tools)}"
    if prompt.system is not None:
        yield from _indented(prompt.system, style.cyan("system") + ": ")
    yield f"messages ({len(prompt.messages)}):"
    for index, message in enumerate(prompt.messages, 1):
        yield from _indented(message_text(message), f"  [{index}] {message_role(message, style)}: ")


def message_role(message: Any, style: Style) -> str:
    """A message's role as a prompt lists it: ``tool_result NAME (ID) ERROR``."""
    role = "message"
    if isinstance(message, dict):
        role = str(message.get("$type") or message.get("role") or role)
        if role == "tool_result":
            role += f" {message.get('name')} ({message.get('tool_call_id')})"
            if message.get("is_error"):
                return style.cyan(role) + " " + style.red("ERROR")
    return style.cyan(role)
