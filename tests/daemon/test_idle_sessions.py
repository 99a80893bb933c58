"""Idle sessions give their descriptor back: the daemon holds many sessions with few
open files, reopens a file on the next write, and refuses to write a file that was
replaced or changed while it was closed."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    BeginRun,
    CloseRun,
    CloseSession,
    ErrorReply,
    RunStarted,
    SessionStatus,
    Status,
    StatusReply,
    Sync,
)
from support import DaemonProcess, RawClient, read_lines, wait_for
from support.daemon import (
    assert_serving,
    begin,
    check_file,
    create,
    expect_record_failed,
    fact,
    open_fds,
    synced_seq,
)

SESSIONS = 20
MAX_OPEN = 4


@pytest.fixture
def idle_daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(
        short_tmp, "--idle-timeout", "0.2", "--max-open-files", str(MAX_OPEN)
    ).start()
    try:
        yield daemon
    finally:
        daemon.stop()


def _status(client: RawClient) -> StatusReply:
    status = client.request(Status(id=client.next_id()))
    assert isinstance(status, StatusReply), status
    return status


def _session_status(client: RawClient, session_id: str) -> SessionStatus:
    (found,) = [s for s in _status(client).sessions if s.session_id == session_id]
    return found


def _wait_file_closed(client: RawClient, session_id: str) -> None:
    wait_for(lambda: not _session_status(client, session_id).file_open)


def test_many_sessions_on_one_connection_hold_few_descriptors(
    idle_daemon: DaemonProcess,
) -> None:
    daemon = idle_daemon
    with RawClient(daemon.socket) as client:
        _status(client)
        baseline = open_fds(daemon.pid)  # the daemon's own, and this connection
        sessions = []
        for i in range(SESSIONS):
            opened = create(client, f"many/{i}.jsonl")
            run = begin(client, opened.session_id)
            client.send(fact(opened.session_id, run.run_id, i))
            assert synced_seq(client, opened.session_id) == 3
            sessions.append((opened.session_id, run.run_id))
            assert open_fds(daemon.pid) <= baseline + MAX_OPEN
            assert _status(client).open_files <= MAX_OPEN
        status = _status(client)
        assert len(status.sessions) == SESSIONS
        assert all(s.writer_pid == os.getpid() for s in status.sessions)

        # Idle, every file closes; the sessions stay open and owned.
        wait_for(lambda: _status(client).open_files == 0)
        wait_for(lambda: open_fds(daemon.pid) == baseline)
        assert len(_status(client).sessions) == SESSIONS

        # Writing to each reopens its file; seq continues; still few descriptors.
        for i, (session_id, run_id) in enumerate(sessions):
            client.send(fact(session_id, run_id, 100 + i))
            assert synced_seq(client, session_id) == 4
            assert open_fds(daemon.pid) <= baseline + MAX_OPEN
        for session_id, run_id in sessions:
            closed = client.request(
                CloseRun(id=client.next_id(), session_id=session_id, run_id=run_id, time=now())
            )
            assert closed == Ack(id=closed.id, seq=5)
            done = client.request(CloseSession(id=client.next_id(), session_id=session_id))
            assert isinstance(done, Ack), done
        # The reply to a close comes once synced; the actor forgets the session after.
        wait_for(lambda: _status(client).sessions == [])
    for i in range(SESSIONS):
        path = daemon.root / "many" / f"{i}.jsonl"
        report = check_file(path)
        assert report.sound and report.last_seq == 5 and report.open_runs == [], report
        assert [line["data"].get("turn_index") for line in read_lines(path)[2:4]] == [i, 100 + i]


def test_session_with_a_closed_file_serves_every_request(idle_daemon: DaemonProcess) -> None:
    with RawClient(idle_daemon.socket) as client:
        opened = create(client, "sleepy.jsonl")
        _wait_file_closed(client, opened.session_id)
        run = client.request(
            BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
        )
        assert isinstance(run, RunStarted) and run.seq == 2
        _wait_file_closed(client, opened.session_id)
        assert synced_seq(client, opened.session_id) == 2
        closed = client.request(
            CloseRun(
                id=client.next_id(), session_id=opened.session_id, run_id=run.run_id, time=now()
            )
        )
        assert closed == Ack(id=closed.id, seq=3)
    assert check_file(idle_daemon.root / "sleepy.jsonl").sound


def _idle_session(daemon: DaemonProcess, client: RawClient, name: str) -> tuple[str, str, Path]:
    opened = create(client, name)
    run = begin(client, opened.session_id)
    client.send(fact(opened.session_id, run.run_id, 1))
    assert synced_seq(client, opened.session_id) == 3
    _wait_file_closed(client, opened.session_id)
    return opened.session_id, run.run_id, daemon.root / name


def _assert_refused_and_untouched(
    client: RawClient, session_id: str, run_id: str, path: Path, content: bytes | None
) -> None:
    client.send(fact(session_id, run_id, 2))
    failed = expect_record_failed(client, "write_failed", session_id)
    if content is None:
        assert not path.exists()
    else:
        assert path.read_bytes() == content
    reply = client.request(CloseSession(id=client.next_id(), session_id=session_id))
    assert isinstance(reply, ErrorReply) and reply.message == failed.message, reply


def test_file_replaced_while_closed_is_not_appended_to(idle_daemon: DaemonProcess) -> None:
    with RawClient(idle_daemon.socket) as client:
        session_id, run_id, path = _idle_session(idle_daemon, client, "replaced.jsonl")
        content = path.read_bytes()
        replacement = path.with_name("replacement")
        replacement.write_bytes(content)  # the same bytes, another file
        replacement.rename(path)
        _assert_refused_and_untouched(client, session_id, run_id, path, content)


def test_file_appended_to_while_closed_is_not_appended_to(idle_daemon: DaemonProcess) -> None:
    with RawClient(idle_daemon.socket) as client:
        session_id, run_id, path = _idle_session(idle_daemon, client, "grown.jsonl")
        with path.open("ab") as file:
            file.write(b'{"someone":"else"}\n')
        _assert_refused_and_untouched(client, session_id, run_id, path, path.read_bytes())


def test_file_removed_while_closed_is_not_recreated(idle_daemon: DaemonProcess) -> None:
    with RawClient(idle_daemon.socket) as client:
        session_id, run_id, path = _idle_session(idle_daemon, client, "removed.jsonl")
        path.unlink()
        _assert_refused_and_untouched(client, session_id, run_id, path, None)


def test_released_session_closes_when_idle(idle_daemon: DaemonProcess) -> None:
    with RawClient(idle_daemon.socket) as writer:
        opened = create(writer, "released.jsonl")
        begin(writer, opened.session_id)
    with RawClient(idle_daemon.socket) as client:
        wait_for(lambda: _status(client).sessions == [])


def test_file_locked_by_another_process_while_closed_is_not_written(
    idle_daemon: DaemonProcess,
) -> None:
    with RawClient(idle_daemon.socket) as client:
        session_id, run_id, path = _idle_session(idle_daemon, client, "locked.jsonl")
        content = path.read_bytes()
        with path.open("rb") as other:
            fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            _assert_refused_and_untouched(client, session_id, run_id, path, content)
    assert idle_daemon.alive()
    assert_serving(idle_daemon)


def test_sync_owed_when_the_file_is_locked_by_another_process(
    idle_daemon: DaemonProcess,
) -> None:
    with RawClient(idle_daemon.socket) as client:
        opened = create(client, "owed.jsonl")
        run = begin(client, opened.session_id)
        client.send(fact(opened.session_id, run.run_id, 1))
        # Written, not synced; then the file closes while idle.
        wait_for(lambda: len(read_lines(idle_daemon.root / "owed.jsonl")) == 3)
        _wait_file_closed(client, opened.session_id)
        path = idle_daemon.root / "owed.jsonl"
        with path.open("rb") as other:
            fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            reply = client.request(Sync(id=client.next_id(), session_id=opened.session_id))
            assert isinstance(reply, ErrorReply) and reply.code == "write_failed", reply
    assert idle_daemon.alive()
    assert_serving(idle_daemon)
