"""The three systems under comparison, behind one small interface used inside agents.

* ``flightlog``: flightlogd through the SDK (``flightlog.sdk.connect``), one connection
  per agent process.
* ``jsonl``: the in-process JSONL recorder flightlog replaces: each agent appends its
  own session files, one ``os.write`` per record, no fsync (``checkpoint`` writes and
  fsyncs, the bare durable append).
* ``sqlite``: the durable event log flightlog replaces: WAL, ``synchronous=NORMAL``, an
  ``events`` table plus a ``log`` overlay with an autoincrement ``seq`` and a unique
  event id, one commit per event (``checkpoint`` commits with ``synchronous=FULL``).
  One database per agent process: no cross-process lock contention, the baseline's
  best case.

All three store, per record, the same line bytes (:class:`bench._events.LineEncoder`):
the agent runs the same codec on the same event for each.  A :class:`System` is built
in the harness and handed to agents (it pickles as its settings only); an agent calls
:meth:`System.agent` once and opens its sessions from what that returns.  The syslog
peers of scenarios 1 and 2 (``rsyslog``, ``syslog-ng``) are systems too; their daemons
and agents live in :mod:`bench._syslog`, which knows nothing of this module.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from flightlog.protocol import (
    RUN_START,
    SESSION_START,
    Event,
    Record,
    RunStartData,
    SessionStartData,
    default_codec,
    new_id,
    now,
)
from flightlog.protocol.format import (
    append_line,
)

from ._events import LineEncoder, line_lengths
from ._syslog import PeerDaemons, SyslogAgent

__all__ = ["SYSTEMS", "AgentClient", "Sink", "System", "peer_systems"]

SYSTEMS = ("flightlog", "jsonl", "sqlite")

_DRAIN_TIMEOUT = 120.0


class Sink(Protocol):
    """One session, with one open run, as an agent sees it."""

    path: str

    def record(self, event: Event) -> None:
        """Record one event (not durable)."""

    def record_new(self, event: Event) -> None:
        """Record an event built for this call (the tail's stamped events); flightlogd's
        :meth:`drain` does not account for these."""

    def checkpoint(self, snapshot: Any) -> None:
        """Record a checkpoint and return once it is durable."""

    def drain(self) -> None:
        """Return once everything recorded is in the file or database (not durable)."""

    def close(self) -> None: ...


class AgentClient(Protocol):
    def session(self, name: str) -> Sink: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class System:
    """Which system, and where it keeps its data (``socket`` for flightlog)."""

    name: str
    directory: str
    socket: str = ""

    def agent(self, index: int) -> AgentClient:
        if self.name == "flightlog":
            return _FlightlogAgent(self.socket, self.directory)
        if self.name == "jsonl":
            return _JsonlAgent(self.directory)
        if self.name == "sqlite":
            return _SqliteAgent(os.path.join(self.directory, f"agent-{index}.db"))
        if self.name in ("rsyslog", "syslog-ng"):
            return SyslogAgent(self.name, self.socket, self.directory)
        raise ValueError(f"unknown system {self.name!r}")


def peer_systems(peers: PeerDaemons) -> list[System]:
    """The syslog peers of ``peers`` (started) as systems."""
    return [System(d.peer.name, str(d.root), d.socket) for d in peers.daemons]


# ------------------------------------------------------------------------- flightlog


class _FlightlogAgent:
    def __init__(self, socket: str, root: str) -> None:
        from flightlog.sdk import connect

        self.root = root
        self.client = connect(socket, client_name="bench")
        self.sinks: list[_FlightlogSink] = []

    def session(self, name: str) -> _FlightlogSink:
        sink = _FlightlogSink(self.client, name)
        self.sinks.append(sink)
        return sink

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.client.close()


class _FlightlogSink:
    """A session through the SDK; :meth:`drain` watches the file grow to its expected size.

    Expected size: the file's size after ``begin_run`` plus the exact length of every
    line recorded since (the same bytes the baselines write, so computed the same way).
    """

    def __init__(self, client: Any, name: str) -> None:
        self.session = client.create(name, meta={"bench": True})
        self.run = self.session.begin_run()
        self.path = self.session.path
        self._base_size = os.stat(self.path).st_size
        self._next_seq = self.run.seq + 1
        self._segments: list[list[int]] = []  # [line length at seq 1, first seq, count]
        self._last_event: Event | None = None
        self._closed = False

    def record(self, event: Event) -> None:
        self.run.record(event)
        if event is self._last_event:
            self._segments[-1][2] += 1
        else:
            self._last_event = event
            sample = LineEncoder(self.session.session_id, self.run.run_id).line(event)
            self._segments.append([len(sample), self._next_seq, 1])
        self._next_seq += 1

    def record_new(self, event: Event) -> None:
        """Record an event without tracking its size (drain does not work after it)."""
        self.run.record(event)
        self._segments.append([0, 0, 0])
        self._last_event = None

    def expected_size(self) -> int:
        return self._base_size + sum(line_lengths(*segment) for segment in self._segments)

    def drain(self) -> None:
        expected = self.expected_size()
        deadline = time.monotonic() + _DRAIN_TIMEOUT
        while os.stat(self.path).st_size < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.path} did not reach {expected} bytes")
            if self.run.error is not None:
                raise self.run.error
            time.sleep(0.0005)

    def checkpoint(self, snapshot: Any) -> None:
        self.run.save_checkpoint(snapshot)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.run.close()
            self.session.close()


# ----------------------------------------------------------------------------- JSONL


def _structural_lines(session_id: str, run_id: str) -> bytes:
    buf = bytearray()
    append_line(
        buf,
        Record(
            session_id=session_id,
            seq=1,
            type=SESSION_START,
            time=now(),
            data=msgspec.Raw(msgspec.json.encode(SessionStartData(meta={"bench": True}))),
        ),
    )
    append_line(
        buf,
        Record(
            session_id=session_id,
            seq=2,
            type=RUN_START,
            time=now(),
            run_id=run_id,
            data=msgspec.Raw(msgspec.json.encode(RunStartData(pid=os.getpid(), client="bench"))),
        ),
    )
    return bytes(buf)


class _JsonlAgent:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.sinks: list[_JsonlSink] = []

    def session(self, name: str) -> _JsonlSink:
        sink = _JsonlSink(os.path.join(self.directory, name))
        self.sinks.append(sink)
        return sink

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class _JsonlSink:
    """The original recorder: encode the line in the agent, one ``write`` per record."""

    def __init__(self, path: str) -> None:
        self.path = path
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        session_id, run_id = new_id(), new_id()
        os.write(self.fd, _structural_lines(session_id, run_id))
        os.fsync(self.fd)  # a created session is durable, as flightlogd makes it
        self.lines = LineEncoder(session_id, run_id, first_seq=3)

    def record(self, event: Event) -> None:
        os.write(self.fd, self.lines.line(event))

    record_new = record

    def checkpoint(self, snapshot: Any) -> None:
        os.write(self.fd, _checkpoint_line(self.lines, snapshot))
        os.fsync(self.fd)

    def drain(self) -> None:
        pass

    def close(self) -> None:
        if self.fd >= 0:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1


def _checkpoint_line(lines: LineEncoder, snapshot: Any) -> bytes:
    lines.seq += 1
    buf = bytearray()
    append_line(
        buf,
        Record(
            session_id=lines.session_id,
            seq=lines.seq,
            type="checkpoint",
            time=now(),
            run_id=lines.run_id,
            data=msgspec.Raw(b'{"snapshot":' + default_codec.encode_value(snapshot) + b"}"),
        ),
    )
    return bytes(buf)


# ---------------------------------------------------------------------------- SQLite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    event_id   TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    run_id     TEXT,
    type       TEXT NOT NULL,
    time       TEXT NOT NULL,
    line       BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS log (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id   TEXT NOT NULL UNIQUE REFERENCES events(event_id),
    session_id TEXT NOT NULL
);
"""


def open_sqlite(path: str) -> sqlite3.Connection:
    """A connection in the baseline's configuration: WAL, synchronous=NORMAL."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=10000")
    conn.executescript(_SCHEMA)
    return conn


class _SqliteAgent:
    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.conn = open_sqlite(path)
        self.sinks: list[_SqliteSink] = []

    def session(self, name: str) -> _SqliteSink:
        sink = _SqliteSink(self.conn, self.path)
        self.sinks.append(sink)
        return sink

    def close(self) -> None:
        self.conn.close()


class _SqliteSink:
    """The durable event log: both tables written in one transaction per event."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self.conn = conn
        self.path = path
        session_id, run_id = new_id(), new_id()
        self.lines = LineEncoder(session_id, run_id, first_seq=3)
        for line, type in zip(
            _structural_lines(session_id, run_id).splitlines(keepends=True),
            (SESSION_START, RUN_START),
            strict=True,
        ):
            self._insert(line, type, now())

    def _insert(self, line: bytes, type: str, time: str) -> None:
        conn = self.conn
        event_id = new_id()
        session_id = self.lines.session_id
        conn.execute("BEGIN")
        conn.execute(
            "INSERT INTO events (event_id, session_id, run_id, type, time, line)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (event_id, session_id, self.lines.run_id, type, time, line),
        )
        conn.execute("INSERT INTO log (event_id, session_id) VALUES (?, ?)", (event_id, session_id))
        conn.execute("COMMIT")

    def record(self, event: Event) -> None:
        line = self.lines.line(event)
        self._insert(line, self.lines.type, self.lines.time)

    record_new = record

    def checkpoint(self, snapshot: Any) -> None:
        self.conn.execute("PRAGMA synchronous=FULL")
        self._insert(_checkpoint_line(self.lines, snapshot), "checkpoint", now())
        self.conn.execute("PRAGMA synchronous=NORMAL")

    def drain(self) -> None:
        pass

    def close(self) -> None:
        pass
