"""The best-effort recorder the framework integrations share: recording never breaks the agent.

Theory of operation
-------------------
An integration lives inside someone else's loop: an exception raised from its hook would
abort the agent's own run.  So every call into flightlog goes through this layer, on
a client in best-effort mode (``record()`` never raises; an event it cannot record is
dropped, counted and named in ``run_close``), and the agent's run finishes with the
same result as without flightlog.  A value the codec cannot encode costs no event: it
is written as a marker and named in ``run_close`` by the SDK (not a problem here).  A
problem (no daemon, a daemon that died, a full disk, ``session_busy``) is:

* logged once per kind (its error code), not once per event: an event the client
  dropped by the client itself, on the ``flightlog.sdk`` logger, as for any best-effort
  client; any other problem on the ``flightlog.integrations`` logger;
* counted in :attr:`Recorder.stats`, which the host can read (and export as a metric);
* written into the run's ``run_close`` when the file is still reachable (a sticky error
  the daemon pushed is written there by the SDK itself).

The client rides through a daemon restart for :data:`RECONNECT_GRACE` seconds only (an
agent must never wait long for its recorder); past it, events are dropped and the client
tries to reconnect once a second, so a run goes on recording once the daemon is back.
Without a daemon at the start nothing waits: the run records nothing, and the next run
tries again.

The recorder holds each session it opened until :meth:`Recorder.close` (or the interpreter's
exit, for the shared :func:`default_recorder`), or until more than ``max_sessions`` are
open, when the least recently used is closed: a conversation continued in a later run
then writes its next run into the same file without a round trip to open it again.  It
uses the sync client, which never waits for an fsync on a thread that runs an event loop,
so it serves sync callbacks and async hooks alike.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Final, TypeVar

from flightlog.protocol import ErrorCode, Event, FlightlogError, LocalProtocolError, events
from flightlog.sdk import Client, Run, Session, connect

from ._continuation import Continuation

__all__ = [
    "CANCELLED",
    "RECONNECT_GRACE",
    "Continuation",
    "Hooks",
    "RecordedRun",
    "Recorder",
    "RecorderStats",
    "cancelled_model_end",
    "cancelled_tool_end",
    "default_recorder",
]

logger: Final = logging.getLogger("flightlog.integrations")

#: Seconds a recorder's client waits for a restarted daemon before it drops events.
RECONNECT_GRACE: Final = 1.0

#: The error written as the end of a call the run was cancelled in (a task cancelled, a
#: timeout): the call has an end, and the end says it did not finish.
CANCELLED: Final = "cancelled: the run ended before this call did"


#: The error of a run the recorder closed before its agent ended.
UNFINISHED: Final = "interrupted: the recorder was closed (the process exits) before the run ended"


def cancelled_tool_end(execution: events.Execution, tool_call_id: str, name: str) -> Event:
    """The ``tool_exec_end`` of a tool call its run was cancelled in."""
    return events.ToolExecEnd(
        execution=execution,
        tool_call_id=tool_call_id,
        name=name,
        content=[events.TextPart(text=CANCELLED)],
        is_error=True,
        disposition="cancelled",
    )


def cancelled_model_end(execution: events.Execution, message: Any = None, **more: Any) -> Event:
    """The ``model_exec_end`` of a model call its run was cancelled in: ``message`` is
    what came of the response, if anything (``more``: its usage, provider state)."""
    return events.ModelExecEnd(
        execution=execution, message=message, error=CANCELLED, disposition="cancelled", **more
    )


_K = TypeVar("_K")
_V = TypeVar("_V")


def nearest(found: Mapping[Any, _V], parents: Mapping[_K, _K | None], key: _K | None) -> _V | None:
    """What ``found`` holds for ``key`` or its nearest ancestor (``parents`` links a
    framework's span or run ids to their parents'), or None."""
    while key is not None:
        value = found.get(key)
        if value is not None:
            return value
        key = parents.get(key)
    return None


#: The failures its client gets over by itself (it reconnects).
_RECONNECTS: Final = frozenset({ErrorCode.CONNECTION_LOST, ErrorCode.DAEMON_UNREACHABLE})


@dataclass
class RecorderStats:
    """What went wrong while recording, for the host to read.

    ``problems`` counts every problem (an event dropped is one); ``by_code`` per error code
    (``daemon_not_running``, ``daemon_unreachable``, ``session_busy``, ``write_failed``,
    ``codec_error`` …); ``last_problem`` is the latest one's text.
    """

    problems: int = 0
    by_code: dict[str, int] = field(default_factory=dict)
    last_problem: str | None = None


def _code_of(exc: BaseException) -> str:
    if isinstance(exc, FlightlogError):
        return str(exc.code)
    return ErrorCode.INTERNAL.value


def _text_of(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, FlightlogError) else str(exc)
    return f"{_code_of(exc)}: {text}" if text else _code_of(exc)


class Recorder:
    """Records runs into session files through flightlogd, and never raises.

    ``socket`` is the daemon's socket (default: ``$FLIGHTLOG_SOCKET``, else the default
    socket); ``client_name`` is written in every ``run_start``; ``reconnect_grace`` is
    how long its client waits for a restarted daemon (see the module docstring).  With
    ``repair`` (default: ``$FLIGHTLOG_REPAIR`` set to ``1``), each session is repaired
    as it is opened (``client.session(path, repair=True)``): every run a crash left
    without ``run_close`` is mended, a tool call without a result getting one marked
    ``repaired``.
    """

    def __init__(
        self,
        *,
        socket: str | None = None,
        client_name: str | None = None,
        max_sessions: int = 32,
        reconnect_grace: float = RECONNECT_GRACE,
        repair: bool | None = None,
    ) -> None:
        if repair is None:
            repair = os.environ.get("FLIGHTLOG_REPAIR") == "1"
        self.repair = repair
        self.socket = socket
        self.client_name = client_name
        self.max_sessions = max_sessions
        self.reconnect_grace = reconnect_grace
        self.stats = RecorderStats()
        self._lock = threading.Lock()
        #: Held while a run begins: two runs of one path at once take two sessions.
        self._beginning = threading.Lock()
        self._client: Client | None = None
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._logged: set[str] = set()
        #: The client whose drops are counted, and its ``dropped`` counted so far.
        self._counted_client: Client | None = None
        self._counted: dict[str, int] = {}
        #: Per session path, its agents' continuations (see Continuation): they live as
        #: long as the session stays open here.
        self._continuations: dict[str, dict[Hashable, Continuation]] = {}
        #: The runs begun and not yet closed, closed by :meth:`close` (at the process's
        #: exit, for the default recorder: a run cut by ``KeyboardInterrupt``).
        self._open: dict[RecordedRun, None] = {}

    def problem(self, exc: BaseException, where: str) -> str:
        """Count ``exc``, log it the first time its kind is met; returns its text."""
        text = _text_of(exc)
        self._count(_code_of(exc), text, where, 1)
        return text

    def dropped(self, client: Client, where: str) -> None:
        """Count the events ``client`` dropped since last counted, per code."""
        with self._lock:
            if client is not self._counted_client:
                self._counted_client, self._counted = client, {}
            counted = self._counted
            fresh = {
                code: count - counted.get(code, 0)
                for code, count in list(client.dropped.items())
                if count > counted.get(code, 0)
            }
            counted.update((code, counted.get(code, 0) + n) for code, n in fresh.items())
        for code, count in fresh.items():
            # The client logged the first drop of each kind already (flightlog.sdk).
            self._count(code, f"{code}: {count} events not recorded", where, count, log=False)

    def continuation(self, path: str, key: Hashable) -> Continuation:
        """The continuation of the agent ``key`` in the session at ``path``."""
        with self._lock:
            found = self._continuations.setdefault(path, {})
            continuation = found.get(key)
            if continuation is None:
                continuation = found[key] = Continuation(self._mark)
            return continuation

    def _mark(self) -> object:
        # What changes with any problem: the client, the events it dropped (those it
        # gave up on after a send included), and the problems counted.
        client = self._client
        dropped = sum(client.dropped.values()) if client is not None else 0
        return (id(client), dropped, self.stats.problems)

    def _recorded(self, path: str, batch: Sequence[Event], ok: bool) -> None:
        """The continuations of ``path`` learn whether ``batch`` was recorded whole."""
        with self._lock:
            continuations = list(self._continuations.get(path, {}).values())
        for continuation in continuations:
            if not ok:
                continuation.forget()
                continue
            for event in batch:
                if isinstance(event, events.ModelRequest):
                    continuation.confirm(event.execution.id)
                elif isinstance(event, events.ModelExecEnd):
                    continuation.answered(event.execution.id)

    def _count(self, code: str, text: str, where: str, count: int, *, log: bool = True) -> None:
        with self._lock:
            self.stats.problems += count
            self.stats.by_code[code] = self.stats.by_code.get(code, 0) + count
            self.stats.last_problem = text
            first = log and code not in self._logged
            self._logged.add(code)
        if first:
            logger.warning(
                "flightlog could not record %s (%s); the agent goes on, this kind of problem "
                "is logged once and counted in the recorder's stats",
                where,
                text,
            )

    def begin(self, path: str, *, meta: Mapping[str, Any] | None = None) -> RecordedRun:
        """Start a run in the session at ``path`` (created with ``meta`` when new).

        A session has one open run at a time: while a run of this recorder is open in
        it (runs of one conversation at once), the run goes into the first of
        ``<stem>.2<suffix>``, ``<stem>.3<suffix>`` … that has none.  Never raises: when
        the run cannot be started, the problem is counted and the returned run records
        nothing.
        """
        with self._beginning:
            for candidate in _siblings(path, self.max_sessions):
                try:
                    session = self._session(candidate, meta)
                    run = session.begin_run()
                except FlightlogError as exc:
                    if exc.code == ErrorCode.RUN_OPEN:
                        continue
                    failure: Exception = exc
                except Exception as exc:
                    failure = exc
                else:
                    recorded = RecordedRun(self, candidate, run)
                    with self._lock:
                        self._open[recorded] = None
                    return recorded
                self._forget(candidate, failure)
                self.problem(failure, f"a run in {candidate}")
                return RecordedRun(self, candidate, None)
        crowded = LocalProtocolError(
            f"{self.max_sessions} runs of this session are open at once", code=ErrorCode.RUN_OPEN
        )
        self.problem(crowded, f"a run in {path}")
        return RecordedRun(self, path, None)

    def _session(self, path: str, meta: Mapping[str, Any] | None) -> Session:
        with self._lock:
            session = self._sessions.get(path)
            if session is not None:
                self._sessions.move_to_end(path)
                return session
        client = self._connected()
        session = client.session(path, meta=dict(meta or {}), repair=self.repair)
        evicted: list[Session] = []
        with self._lock:
            self._sessions[path] = session
            self._continuations.pop(path, None)
            while len(self._sessions) > self.max_sessions:
                gone, old = self._sessions.popitem(last=False)
                self._continuations.pop(gone, None)
                evicted.append(old)
        for old in evicted:
            try:
                old.close()
            except Exception as exc:
                self.problem(exc, f"closing {old.path}")
        return session

    def _connected(self) -> Client:
        with self._lock:
            client = self._client
        if client is not None and _usable(client):
            return client
        self._drop_client()
        client = connect(
            self.socket,
            client_name=self.client_name,
            reconnect_grace=self.reconnect_grace,
            best_effort=True,
        )
        with self._lock:
            self._client = client
        return client

    def _forget(self, path: str, exc: BaseException) -> None:
        # A session that failed is opened anew next time; one the client reopens by
        # itself after a reconnect is kept; a client that cannot go on takes every
        # session with it.
        if isinstance(exc, FlightlogError) and exc.code in (
            ErrorCode.SESSION_BUSY,
            ErrorCode.PATH_REFUSED,
            *_RECONNECTS,
        ):
            return
        with self._lock:
            self._sessions.pop(path, None)
            self._continuations.pop(path, None)
        client = self._client
        if client is None or not _usable(client):
            self._drop_client()

    def _drop_client(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            self._sessions.clear()
            self._continuations.clear()
        if client is not None:
            try:
                client.close()
            except Exception as exc:
                self.problem(exc, "closing the connection")

    def _closed(self, run: RecordedRun) -> None:
        with self._lock:
            self._open.pop(run, None)

    def close(self) -> None:
        """Close every session this recorder holds, and its connection; never raises.

        A run still open (its agent cut by ``KeyboardInterrupt``, or still running) is
        closed first, with the ends it owes written as cancelled.
        """
        with self._lock:
            runs = list(self._open)
        for run in runs:
            run.close(UNFINISHED)
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
            self._continuations.clear()
        for session in sessions:
            try:
                session.close()
            except Exception as exc:
                self.problem(exc, f"closing {session.path}")
        self._drop_client()


def _siblings(path: str, count: int) -> Iterator[str]:
    """``path``, then ``<stem>.2<suffix>`` … up to ``count`` paths in all."""
    yield path
    where = PurePosixPath(path)
    for n in range(2, count + 1):
        yield str(where.with_name(f"{where.stem}.{n}{where.suffix}"))


def _usable(client: Client) -> bool:
    """Whether ``client`` goes on: sound, or reconnecting by itself."""
    failure = client.failure
    return not client.closed and (failure is None or failure.code in _RECONNECTS)


class RecordedRun:
    """One run being recorded, or not (``recording`` is False): every method is safe."""

    def __init__(self, recorder: Recorder, path: str, run: Run | None) -> None:
        self.recorder = recorder
        self.path = path
        self.run = run
        self._error: str | None = None
        self._lock = threading.Lock()
        #: The ends this run owes (of calls, turns and agents started and not ended),
        #: in the order they were owed; see :meth:`owe`.
        self._owed: dict[Hashable, Callable[[], Event]] = {}

    @property
    def recording(self) -> bool:
        return self.run is not None

    @property
    def run_id(self) -> str | None:
        return self.run.run_id if self.run is not None else None

    def continuation(self, *key: Hashable) -> Continuation:
        """The continuation of the agent ``key`` names (its name, say) in this run's
        session, shared with the session's earlier and later runs in this recorder; a
        run that records nothing gets one of its own, which never continues."""
        if self.run is None:
            return Continuation()
        return self.recorder.continuation(self.path, key)

    def record(self, *events: Event) -> None:
        """Record ``events`` (with one send); what is dropped is counted, and the run's
        ``run_close`` names it."""
        run = self.run
        if run is None:
            return
        dropped, problems, diagnosed = run.dropped, self.recorder.stats.problems, run.diagnosed
        try:
            if len(events) == 1:
                run.record(events[0])
            else:
                run.record_many(events)
        except Exception as exc:
            # Best effort raises nothing of flightlog's own: what is left is a bug.
            text = self.recorder.problem(exc, self._about(events))
            with self._lock:
                self._error = self._error or text
            self.recorder._recorded(self.path, events, False)
            return
        # Whole, as far as the recorder can tell: nothing dropped, no problem counted
        # meanwhile, no event written as a stub or with a marker in place of a value.
        intact = run.dropped == dropped and self.recorder.stats.problems == problems
        if not intact:
            self.recorder.dropped(run.session.client, self._about(events))
        self.recorder._recorded(self.path, events, intact and run.diagnosed == diagnosed)

    def owe(self, key: Hashable, end: Callable[[], Event]) -> None:
        """Note that ``end()`` is owed under ``key``: a call, turn or agent started, whose
        end the run writes (as cancelled) if it closes before :meth:`paid` is called,
        so that no start is ever left without its end."""
        if self.run is not None:
            with self._lock:
                self._owed[key] = end

    def paid(self, key: Hashable) -> bool:
        """The end owed under ``key`` is written by its owner: whether it was owed (a
        False means it was written already, as cancelled, and must not be again)."""
        with self._lock:
            return self._owed.pop(key, None) is not None

    def owed(self, above: Hashable | None = None) -> list[Event]:
        """Take the ends owed after ``above`` (all of them when None; none when
        ``above`` is not owed), the latest owed first: what is nested ends first."""
        with self._lock:
            keys = list(self._owed)
            if above is not None:
                if above not in self._owed:
                    return []
                keys = keys[keys.index(above) + 1 :]
            makers = [self._owed.pop(key) for key in reversed(keys)]
        return [make() for make in makers]

    def _about(self, events: Sequence[Event]) -> str:
        return f"{', '.join(event.record_type for event in events)} in {self.path}"

    def close(self, error: str | None = None) -> None:
        """Write the ends still owed (as cancelled), then ``run_close`` with ``error`` and
        any recording problem; never raises."""
        owed = self.owed()
        if owed:
            self.record(*owed)
        run, self.run = self.run, None
        if run is None:
            return
        self.recorder._closed(self)
        texts = [text for text in (error, self._error) if text]
        try:
            run.close(error="; ".join(texts) if texts else None)
        except Exception as exc:
            self.recorder.problem(exc, f"closing a run in {self.path}")
            self.recorder._forget(self.path, exc)


_default: Recorder | None = None
_default_lock = threading.Lock()


def default_recorder() -> Recorder:
    """The process's shared recorder (``$FLIGHTLOG_SOCKET``), closed at interpreter exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Recorder()
            atexit.register(_default.close)
        return _default


class Hooks:
    """What the hook objects of the sync frameworks share: the session they record into,
    their recorder, and calls that never raise.

    ``path`` names the session (None: the integration's default, from the framework's
    conversation id); ``meta`` goes into its ``session_start``; ``recorder`` defaults to
    :func:`default_recorder`.  Hooks may be called from several threads: one at a time.
    """

    #: What a problem met in a hook is said to be about, in the log.
    where = "a framework hook"

    def __init__(
        self,
        *,
        path: str | None = None,
        meta: Mapping[str, Any] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.path = path
        self.meta = meta
        self._recorder = recorder
        self._lock = threading.Lock()

    @property
    def recorder(self) -> Recorder:
        return self._recorder or default_recorder()

    def _safely(self, action: Callable[..., None], *args: Any) -> None:
        try:
            with self._lock:
                action(*args)
        except Exception as exc:
            self.recorder.problem(exc, self.where)
