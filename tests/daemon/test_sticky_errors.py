"""A failed write is final for its session: pushed at once, returned by every later
request of the session and by close, the file still reads, other sessions go on.

Two real failures: a 1 MiB tmpfs that fills up (ENOSPC) and a file-size limit on the
daemon (RLIMIT_FSIZE, EFBIG).
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    BeginRun,
    CheckpointLoaded,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    LoadCheckpoint,
    Open,
    RecordFailed,
    SaveCheckpoint,
    SessionOpened,
    Status,
    StatusReply,
    Sync,
)
from support import DaemonProcess, RawClient, read_lines
from support.daemon import (
    assert_serving,
    begin,
    check_file,
    create,
    fact,
    synced_seq,
)

BIG = 64 * 1024


@pytest.fixture
def small_fs() -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test."""
    mountpoint = Path(tempfile.mkdtemp(prefix="fl-fs-", dir="/tmp"))
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        mountpoint.rmdir()
        pytest.skip(f"cannot mount a small tmpfs (needs root): {result.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        mountpoint.rmdir()


def _big_fact(session_id: str, run_id: str, n: int) -> object:
    return fact(session_id, run_id, data=b'{"n":%d,"pad":"%s"}' % (n, b"x" * BIG))


def _fill_until_refused(client: RawClient, session_id: str, run_id: str) -> RecordFailed:
    """Send big records until the write-failure push arrives."""
    for n in range(64):  # 4 MiB: four times what the file system holds
        client.send(_big_fact(session_id, run_id, n))  # type: ignore[arg-type]
    # The push comes at once, before the reply to this sync.
    reply = client.request(Sync(id=client.next_id(), session_id=session_id))
    assert isinstance(reply, ErrorReply) and reply.code == "write_failed", reply
    failed = client.pending.pop(0)
    assert isinstance(failed, RecordFailed), failed
    assert failed.code == "write_failed" and failed.run_id == run_id
    assert reply.message == failed.message
    assert not client.pending, client.pending
    return failed


def _assert_every_request_returns(
    client: RawClient, session_id: str, run_id: str, failed: RecordFailed
) -> None:
    def same(reply: object) -> None:
        assert isinstance(reply, ErrorReply), reply
        assert (reply.code, reply.message) == (failed.code, failed.message), reply

    # Records of the run are refused with it; the writer was told once already.
    client.send(fact(session_id, run_id, 1))
    same(
        client.request(
            SaveCheckpoint(
                id=client.next_id(),
                session_id=session_id,
                run_id=run_id,
                time=now(),
                snapshot=b"{}",
            )
        )
    )
    same(
        client.request(
            CloseRun(id=client.next_id(), session_id=session_id, run_id=run_id, time=now())
        )
    )
    same(client.request(BeginRun(id=client.next_id(), session_id=session_id, time=now())))
    same(client.request(Sync(id=client.next_id(), session_id=session_id)))
    status = client.request(Status(id=client.next_id()))
    assert isinstance(status, StatusReply)
    assert status.errors >= 1
    (mine,) = [s for s in status.sessions if s.session_id == session_id]
    assert mine.error == failed.message
    loaded = client.request(LoadCheckpoint(id=client.next_id(), session_id=session_id))
    assert isinstance(loaded, CheckpointLoaded | ErrorReply), loaded
    same(client.request(CloseSession(id=client.next_id(), session_id=session_id)))
    assert not client.pending, client.pending


def _assert_reads_up_to_the_last_good_line(path: Path, session_id: str) -> int:
    report = check_file(path)
    assert report.sound, report
    assert report.session_id == session_id
    lines = read_lines(path)
    assert [line["seq"] for line in lines] == list(range(1, report.last_seq + 1))
    assert [line["type"] for line in lines[:2]] == ["session_start", "run_start"]
    assert all(line["type"] == "turn_start" for line in lines[2:])
    return report.last_seq


def test_enospc_is_sticky_and_other_sessions_go_on(short_tmp: Path, small_fs: Path) -> None:
    daemon = DaemonProcess(short_tmp, "--allow", str(small_fs)).start()
    try:
        path = small_fs / "full.jsonl"
        with RawClient(daemon.socket) as client, RawClient(daemon.socket) as other:
            opened = create(client, str(path))
            run = begin(client, opened.session_id)
            # Another session, on the normal root, open on the same connection.
            healthy = create(client, "healthy.jsonl")
            healthy_run = begin(client, healthy.session_id)
            failed = _fill_until_refused(client, opened.session_id, run.run_id)
            assert "No space left on device" in failed.message
            assert str(path) in failed.message
            size = path.stat().st_size

            client.send(fact(healthy.session_id, healthy_run.run_id, 1))
            assert synced_seq(client, healthy.session_id) == 3
            assert_serving(daemon)
            # And another connection can still use the full file system's neighbour.
            assert isinstance(other.request(Status(id=other.next_id())), StatusReply)

            _assert_every_request_returns(client, opened.session_id, run.run_id, failed)
            assert path.stat().st_size == size  # nothing written after the failure

        last_seq = _assert_reads_up_to_the_last_good_line(path, opened.session_id)
        # With room again, the session opens: the torn line is cut, the seq goes on.
        torn = path.stat().st_size - check_file(path).valid_bytes
        with RawClient(daemon.socket) as client:
            reopened = open_after_freeing(client, path, small_fs)
            assert reopened.last_seq == last_seq
            assert reopened.truncated_bytes == torn
            assert reopened.interrupted_runs == [run.run_id]
            assert begin(client, reopened.session_id).seq == last_seq + 1
        assert check_file(path).sound
    finally:
        daemon.stop()


def open_after_freeing(client: RawClient, path: Path, fs: Path) -> SessionOpened:
    for other in fs.iterdir():
        if other != path:
            other.unlink()
    reopened = client.request(Open(id=client.next_id(), path=str(path)))
    assert isinstance(reopened, SessionOpened), reopened
    return reopened


def test_enospc_on_create_leaves_no_file(short_tmp: Path, small_fs: Path) -> None:
    fd = os.open(small_fs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    daemon = DaemonProcess(short_tmp, "--allow", str(small_fs)).start()
    try:
        with RawClient(daemon.socket) as client:
            reply = client.request(
                Create(
                    id=client.next_id(), path=str(small_fs / "new.jsonl"), meta={"x": "y" * 8192}
                )
            )
            assert isinstance(reply, ErrorReply) and reply.code == "write_failed", reply
        assert not (small_fs / "new.jsonl").exists()
        assert_serving(daemon)
    finally:
        daemon.stop()


LIMIT = 512 * 1024


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _ignored_signals(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise KeyError("SigIgn")


def test_file_size_limit_is_sticky_and_nothing_follows_the_torn_write(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start(preexec_fn=_limit_file_size)
    try:
        # Without SIGXFSZ ignored, the kernel would kill the daemon instead of
        # failing the write with EFBIG.
        assert _ignored_signals(daemon.pid) & (1 << (signal.SIGXFSZ - 1))
        with RawClient(daemon.socket) as client:
            opened = create(client, "limited.jsonl")
            run = begin(client, opened.session_id)
            failed = _fill_until_refused(client, opened.session_id, run.run_id)
            assert "File too large" in failed.message
            path = daemon.root / "limited.jsonl"
            assert path.stat().st_size == LIMIT
            # A torn line at the limit, and never anything after it.
            for n in range(10):
                client.send(fact(opened.session_id, run.run_id, n))
            _assert_every_request_returns(client, opened.session_id, run.run_id, failed)
            assert path.stat().st_size == LIMIT
        assert daemon.alive()
        _assert_reads_up_to_the_last_good_line(path, opened.session_id)
        report = check_file(path)
        assert report.valid_bytes + report.tail_bytes == LIMIT
        assert_serving(daemon)
    finally:
        daemon.stop()


def _fill(fs: Path) -> None:
    """Fill the file system to the last block."""
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"x" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_checkpoint_that_cannot_be_written_is_not_acknowledged(
    short_tmp: Path, small_fs: Path
) -> None:
    daemon = DaemonProcess(short_tmp, "--allow", str(small_fs)).start()
    try:
        with RawClient(daemon.socket) as client:
            opened = create(client, str(small_fs / "ckpt.jsonl"))
            run = begin(client, opened.session_id)
            reply = client.request(
                SaveCheckpoint(
                    id=client.next_id(),
                    session_id=opened.session_id,
                    run_id=run.run_id,
                    time=now(),
                    snapshot=b'{"big":"%s"}' % (b"s" * 2 * 1024 * 1024),
                )
            )
            assert isinstance(reply, ErrorReply) and reply.code == "write_failed", reply
            failed = client.pending.pop(0)
            assert isinstance(failed, RecordFailed) and failed.message == reply.message
            loaded = client.request(
                LoadCheckpoint(id=client.next_id(), session_id=opened.session_id)
            )
            assert isinstance(loaded, CheckpointLoaded | ErrorReply), loaded
            assert getattr(loaded, "snapshot", None) is None, loaded
        assert check_file(small_fs / "ckpt.jsonl").checkpoints == 0
    finally:
        daemon.stop()


def test_run_start_that_cannot_be_written_is_not_acknowledged(
    short_tmp: Path, small_fs: Path
) -> None:
    daemon = DaemonProcess(short_tmp, "--allow", str(small_fs)).start()
    try:
        with RawClient(daemon.socket) as client:
            # Make the session_start line end 16 bytes short of a page boundary, so
            # that the run_start needs a page the full file system does not have.
            probe = create(client, str(small_fs / "probe.jsonl"), pad="")
            base = (small_fs / "probe.jsonl").stat().st_size
            path = small_fs / "edge.jsonl"
            opened = create(client, str(path), pad="p" * (4096 - 16 - base))
            assert path.stat().st_size == 4096 - 16
            del probe
            _fill(small_fs)
            reply = client.request(
                BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
            )
            assert isinstance(reply, ErrorReply) and reply.code == "write_failed", reply
        report = check_file(path)
        assert report.sound and report.runs == 0, report
    finally:
        daemon.stop()
