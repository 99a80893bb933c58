"""The rules of ``find`` that are not about bytes: failures, models, times, meta and
data members, and who wrote a record (its agent, the call it is nested in).

Theory of operation
-------------------
Most filters test one record alone.  Two need what came before it in its run, and
:class:`Lineage` keeps that, one file at a time, as the records are read in order:

* **agent** (the author): a call names its agent in ``execution.agent`` (after a handoff,
  in a sub-agent); ``agent_start`` and ``agent_end`` name theirs in ``agent``.  A record
  that names none (a call of the run's only agent, a ``turn_start``) was written by the
  innermost agent whose ``agent_start`` has no ``agent_end`` yet (sub-agents nest like
  parentheses, docs/format.md 4.5); outside every agent, by none.
* **under** a call: the call itself, every call whose ``parent_id`` is one of those
  (at any depth), and every record of a sub-agent whose ``agent_start`` names one of
  those as its ``parent_id``, down to its ``agent_end``.  Execution ids are run-local,
  so the tree starts again in each run.

Both forget everything at the start of each run (runs are contiguous in a file).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from flightlog.protocol import Record, parse_time

__all__ = [
    "FAILURE_PATTERNS",
    "NAMES_MODEL",
    "Lineage",
    "between",
    "failed",
    "instant_text",
    "meta_matches",
    "models",
    "moment",
    "record_data",
    "value_at",
    "value_text",
]

#: For each record type that can report a failure (see ``failed``): patterns of which a
#: failed record of the type holds at least one.  Each names the member that reports it,
#: not followed by the value that says "no failure" (so whitespace, another spelling
#: or any other value lets the line through); ``"retry"`` is the type itself.
_FAILED_CALL: Final = (rb'"is_error"(?!:(?:false|null))', rb'"disposition"(?!:(?:"ran"|null))')
FAILURE_PATTERNS: Final[dict[str, tuple[bytes, ...]]] = {
    "error": (rb'"error"(?!:null)',),
    "retry": (rb'"retry"',),
    "model_exec_end": (rb'"error"(?!:null)',),
    "context_prepare_end": (rb'"error"(?!:null)',),
    "run_close": (rb'"error"(?!:null)',),
    "agent_end": (rb'"ok"(?!:true)',),
    "tool_exec_end": _FAILED_CALL,
    "tool_invoke_end": _FAILED_CALL,
}
#: The record types whose data can name a model (``models``).
NAMES_MODEL: Final = frozenset(
    {"model_request", "model_exec_start", "model_exec_end", "model_response", "message_end"}
)
_RELATIVE: Final = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FAILED_TYPES: Final = frozenset({"error"})


def failed(type: str, data: Mapping[str, Any]) -> bool:
    """Whether a record reports a failure (an error, a failed call or run)."""
    if type in _FAILED_TYPES or type == "retry":
        return True
    if type == "model_exec_end" or type == "context_prepare_end":
        return bool(data.get("error"))
    if type in ("tool_exec_end", "tool_invoke_end"):
        return bool(data.get("is_error")) or data.get("disposition", "ran") not in (None, "ran")
    if type == "agent_end":
        return not data.get("ok", True)
    if type == "run_close":
        return bool(data.get("error"))
    return False


def record_data(record: Record) -> dict[str, Any]:
    """A record's ``data`` as plain JSON values; ``{}`` when it is not an object."""
    try:
        data = record.decode_data()
    except Exception:  # a reader already vouched for the JSON; be lenient anyway
        return {}
    return data if isinstance(data, dict) else {}


def moment(text: str, now: datetime) -> datetime:
    """An RFC 3339 UTC time, or an age before ``now`` (``30s``, ``15m``, ``2h``, ``1d``);
    raises :class:`ValueError` for anything else."""
    relative = _RELATIVE.fullmatch(text.strip())
    if relative:
        return now - timedelta(seconds=float(relative.group(1)) * _UNITS[relative.group(2)])
    try:
        return parse_time(text.strip())
    except ValueError:
        raise ValueError(
            f"an RFC 3339 UTC time (2026-11-29T20:00:00Z) or an age "
            f"(30s, 15m, 2h, 1d), not {text!r}"
        ) from None


def instant_text(text: str) -> str:
    """``format_time``'s text as :meth:`Query._instant` gives it."""
    return text[:19] + text[20:26]


def between(low: str | None, high: str | None) -> str:
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


def value_at(value: Any, path: str) -> Any:
    """The member at ``path`` of a decoded JSON value: a key (``model``), or keys and list
    indexes joined by dots (``config.model``, ``content.0.text``); None where there is none.
    A key that itself holds dots is found as it is first."""
    if isinstance(value, dict) and path in value:
        return value[path]
    for key in path.split("."):
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return None
    return value


def meta_matches(value: Any, wanted: Mapping[str, str | None]) -> bool:
    """Whether ``value`` (a session's meta, a record's data) has each of ``wanted``'s
    paths (:func:`value_at`) with that value, a value that is not a string compared as
    its JSON (:func:`value_text`)."""
    return all(value_text(value_at(value, key)) == text for key, text in wanted.items())


def value_text(value: Any) -> str | None:
    """A member's value as the text a filter compares: a string as it is, None for
    none, anything else as its JSON (``7``, ``true``, ``{"a": 1}``)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value)


def models(data: dict[str, Any]) -> list[Any]:
    """The models a record's data names (requests, starts, responses)."""
    config = data.get("config")
    message = data.get("message")
    return [
        data.get("model"),
        config.get("model") if isinstance(config, dict) else None,
        message.get("model") if isinstance(message, dict) else None,
    ]


@dataclass
class _Agent:
    name: Any
    under: bool  # its agent_start is nested under the call of ``Lineage.root``


@dataclass
class Lineage:
    """Who wrote each record of a file, and whether it is nested under the call
    ``root`` (see the theory of operation); fed every record that can change it, in
    order, through :meth:`follow`."""

    root: str | None = None
    _run: str | None = None
    _agents: list[_Agent] = field(default_factory=list)
    _ids: set[str] = field(default_factory=set)

    def follow(self, type: str, run_id: str | None, data: dict[str, Any]) -> tuple[Any, bool]:
        """The agent that wrote this record, and whether it is under ``root``."""
        if run_id != self._run:
            self._run = run_id
            self._agents.clear()
            self._ids = {self.root} if self.root is not None else set()
        innermost = self._agents[-1] if self._agents else None
        if type == "agent_start":
            parent = data.get("parent_id")
            under = parent in self._ids or (innermost is not None and innermost.under)
            self._agents.append(_Agent(data.get("agent"), under))
            return data.get("agent"), under
        if type == "agent_end" and self._agents:
            ended = self._agents.pop()
            return data.get("agent", ended.name), ended.under
        execution = data.get("execution")
        if not isinstance(execution, dict):
            name = innermost.name if innermost is not None else None
            return name, innermost is not None and innermost.under
        ids = self._ids
        id, parent = execution.get("id"), execution.get("parent_id")
        under = (
            id in ids or parent in ids or (innermost is not None and innermost.under)
        ) and self.root is not None
        if under and isinstance(id, str):
            ids.add(id)
        agent = execution.get("agent")
        if agent is None and innermost is not None:
            agent = innermost.name
        return agent, under
