"""The one pairing rule of calls: which runs have no ``run_close`` and which model and
tool calls have a start and no end, as records are fed in file order.

A call's start and end are paired by ``(run_id, execution.id, execution.attempt,
execution.kind)`` (docs/format.md, section 4.5).  A call with a start and no end was
cut: the process died, or the daemon lost its end.  The SDK's ``resume()`` and the
daemon's open both feed a :class:`CallLedger`; sans I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from ._events import Execution
from ._records import RUN_CLOSE, RUN_START, Record

__all__ = ["CallLedger", "CallState", "Calls", "OpenCall", "open_calls"]

_STARTS = {
    "model_request": "model",
    "model_exec_start": "model",
    "tool_queued": "tool",
    "tool_exec_start": "tool",
}
_ENDS = {"model_exec_end": "model", "tool_exec_end": "tool"}


@dataclass(frozen=True)
class OpenCall:
    """A model or tool call with a start and no end.

    ``execution`` is the call's Execution as recorded; ``tool_call_id`` and ``name``
    (tools) are the model's call id and the tool's name; ``seq`` is its first record's.
    """

    run_id: str
    execution: Execution
    seq: int
    tool_call_id: str | None = None
    name: str | None = None
    arguments: Any = None


class _Keyed(msgspec.Struct):
    # What pairing needs of a start's or an end's data; the rest (messages, results)
    # is skipped, not decoded.  A missing or invalid execution fails the decode: the
    # record pairs nothing.
    execution: Execution


class _CallData(msgspec.Struct):
    tool_call_id: Any = None
    name: Any = None
    arguments: Any = None


_keyed: Final = msgspec.json.Decoder(_Keyed)
_call_data: Final = msgspec.json.Decoder(_CallData)
_Key = tuple[str, str, int, str]


class CallState(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """What a :class:`CallLedger` knows, kept to seed one later
    (:meth:`CallLedger.state`, :meth:`CallLedger.from_state`): the runs without
    ``run_close``, the calls started and not ended (key, execution, seq and the start's
    data) and the keys of the calls that ended, in the order they came."""

    runs: list[str]
    calls: list[tuple[_Key, Execution, int, bytes]]
    ended: list[_Key]


class CallLedger:
    """The runs without ``run_close`` and the calls without an end, kept as records are
    fed in file order (:meth:`feed`); :meth:`result` says them at any point.  The one
    pairing rule: :func:`open_calls` and the daemon's open both feed one."""

    def __init__(self) -> None:
        self._runs: dict[str, None] = {}
        # A start not ended yet: its execution, seq and data (decoded once it is
        # asked for: most calls end).
        self._calls: dict[_Key, tuple[Execution, int, msgspec.Raw]] = {}
        self._ended: set[_Key] = set()

    def feed(self, record: Record) -> None:
        run_id = record.run_id
        if run_id is None:
            return
        type = record.type
        if type == RUN_START:
            self._runs[run_id] = None
        elif type == RUN_CLOSE:
            self._runs.pop(run_id, None)
        kind = _STARTS.get(type) or _ENDS.get(type)
        if kind is None:
            return
        try:
            execution = _keyed.decode(record.data).execution
        except (msgspec.ValidationError, msgspec.DecodeError):
            return
        key = (run_id, execution.id, execution.attempt, kind)
        if type in _ENDS:
            self._ended.add(key)
            self._calls.pop(key, None)
        elif key not in self._calls and key not in self._ended:
            self._calls[key] = (execution, record.seq, record.data)

    def state(self) -> CallState:
        calls = [
            (key, execution, seq, bytes(raw)) for key, (execution, seq, raw) in self._calls.items()
        ]
        return CallState(list(self._runs), calls, list(self._ended))

    @classmethod
    def from_state(cls, state: CallState) -> CallLedger:
        """A ledger that goes on from ``state`` as the one that made it would."""
        ledger = cls()
        ledger._runs = dict.fromkeys(state.runs)
        ledger._calls = {
            key: (execution, seq, msgspec.Raw(data)) for key, execution, seq, data in state.calls
        }
        ledger._ended = set(state.ended)
        return ledger

    def result(self) -> tuple[list[str], list[OpenCall]]:
        """The runs without ``run_close`` and the calls without an end, in file order."""
        calls = []
        for (run_id, *_), (execution, seq, raw) in self._calls.items():
            data = _call_data.decode(raw)
            calls.append(
                OpenCall(run_id, execution, seq, data.tool_call_id, data.name, data.arguments)
            )
        return list(self._runs), calls


#: The runs without ``run_close`` and the calls without an end.
Calls = tuple[list[str], list[OpenCall]]


def open_calls(records: Iterable[Record]) -> tuple[list[str], list[OpenCall]]:
    """The runs without ``run_close`` and the calls without an end, in file order."""
    ledger = CallLedger()
    for record in records:
        ledger.feed(record)
    return ledger.result()
