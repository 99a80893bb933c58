"""A full disk and a failing disk: the writer of the session hit gets a sticky
write_failed at once, every other session goes on, the daemon stays up, and once the
disk is back a new session records normally.

ENOSPC is real: a small tmpfs made by the test fills up under many writers at once,
and one with few inodes runs out of them.  EIO is injected into the daemon's storage
layer (in process), at the write and at the fsync of every request that syncs.
(tests/daemon/test_sticky_errors.py has one writer filling a tmpfs, and a file-size
limit; this goes further.)
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightlog.daemon._sessions import DISK_THREADS
from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    Open,
    RecordFailed,
    SaveCheckpoint,
    SessionOpened,
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
    fact,
    synced_seq,
    wait_for_log,
)

from .harness import DiskFaults, InProcessDaemon, assert_every_file_sound, tmpfs

BIG = 64 * 1024
WRITERS = 6


def _big(session_id: str, run_id: str, n: int) -> Any:
    return fact(session_id, run_id, data=b'{"n":%d,"pad":"%s"}' % (n, b"x" * BIG))


def _write_until_full(
    daemon: DaemonProcess, fs: Path, number: int, results: dict[int, Any], errors: list[Any]
) -> None:
    """One writer: a session on the small file system and one on the root, written in
    turn until the small one fails; then the root one must still record."""
    try:
        with RawClient(daemon.socket, client=f"enospc-{number}") as client:
            full = create(client, str(fs / f"w{number}.jsonl"))
            full_run = begin(client, full.session_id)
            healthy = create(client, f"healthy/w{number}.jsonl")
            healthy_run = begin(client, healthy.session_id)
            healthy_seq = 2
            for n in range(1000):
                client.send(_big(full.session_id, full_run.run_id, n))
                client.send(fact(healthy.session_id, healthy_run.run_id, n))
                healthy_seq += 1
                if n % 4 == 3:
                    reply = client.request(Sync(id=client.next_id(), session_id=full.session_id))
                    if isinstance(reply, ErrorReply):
                        break
            else:
                raise AssertionError("the file system never filled")
            assert reply.code == "write_failed" and "No space left" in reply.message, reply
            pushed = client.pending.pop(0)
            assert isinstance(pushed, RecordFailed) and pushed.message == reply.message
            # Sticky: later requests of the session get the same error.
            again = client.request(
                SaveCheckpoint(
                    id=client.next_id(),
                    session_id=full.session_id,
                    run_id=full_run.run_id,
                    time=now(),
                    snapshot=b"{}",
                )
            )
            assert isinstance(again, ErrorReply) and again.message == reply.message, again
            # The writer's other session goes on.
            for n in range(10):
                client.send(fact(healthy.session_id, healthy_run.run_id, n))
            assert synced_seq(client, healthy.session_id) == healthy_seq + 10
            closed = client.request(CloseSession(id=client.next_id(), session_id=full.session_id))
            assert isinstance(closed, ErrorReply) and closed.message == reply.message
            results[number] = (full.session_id, full_run.run_id)
    except BaseException as exc:
        errors.append(exc)


def test_enospc_under_many_writers_then_space_comes_back(short_tmp: Path) -> None:
    with tmpfs("2m") as fs:
        daemon = DaemonProcess(short_tmp, "--allow", str(fs)).start()
        try:
            results: dict[int, Any] = {}
            errors: list[Any] = []
            writers = [
                threading.Thread(target=_write_until_full, args=(daemon, fs, i, results, errors))
                for i in range(WRITERS)
            ]
            for writer in writers:
                writer.start()
            for writer in writers:
                writer.join(timeout=120)
            assert not errors, errors
            assert sorted(results) == list(range(WRITERS))
            assert daemon.alive()
            assert_serving(daemon)
            reports = assert_every_file_sound(fs) | assert_every_file_sound(daemon.root)
            assert len(reports) == 2 * WRITERS + 1

            # Space comes back: half the sessions are deleted.  A new session records.
            for number in range(WRITERS // 2):
                (fs / f"w{number}.jsonl").unlink()
            with RawClient(daemon.socket) as client:
                fresh = create(client, str(fs / "fresh.jsonl"))
                run = begin(client, fresh.session_id)
                for n in range(8):
                    client.send(_big(fresh.session_id, run.run_id, n))
                ack = client.request(
                    SaveCheckpoint(
                        id=client.next_id(),
                        session_id=fresh.session_id,
                        run_id=run.run_id,
                        time=now(),
                        snapshot=b'{"n":8}',
                    )
                )
                assert ack == Ack(id=ack.id, seq=11), ack
                # And the failed sessions still there reopen: the torn tail goes, the
                # seq goes on.
                for number in range(WRITERS // 2, WRITERS):
                    path = fs / f"w{number}.jsonl"
                    report = check_file(path)
                    reopened = client.request(Open(id=client.next_id(), path=str(path)))
                    assert isinstance(reopened, SessionOpened), reopened
                    assert reopened.last_seq == report.last_seq
                    assert reopened.truncated_bytes == report.tail_bytes
                    assert reopened.interrupted_runs == [results[number][1]]
                    assert begin(client, reopened.session_id).seq == report.last_seq + 1
            assert_every_file_sound(fs, tail_allowed=False)
        finally:
            daemon.stop()


def test_out_of_inodes_refuses_creates_and_existing_sessions_go_on(short_tmp: Path) -> None:
    with tmpfs("4m", inodes=6) as fs:
        daemon = DaemonProcess(short_tmp, "--allow", str(fs)).start()
        try:
            with RawClient(daemon.socket) as client:
                sessions = []
                for i in range(10):
                    reply = client.request(
                        Create(id=client.next_id(), path=str(fs / f"s{i}.jsonl"))
                    )
                    if isinstance(reply, ErrorReply):
                        break
                    sessions.append((reply, begin(client, reply.session_id)))
                assert reply.code == "write_failed" and "No space left" in reply.message, reply
                assert sessions, "not even one session fitted"
                nested = client.request(
                    Create(id=client.next_id(), path=str(fs / "deeper" / "s.jsonl"))
                )
                assert isinstance(nested, ErrorReply) and nested.code == "write_failed", nested
                for opened, run in sessions:
                    client.send(fact(opened.session_id, run.run_id, 1))
                    assert synced_seq(client, opened.session_id) == 3
                assert_serving(daemon)
                # An inode comes back: the create works.
                opened, _ = sessions.pop()
                client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
                Path(opened.path).unlink()
                again = create(client, str(fs / "again.jsonl"))
                assert synced_seq(client, again.session_id) == 1
            assert_every_file_sound(fs, tail_allowed=False)
            assert sorted(p.name for p in fs.iterdir() if p.name.startswith(".")) == []
        finally:
            daemon.stop()


# ----------------------------------------------------------------- EIO, injected


@pytest.fixture(scope="module")
def shared() -> Iterator[InProcessDaemon]:
    base = Path(tempfile.mkdtemp(prefix="fl-eio-", dir="/tmp"))
    try:
        (base / "other").mkdir()
        with InProcessDaemon(base, idle_timeout=0.2, allow=(str(base / "other"),)) as daemon:
            yield daemon
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def eio(shared: InProcessDaemon) -> InProcessDaemon:
    assert shared.alive(), shared.log
    return shared


class _Writer:
    """A session with an open run and a few records, on its own connection."""

    def __init__(self, daemon: InProcessDaemon, name: str) -> None:
        self.daemon = daemon
        self.name = name
        self.path = daemon.root / name
        self.client = RawClient(daemon.socket, client=name)
        opened = create(self.client, name)
        self.session_id = opened.session_id
        self.run_id = begin(self.client, self.session_id).run_id
        for n in range(5):
            self.client.send(fact(self.session_id, self.run_id, n))
        assert synced_seq(self.client, self.session_id) == 7

    def request(self, message: Any) -> Any:
        return self.client.request(message)

    def checkpoint(self) -> Any:
        return self.request(
            SaveCheckpoint(
                id=self.client.next_id(),
                session_id=self.session_id,
                run_id=self.run_id,
                time=now(),
                snapshot=b'{"at":"checkpoint"}',
            )
        )


def _close_run(w: _Writer) -> Any:
    return w.request(
        CloseRun(id=w.client.next_id(), session_id=w.session_id, run_id=w.run_id, time=now())
    )


def _sync(w: _Writer) -> Any:
    return w.request(Sync(id=w.client.next_id(), session_id=w.session_id))


def _close_session(w: _Writer) -> Any:
    return w.request(CloseSession(id=w.client.next_id(), session_id=w.session_id))


def _record_then_sync(w: _Writer) -> Any:
    w.client.send(fact(w.session_id, w.run_id, 99))
    return _sync(w)


def _record_then_close_session(w: _Writer) -> Any:
    w.client.send(fact(w.session_id, w.run_id, 99))
    return _close_session(w)


FAILURES = {
    "write": (_record_then_sync, "write"),
    "fsync-checkpoint": (_Writer.checkpoint, "fsync"),
    "fsync-run-close": (_close_run, "fsync"),
    "fsync-sync": (_record_then_sync, "fsync"),
    "fsync-close-session": (_record_then_close_session, "fsync"),
}


def _assert_sticky(w: _Writer, message: str) -> None:
    for reply in (
        _sync(w),
        w.checkpoint(),
        _close_run(w),
        w.request(BeginRun(id=w.client.next_id(), session_id=w.session_id, time=now())),
    ):
        if reply is None:
            continue
        assert isinstance(reply, ErrorReply) and reply.message == message, reply


def _assert_neighbours_go_on(daemon: InProcessDaemon, neighbour: _Writer) -> None:
    neighbour.client.send(fact(neighbour.session_id, neighbour.run_id, 1))
    assert synced_seq(neighbour.client, neighbour.session_id) == 8
    assert isinstance(neighbour.checkpoint(), Ack)
    assert_serving(daemon)


@pytest.mark.parametrize("where", FAILURES)
def test_eio_is_sticky_for_its_session_only(
    eio: InProcessDaemon, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    faults = DiskFaults(monkeypatch)
    request, call = FAILURES[where]
    w = _Writer(eio, f"eio/{where}.jsonl")
    neighbour = _Writer(eio, f"eio/{where}-neighbour.jsonl")
    try:
        if call == "write":
            faults.on(w.path).write_limit = 0
        else:
            faults.on(w.path).fsync_errno = errno.EIO
        reply = request(w)
        assert isinstance(reply, ErrorReply) and reply.code == "write_failed", reply
        assert "Input/output error" in reply.message and call in reply.message, reply
        if request is not _record_then_close_session:  # a close has only its reply
            pushed = w.client.pending.pop(0)
            assert isinstance(pushed, RecordFailed) and pushed.message == reply.message
            _assert_sticky(w, reply.message)
            assert isinstance(_close_session(w), ErrorReply)
        assert not w.client.pending, w.client.pending
        status = neighbour.request(Status(id=neighbour.client.next_id()))
        assert isinstance(status, StatusReply) and status.errors >= 1
        _assert_neighbours_go_on(eio, neighbour)
        faults.clear(w.path)
        # The disk is back: the file reads, reopens, and a new session there records.
        report = check_file(w.path)
        assert report.sound and report.last_seq >= 7, report
        reopened = w.request(Open(id=w.client.next_id(), path=w.name))
        assert isinstance(reopened, SessionOpened), reopened
        assert reopened.last_seq == report.last_seq
        assert begin(w.client, w.session_id).seq == report.last_seq + 1
        assert_serving(eio)
    finally:
        w.client.close()
        neighbour.client.close()


def test_eio_at_the_fsync_of_a_create_leaves_no_file(
    eio: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = DiskFaults(monkeypatch)
    directory = eio.root / "eio-create"
    directory.mkdir(parents=True, exist_ok=True)
    faults.on(directory).fsync_errno = errno.EIO
    with RawClient(eio.socket) as client:
        reply = client.request(Create(id=client.next_id(), path="eio-create/s.jsonl"))
        assert isinstance(reply, ErrorReply) and reply.code == "write_failed", reply
        assert os.listdir(directory) == []
        faults.clear(directory)
        opened = create(client, "eio-create/s.jsonl")
        assert synced_seq(client, opened.session_id) == 1
    assert_serving(eio)


def test_eio_at_the_fsync_of_a_disconnect_is_logged_and_the_file_reads(
    eio: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = DiskFaults(monkeypatch)
    w = _Writer(eio, "eio/disconnect.jsonl")
    faults.on(w.path).fsync_errno = errno.EIO
    w.client.send(fact(w.session_id, w.run_id, 8))
    w.client.close()  # the release syncs, and fails: nobody is left to tell but the log
    wait_for_log(eio, event="session_failed", session_id=w.session_id)  # type: ignore[arg-type]
    faults.clear(w.path)
    report = check_file(w.path)
    assert report.sound and report.last_seq == 8 and report.open_runs == [w.run_id], report
    assert_serving(eio)


def test_eio_at_the_sync_owed_after_an_idle_close(
    eio: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's descriptor is closed while idle with a sync still owed; the sync
    reopens it, and its failure is the session's."""
    faults = DiskFaults(monkeypatch)
    w = _Writer(eio, "eio/idle.jsonl")
    try:
        w.client.send(fact(w.session_id, w.run_id, 8))
        status_of = lambda: next(  # noqa: E731
            s
            for s in w.request(Status(id=w.client.next_id())).sessions
            if s.session_id == w.session_id
        )
        wait_for(lambda: status_of().last_seq == 8 and not status_of().file_open)
        faults.on(w.path).fsync_errno = errno.EIO
        reply = _sync(w)
        assert isinstance(reply, ErrorReply) and "fsync" in reply.message, reply
        _assert_sticky(w, reply.message)
    finally:
        w.client.close()
        faults.clear(w.path)
    assert check_file(w.path).sound


def test_eio_at_the_truncation_of_a_torn_tail_refuses_the_open(
    eio: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = DiskFaults(monkeypatch)
    w = _Writer(eio, "eio/torn.jsonl")
    assert isinstance(_close_session(w), Ack)
    w.client.close()
    with w.path.open("ab") as file:
        file.write(b'{"session_id":"torn')
    faults.on(w.path).fsync_errno = errno.EIO
    with RawClient(eio.socket) as client:
        reply = client.request(Open(id=client.next_id(), path=w.name))
        assert isinstance(reply, ErrorReply) and reply.code == "write_failed", reply
        faults.clear(w.path)
        reopened = client.request(Open(id=client.next_id(), path=w.name))
        assert isinstance(reopened, SessionOpened), reopened
        assert reopened.last_seq == 7
    assert [line["seq"] for line in read_lines(w.path)] == list(range(1, 8))
    assert check_file(w.path).unfinished_tail is False


# ------------------------------------------------------------ a disk that hangs


def test_a_hung_fsync_stalls_only_its_own_session(
    eio: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = DiskFaults(monkeypatch)
    gate = threading.Event()
    w = _Writer(eio, "hung/one.jsonl")
    try:
        faults.on(w.path).fsync_gate = gate
        w.client.send(
            SaveCheckpoint(
                id=w.client.next_id(),
                session_id=w.session_id,
                run_id=w.run_id,
                time=now(),
                snapshot=b"{}",
            )
        )
        wait_for(lambda: faults.on(w.path).fsyncs == 1)
        # While the checkpoint waits for its disk, everyone else is served.
        other = _Writer(eio, "hung/other.jsonl")
        _assert_neighbours_go_on(eio, other)
        other.client.close()
        gate.set()
        ack = w.client.receive()
        assert isinstance(ack, Ack) and ack.seq == 8, ack
    finally:
        gate.set()
        w.client.close()


HUNG_SESSIONS = DISK_THREADS + 40  # more than the daemon's worker threads altogether


def test_many_sessions_on_a_hung_disk_stall_no_other_root(
    eio: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: more sessions waiting on a hung disk than the daemon had worker
    threads (one pool of 40) stalled the fsync, create and open of every other
    session.  Now a root's file work has threads of its own."""
    faults = DiskFaults(monkeypatch)
    gate = threading.Event()
    hung_dir = eio.base / "other" / "hung-many"
    writers = [_Writer(eio, str(hung_dir / f"s{i}.jsonl")) for i in range(HUNG_SESSIONS)]
    try:
        faults.on(hung_dir).fsync_gate = gate
        for w in writers:
            w.client.send(fact(w.session_id, w.run_id, 8))
            w.client.send(Sync(id=w.client.next_id(), session_id=w.session_id))
        wait_for(lambda: faults.on(hung_dir).fsyncs >= DISK_THREADS)
        other = _Writer(eio, "not-hung/other.jsonl")
        _assert_neighbours_go_on(eio, other)
        other.client.close()
        gate.set()
        for w in writers:
            ack = w.client.receive()
            assert isinstance(ack, Ack) and ack.seq == 8, ack
        assert faults.on(hung_dir).fsyncs == HUNG_SESSIONS
    finally:
        gate.set()
        for w in writers:
            w.client.close()
