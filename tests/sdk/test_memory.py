"""The memory daemon behind the mock transports answers as flightlogd does.

One script of frames, rule-breaking ones included, is played against a real flightlogd
on a socket and against a :class:`MemoryDaemon`; what each sends back (every reply and
push, in order, by kind and error code) must be the same.  Until flightlogd runs the
protocol's server connection itself, this keeps the two from drifting apart.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

from flightlog.protocol import (
    ErrorCode,
    Record,
    events,
    now,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    BeginRun,
    BlobLoaded,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    Hello,
    LoadBlob,
    LoadCheckpoint,
    Message,
    Open,
    RecordEvent,
    SaveCheckpoint,
    Subscribe,
    Sync,
    TailEnd,
    Unsubscribe,
    client_decoder,
    encode_frame,
)
from flightlog.sdk import Client, MemoryDaemon, MockTransport, connect
from flightlog.sdk._memory import MemoryConnection
from support import DaemonProcess, RawClient, read_lines


class Peer(Protocol):
    def send(self, message: Message) -> None: ...

    def request(self, message: Message) -> list[Any]: ...

    def until(self, kind: type) -> list[Any]: ...


class Real:
    """A connection to flightlogd."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.client = RawClient(daemon.socket, hello=False)

    def send(self, message: Message) -> None:
        self.client.send(message)

    def request(self, message: Message) -> list[Any]:
        """Everything received up to and including the reply to ``message``."""
        self.client.send(message)
        received = list(self.client.pending)
        self.client.pending.clear()
        while True:
            reply = self.client.receive()
            received.append(reply)
            if getattr(reply, "id", None) == getattr(message, "id", None):
                return received

    def until(self, kind: type) -> list[Any]:
        """Everything received up to and including a message of ``kind``."""
        received = [self.client.receive()]
        while not isinstance(received[-1], kind):
            received.append(self.client.receive())
        return received


class Memory:
    """A connection to a memory daemon."""

    def __init__(self, daemon: MemoryDaemon) -> None:
        self.conn: MemoryConnection = daemon.connect()
        self.decoder = client_decoder()

    def send(self, message: Message) -> None:
        self.conn.receive_data(encode_frame(message))

    def request(self, message: Message) -> list[Any]:
        self.send(message)
        return self.until(Message)

    def until(self, kind: type) -> list[Any]:
        self.decoder.feed(self.conn.data_to_send())
        return list(self.decoder)


def kinds(received: list[Any]) -> list[tuple[str, str | None]]:
    return [(type(m).__name__, getattr(m, "code", None)) for m in received]


def script(writer: Peer, other: Peer) -> list[list[tuple[str, str | None]]]:
    """Play the script; what came back for each request."""
    out: list[list[tuple[str, str | None]]] = []

    def ask(peer: Peer, message: Message) -> list[Any]:
        received = peer.request(message)
        out.append(kinds(received))
        return received

    ask(writer, Hello(id=1, version=PROTOCOL_VERSION, client="parity", pid=1))
    ask(other, Hello(id=1, version=PROTOCOL_VERSION, client="other", pid=2))
    [opened] = ask(writer, Create(id=2, path="s.jsonl", meta={"a": 1}))
    sid = opened.session_id
    ask(writer, Create(id=3, path="s.jsonl"))
    ask(writer, Open(id=4, path="missing.jsonl"))
    ask(other, Open(id=2, path="s.jsonl"))
    ask(other, Sync(id=3, session_id=sid))
    ask(writer, Sync(id=5, session_id="f" * 32))
    ask(writer, CloseRun(id=6, session_id=sid, run_id="r", time=now()))
    [started] = ask(writer, BeginRun(id=7, session_id=sid, time=now()))
    run_id = started.run_id
    ask(writer, BeginRun(id=8, session_id=sid, time=now()))

    def record(**changes: Any) -> RecordEvent:
        fields = {
            "session_id": sid,
            "run_id": run_id,
            "event_type": "turn_start",
            "time": now(),
            "data": b"{}",
        }
        return RecordEvent(**{**fields, **changes})

    writer.send(record())
    writer.send(record(event_type="run_close"))
    writer.send(record(data=b"[1]"))  # the run's refusal was pushed already
    ask(writer, Sync(id=9, session_id=sid))
    other.send(record())
    ask(other, Sync(id=4, session_id=sid))
    snapshot = {"session_id": sid, "run_id": run_id, "snapshot": b"{}"}
    ask(writer, SaveCheckpoint(id=10, time="later", **snapshot))
    ask(writer, SaveCheckpoint(id=11, time=now(), **{**snapshot, "run_id": "0" * 32}))
    ask(writer, SaveCheckpoint(id=12, time=now(), **snapshot))
    ask(writer, CloseRun(id=13, session_id=sid, run_id=run_id, time=now()))
    ask(writer, LoadCheckpoint(id=14, session_id=sid))
    # Data that would not make one valid line, each in a run of its own.
    for n, data in enumerate([b'{"a":\n1}', b'{"a":"\xff"}', b'{"a":'], start=1):
        [started] = ask(writer, BeginRun(id=100 + n, session_id=sid, time=now()))
        run_id = started.run_id
        writer.send(record(data=data))
        ask(writer, CloseRun(id=200 + n, session_id=sid, run_id=run_id, time=now()))
    ask(writer, Unsubscribe(id=15, subscription=99))
    ask(writer, Hello(id=16, version=PROTOCOL_VERSION))
    # The tail's batches come from a task of flightlogd's own: wait for its end.
    out.append(kinds(writer.request(Subscribe(id=17, path="s.jsonl")) + writer.until(TailEnd)))
    ask(writer, CloseSession(id=19, session_id=sid))
    ask(writer, CloseSession(id=20, session_id=sid))
    ask(other, Open(id=5, path="s.jsonl"))
    # A run cut by its writer's going, resumed by the next writer.
    [opened] = ask(writer, Create(id=21, path="r.jsonl"))
    sid = opened.session_id
    [started] = ask(writer, BeginRun(id=22, session_id=sid, time=now(), run_id="c" * 32))
    run_id = started.run_id
    for _ in range(3):
        writer.send(record())
    ask(writer, SaveCheckpoint(id=23, session_id=sid, run_id=run_id, time=now(), snapshot=b"1"))
    ask(writer, CloseSession(id=24, session_id=sid))
    [reopened] = ask(other, Open(id=6, path="r.jsonl"))
    out.append([("last_run", reopened.last_run), ("items", str(reopened.last_run_items))])
    ask(other, BeginRun(id=7, session_id=sid, time=now(), run_id=run_id))
    ask(other, BeginRun(id=8, session_id=sid, time=now(), resume="d" * 32))
    [resumed] = ask(other, BeginRun(id=9, session_id=sid, time=now(), resume=run_id))
    out.append([("resumed", resumed.run_id), ("seq", str(resumed.seq))])
    ask(other, BeginRun(id=10, session_id=sid, time=now(), resume=run_id))
    ask(other, CloseRun(id=11, session_id=sid, run_id=run_id, time=now()))
    [closed] = ask(other, CloseSession(id=12, session_id=sid))
    [again] = ask(writer, Open(id=25, path="r.jsonl"))
    out.append([("last_run", again.last_run), ("seq", str(closed.seq))])
    # Meta is written as a reader reads it: keys JSON writes alike are refused.
    ask(writer, Create(id=26, path="dup.jsonl", meta={"tags": {1: "int", "1": "str"}}))
    [ints] = ask(writer, Create(id=27, path="ints.jsonl", meta={"tags": {1: "one", 2: [{3: 4}]}}))
    out.append([("meta", repr(ints.meta))])
    return out


def test_the_memory_daemon_answers_as_flightlogd_does(daemon: DaemonProcess) -> None:
    writer, other = Real(daemon), Real(daemon)
    try:
        real = script(writer, other)
    finally:
        writer.client.close()
        other.client.close()
    memory = MemoryDaemon()
    assert script(Memory(memory), Memory(memory)) == real
    # The script went where it meant to go.
    assert real[5] == [("ErrorReply", "session_busy")]
    assert real[11] == [("RecordFailed", "bad_event"), ("Ack", None)]  # one push per run
    assert real[12] == [("RecordFailed", "not_writer"), ("ErrorReply", "not_writer")]
    assert real[19:24:2] == [[("RecordFailed", "bad_event"), ("Ack", None)]] * 3
    assert real[26] == [("Subscribed", None), ("TailBatch", None), ("TailEnd", None)]
    assert real[-19] == [("SessionOpened", None)]
    # Three records and a checkpoint in the cut run; a refused begin_run opens nothing.
    assert real[-13] == [("last_run", "c" * 32), ("items", "4")]
    assert real[-12] == [("ErrorReply", "bad_message")]  # the run id is not fresh
    assert real[-11] == [("ErrorReply", "run_not_open")]
    assert real[-9] == [("resumed", "c" * 32), ("seq", "7")]
    assert real[-8] == [("ErrorReply", "run_open")]
    assert real[-4] == [("last_run", None), ("seq", "8")]
    assert real[-3] == [("ErrorReply", "bad_message")]
    assert real[-1] == [("meta", repr({"tags": {"1": "one", "2": [{"3": 4}]}}))]


def reused_run_ids(peer: Peer) -> list[list[tuple[str, str | None]]]:
    """A new run under the id of a run the file holds: closed in this opening, closed
    in an earlier one, or cut (resumable); then a fresh id, accepted."""
    out: list[list[tuple[str, str | None]]] = []

    def ask(message: Message) -> list[Any]:
        received = peer.request(message)
        out.append(kinds(received))
        return received

    ask(Hello(id=1, version=PROTOCOL_VERSION, client="reuse", pid=1))
    [opened] = ask(Create(id=2, path="reuse.jsonl"))
    sid = opened.session_id
    ask(BeginRun(id=3, session_id=sid, time=now(), run_id="a" * 32))
    ask(CloseRun(id=4, session_id=sid, run_id="a" * 32, time=now()))
    ask(BeginRun(id=5, session_id=sid, time=now(), run_id="a" * 32))
    ask(BeginRun(id=6, session_id=sid, time=now(), run_id="b" * 32))
    ask(CloseSession(id=7, session_id=sid))  # run b cut
    [again] = ask(Open(id=8, path="reuse.jsonl"))
    ask(BeginRun(id=9, session_id=again.session_id, time=now(), run_id="a" * 32))
    ask(BeginRun(id=10, session_id=again.session_id, time=now(), run_id="b" * 32))
    ask(BeginRun(id=11, session_id=again.session_id, time=now(), run_id="c" * 32))
    return out


def test_a_new_run_under_the_id_of_a_run_in_the_file_is_refused(daemon: DaemonProcess) -> None:
    """docs/protocol.md: a ``begin_run`` whose ``run_id`` names a run the file already
    holds is refused with ``bad_message``: a closed run's id as well as a cut one's, in
    flightlogd and in the memory daemon alike."""
    real = Real(daemon)
    try:
        answers = reused_run_ids(real)
    finally:
        real.client.close()
    assert reused_run_ids(Memory(MemoryDaemon())) == answers
    refused = [("ErrorReply", "bad_message")]
    assert answers[4] == refused  # closed in this opening
    assert answers[8] == refused  # closed in an earlier opening
    assert answers[9] == refused  # cut
    assert answers[10] == [("RunStarted", None)]
    lines = read_lines(daemon.root / "reuse.jsonl")
    assert [line["type"] for line in lines].count("run_start") == 3


def test_the_memory_daemon_takes_blobs_out_as_flightlogd_does() -> None:
    """With blobs on, a MemoryDaemon holds the line a flightlogd ``--blobs`` writes (the
    reference in the payload's place), and a tail gives the payload back in both."""
    data = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40).decode()
    event = events.ToolExecEnd(
        execution=events.Execution(id="t1", kind="tool"),
        tool_call_id="c1",
        name="screenshot",
        content=[{"type": "image", "data": data}],
    )

    def played(client: Client) -> list[Record]:
        session = client.create("shots.jsonl")
        with session.begin_run() as run:
            run.record(event)
        session.close()
        return [r for r in client.tail("shots.jsonl") if r.type == "tool_exec_end"]

    memory = MemoryDaemon(blobs=True)
    with connect(transport=MockTransport(memory)) as client:
        [from_memory] = played(client)
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))  # a short socket path
    proc = DaemonProcess(base, "--blobs").start()
    try:
        with connect(proc.socket) as client:
            [from_daemon] = played(client)
    finally:
        proc.stop()
    [written] = [r for r in read_lines(proc.root / "shots.jsonl") if r["type"] == "tool_exec_end"]
    [held] = [
        r
        for r in map(json.loads, memory.session("shots.jsonl").lines)
        if r["type"] == "tool_exec_end"
    ]
    assert held["data"] == written["data"] and data not in json.dumps(held)
    assert memory.blobs is not None and list(memory.blobs) == [
        held["data"]["content"][0]["data"]["sha256"]
    ]
    assert bytes(from_memory.data) == bytes(from_daemon.data)
    assert data.encode() in bytes(from_memory.data)
    shutil.rmtree(base, ignore_errors=True)


def test_the_memory_daemon_answers_load_blob_from_its_blobs() -> None:
    """``load_blob`` of a session's blob: its bytes; of a blob it does not hold, or of
    a session that does not exist, the refusal flightlogd gives."""
    payload = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40
    memory = MemoryDaemon(blobs=True)
    with connect(transport=MockTransport(memory)) as client:
        session = client.create("shots.jsonl")
        with session.begin_run() as run:
            run.record(
                events.ToolExecEnd(
                    execution=events.Execution(id="t1", kind="tool"),
                    tool_call_id="c1",
                    name="screenshot",
                    content=[{"type": "image", "data": base64.b64encode(payload).decode()}],
                )
            )
        session.close()
    assert memory.blobs is not None
    [digest] = memory.blobs
    peer = Memory(memory)
    peer.request(Hello(id=1, version=PROTOCOL_VERSION))

    [loaded] = peer.request(LoadBlob(id=2, path="shots.jsonl", sha256=digest))
    [missing] = peer.request(LoadBlob(id=3, path="shots.jsonl", sha256="0" * 64))
    [nowhere] = peer.request(LoadBlob(id=4, path="other.jsonl", sha256=digest))

    assert loaded == BlobLoaded(id=2, sha256=digest, data=payload)
    assert isinstance(missing, ErrorReply) and missing.code == ErrorCode.BLOB_NOT_FOUND
    assert isinstance(nowhere, ErrorReply) and nowhere.code == ErrorCode.SESSION_NOT_FOUND
