"""One run ledger, three feeds: the same scripts played through the daemon's session
actor (a real flightlogd), the SDK's ``MemoryDaemon`` and a scan of the file they
wrote must agree on every line and on what each opening says of the runs.

A script is a list of wire requests of one writer; ``drop`` hangs up without closing
(the actor keeps the session, its writer released: the request feed), ``close_session``
closes it (the next open scans the file: the record feed).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from flightlog.protocol import (
    ErrorCode,
    Record,
)
from flightlog.protocol.format import (
    RunLedger,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    Hello,
    Message,
    Open,
    RecordEvent,
    SaveCheckpoint,
    SessionOpened,
    Sync,
    client_decoder,
    encode_frame,
)
from flightlog.sdk import MemoryDaemon, read
from support import DaemonProcess, RawClient

#: Longer than a run_start keeps: both must cut it alike.
CLIENT = "agent-" * 50
RUNS = {name: f"{index:032x}" for index, name in enumerate("abcd", start=1)}
TIME = "2026-11-29T20:00:00.000000Z"

#: Each step: (op, argument).
SCRIPTS: dict[str, list[tuple[str, Any]]] = {
    "closed_runs": [
        ("begin", "a"),
        ("record", 3),
        ("checkpoint", None),
        ("close", "a"),
        ("begin", "b"),
        ("record", 1),
        ("close", "b"),
        ("close_session", None),
        ("open", None),
    ],
    "cut_then_resumed_by_the_same_actor": [
        ("begin", "a"),
        ("record", 2),
        ("checkpoint", None),
        ("record", 1),
        ("drop", None),
        ("open", None),
        ("resume", "a"),
        ("record", 2),
        ("drop", None),
        ("open", None),
        ("resume", "a"),
        ("close", "a"),
        ("drop", None),
        ("open", None),
    ],
    "cut_then_resumed_after_a_scan": [
        ("begin", "a"),
        ("record", 2),
        ("checkpoint", None),
        ("drop", None),
        ("open", None),
        ("close_session", None),
        ("open", None),
        ("resume", "a"),
        ("record", 3),
        ("close_session", None),
        ("open", None),
        ("resume", "a"),
        ("record", 1),
        ("drop", None),
        ("open", None),
    ],
    "several_cut_runs": [
        ("begin", "a"),
        ("record", 1),
        ("drop", None),
        ("open", None),
        ("begin", "b"),
        ("record", 2),
        ("drop", None),
        ("open", None),
        ("close_session", None),
        ("open", None),
        ("begin", "c"),
        ("checkpoint", None),
        ("close", "c"),
        ("drop", None),
        ("open", None),
    ],
    "repairs_of_earlier_runs": [
        ("begin", "a"),
        ("record", 2),
        ("drop", None),
        ("open", None),
        ("begin", "b"),
        ("record", 1),
        ("drop", None),
        ("open", None),
        ("resume", "a"),  # only a repair continues a run before the last
        ("repair", "a"),
        ("record", 1),
        ("close", "a"),
        ("drop", None),
        ("open", None),
        ("close_session", None),
        ("open", None),
        ("repair", "a"),  # closed now
        ("repair", "b"),
        ("record", 1),
        ("drop", None),  # a repair cut: its run stays interrupted
        ("open", None),
        ("repair", "b"),
        ("close", "b"),
        ("drop", None),
        ("open", None),
    ],
    "closed_twice": [
        ("begin", "a"),
        ("record", 2),
        ("close", "a"),
        ("close_session", None),
        ("close_session", None),
        ("open", None),
        ("close_session", None),
        ("close_session", None),
    ],
    # Past INDEX_FROM: the daemon's close writes the session's index in a thread first.
    "a_big_session_closed_twice": [
        ("begin", "a"),
        ("big", 5),
        ("close", "a"),
        ("close_session", None),
        ("close_session", None),
        ("open", None),
        ("begin", "b"),
        ("close_session", None),
        ("close_session", None),
        ("open", None),
    ],
    "refused_begins": [
        ("begin", "a"),
        ("record", 1),
        ("close", "a"),
        ("drop", None),
        ("open", None),
        ("resume", "a"),
        ("begin", "a"),
        ("begin", "b"),
        ("record", 1),
        ("drop", None),
        ("open", None),
        ("resume", "a"),
        ("resume", "b"),
        ("drop", None),
        ("open", None),
    ],
}


class _Writer:
    """One connection of a writer, to the real daemon or to a MemoryDaemon."""

    def __init__(self, target: DaemonProcess | MemoryDaemon) -> None:
        self._ids = 0
        if isinstance(target, MemoryDaemon):
            self._memory = target.connect()
            self._raw: RawClient | None = None
            self._decoder = client_decoder()
            self.request(Hello(id=self.next_id(), version=PROTOCOL_VERSION, client="t", pid=1))
        else:
            self._raw = RawClient(target.socket, client="t")
            self._ids = 1

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def send(self, message: Message) -> None:
        if self._raw is not None:
            self._raw.send(message)
        else:
            self._memory.receive_data(encode_frame(message))

    def request(self, message: Message) -> Any:
        if self._raw is not None:
            return self._raw.request(message)
        self.send(message)
        self._decoder.feed(self._memory.data_to_send())
        replies = [m for m in self._decoder if getattr(m, "id", 0) == message.id]
        assert len(replies) == 1
        return replies[0]

    def drop(self) -> None:
        if self._raw is not None:
            self._raw.close()
        else:
            self._memory.receive_data(b"")


def _opened(writer: _Writer, path: str) -> SessionOpened:
    # A writer that just hung up is released by the daemon a moment later.
    deadline = time.monotonic() + 10
    while True:
        reply = writer.request(Open(id=writer.next_id(), path=path))
        if not (isinstance(reply, ErrorReply) and reply.code == ErrorCode.SESSION_BUSY):
            assert isinstance(reply, SessionOpened), reply
            return reply
        assert time.monotonic() < deadline, "the session was never released"
        time.sleep(0.01)


def _play(
    target: DaemonProcess | MemoryDaemon, path: str, script: list[tuple[str, Any]]
) -> list[Any]:
    """Play ``script``; what each step answered (an opening: what it says of the runs;
    a refusal: its code)."""
    writer = _Writer(target)
    opened = writer.request(Create(id=writer.next_id(), path=path))
    assert isinstance(opened, SessionOpened)
    session_id, run_id = opened.session_id, ""
    seen: list[Any] = []
    for op, arg in script:
        match op:
            case "begin" | "resume" | "repair":
                named = RUNS[arg]
                request = BeginRun(
                    id=writer.next_id(),
                    session_id=session_id,
                    time=TIME,
                    client=CLIENT,
                    pid=1,
                    run_id=named if op == "begin" else None,
                    resume=named if op != "begin" else None,
                    repair=op == "repair",
                )
                reply = writer.request(request)
                if isinstance(reply, ErrorReply):
                    seen.append((op, arg, reply.code))
                else:
                    run_id = reply.run_id
                    seen.append((op, arg, reply.seq))
            case "record" | "big":
                pad = b',"pad":"%s"' % (b"x" * 1024 * 1024) if op == "big" else b""
                for _ in range(arg):
                    writer.send(
                        RecordEvent(
                            session_id=session_id,
                            run_id=run_id,
                            event_type="turn_start",
                            time=TIME,
                            data=b'{"turn_index":0%s}' % pad,
                        )
                    )
            case "checkpoint":
                reply = writer.request(
                    SaveCheckpoint(
                        id=writer.next_id(),
                        session_id=session_id,
                        run_id=run_id,
                        time=TIME,
                        snapshot=b'{"n":1}',
                    )
                )
                seen.append((op, getattr(reply, "seq", None)))
            case "close":
                reply = writer.request(
                    CloseRun(
                        id=writer.next_id(),
                        session_id=session_id,
                        run_id=RUNS[arg],
                        time=TIME,
                    )
                )
                seen.append((op, arg, getattr(reply, "seq", None)))
            case "drop":
                reply = writer.request(Sync(id=writer.next_id(), session_id=session_id))
                seen.append((op, reply.seq))
                writer.drop()
                writer = _Writer(target)
            case "close_session":
                reply = writer.request(CloseSession(id=writer.next_id(), session_id=session_id))
                seen.append((op, reply.code if isinstance(reply, ErrorReply) else reply.seq))
            case "open":
                opened = _opened(writer, path)
                seen.append(
                    (
                        op,
                        opened.last_seq,
                        opened.interrupted_runs,
                        opened.last_run,
                        opened.last_run_items,
                    )
                )
    writer.drop()
    return seen


def _scanned(records: list[Record]) -> tuple[list[str], str | None, int]:
    ledger = RunLedger()
    for record in records:
        ledger.add(record.type, record.run_id)
    return ledger.interrupted_runs, ledger.last_run, ledger.last_run_items


def _comparable(records: list[Record]) -> list[tuple[Any, ...]]:
    # The session's own id and its session_start time differ; nothing else may.
    return [
        (r.seq, r.type, r.time, r.run_id, msgspec.json.decode(r.data)) for r in records if r.seq > 1
    ]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_actor_the_memory_daemon_and_a_scan_agree(name: str, daemon: DaemonProcess) -> None:
    script = SCRIPTS[name]
    path = f"{name}.jsonl"
    on_disk = _play(daemon, path, script)
    memory = MemoryDaemon()
    in_memory = _play(memory, path, script)
    assert on_disk == in_memory

    file_records = list(read(daemon.root / path))
    memory_records = memory.session(path).records()
    assert _comparable(file_records) == _comparable(memory_records)
    # The last opening said what a scan of the file says.
    last_open = [step for step in on_disk if step[0] == "open"][-1]
    assert last_open[2:] == _scanned(file_records)
    assert _scanned(file_records) == _scanned(memory_records)
