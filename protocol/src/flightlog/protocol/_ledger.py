"""The runs of one session, kept once for every writer and reader: :class:`RunLedger`.

Theory of operation
-------------------

A session file's runs are what a writer must know to open it again: every run id it
holds (a new run's must be fresh), the runs left without ``run_close`` (*interrupted*),
and its *last run* when that has no ``run_close``, with how many *items* (agent facts
and checkpoints) it holds, so that a writer cut by a restart may continue it after a
``run_resume`` and send again only what the file lacks.

The ledger is fed in one of two ways, and both give the same state:

* *records*, in file order (:meth:`RunLedger.add`): the daemon's open-time scan and the
  reader's :func:`~._check.check`.  A ``run_resume`` only continues the run it names;
  the file says nothing of writers coming and going, so a run without ``run_close`` is
  simply interrupted once the records are all read.  A *repair* (a ``run_resume``
  marked ``repair``) may continue any interrupted run, not only the last, to answer its
  open calls and close it: its records count for the run they are in.
* *requests*, as a writer makes them (the daemon's session actor, the SDK's
  ``MemoryDaemon``): :meth:`~RunLedger.begin_run`, :meth:`~RunLedger.checkpoint` and
  :meth:`~RunLedger.close_run` apply the rule only the file can (``check_run_start``)
  and say what to write, an :class:`Entry` that gives the reply once written;
  :meth:`~RunLedger.wrote` counts records written (:meth:`~RunLedger.dropped` those
  not written for an event id the session held), :meth:`~RunLedger.release` the
  writer gone.  The owner adds only how lines are encoded, batched, written and synced.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import msgspec

from ._records import (
    CHECKPOINT,
    RUN_CLOSE,
    RUN_RESUME,
    RUN_START,
    RunCloseData,
    RunResumeData,
    RunStartData,
)
from ._server_events import StartRun, check_run_start
from ._wire import Ack, CloseRun, Message, RunStarted, SaveCheckpoint

__all__ = ["MAX_CLIENT_NAME", "Entry", "LedgerState", "RunLedger"]

#: A ``run_start`` keeps at most this many characters of the client's name.
MAX_CLIENT_NAME: Final = 200

_encode_json: Final = msgspec.json.Encoder().encode


class Entry(NamedTuple):
    """One line a request writes (its type, time, data and run) and how its reply is
    made once the line has its seq."""

    type: str
    time: str
    data: bytes
    run_id: str
    #: The request's id; a ``begin_run`` is answered with ``run_started``, the rest
    #: with ``ack``.
    request_id: int

    def reply(self, seq: int) -> Message:
        """The reply to the request, its line written at ``seq``."""
        if self.type in (RUN_START, RUN_RESUME):
            return RunStarted(id=self.request_id, run_id=self.run_id, seq=seq)
        return Ack(id=self.request_id, seq=seq)


class LedgerState(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """What a :class:`RunLedger` fed records knows, kept to seed one later
    (:meth:`RunLedger.state`, :meth:`RunLedger.from_state`): every run, the runs
    without ``run_close`` in start order with their items, and the last run."""

    runs: list[str]
    open: list[tuple[str, int]]
    last: str | None


class RunLedger:
    """The runs of one session (see the module docstring)."""

    __slots__ = ("_last", "_open", "duplicates", "repairing", "runs", "writing")

    def __init__(self) -> None:
        #: Every run the session holds, closed or not.
        self.runs: set[str] = set()
        #: Runs without run_close, in the order they started, with their items
        #: (agent facts and checkpoints).
        self._open: dict[str, int] = {}
        #: The last run started, while it has no run_close.
        self._last: str | None = None
        #: The run a writer has open now (requests only).
        self.writing: str | None = None
        #: Records of the open run dropped for an event id the session held (requests
        #: only): its ``run_close`` counts them.
        self.duplicates = 0
        #: Whether the open run is a repair's (requests only): its ``run_close`` says
        #: ``repaired``.
        self.repairing = False

    @property
    def interrupted_runs(self) -> list[str]:
        """Runs without ``run_close`` and no writer writing them, in start order."""
        return [run for run in self._open if run != self.writing]

    @property
    def last_run(self) -> str | None:
        """The last run when it has no ``run_close`` and no writer has it open: the one
        a ``begin_run`` may resume."""
        return self._last if self.writing is None else None

    @property
    def items(self) -> int:
        """The items of the last run (0 once it has a ``run_close``)."""
        return self._open.get(self._last, 0) if self._last is not None else 0

    @property
    def last_run_items(self) -> int:
        """The items of :attr:`last_run` (0 when there is none)."""
        return self.items if self.last_run is not None else 0

    # ------------------------------------------------------------ fed records

    def state(self) -> LedgerState:
        """What the records fed so far left (the requests' own state is not part of
        it: a run a writer has open is, in the file, one without ``run_close``)."""
        return LedgerState(sorted(self.runs), list(self._open.items()), self._last)

    @classmethod
    def from_state(cls, state: LedgerState) -> RunLedger:
        """A ledger that goes on from ``state`` as the one that made it would.  Raises
        :class:`ValueError` for a state no records could leave (an open run or the
        last run that is not one of the runs, a negative count of items)."""
        ledger = cls()
        ledger.runs = set(state.runs)
        ledger._open = dict(state.open)
        ledger._last = state.last
        if (
            not ledger.runs.issuperset(ledger._open)
            or len(ledger._open) != len(state.open)
            or any(items < 0 for items in ledger._open.values())
            or (state.last is not None and state.last not in ledger._open)
        ):
            raise ValueError("a run ledger's state that no records leave")
        return ledger

    def add(self, type: str, run_id: str | None) -> None:
        """Take in the next record of the file, of ``type`` in run ``run_id``."""
        if not run_id:
            return
        if type == RUN_START:
            self._open[run_id] = 0
            self.runs.add(run_id)
            self._last = run_id
        elif type == RUN_CLOSE:
            self._open.pop(run_id, None)
            if run_id == self._last:  # a repair may close an earlier run
                self._last = None
        elif type != RUN_RESUME and run_id in self._open:
            self._open[run_id] += 1

    # ------------------------------------------------------------ fed requests

    def begin_run(
        self, start: StartRun, *, peer_pid: int | None, uid: int | None, gid: int | None
    ) -> Entry:
        """What a ``begin_run`` that passed the connection's rules writes: a
        ``run_start`` (``peer_pid``, ``uid``, ``gid``: what the kernel says of the
        writer), or a ``run_resume`` of the last run, continued after its items, or of
        any interrupted run for a repair.  Raises :class:`LocalProtocolError` as
        :func:`check_run_start` does."""
        check_run_start(start, self.last_run, self.runs, self.interrupted_runs)
        request, run_id = start.request, start.run_id
        self.writing = run_id
        self.duplicates = 0
        self.repairing = request.resume is not None and request.repair
        if request.resume is not None:
            data = RunResumeData(
                pid=request.pid,
                client=request.client,
                items=self._open[run_id],
                repair=self.repairing or msgspec.UNSET,
            )
            return Entry(RUN_RESUME, request.time, _encode_json(data), run_id, request.id)
        self.runs.add(run_id)
        self._open[run_id] = 0
        self._last = run_id
        started = RunStartData(
            pid=request.pid,
            client=request.client[:MAX_CLIENT_NAME],
            peer_pid=peer_pid,
            uid=uid,
            gid=gid,
        )
        return Entry(RUN_START, request.time, _encode_json(started), run_id, request.id)

    def wrote(self, count: int) -> None:
        """``count`` records of the open run were written."""
        if self.writing in self._open:
            self._open[self.writing] += count

    def dropped(self, count: int) -> None:
        """``count`` records of the open run were not written, for an event id the
        session held: items still (their writer numbered them), and counted."""
        self.wrote(count)
        self.duplicates += count

    def checkpoint(self, message: SaveCheckpoint) -> Entry:
        """What a ``save_checkpoint`` writes (an item of the run)."""
        self.wrote(1)
        data = b'{"snapshot":' + message.snapshot + b"}"
        return Entry(CHECKPOINT, message.time, data, message.run_id, message.id)

    def close_run(self, message: CloseRun) -> Entry:
        """What a ``close_run`` writes."""
        self._open.pop(message.run_id, None)
        if message.run_id == self._last:
            self._last = None
        self.writing = None
        closing = RunCloseData(
            error=message.error,
            duplicates=self.duplicates or msgspec.UNSET,
            repaired=self.repairing or msgspec.UNSET,
        )
        self.repairing = False
        data = _encode_json(closing)
        return Entry(RUN_CLOSE, message.time, data, message.run_id, message.id)

    def release(self) -> None:
        """The writer is gone: a run it left open stays without ``run_close``, the
        session's last run, which a later writer may resume."""
        self.writing = None
        self.repairing = False
