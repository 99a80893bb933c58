"""One writer per session: refusing a second one, releasing when the writer goes away
(cleanly or killed), and opening a file whose last write was cut short."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from flightlog.protocol import (
    Record,
    new_id,
    now,
)
from flightlog.protocol.format import (
    encode_line,
)
from flightlog.protocol.wire import (
    Ack,
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    Open,
    RunStarted,
    SessionOpened,
    Sync,
)
from support import DaemonProcess, RawClient, read_lines
from support.daemon import (
    agent_report,
    assert_refusal_logged,
    assert_serving,
    begin,
    check_file,
    create,
    fact,
    open_when_released,
    spawn_agent,
    synced_seq,
)

RECORDS = 20_000


@pytest.fixture
def holder(daemon: DaemonProcess) -> Iterator[tuple[object, dict[str, object]]]:
    """An agent process that created ``held.jsonl``, sent RECORDS records in one open
    run and now waits, holding the session."""
    agent = spawn_agent("hold", daemon.socket, "held.jsonl", str(RECORDS))
    try:
        yield agent, agent_report(agent)
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.wait(timeout=10)
        for stream in (agent.stdin, agent.stdout, agent.stderr):
            if stream is not None:
                stream.close()


def _assert_everything_sent_is_there(path: Path, run_id: object, count: int) -> None:
    lines = read_lines(path)
    assert [line["seq"] for line in lines] == list(range(1, len(lines) + 1))
    assert [line["type"] for line in lines[:2]] == ["session_start", "run_start"]
    facts = [line for line in lines if line["type"] == "turn_start" and line["run_id"] == run_id]
    assert [line["data"]["turn_index"] for line in facts] == list(range(count))
    assert not [line for line in lines if line["type"] == "run_close" and line["run_id"] == run_id]


def test_second_writer_is_refused_with_the_holders_pid(
    daemon: DaemonProcess, holder: tuple[object, dict[str, object]]
) -> None:
    agent, _ = holder
    with RawClient(daemon.socket) as client:
        reply = client.request(Open(id=client.next_id(), path="held.jsonl"))
        assert isinstance(reply, ErrorReply) and reply.code == "session_busy", reply
        assert f"pid {agent.pid}" in reply.message  # type: ignore[attr-defined]
        assert "agent-hold" in reply.message
        # By its absolute path too: the same file.
        reply = client.request(Open(id=client.next_id(), path=str(daemon.root / "held.jsonl")))
        assert isinstance(reply, ErrorReply) and reply.code == "session_busy", reply
    assert_refusal_logged(daemon, "session_busy")
    assert_serving(daemon)


def test_sigkilled_writer_releases_the_session_with_all_it_sent(
    daemon: DaemonProcess, holder: tuple[object, dict[str, object]]
) -> None:
    agent, sent = holder
    os.kill(agent.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    agent.wait(timeout=10)  # type: ignore[attr-defined]
    with RawClient(daemon.socket) as client:
        reopened = open_when_released(client, "held.jsonl")
        assert reopened.session_id == sent["session_id"]
        assert reopened.last_seq == RECORDS + 2
        assert reopened.interrupted_runs == [sent["run_id"]]
        assert reopened.truncated_bytes == 0
        _assert_everything_sent_is_there(daemon.root / "held.jsonl", sent["run_id"], RECORDS)
        run = begin(client, reopened.session_id)
        assert run.seq == RECORDS + 3
        assert run.run_id != sent["run_id"]
        client.send(fact(reopened.session_id, run.run_id, 1))
        closed = client.request(
            CloseRun(
                id=client.next_id(), session_id=reopened.session_id, run_id=run.run_id, time=now()
            )
        )
        assert closed == Ack(id=closed.id, seq=RECORDS + 5)
    report = check_file(daemon.root / "held.jsonl")
    assert report.sound and report.runs == 2 and report.open_runs == [sent["run_id"]], report
    assert_serving(daemon)


def test_writer_that_closes_its_socket_releases_the_session(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        opened = create(client, "clean.jsonl")
        run = begin(client, opened.session_id)
        for n in range(1000):
            client.send(fact(opened.session_id, run.run_id, n))
    with RawClient(daemon.socket) as again:
        reopened = open_when_released(again, "clean.jsonl")
        assert reopened.last_seq == 1002
        assert reopened.interrupted_runs == [run.run_id]
        assert begin(again, reopened.session_id).seq == 1003
    assert_serving(daemon)


def test_waiting_open_gets_the_session_once_the_writer_closes_it(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as first, RawClient(daemon.socket) as second:
        opened = create(first, "handover.jsonl")
        run = begin(first, opened.session_id)
        refused = second.request(Open(id=second.next_id(), path="handover.jsonl"))
        assert isinstance(refused, ErrorReply) and refused.code == "session_busy"
        first.request(
            CloseRun(
                id=first.next_id(), session_id=opened.session_id, run_id=run.run_id, time=now()
            )
        )
        done = first.request(CloseSession(id=first.next_id(), session_id=opened.session_id))
        assert isinstance(done, Ack)
        reopened = second.request(Open(id=second.next_id(), path="handover.jsonl"))
        assert isinstance(reopened, SessionOpened), reopened
        assert reopened.interrupted_runs == []
        assert reopened.last_seq == 3
        # The first connection is no longer the writer.
        reply = first.request(CloseSession(id=first.next_id(), session_id=opened.session_id))
        assert isinstance(reply, ErrorReply) and reply.code == "not_writer", reply


def test_close_session_with_an_open_run_leaves_it_interrupted(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        opened = create(client, "open-run.jsonl")
        run = begin(client, opened.session_id)
        client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
        reopened = client.request(Open(id=client.next_id(), path="open-run.jsonl"))
        assert isinstance(reopened, SessionOpened), reopened
        assert reopened.interrupted_runs == [run.run_id]
        assert isinstance(begin(client, opened.session_id), RunStarted)


# ------------------------------------------------------------ unfinished tail


def _session_file(path: Path, records: int) -> tuple[str, int]:
    """A file of a session_start and ``records`` more lines; (session_id, size)."""
    session_id = new_id()
    lines = [
        Record(
            session_id=session_id,
            seq=1,
            type="session_start",
            time="2026-11-29T20:00:00.000000Z",
            data=msgspec.Raw(b'{"format_version":1,"meta":{"app":"t"}}'),
        )
    ]
    run_id = new_id()
    lines.append(
        Record(
            session_id=session_id,
            seq=2,
            type="run_start",
            time="2026-11-29T20:00:00.000000Z",
            run_id=run_id,
            data=msgspec.Raw(b'{"pid":1,"client":"t"}'),
        )
    )
    for seq in range(3, records + 2):
        lines.append(
            Record(
                session_id=session_id,
                seq=seq,
                type="turn_start",
                time="2026-11-29T20:00:00.000000Z",
                run_id=run_id,
                data=msgspec.Raw(b'{"turn_index":%d}' % seq),
            )
        )
    content = b"".join(encode_line(line) for line in lines)
    path.write_bytes(content)
    return session_id, len(content)


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param("valid", id="a-complete-json-record-without-newline"),
        pytest.param(b'{"session_id":"', id="half-a-line"),
        pytest.param(b"\x00" * 4096, id="nul-bytes"),
    ],
)
def test_open_truncates_an_unfinished_tail_and_nothing_else(
    daemon: DaemonProcess, tail: str | bytes
) -> None:
    path = daemon.root / "tail.jsonl"
    session_id, size = _session_file(path, 10)
    if tail == "valid":
        tail = encode_line(
            Record(
                session_id=session_id,
                seq=12,
                type="turn_start",
                time="2026-11-29T20:00:00.000000Z",
                data=msgspec.Raw(b"{}"),
            )
        )[:-1]
    assert isinstance(tail, bytes)
    with path.open("ab") as file:
        file.write(tail)
    with RawClient(daemon.socket) as client:
        opened = client.request(Open(id=client.next_id(), path="tail.jsonl"))
        assert isinstance(opened, SessionOpened), opened
        assert opened.session_id == session_id
        assert opened.last_seq == 11
        assert opened.truncated_bytes == len(tail)
        assert opened.meta == {"app": "t"}
        assert len(opened.interrupted_runs) == 1
        assert path.stat().st_size == size
        run = begin(client, session_id)
        assert run.seq == 12
        client.send(fact(session_id, run.run_id, 7))
        assert synced_seq(client, session_id) == 13
    report = check_file(path)
    assert report.sound and not report.unfinished_tail and report.last_seq == 13, report
    assert read_lines(path)[-1]["data"] == {"turn_index": 7}


def test_file_whose_only_line_is_unfinished_is_refused(daemon: DaemonProcess) -> None:
    path = daemon.root / "stub.jsonl"
    _session_file(path, 1)
    first_line = path.read_bytes().split(b"\n")[0]
    path.write_bytes(first_line)
    size = len(first_line) + 1
    with RawClient(daemon.socket) as client:
        reply = client.request(Open(id=client.next_id(), path="stub.jsonl"))
        assert isinstance(reply, ErrorReply) and reply.code == "session_corrupt", reply
        # And creating over it is refused: the file is there.
        reply = client.request(Create(id=client.next_id(), path="stub.jsonl"))
        assert isinstance(reply, ErrorReply) and reply.code == "session_exists", reply
    assert path.stat().st_size == size - 1


def test_open_racing_a_close_session_gets_a_live_session(daemon: DaemonProcess) -> None:
    """An open that arrives while the session's close is being synced must not be
    handed the actor that is about to stop."""
    with RawClient(daemon.socket) as first, RawClient(daemon.socket) as second:
        session_id = create(first, "relay.jsonl").session_id
        holder, taker = first, second
        for _ in range(30):
            holder.send(CloseSession(id=holder.next_id(), session_id=session_id))
            while True:
                reply = taker.request(Open(id=taker.next_id(), path="relay.jsonl"))
                if isinstance(reply, SessionOpened):
                    break
                assert isinstance(reply, ErrorReply) and reply.code == "session_busy", reply
            assert isinstance(holder.receive(), Ack)
            run = taker.request(BeginRun(id=taker.next_id(), session_id=session_id, time=now()))
            assert isinstance(run, RunStarted), run
            holder, taker = taker, holder
    report = check_file(daemon.root / "relay.jsonl")
    assert report.sound and report.runs == 30, report


def test_writer_that_stops_reading_still_has_everything_it_sends_written(
    daemon: DaemonProcess,
) -> None:
    """A client that shuts down its read side makes the daemon's replies fail (EPIPE);
    what it sends after that is still read and written."""
    with RawClient(daemon.socket) as client:
        opened = create(client, "deaf.jsonl")
        run = begin(client, opened.session_id)
        client.sock.shutdown(socket.SHUT_RD)
        client.send(Sync(id=client.next_id(), session_id=opened.session_id))
        for n in range(RECORDS):
            client.send(fact(opened.session_id, run.run_id, n))
    with RawClient(daemon.socket) as again:
        reopened = open_when_released(again, "deaf.jsonl")
        assert reopened.last_seq == RECORDS + 2
    _assert_everything_sent_is_there(daemon.root / "deaf.jsonl", run.run_id, RECORDS)
