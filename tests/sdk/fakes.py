"""A scripted fake daemon for the SDK's mock transports.

:class:`FakeDaemon` answers every request the way flightlogd does, keeping sessions as
lists of JSONL lines in memory, so the SDK can be tested without a daemon.  A test
changes its behaviour with :attr:`FakeDaemon.script` (message type -> replies) or by
pushing messages through the transport.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import msgspec

from flightlog.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    Ack,
    BeginRun,
    CheckpointLoaded,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    Hello,
    LoadCheckpoint,
    Message,
    Open,
    Record,
    RecordEvent,
    RunStarted,
    SaveCheckpoint,
    SessionOpened,
    Status,
    StatusReply,
    Subscribe,
    Subscribed,
    Sync,
    TailBatch,
    TailEnd,
    Unsubscribe,
    Welcome,
    encode_line,
    new_id,
    now,
)


class FakeSession:
    def __init__(self, path: str, meta: dict[str, Any]) -> None:
        self.path = path
        self.session_id = new_id()
        self.lines: list[bytes] = []
        self.run_id: str | None = None
        self.checkpoint: bytes | None = None
        self.closed = False
        self.append("session_start", None, {"format_version": 1, "meta": meta}, now())

    @property
    def seq(self) -> int:
        return len(self.lines)

    def append(self, type: str, run_id: str | None, data: Any, time: str) -> int:
        raw = data if isinstance(data, bytes) else msgspec.json.encode(data)
        record = Record(
            session_id=self.session_id,
            seq=self.seq + 1,
            type=type,
            time=time,
            run_id=run_id,
            data=msgspec.Raw(raw),
        )
        self.lines.append(encode_line(record)[:-1])
        return record.seq

    def records(self) -> list[Record]:
        return [msgspec.json.decode(line, type=Record) for line in self.lines]


Script = Callable[[Any], list[Message]]


class FakeDaemon:
    """Answers the client's messages like flightlogd, from memory."""

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self.sessions: dict[str, FakeSession] = {}
        self.by_path: dict[str, FakeSession] = {}
        #: Replies for a message type, replacing the daemon's own answer.
        self.script: dict[type, Script] = {}
        self.hello: Hello | None = None
        self._subscriptions = 0

    def session(self, path: str) -> FakeSession:
        return self.by_path[path]

    def __call__(self, message: Any) -> list[Message]:
        scripted = self.script.get(type(message))
        if scripted is not None:
            return scripted(message)
        return self.answer(message)

    def answer(self, message: Any) -> list[Message]:
        match message:
            case Hello(id=id):
                self.hello = message
                return [
                    Welcome(
                        id=id,
                        version=PROTOCOL_VERSION,
                        max_frame_size=self.max_frame_size,
                        daemon_pid=os.getpid(),
                        server="fake",
                    )
                ]
            case Create(id=id, path=path, meta=meta):
                if path in self.by_path:
                    return [error(id, "session_exists", f"{path} exists")]
                session = FakeSession(path, meta)
                self.sessions[session.session_id] = session
                self.by_path[path] = session
                return [self._opened(id, session)]
            case Open(id=id, path=path):
                if path not in self.by_path:
                    return [error(id, "session_not_found", f"{path} does not exist")]
                return [self._opened(id, self.by_path[path])]
            case BeginRun(id=id, session_id=sid, time=time, client=client, pid=pid):
                session = self.sessions[sid]
                session.run_id = new_id()
                seq = session.append(
                    "run_start", session.run_id, {"pid": pid, "client": client}, time
                )
                return [RunStarted(id=id, run_id=session.run_id, seq=seq)]
            case RecordEvent(session_id=sid, run_id=rid, event_type=type, time=time, data=data):
                self.sessions[sid].append(type, rid, data, time)
                return []
            case SaveCheckpoint(id=id, session_id=sid, run_id=rid, time=time, snapshot=snapshot):
                session = self.sessions[sid]
                session.checkpoint = snapshot
                raw = b'{"snapshot":' + snapshot + b"}"
                return [Ack(id=id, seq=session.append("checkpoint", rid, raw, time))]
            case CloseRun(id=id, session_id=sid, run_id=rid, time=time, error=text):
                session = self.sessions[sid]
                session.run_id = None
                return [Ack(id=id, seq=session.append("run_close", rid, {"error": text}, time))]
            case CloseSession(id=id, session_id=sid):
                self.sessions[sid].closed = True
                return [Ack(id=id, seq=self.sessions[sid].seq)]
            case Sync(id=id, session_id=sid):
                return [Ack(id=id, seq=self.sessions[sid].seq)]
            case LoadCheckpoint(id=id, session_id=sid):
                return [CheckpointLoaded(id=id, snapshot=self.sessions[sid].checkpoint)]
            case Subscribe(id=id, path=path, after=after):
                self._subscriptions += 1
                sub = self._subscriptions
                replies: list[Message] = [Subscribed(id=id, subscription=sub, path=path)]
                sessions = (
                    [self.by_path[path]] if path is not None else list(self.sessions.values())
                )
                for session in sessions:
                    lines = session.lines[after:]
                    replies.append(TailBatch(subscription=sub, lines=lines, path=session.path))
                replies.append(TailEnd(subscription=sub, reason="end_of_file"))
                return replies
            case Unsubscribe(id=id, subscription=sub):
                return [TailEnd(subscription=sub, reason="unsubscribed"), Ack(id=id)]
            case Status(id=id):
                return [
                    StatusReply(
                        id=id,
                        pid=os.getpid(),
                        version="fake",
                        uptime=1.0,
                        connections=1,
                        subscribers=0,
                        records_written=sum(s.seq for s in self.sessions.values()),
                        bytes_written=0,
                    )
                ]
        raise AssertionError(f"the fake daemon does not know {message!r}")

    def _opened(self, id: int, session: FakeSession) -> SessionOpened:
        return SessionOpened(
            id=id,
            session_id=session.session_id,
            path=session.path,
            last_seq=session.seq,
            meta=session.records()[0].decode_data()["meta"],
        )


def error(id: int, code: str, message: str, session_id: str | None = None) -> ErrorReply:
    return ErrorReply(id=id, code=code, message=message, session_id=session_id)
