"""Turning records into short readable text, for ``flightlog tail``, ``show`` and ``inspect``.

Everything here works on a record's ``data`` decoded to plain JSON values, not on the
typed events: a session may hold an application's own message types (tagged with
``"$type"``) that this process never registered, and a newer writer may add fields or
record types; both must still print.  Nothing here raises on odd data: a field of an
unexpected shape is shown as it is, never guessed at.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any, Final, TextIO

from flightlog.protocol import Record, parse_time
from flightlog.sdk.search import failed, record_data

__all__ = [
    "Style",
    "call_label",
    "clock",
    "duration",
    "execution_of",
    "failed",
    "format_args",
    "format_bytes",
    "format_duration",
    "format_tokens",
    "format_usage",
    "message_text",
    "one_line",
    "record_data",
    "say",
    "short",
    "summarize",
    "tail_line",
]

_RESET: Final = "\x1b[0m"
_CODES: Final = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}


class Style:
    """ANSI colours, or none: ``Style.for_stream(sys.stdout, "auto")``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream: TextIO, mode: str = "auto") -> Style:
        """Colour for ``always``; never for ``never``; for ``auto``, only on a terminal
        and only when ``$NO_COLOR`` is unset or empty (https://no-color.org)."""
        if mode == "always":
            return cls(True)
        if mode == "never" or os.environ.get("NO_COLOR"):
            return cls(False)
        isatty = getattr(stream, "isatty", None)
        return cls(bool(isatty and isatty()) and os.environ.get("TERM") != "dumb")

    def paint(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles or not text:
            return text
        codes = ";".join(_CODES[name] for name in styles)
        return f"\x1b[{codes}m{text}{_RESET}"

    def bold(self, text: str) -> str:
        return self.paint(text, "bold")

    def dim(self, text: str) -> str:
        return self.paint(text, "dim")

    def red(self, text: str) -> str:
        return self.paint(text, "red")

    def green(self, text: str) -> str:
        return self.paint(text, "green")

    def yellow(self, text: str) -> str:
        return self.paint(text, "yellow")

    def cyan(self, text: str) -> str:
        return self.paint(text, "cyan")


# ------------------------------------------------------------------ terminal safety

#: What reaches a terminal only as a visible escape: every C0 control character but tab
#: and newline, DEL and the C1 controls, and the bidirectional controls (the marks and
#: the embeddings, overrides and isolates, U+202E among them), which make a terminal
#: show text in an order other than its own (``gnp.exe`` for ``exe.png``).  With
#: colours on, an ESC passes only at the start of a colour sequence (SGR,
#: ``ESC [ digits m``), as ``Style`` writes them and ``less -R`` shows them.
_CONTROLS = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[{_CONTROLS}]")
_CONTROL_BUT_COLOURS = re.compile(rf"\x1b\[[0-9;]*m|[{_CONTROLS}]")


def _visible(match: re.Match[str]) -> str:
    text = match.group()
    if len(text) > 1:
        return text  # a colour sequence
    return f"\\x{ord(text):02x}" if ord(text) < 0x100 else f"\\u{ord(text):04x}"


def neutralize(text: str, *, colours: bool = False) -> str:
    """``text`` with every control character that could drive a terminal (cursor moves,
    title changes, BEL, erasing) written as a visible ``\\xNN`` escape; with
    ``colours``, colour sequences pass."""
    return (_CONTROL_BUT_COLOURS if colours else _CONTROL).sub(_visible, text)


#: What would end or break a line: ``\n`` inside an execution id, a path or a tool's
#: name would otherwise print a line of the record's choosing (a forged one).
_LINE_BREAKS = re.compile(r"[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
_BREAK_NAMES: Final = {"\n": "\\n", "\r": "\\r"}


def _break_visible(match: re.Match[str]) -> str:
    char = match.group()
    name = _BREAK_NAMES.get(char)
    if name is not None:
        return name
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def one_line(text: str) -> str:
    """``text`` as one line of output: every character that would break it (``\\n``,
    ``\\r``, vertical tab, form feed, the separators, NEL, U+2028/9) written as a
    visible escape.  Every readable line the commands print goes through it."""
    return _LINE_BREAKS.sub(_break_visible, text)


def say(text: str, stream: TextIO) -> None:
    """Write ``text`` to ``stream`` (stderr) as one line, flushed: line breaks and every
    control character but colours escaped, as :class:`TerminalText` does for stdout."""
    stream.write(one_line(neutralize(text, colours=True)) + "\n")
    stream.flush()


class TerminalText:
    """A text stream to a terminal that neutralizes what records bring in
    (:func:`neutralize`), as journalctl and less do.  ``--json`` output bypasses it."""

    def __init__(self, stream: TextIO, *, colours: bool) -> None:
        self._stream = stream
        self._colours = colours

    def write(self, text: str) -> int:
        return self._stream.write(neutralize(text, colours=self._colours))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


# ------------------------------------------------------------------------ small pieces


def short(text: str, width: int = 80) -> str:
    """``text`` on one line (whitespace collapsed), cut to ``width`` with an ellipsis."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    return flat[: max(width - 1, 0)] + "…"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def format_args(arguments: Any, width: int = 60) -> str:
    """Tool arguments in short: ``city="Paris", days=3``."""
    if isinstance(arguments, Mapping):
        text = ", ".join(f"{key}={_json(value)}" for key, value in arguments.items())
    elif arguments is None:
        text = ""
    else:
        text = _json(arguments)
    return short(text, width)


def format_tokens(count: Any) -> str:
    return f"{count:,}" if isinstance(count, int) else "?"


def format_usage(usage: Any) -> str:
    """``1,234→56 tok`` (input→output), with the cache reads and writes among the input
    and the cost the provider reported, when present."""
    if not isinstance(usage, Mapping):
        return ""
    text = (
        f"{format_tokens(usage.get('input_tokens', 0))}→"
        f"{format_tokens(usage.get('output_tokens', 0))} tok"
    )
    cache = [
        f"{format_tokens(count)} {what}"
        for what in ("cache read", "cache write")
        if isinstance(count := usage.get(what.replace(" ", "_") + "_tokens"), int) and count
    ]
    if cache:
        text += f" ({', '.join(cache)})"
    cost = usage.get("cost")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        text += f" provider cost ${cost:.4f}"
    return text


def format_bytes(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} kB"
    if size < 1024**3:
        return f"{size / 1024 / 1024:.1f} MB"
    return f"{size / 1024**3:.1f} GB"


def clock(time: str) -> str:
    """``20:00:01.123`` from a record time (UTC, as written)."""
    return time[11:23] if len(time) >= 23 else time


def duration(start: str | None, end: str | None) -> float | None:
    """Seconds from ``start`` to ``end`` (record times), or None when either is missing."""
    if not start or not end:
        return None
    try:
        return (parse_time(end) - parse_time(start)).total_seconds()
    except ValueError:
        return None


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.2f}s"
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


def execution_of(data: Mapping[str, Any]) -> tuple[str, str, int] | None:
    """``(kind, id, attempt)`` of a record's ``execution``, or None without one."""
    execution = data.get("execution")
    if not isinstance(execution, Mapping):
        return None
    exec_id, kind, attempt = execution.get("id"), execution.get("kind"), execution.get("attempt", 1)
    if not isinstance(exec_id, str) or not isinstance(kind, str):
        return None
    return kind, exec_id, attempt if isinstance(attempt, int) else 1


def call_label(kind: str, exec_id: str, attempt: int) -> str:
    """``tool t-2`` or, for a retry, ``tool t-2#2``."""
    return f"{kind} {exec_id}" + (f"#{attempt}" if attempt != 1 else "")


def _parts_text(parts: Any, whole: bool = False) -> str:
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return _json(parts) if parts is not None else ""
    pieces: list[str] = []
    for part in parts:
        if not isinstance(part, Mapping):
            pieces.append(_json(part))
            continue
        kind = part.get("$type")
        if kind == "text":
            pieces.append(str(part.get("text", "")))
        elif kind == "tool_call":
            arguments = part.get("arguments")
            shown = _json(arguments) if whole else format_args(arguments, 40)
            pieces.append(f"→{part.get('name')}({shown})")
        elif kind == "thinking":
            thought = part.get("thinking")
            pieces.append(f"[thinking] {thought}" if whole and thought else "[thinking]")
        elif kind in ("image", "file"):
            pieces.append(f"[{kind} {part.get('name') or part.get('media_type', '')}]")
        else:
            pieces.append(_json(part))
    return " ".join(piece for piece in pieces if piece)


def message_text(message: Any, *, whole: bool = False) -> str:
    """The readable content of a message (text parts, tool calls in short); ``whole``:
    every tool call's arguments and every thinking part's text in full."""
    if isinstance(message, str):
        return message
    if not isinstance(message, Mapping):
        return "" if message is None else _json(message)
    if "content" in message:
        return _parts_text(message["content"], whole)
    return _json(message)


def _role(message: Any) -> str:
    if isinstance(message, Mapping):
        role = message.get("$type") or message.get("role")
        if isinstance(role, str):
            return role
    return "message"


def _first_user_text(messages: Any) -> str:
    if isinstance(messages, list):
        for message in messages:
            if _role(message) == "user":
                return message_text(message)
        if messages:
            return message_text(messages[0])
    return ""


def _quoted(text: str, width: int) -> str:
    return f'"{short(text, width)}"' if text else ""


def _tool_result(data: Mapping[str, Any], width: int) -> str:
    disposition = data.get("disposition", "ran")
    text = _parts_text(data.get("content"))
    if disposition not in (None, "ran"):
        reason = data.get("reason") or text
        return f"{disposition}" + (f": {short(str(reason), width)}" if reason else "")
    if data.get("is_error"):
        return "FAILED" + (f": {short(text, width)}" if text else "")
    return "→ " + (_quoted(text, width) or "(no content)")


# --------------------------------------------------------------------------- summaries


def summarize(type: str, data: Mapping[str, Any], width: int = 72) -> str:
    """One short line about a record: what a person wants to see in ``tail``."""
    get = data.get
    match type:
        case "session_start":
            meta = get("meta") or {}
            return f"format {get('format_version')}" + (f", meta {_json(meta)}" if meta else "")
        case "run_start":
            return f"run started by {get('client') or '?'} (pid {get('pid')})"
        case "run_close":
            error = get("error")
            return "run closed" + (f" with error: {short(str(error), width)}" if error else "")
        case "checkpoint":
            return "checkpoint saved"
        case "agent_start":
            agent = get("agent")
            text = _quoted(_first_user_text(get("messages")), width)
            started = "started" if not get("parent_id") else f"started by {get('parent_id')}"
            return " ".join(x for x in ("agent", agent or "", started, text) if x)
        case "agent_end":
            head = "ok" if get("ok", True) else "FAILED"
            bits = [head, str(get("reason") or "")]
            if get("error"):
                bits.append(short(str(get("error")), width))
            if get("turns"):
                bits.append(f"{get('turns')} turns")
            if get("usage"):
                bits.append(format_usage(get("usage")))
            output = get("output")
            if output is not None:
                text = output if isinstance(output, str) else _json(output)
                bits.append(f"output {_quoted(text, width // 2)}")
            return ", ".join(bit for bit in bits if bit)
        case "turn_start":
            return f"turn {get('turn_index')}"
        case "turn_end":
            bits = [f"turn {get('turn_index')} ended"]
            if get("stop_reason"):
                bits.append(f"stop={get('stop_reason')}")
            if get("tool_call_count"):
                bits.append(f"{get('tool_call_count')} tool calls")
            if get("usage"):
                bits.append(format_usage(get("usage")))
            return ", ".join(bits)
        case "model_request":
            config = get("config") if isinstance(get("config"), Mapping) else {}
            model = config.get("model") if isinstance(config, Mapping) else None
            messages = get("messages")
            tools = get("tools")
            bits = [str(model or "model")]
            if isinstance(messages, list):
                bits.append(f"{len(messages)} messages")
            if isinstance(tools, list) and tools:
                bits.append(f"{len(tools)} tools")
            return ", ".join(bits)
        case "model_exec_start":
            return " ".join(str(x) for x in (get("provider"), get("model")) if x) or "started"
        case "model_exec_end":
            message = get("message")
            if get("error"):
                return f"FAILED: {short(str(get('error')), width)}"
            bits = ["ok"]
            if get("usage"):
                bits.append(format_usage(get("usage")))
            if isinstance(message, Mapping) and message.get("stop_reason"):
                bits.append(f"stop={message.get('stop_reason')}")
            text = _quoted(message_text(message), width // 2)
            return ", ".join(bits) + (f" {text}" if text else "")
        case "model_response":
            return f"length recovery: {get('length_recovery')}"
        case "message_end":
            message = get("message")
            return f"{_role(message)}: {_quoted(message_text(message), width)}"
        case "tool_queued" | "tool_exec_start" | "tool_invoke_start":
            return f"{get('name')}({format_args(get('arguments'), width - 10)})"
        case "tool_invoke_end" | "tool_exec_end":
            return f"{get('name')} {_tool_result(data, width - 10)}"
        case "retry":
            error = get("error")
            text = f"retry in {get('delay_seconds', 0)}s"
            return text + (f" after: {short(str(error), width)}" if error else "")
        case "retry_wait_start":
            return f"waiting {get('delay_seconds', 0)}s"
        case "retry_wait_end":
            return "wait cancelled" if get("cancelled") else "wait over"
        case "context_prepare_start":
            return f"preparing context, {get('message_count', 0)} messages"
        case "context_prepare_end":
            if get("error"):
                return f"FAILED: {short(str(get('error')), width)}"
            return f"context ready, {get('message_count', 0)} messages" + (
                f", ~{format_tokens(get('token_estimate'))} tok" if get("token_estimate") else ""
            )
        case "context_projected":
            return f"{get('source_count', 0)} → {get('message_count', 0)} messages" + (
                f" ({get('strategy')})" if get("strategy") else ""
            )
        case "context_compacted":
            return (
                f"compacted {get('compacted_count', 0)} messages, kept {get('kept_count', 0)}"
                + (
                    f", {format_tokens(get('tokens_before'))}→{format_tokens(get('tokens_after'))}"
                    " tok"
                    if get("tokens_before") is not None
                    else ""
                )
            )
        case "error":
            fatal = "FATAL " if get("fatal") else ""
            code = f"[{get('code')}] " if get("code") else ""
            return f"{fatal}{code}{short(str(get('message', '')), width)}"
    return short(_json(dict(data)), width)


_END_TYPES: Final = frozenset(
    {"model_exec_end", "tool_exec_end", "tool_invoke_end", "agent_end", "run_close"}
)
_START_TYPES: Final = frozenset(
    {"session_start", "run_start", "agent_start", "turn_start", "model_exec_start"}
)


def tail_line(record: Record, style: Style, width: int = 72) -> str:
    """One line for ``flightlog tail``: time, seq, type, call and a short summary."""
    data = record_data(record)
    type = record.type
    if failed(type, data):
        painted = style.red(f"{type:<21}")
    elif type in _END_TYPES:
        painted = style.green(f"{type:<21}")
    elif type in _START_TYPES:
        painted = style.cyan(f"{type:<21}")
    else:
        painted = f"{type:<21}"
    execution = execution_of(data)
    call = style.yellow(f"[{call_label(*execution)}] ") if execution else ""
    seq = style.dim(f"{record.seq:>6}")
    if type == "checkpoint":
        summary = f"checkpoint saved, {format_bytes(len(bytes(record.data)))}"
    else:
        summary = summarize(type, data, width)
    return f"{style.dim(clock(record.time))} {seq} {painted} {call}{summary}"
