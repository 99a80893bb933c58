"""A daemon in memory, for tests: the real server connection, sessions as lists of lines.

:class:`MemoryDaemon` is what the mock transports talk to.  Each connection is a
:class:`flightlog.protocol.wire.ServerConnection`, so every rule (hello first, one writer per
session, one open run, the sticky failure, what a record must be) is the one flightlogd
applies; this module only stores: it numbers and keeps lines, answers checkpoints and
status, and feeds tails.  With ``blobs=True`` it takes payloads out of records by the
rule flightlogd ``--blobs`` applies (``flightlog.protocol._blobs.extract``): the lines
hold the references a file would, the blobs are kept in :attr:`MemoryDaemon.blobs`, and
a tail gets the payloads back, as the SDK's tail puts them back from a store it can
read.  Tests break it on purpose with :meth:`MemoryDaemon.hold` (a
request never answered) and :meth:`MemoryDaemon.break_disk` (every later write of a
session fails).
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from flightlog.protocol import (
    CHECKPOINT,
    SESSION_START,
    ErrorCode,
    FlightlogError,
    LocalProtocolError,
    Origin,
    Record,
    new_id,
    now,
)
from flightlog.protocol._blobs import BLOB_MIN, extract, resolve
from flightlog.protocol.format import (
    Entry,
    RunLedger,
    encode_line,
    event_id_key,
    session_start_line,
)
from flightlog.protocol.wire import (
    DEFAULT_MAX_FRAME_SIZE,
    SUPPORTED_VERSIONS,
    Ack,
    BlobLoaded,
    CheckpointLoaded,
    CloseRun,
    CloseSession,
    ConnectionClosed,
    Create,
    LoadBlob,
    LoadCheckpoint,
    Open,
    RecordEvent,
    SaveCheckpoint,
    ServerConnection,
    ServerEvent,
    SessionMachine,
    SessionOpened,
    SessionState,
    SessionStatus,
    StartRun,
    Status,
    StatusReply,
    Subscribe,
    Subscribed,
    Sync,
    TailBatch,
    TailEnd,
    Unsubscribe,
    line_bound,
)

__all__ = ["MemoryConnection", "MemoryDaemon", "MemorySession"]


class MemorySession:
    """One session "file": its lines (without ``\\n``) and what its rules need.

    Raises :class:`LocalProtocolError` (``bad_message``) for meta flightlogd refuses.
    """

    def __init__(self, path: str, meta: dict[str, Any], origin: Origin | None = None) -> None:
        self.path = path
        self.session_id = new_id()
        line, self.meta = session_start_line(self.session_id, now(), meta, origin)
        self.lines: list[bytes] = [line[:-1]]
        self.rules: SessionMachine[FlightlogError] = SessionMachine()
        self.writer: MemoryConnection | None = None
        #: Its runs: every run id, the interrupted runs, the last run and its items.
        self.ledger = RunLedger()
        #: Set by :meth:`MemoryDaemon.break_disk`: every later write fails with it.
        self.broken: FlightlogError | None = None
        #: The event ids its records carry (``event_id_key``).
        self.event_ids: set[bytes] = set()
        # (type, run_id) of each line
        self._kinds: list[tuple[str, str | None]] = [(SESSION_START, None)]
        self._checkpoint: Record | None = None

    @property
    def closed(self) -> bool:
        """Whether its writer closed it."""
        return self.rules.state is SessionState.CLOSED

    @property
    def last_seq(self) -> int:
        return len(self.lines)

    def first_time(self, event_id: str) -> bool:
        """Whether no record holds ``event_id`` yet; a repeat is counted in the run (and
        among its items: its writer numbered it), as flightlogd does."""
        key = event_id_key(event_id)
        if key in self.event_ids:
            self.ledger.dropped(1)
            return False
        self.event_ids.add(key)
        return True

    def append(
        self, type: str, time: str, data: bytes, run_id: str | None, event_id: str | None = None
    ) -> Record:
        record = Record(
            session_id=self.session_id,
            seq=self.last_seq + 1,
            type=type,
            time=time,
            run_id=run_id,
            event_id=msgspec.UNSET if event_id is None else event_id,
            data=msgspec.Raw(data),
        )
        self.lines.append(encode_line(record)[:-1])
        self._kinds.append((type, run_id))
        if type == CHECKPOINT:
            self._checkpoint = record
        return record

    def release(self) -> None:
        """The writer is gone: a run it left open stays without run_close."""
        self.writer = None
        self.ledger.release()

    def records(self) -> list[Record]:
        """Every record, decoded."""
        return [msgspec.json.decode(line, type=Record) for line in self.lines]

    def lines_for(
        self, tail: _Tail, after: int, blobs: dict[str, bytes] | None = None
    ) -> list[bytes]:
        """The lines after seq ``after`` that ``tail`` wants, each reference put back as
        its payload where ``blobs`` has it."""
        return [
            line if blobs is None else resolve(line, blobs.get)
            for line, (type, run_id) in zip(self.lines[after:], self._kinds[after:], strict=True)
            if tail.wants(type, run_id)
        ]

    def checkpoint_reply(self, request_id: int) -> CheckpointLoaded:
        record = self._checkpoint
        if record is None:
            return CheckpointLoaded(id=request_id)
        snapshot = msgspec.json.decode(record.data, type=dict[str, msgspec.Raw])["snapshot"]
        return CheckpointLoaded(
            id=request_id,
            seq=record.seq,
            run_id=record.run_id,
            time=record.time,
            snapshot=bytes(snapshot),
        )


class _Tail:
    """One subscription: who gets its batches and which records it wants."""

    def __init__(self, number: int, conn: MemoryConnection, request: Subscribe) -> None:
        self.number = number
        self.conn = conn
        self.path = request.path
        self.follow = request.follow
        self.types = set(request.types) if request.types is not None else None
        self.run_id = request.run_id

    def wants(self, type: str, run_id: str | None) -> bool:
        return (self.types is None or type in self.types) and (
            self.run_id is None or run_id == self.run_id
        )

    def batch(self, lines: list[bytes], path: str) -> None:
        if lines:
            self.conn.server.send(TailBatch(subscription=self.number, lines=lines, path=path))

    def end(self, reason: str, last_seq: int = 0, error: FlightlogError | None = None) -> None:
        self.conn.server.send(
            TailEnd(
                subscription=self.number,
                reason=reason,
                last_seq=last_seq,
                code=error.code if error is not None else None,
                message=error.message if error is not None else None,
            )
        )


class MemoryConnection:
    """The daemon's end of one client connection: bytes in, bytes out."""

    def __init__(self, daemon: MemoryDaemon) -> None:
        self.daemon = daemon
        self.server = ServerConnection(
            max_frame_size=daemon.max_frame_size,
            pid=os.getpid(),
            server=daemon.name,
            versions=daemon.versions,
            written_elsewhere=daemon.written_elsewhere,
            max_line=line_bound(daemon.max_frame_size),
        )

    def receive_data(self, data: bytes) -> None:
        """What the client sent (``b""``: it hung up); every event is answered at once."""
        self.server.receive_data(data)
        while (event := self.server.next_event()) is not None:
            self.daemon.handle(self, event)

    def data_to_send(self) -> bytes:
        """What the daemon has for the client."""
        return self.server.data_to_send()


class MemoryDaemon:
    """Sessions kept in memory behind real server connections; see the module docstring."""

    def __init__(
        self,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        versions: tuple[int, ...] = SUPPORTED_VERSIONS,
        name: str = "flightlog memory daemon",
        blobs: bool = False,
    ) -> None:
        self.max_frame_size = max_frame_size
        #: With ``blobs``: the payloads taken out of records, by SHA-256 (else None).
        self.blobs: dict[str, bytes] | None = {} if blobs else None
        self.versions = versions
        self.name = name
        #: Every session ever created, by path: the "files".
        self.sessions: dict[str, MemorySession] = {}
        #: Requests left unanswered (see :meth:`hold`), in the order they came.
        self.held: list[Any] = []
        self.connections = 0
        self._holding: tuple[type, ...] = ()
        self._tails: dict[int, _Tail] = {}
        self._subscriptions = 0
        self._records_written = 0
        self._bytes_written = 0

    def connect(self) -> MemoryConnection:
        """A new client connection."""
        self.connections += 1
        return MemoryConnection(self)

    def session(self, path: str) -> MemorySession:
        """The session at ``path``; raises KeyError when there is none."""
        return self.sessions[path]

    def hold(self, *types: type) -> None:
        """Leave requests of these message types unanswered, as a hung disk would."""
        self._holding = types

    def break_disk(self, path: str, message: str = "the disk failed") -> None:
        """Every later write to the session at ``path`` fails with ``write_failed``."""
        self.sessions[path].broken = FlightlogError(message, code=ErrorCode.WRITE_FAILED)

    def written_elsewhere(self, session_id: str) -> bool:
        """Whether a connection writes the session ``session_id``."""
        return any(
            s.session_id == session_id and s.writer is not None for s in self.sessions.values()
        )

    # ------------------------------------------------------------------ events

    def handle(self, conn: MemoryConnection, event: ServerEvent) -> None:
        """Answer one event of ``conn``'s server connection."""
        request = event.request if isinstance(event, StartRun) else event
        if self._holding and isinstance(request, self._holding):
            self.held.append(request)
            return
        server = conn.server
        try:
            self._answer(conn, event)
        except FlightlogError as exc:
            server.refuse(event, exc)

    def _answer(self, conn: MemoryConnection, event: ServerEvent) -> None:
        server = conn.server
        match event:
            case Create(id=request_id, path=path, meta=meta, origin=origin):
                if path in self.sessions:
                    raise FlightlogError(
                        f"{path} already exists; open it to append, or choose a new path",
                        code=ErrorCode.SESSION_EXISTS,
                    )
                session = self.sessions[path] = MemorySession(path, meta, origin)
                self._count(session.lines[0])
                self._opened(conn, request_id, session)
                self._publish(session, 0)
            case Open(id=request_id, path=path):
                session = self._open(path)
                self._opened(conn, request_id, session)
            case StartRun(request=request):
                session = self._by_id(request.session_id)
                self._check_disk(conn, session)
                # Its peers live in this very process: these are what the kernel
                # would say of them.
                entry = session.ledger.begin_run(
                    event, peer_pid=os.getpid(), uid=os.getuid(), gid=os.getgid()
                )
                self._entry(conn, session, entry)
            case RecordEvent(session_id=session_id, event_type=type, time=time, data=data):
                session = self._by_id(session_id)
                self._check_disk(conn, session)
                event_id = event.event_id
                if event_id is None or session.first_time(event_id):
                    if self.blobs is not None and len(data) >= BLOB_MIN:
                        data, found = extract(bytes(data))
                        self.blobs.update((blob.sha256, blob.data) for blob in found)
                    self._append(session, type, time, data, event.run_id, event_id)
                    session.ledger.wrote(1)
            case SaveCheckpoint(session_id=session_id):
                session = self._by_id(session_id)
                self._check_disk(conn, session)
                self._entry(conn, session, session.ledger.checkpoint(event))
            case CloseRun(session_id=session_id):
                session = self._by_id(session_id)
                self._check_disk(conn, session)
                self._entry(conn, session, session.ledger.close_run(event))
            case Sync(id=request_id, session_id=session_id):
                session = self._by_id(session_id)
                self._sync(conn, session)
                server.send(Ack(id=request_id, seq=session.last_seq))
            case LoadCheckpoint(id=request_id, session_id=session_id):
                server.send(self._by_id(session_id).checkpoint_reply(request_id))
            case CloseSession(id=request_id, session_id=session_id):
                session = self._by_id(session_id)
                session.release()
                for tail in self._tails_of(session.path):
                    del self._tails[tail.number]
                    tail.end("session_closed", session.last_seq)
                if session.rules.failure is not None:
                    raise session.rules.failure
                server.send(Ack(id=request_id, seq=session.last_seq))
            case Subscribe():
                self._subscribe(conn, event)
            case Unsubscribe(id=request_id, subscription=number):
                tail = self._tails.pop(number)
                tail.end("unsubscribed")
                server.send(Ack(id=request_id))
            case Status(id=request_id):
                server.send(self._status(request_id))
            case LoadBlob(id=request_id, path=path, sha256=sha256):
                server.send(BlobLoaded(id=request_id, sha256=sha256, data=self._blob(path, sha256)))
            case ConnectionClosed(released=released):
                self.connections -= 1
                for session_id in released:
                    self._by_id(session_id).release()
                for tail in [t for t in self._tails.values() if t.conn is conn]:
                    del self._tails[tail.number]

    def _blob(self, path: str, sha256: str) -> bytes:
        if path not in self.sessions:
            raise FlightlogError(f"{path} does not exist", code=ErrorCode.SESSION_NOT_FOUND)
        data = None if self.blobs is None else self.blobs.get(sha256)
        if data is None:
            raise FlightlogError(
                f"the blob store of {path} holds no blob {sha256}", code=ErrorCode.BLOB_NOT_FOUND
            )
        return data

    def _open(self, path: str) -> MemorySession:
        session = self.sessions.get(path)
        if session is None:
            raise FlightlogError(
                f"{path} does not exist; create it first", code=ErrorCode.SESSION_NOT_FOUND
            )
        if session.writer is not None:
            raise LocalProtocolError(
                f"{path} is being written by pid {session.writer.server.client_pid}; "
                "a session has one writer at a time",
                code=ErrorCode.SESSION_BUSY,
            )
        if session.closed:
            # Opened again after a close, the session starts over (a failure included).
            session.rules = SessionMachine()
        return session

    def _opened(self, conn: MemoryConnection, request_id: int, session: MemorySession) -> None:
        session.writer = conn
        reply = SessionOpened(
            id=request_id,
            session_id=session.session_id,
            path=session.path,
            last_seq=session.last_seq,
            meta=session.meta,
            interrupted_runs=session.ledger.interrupted_runs,
            last_run=session.ledger.last_run,
            last_run_items=session.ledger.last_run_items,
        )
        conn.server.opened(reply, session.rules)

    def _by_id(self, session_id: str) -> MemorySession:
        return next(s for s in self.sessions.values() if s.session_id == session_id)

    def _check_disk(self, conn: MemoryConnection, session: MemorySession) -> None:
        if session.broken is not None:
            conn.server.fail(session.session_id, session.broken)
            raise session.broken

    def _entry(self, conn: MemoryConnection, session: MemorySession, entry: Entry) -> None:
        record = self._append(session, entry.type, entry.time, entry.data, entry.run_id)
        conn.server.send(entry.reply(record.seq))

    def _append(
        self,
        session: MemorySession,
        type: str,
        time: str,
        data: bytes,
        run_id: str | None,
        event_id: str | None = None,
    ) -> Record:
        record = session.append(type, time, data, run_id, event_id)
        self._count(session.lines[-1])
        self._publish(session, record.seq - 1)
        return record

    def _sync(self, conn: MemoryConnection, session: MemorySession) -> None:
        if session.broken is not None:
            conn.server.fail(session.session_id, session.broken)
            raise session.broken

    def _count(self, line: bytes) -> None:
        self._records_written += 1
        self._bytes_written += len(line) + 1

    # ------------------------------------------------------------------- tails

    def _tails_of(self, path: str | None) -> list[_Tail]:
        return [t for t in self._tails.values() if t.path == path]

    def _publish(self, session: MemorySession, after: int) -> None:
        for tail in self._tails_of(session.path) + self._tails_of(None):
            tail.batch(session.lines_for(tail, after, self.blobs), session.path)

    def _subscribe(self, conn: MemoryConnection, request: Subscribe) -> None:
        self._subscriptions += 1
        tail = _Tail(self._subscriptions, conn, request)
        conn.server.send(Subscribed(id=request.id, subscription=tail.number, path=request.path))
        if request.path is None:
            sessions = list(self.sessions.values())
        elif request.path in self.sessions:
            sessions = [self.sessions[request.path]]
        elif request.follow:
            sessions = []  # it waits for the session to be created
        else:
            tail.end(
                "error",
                error=FlightlogError(
                    f"{request.path} does not exist", code=ErrorCode.SESSION_NOT_FOUND
                ),
            )
            return
        for session in sessions:
            tail.batch(session.lines_for(tail, request.after, self.blobs), session.path)
        if request.follow:
            self._tails[tail.number] = tail
        else:
            tail.end("end_of_file", sessions[0].last_seq if len(sessions) == 1 else 0)

    def _status(self, request_id: int) -> StatusReply:
        held = [s for s in self.sessions.values() if s.writer is not None]
        return StatusReply(
            id=request_id,
            pid=os.getpid(),
            version=self.name,
            uptime=0.0,
            connections=self.connections,
            subscribers=len(self._tails),
            records_written=self._records_written,
            bytes_written=self._bytes_written,
            open_files=len(held),
            sessions=[
                SessionStatus(
                    path=s.path,
                    session_id=s.session_id,
                    writer_pid=s.writer.server.client_pid if s.writer else None,
                    run_id=s.rules.run_id,
                    last_seq=s.last_seq,
                    records=s.last_seq,
                    error=s.rules.failure.message if s.rules.failure else None,
                )
                for s in held
            ],
        )
