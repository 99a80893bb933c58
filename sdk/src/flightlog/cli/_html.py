"""``flightlog show --html``: a session as one self-contained HTML page.

Theory of operation
-------------------
The page is written on the server side, with no script at all: each run is a waterfall
of its calls (a bar placed by the call's start and length within the run), grouped by
turn, and each call is a ``<details>`` element that opens to its full request and
response (a model call's messages and answer, a tool call's arguments and result).
Retries link to the attempt before and after them, a re-issue (``execution.replaces``)
to the call it replaces, and a call whose ``parent_id`` names an earlier call of its
run (a tool call of a model call, a sub-agent's calls under the tool call that started
it) is nested inside that call.

The session's content is hostile data: every text from a record goes through
:func:`html.escape` and nothing else, attributes hold only numbers and ids this module
makes, and a Content-Security-Policy forbids scripts and every fetch, so that neither a
tool result that holds markup nor a mistake here can run code or reach the network.

The runs and calls come from :class:`SessionSummary`; the one thing it does not keep, a
call's full request and response, is kept here per call, as the records are read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from html import escape
from typing import Any, Final

from flightlog.protocol import FileFormatError, parse_time
from flightlog.sdk import Price, Total

from ._commands import EXIT_OK, EXIT_UNSOUND, EXIT_USAGE, CommandError, open_source
from ._inspect import CallSummary, RunSummary, SessionSummary
from ._pricing import INSTALL_NOTE, Pricer
from ._render import execution_of, format_duration, format_tokens, message_text, record_data

__all__ = ["cmd_show_html", "session_html"]

# Scripts, frames, images and every fetch are refused; only the inline style applies.
_POLICY: Final = (
    "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
)

_STYLE: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:1em 2em;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
.meta,.note{color:#666}.bad{color:#b00020}.warn{color:#9a6700}
.turn{margin:.4em 0 .2em;color:#555;font-weight:600}
details.call{margin:2px 0;border-left:3px solid #ccc;padding-left:6px}
details.call.model{border-color:#3b6fd8}details.call.tool{border-color:#2e9d57}
details.call.failed{border-color:#b00020}details.call.noend{border-color:#9a6700}
details.call>summary{cursor:pointer;display:flex;gap:.6em;align-items:center}
.label{min-width:28em;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.figs{min-width:14em;color:#555;white-space:nowrap}
.lane{position:relative;flex:1;height:10px;background:#f3f3f3;min-width:12em}
.bar{position:absolute;top:0;height:10px;min-width:2px;background:#3b6fd8}
.tool .bar{background:#2e9d57}.failed .bar{background:#b00020}.noend .bar{background:#d4a72c}
.body{margin:.3em 0 .6em 1em}.children{margin-left:1.5em}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:.5em;margin:.2em 0}
.msg{margin:.3em 0}.role{font-weight:600}
"""


@dataclass
class _Detail:
    """What a call's line opens to: its records' data, kept whole."""

    request: dict[str, Any] | None = None  # model_request
    start: dict[str, Any] | None = None  # tool_exec_start / tool_invoke_start
    end: dict[str, Any] | None = None  # model_exec_end / tool_exec_end
    notes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


_Key = tuple[str | None, str, str, int]


def _collect(
    details: dict[_Key, _Detail], run_id: str | None, type: str, data: dict[str, Any]
) -> None:
    key = execution_of(data)
    if key is None:
        return
    detail = details.setdefault((run_id, *key), _Detail())
    if type == "model_request":
        detail.request = data
    elif type in ("tool_exec_start", "tool_invoke_start", "tool_queued"):
        detail.start = data
    elif type in ("model_exec_end", "tool_exec_end"):
        detail.end = data
    elif type in ("retry", "error", "retry_wait_start", "retry_wait_end"):
        detail.notes.append((type, data))


def cmd_show_html(args: argparse.Namespace) -> int:
    """``flightlog show --html PATH``: the page on standard output."""
    if args.call:
        raise CommandError("--html shows every call: leave out --call", EXIT_USAGE)
    summary = SessionSummary()
    details: dict[_Key, _Detail] = {}
    failure: FileFormatError | None = None
    with open_source(args.path, args) as source:
        try:
            for record in source.records:
                summary.add(record)
                if record.run_id is not None:
                    _collect(details, record.run_id, record.type, record_data(record))
        except FileFormatError as exc:
            failure = exc
        label = source.label
    if summary.session_id is None and failure is not None:
        raise failure
    runs = summary.run_list()
    if args.run:
        runs = [run for run in runs if run.run_id and run.run_id.startswith(args.run)]
        if len(runs) != 1:
            raise CommandError(f"{args.run!r} names {len(runs)} runs of {args.path}", EXIT_USAGE)
    broken = f"line {failure.line}: {failure.reason}" if failure is not None else None
    page = session_html(summary, details, label, runs, broken)
    sys.stdout.flush()
    sys.stdout.buffer.write(page.encode("utf-8", "surrogateescape"))
    sys.stdout.buffer.flush()
    return EXIT_OK if failure is None else EXIT_UNSOUND


def _e(value: Any) -> str:
    return escape(value if isinstance(value, str) else str(value), quote=True)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def session_html(
    summary: SessionSummary,
    details: Mapping[_Key, _Detail],
    label: str,
    runs: list[RunSummary],
    broken: str | None = None,
) -> str:
    """The whole page for ``runs`` of ``summary``."""
    pricer = Pricer()
    body = [_run_html(run, details, pricer) for run in runs]
    name = summary.meta.get("name") if isinstance(summary.meta.get("name"), str) else None
    title = name or label
    head = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">{_e(label)} · session {_e(summary.session_id or "?")} · '
        f"{summary.records} records · {len(summary.runs)} runs</p>",
    ]
    if summary.meta:
        head.append(f'<p class="meta">meta: {_e(_json(summary.meta))}</p>')
    if pricer.missing:
        head.append(f'<p class="note">{_e(INSTALL_NOTE)}</p>')
    if broken:
        head.append(
            f'<p class="bad">NOT SOUND: {_e(broken)}; the page ends at the last readable line</p>'
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">'
        f"<title>{_e(title)} · flightlog</title><style>{_STYLE}</style></head>\n<body>\n"
        + "\n".join(head + body)
        + "\n</body></html>\n"
    )


def _seconds(time: str | None) -> float | None:
    if not time:
        return None
    try:
        return parse_time(time).timestamp()
    except ValueError:
        return None


def _run_html(run: RunSummary, details: Mapping[_Key, _Detail], pricer: Pricer) -> str:
    calls = [item.call for item in run.timeline if item.call is not None]
    anchors = {id(call): f"r{run.index}c{n}" for n, call in enumerate(calls, 1)}
    # A call nests in the latest call before it that its parent_id names: never in
    # itself or a later call, so that no parent_id, however hostile, makes a cycle.
    latest: dict[str, CallSummary] = {}
    parents: dict[int, CallSummary] = {}
    children: dict[int, list[CallSummary]] = {}
    top: list[CallSummary] = []
    for call in calls:
        parent = latest.get(call.parent_id) if call.parent_id else None
        if parent is not None:
            parents[id(call)] = parent
            children.setdefault(id(parent), []).append(call)
        else:
            top.append(call)
        latest[call.id] = call
    begin = _seconds(run.start_time) or _seconds(calls[0].first_time if calls else None) or 0.0
    end = _seconds(run.close_time or run.last_time) or begin
    span = max(end - begin, 1e-9)
    prices = {id(call): pricer.call(call) for call in calls}
    tokens_in, tokens_out = run.usage()
    cost = Total.of(prices.values())
    status_class = "" if run.ok else ' class="bad"'
    lines = [
        f'<section id="run{run.index}"><h2>run {run.index} · {_e(run.run_id or "?")}</h2>',
        f'<p class="meta"><span{status_class}>{_e(run.status)}</span> · '
        f"{format_duration(_seconds_between(run))} · {len(calls)} calls · "
        f"{format_tokens(tokens_in)} in / {format_tokens(tokens_out)} out tokens"
        + ("" if pricer.missing or not cost.sources else f" · {_e(cost.text())}")
        + "</p>",
    ]
    for gap in run.gaps():
        lines.append(f'<p class="warn">gap: {_e(gap)}</p>')
    waterfall = _Waterfall(run, details, anchors, parents, children, prices, begin, span)
    turn: object = object()
    for call in top:
        if call.turn_index != turn:
            turn = call.turn_index
            what = f"turn {turn}" if turn is not None else "outside a turn"
            lines.append(f'<div class="turn">{what}</div>')
        waterfall.call(call, lines, 0)
    lines.append("</section>")
    return "\n".join(lines)


def _seconds_between(run: RunSummary) -> float | None:
    start, end = _seconds(run.start_time), _seconds(run.close_time or run.last_time)
    return end - start if start is not None and end is not None else None


def _key(call: CallSummary) -> _Key:
    return (call.run_id, call.kind, call.id, call.attempt)


@dataclass
class _Waterfall:
    run: RunSummary
    details: Mapping[_Key, _Detail]
    anchors: dict[int, str]
    parents: dict[int, CallSummary]
    children: dict[int, list[CallSummary]]
    prices: dict[int, Price | None]
    begin: float
    span: float

    def _link(self, call: CallSummary | None, text: str) -> str:
        if call is None or id(call) not in self.anchors:
            return ""
        return (
            f'<a href="#{self.anchors[id(call)]}">{_e(text)} {_e(call.kind)} {_e(call.label)}</a>'
        )

    def call(self, call: CallSummary, lines: list[str], depth: int) -> None:
        status = call.status
        classes = ["call", "model" if call.kind == "model" else "tool"]
        if call.failed:
            classes.append("failed")
        elif status == "no end":
            classes.append("noend")
        start = _seconds(call.start_time or call.first_time)
        finish = _seconds(call.end_time) if call.ended else self.begin + self.span
        left = (
            0.0 if start is None else max(0.0, min(100.0, (start - self.begin) / self.span * 100))
        )
        width = 0.0 if start is None or finish is None else (finish - start) / self.span * 100
        width = max(0.0, min(100.0 - left, width))
        what = call.headline() or call.kind
        agent = f" [{call.agent}]" if call.agent else ""
        figures = [status, format_duration(call.duration)]
        if call.usage:
            figures.append(
                f"{format_tokens(call.usage.get('input_tokens'))}/"
                f"{format_tokens(call.usage.get('output_tokens'))} tok"
            )
        found = self.prices.get(id(call))
        if found is not None:
            figures.append(Total.of([found]).text())
        anchor = self.anchors[id(call)]
        lines.append(
            f'<details class="{" ".join(classes)}" id="{anchor}" data-kind="{_e(call.kind)}">'
            f'<summary><span class="label">{_e(call.kind)} {_e(call.label)}{_e(agent)} '
            f"{_e(what)}</span>"
            f'<span class="figs">{_e(" · ".join(f for f in figures if f))}</span>'
            f'<span class="lane"><span class="bar" style="left:{left:.3f}%;width:{width:.3f}%">'
            "</span></span></summary>"
            f'<div class="body">{self._body(call, found)}</div>'
        )
        kids = self.children.get(id(call), [])
        if kids:
            lines.append('<div class="children">')
            for child in kids:
                self.call(child, lines, depth + 1)
            lines.append("</div>")
        lines.append("</details>")

    def _body(self, call: CallSummary, found: Price | None) -> str:
        detail = self.details.get(_key(call)) or _Detail()
        parts: list[str] = []
        links = []
        if call.attempt > 1:
            links.append(self._link(self._attempt(call, call.attempt - 1), "retry of"))
        if call.retried:
            links.append(self._link(self._attempt(call, call.attempt + 1), "retried as"))
        if call.replaces:
            replaced = next((c for c in self.run.calls.values() if c.id == call.replaces), None)
            links.append(self._link(replaced, "re-issues"))
        links.append(self._link(self.run.replacement_of(call), "re-issued as"))
        links.append(self._link(self.parents.get(id(call)), "inside"))
        if any(links):
            parts.append(f"<p>{' · '.join(link for link in links if link)}</p>")
        if call.error:
            parts.append(f'<p class="bad">error: {_e(call.error)}</p>')
        if call.retry_error:
            parts.append(f'<p class="bad">retried after: {_e(call.retry_error)}</p>')
        missing = call.missing()
        if missing:
            parts.append(f'<p class="warn">{_e(missing)}</p>')
        if found is not None:
            parts.append(f'<p class="note">price: {_e(found.source)}</p>')
        if call.kind == "model":
            parts.append(self._model(detail))
        else:
            arguments = (detail.start or {}).get("arguments", call.arguments)
            parts.append(f"<h4>arguments</h4><pre>{_e(_json(arguments))}</pre>")
            if detail.end is not None:
                result = {k: v for k, v in detail.end.items() if k != "execution"}
                parts.append(
                    f"<h4>result</h4><pre>{_e(message_text(detail.end, whole=True))}</pre>"
                )
                parts.append(_folded("record", result))
        for type, data in detail.notes:
            rest = {k: v for k, v in data.items() if k != "execution"}
            parts.append(f'<p class="note">{_e(type)}: {_e(_json(rest))}</p>')
        return "\n".join(parts)

    def _attempt(self, call: CallSummary, attempt: int) -> CallSummary | None:
        return self.run.calls.get((call.kind, call.id, attempt))

    def _model(self, detail: _Detail) -> str:
        parts: list[str] = ["<h4>request</h4>"]
        request = detail.request
        if request is None:
            parts.append('<p class="note">no model_request recorded</p>')
        else:
            if request.get("continues"):
                continued = str(request["continues"])
                calls = self.run.calls.values()
                earlier = [c for c in calls if c.kind == "model" and c.id == continued]
                link = self._link(earlier[-1], "continues") if earlier else ""
                parts.append(
                    f'<p class="note">{link or "continues " + _e(continued)}: '
                    "its messages come first</p>"
                )
            if request.get("system"):
                parts.append(_message("system", request["system"]))
            messages = request.get("messages")
            for message in messages if isinstance(messages, list) else []:
                role = None
                if isinstance(message, Mapping):
                    role = message.get("$type") or message.get("role")
                parts.append(_message(str(role or "message"), message))
            rest = {k: v for k, v in request.items() if k not in ("execution", "messages")}
            parts.append(_folded("tools and config", rest))
        parts.append("<h4>response</h4>")
        if detail.end is None:
            parts.append('<p class="warn">no model_exec_end recorded</p>')
        else:
            parts.append(_message("assistant", detail.end.get("message")))
            rest = {k: v for k, v in detail.end.items() if k != "execution"}
            parts.append(_folded("record", rest))
        return "\n".join(parts)


def _message(role: str, message: Any) -> str:
    text = _e(message_text(message, whole=True))
    return f'<div class="msg"><span class="role">{_e(role)}</span><pre>{text}</pre></div>'


def _folded(title: str, value: Any) -> str:
    return f"<details><summary>{title}</summary><pre>{_e(_json(value))}</pre></details>"
