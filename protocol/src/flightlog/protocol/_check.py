"""Checking a whole session file: :func:`check` reads it with a :class:`~._reader.Reader`
and reports whether it is sound, and what keeps the reading rules but makes no sense
(:class:`ReusedExecutions`, the run ledger's open runs).

Apart from the reader so that reading a file does not import the run ledger (and
through it the daemon's rules for starting runs).
"""

from __future__ import annotations

from typing import Final

import msgspec

from ._errors import FileFormatError
from ._ledger import RunLedger
from ._reader import BinaryReadable, Reader
from ._records import CHECKPOINT, RUN_CLOSE, RUN_START, Record, is_time

__all__ = ["CALL_END_TYPES", "CALL_START_TYPES", "CheckReport", "ReusedExecutions", "check"]


#: Records that start a call (docs/format.md section 4.5): met again for the same call,
#: or after its end, its execution id was used by a second call.
CALL_START_TYPES: Final = frozenset(
    {"model_request", "model_exec_start", "tool_queued", "tool_exec_start"}
)
#: Records that end a call.
CALL_END_TYPES: Final = frozenset({"model_exec_end", "tool_exec_end", "context_compacted"})


class _Execution(msgspec.Struct):
    id: str
    kind: str
    attempt: int = 1


class _CallData(msgspec.Struct):
    execution: _Execution | None = None


_call_data: Final = msgspec.json.Decoder(_CallData)


class ReusedExecutions:
    """Finds an execution id used by two calls of one run.

    A call is one run's records with the same execution ``kind``, ``id`` and ``attempt``;
    a second start of it (a start type met again, or any start after its end) means two
    calls were recorded under one id, which no reader can tell apart.  Feed each record
    (or, with its execution already decoded, :meth:`add`); each returns True for the
    record where a call's id is first found reused.  Memory grows with the calls of the
    runs not yet :meth:`forget`-ten.
    """

    def __init__(self) -> None:
        # Per run, per call: the start types seen, "ended" once it ended, "reused" once
        # its id was found reused (said once).
        self._calls: dict[str | None, dict[tuple[str, str, int], set[str]]] = {}

    def add(self, run_id: str | None, type: str, kind: str, id: str, attempt: int) -> bool:
        """Note a record of call ``(kind, id, attempt)``; True when it first reuses the id."""
        seen = self._calls.setdefault(run_id, {}).setdefault((kind, id, attempt), set())
        if type in CALL_END_TYPES:
            seen.add("ended")
        if type not in CALL_START_TYPES:
            return False
        reused = "reused" not in seen and ("ended" in seen or type in seen)
        seen.add(type)
        if reused:
            seen.add("reused")
        return reused

    def add_record(self, record: Record) -> bool:
        """Like :meth:`add`, decoding only the ``execution`` of a call's start or end."""
        if record.type not in CALL_START_TYPES and record.type not in CALL_END_TYPES:
            return False
        try:
            execution = _call_data.decode(record.data).execution
        except msgspec.DecodeError:  # a data shape the reading rules do not judge
            return False
        if execution is None:
            return False
        return self.add(record.run_id, record.type, execution.kind, execution.id, execution.attempt)

    def forget(self, run_id: str | None) -> None:
        """Drop what is known of ``run_id``'s calls (its run is closed)."""
        self._calls.pop(run_id, None)


class CheckReport(msgspec.Struct, kw_only=True, frozen=True):
    """What :func:`check` found.

    ``sound`` says whether every complete line keeps the reading rules; an unfinished
    tail does not make a file unsound (it is reported in ``unfinished_tail`` and
    ``tail_bytes``).  ``valid_bytes`` is the length of the readable prefix: where a
    writer would truncate.  ``open_runs`` lists run ids with a ``run_start`` and no
    ``run_close``, in file order: interrupted runs, or the one still being written.
    ``warnings`` notes records that keep the reading rules but make no sense (a record of
    a run that never started, a record after its run's ``run_close``, a call that reuses
    the execution id of another call of its run).
    """

    sound: bool
    session_id: str | None = None
    format_version: int | None = None
    records: int = 0
    runs: int = 0
    open_runs: list[str] = []
    checkpoints: int = 0
    last_seq: int = 0
    valid_bytes: int = 0
    error: str | None = None
    error_line: int | None = None
    unfinished_tail: bool = False
    tail_bytes: int = 0
    warnings: list[str] = []


#: At most this many warnings are kept by :func:`check`.
_MAX_WARNINGS: Final = 100


def check(fileobj: BinaryReadable) -> CheckReport:
    """Read a whole session file and report whether it is sound.

    Never raises :class:`FileFormatError`: a broken line is reported in ``error`` and
    ``error_line``.  Raises :class:`LocalProtocolError` for a file object in text mode.
    """
    reader = Reader(fileobj)
    reused = ReusedExecutions()
    records = runs = checkpoints = 0
    ledger = RunLedger()
    closed_runs: set[str] = set()
    warnings: list[str] = []

    def warn(text: str) -> None:
        if len(warnings) < _MAX_WARNINGS:
            warnings.append(text)

    error: FileFormatError | None = None
    try:
        for record in reader:
            records += 1
            if not is_time(record.time):
                # Never the daemon's: it refuses such a time. Edited by hand, or by
                # another writer; readers show it as written, and sort it as they can.
                warn(
                    f"seq {record.seq}: time {record.time!r} is not a record time "
                    "(RFC 3339 in UTC with a Z, years 0001 to 9999)"
                )
            run_id = record.run_id
            again = run_id in ledger.runs or run_id in closed_runs
            ledger.add(record.type, run_id)
            if record.type == RUN_START:
                runs += 1
                if run_id is None:
                    warn(f"seq {record.seq}: run_start without a run_id")
                    continue
                if again:
                    warn(f"seq {record.seq}: run {run_id} starts a second time")
                continue
            if record.type == CHECKPOINT:
                checkpoints += 1
            if run_id is None:
                continue
            if run_id in closed_runs:
                warn(f"seq {record.seq}: {record.type} in run {run_id} after its run_close")
            elif run_id not in ledger.runs:
                warn(f"seq {record.seq}: {record.type} in run {run_id}, which never started")
            if reused.add_record(record):
                warn(
                    f"seq {record.seq}: {record.type} in run {run_id} starts a second call "
                    "under an execution id already used in that run; the two cannot be told "
                    "apart"
                )
            if record.type == RUN_CLOSE:
                closed_runs.add(run_id)
                reused.forget(run_id)
    except FileFormatError as exc:
        error = exc
    return CheckReport(
        sound=error is None,
        session_id=reader.session_id,
        format_version=reader.format_version,
        records=records,
        runs=runs,
        open_runs=ledger.interrupted_runs,
        checkpoints=checkpoints,
        last_seq=reader.last_seq,
        valid_bytes=reader.offset,
        error=None if error is None else error.reason,
        error_line=None if error is None else error.line,
        unfinished_tail=reader.tail_size > 0,
        tail_bytes=reader.tail_size,
        warnings=warnings,
    )
