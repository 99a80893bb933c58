"""The daemon as a process: one per socket and per data root, a stale socket cleaned
up, and the orderly shutdown on SIGTERM (and the forced one on a second signal)."""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    ErrorReply,
    LoadCheckpoint,
    Open,
    SaveCheckpoint,
    Status,
    encode_frame,
)
from support import DaemonProcess, RawClient, read_lines
from support.daemon import (
    assert_serving,
    begin,
    check_file,
    create,
    fact,
    log_events,
    wait_for_log,
)

# ------------------------------------------------------------ one daemon only


def _second_daemon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightlog.daemon", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_second_daemon_on_the_same_socket_is_refused(daemon: DaemonProcess) -> None:
    second = _second_daemon("--socket", daemon.socket, "--root", str(daemon.base / "other-root"))
    assert second.returncode == 1, second.stderr
    assert f"pid {daemon.pid}" in second.stderr
    assert daemon.socket in second.stderr
    assert "Traceback" not in second.stderr
    assert daemon.alive()
    assert os.path.exists(daemon.socket)
    assert_serving(daemon)


def test_second_daemon_on_the_same_root_is_refused(daemon: DaemonProcess) -> None:
    other_socket = str(daemon.base / "run" / "other.sock")
    second = _second_daemon("--socket", other_socket, "--root", str(daemon.root))
    assert second.returncode == 1, second.stderr
    assert f"pid {daemon.pid}" in second.stderr
    assert str(daemon.root) in second.stderr
    assert "Traceback" not in second.stderr
    assert not os.path.exists(other_socket)
    assert_serving(daemon)


def test_stale_socket_of_a_killed_daemon_is_removed(short_tmp: Path) -> None:
    first = DaemonProcess(short_tmp).start()
    first.kill()
    assert os.path.exists(first.socket)  # left behind
    with (
        pytest.raises(ConnectionRefusedError),
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe,
    ):
        probe.connect(first.socket)
    second = DaemonProcess(short_tmp).start()
    try:
        wait_for_log(second, event="stale_socket_removed", socket=second.socket)
        assert_serving(second)
    finally:
        second.stop()


def test_a_second_daemon_cannot_write_a_session_the_first_holds(
    short_tmp: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    first = DaemonProcess(short_tmp / "a", "--allow", str(shared)).start()
    second = DaemonProcess(short_tmp / "b", "--allow", str(shared)).start()
    try:
        with RawClient(first.socket) as one, RawClient(second.socket) as two:
            opened = create(one, str(shared / "s.jsonl"))
            reply = two.request(Open(id=two.next_id(), path=str(shared / "s.jsonl")))
            assert isinstance(reply, ErrorReply) and reply.code == "session_busy", reply
            assert "locked by another process" in reply.message
            run = begin(one, opened.session_id)
            assert run.seq == 2
        assert check_file(shared / "s.jsonl").sound
    finally:
        first.stop()
        second.stop()


def test_a_file_in_place_of_the_socket_is_not_replaced(short_tmp: Path) -> None:
    (short_tmp / "run").mkdir(mode=0o700)
    (short_tmp / "run" / "flightlog.sock").write_text("precious")
    result = _second_daemon(
        "--socket", str(short_tmp / "run" / "flightlog.sock"), "--root", str(short_tmp / "root")
    )
    assert result.returncode == 1
    assert "not a socket" in result.stderr
    assert (short_tmp / "run" / "flightlog.sock").read_text() == "precious"


# ------------------------------------------------------------------ shutdown

STAGES = [
    "signal_received",
    "shutdown_started",
    "stopped_listening",
    "connections_closed",
    "sessions_closing",
    "stopped",
]


def test_sigterm_with_writers_mid_run_lands_everything_and_exits_0(
    daemon: DaemonProcess,
) -> None:
    writers = [RawClient(daemon.socket, client=f"writer-{i}") for i in range(3)]
    sessions = []
    try:
        for i, client in enumerate(writers):
            opened = create(client, f"term/{i}.jsonl")
            run = begin(client, opened.session_id)
            checkpoint = client.request(
                SaveCheckpoint(
                    id=client.next_id(),
                    session_id=opened.session_id,
                    run_id=run.run_id,
                    time=now(),
                    snapshot=b'{"step":1}',
                )
            )
            assert checkpoint.seq == 3
            sessions.append((opened.session_id, run.run_id))
        # Each writer pipelines 3,000 records; the last of them are still in the
        # socket buffers, unread, when the signal comes.
        for client, (session_id, run_id) in zip(writers, sessions, strict=True):
            client.send_bytes(
                b"".join(
                    encode_frame(
                        fact(session_id, run_id, n, data=b'{"n":%d,"pad":"%s"}' % (n, b"p" * 500))
                    )
                    for n in range(3000)
                )
            )
        assert daemon.terminate() == 0, daemon.log
        for client in writers:
            assert client.closed_by_daemon()
    finally:
        for client in writers:
            client.close()

    for i, (_, run_id) in enumerate(sessions):
        path = daemon.root / "term" / f"{i}.jsonl"
        report = check_file(path)
        assert report.sound and not report.unfinished_tail, report
        assert report.last_seq == 3 + 3000
        assert report.open_runs == [run_id]  # the run stays without run_close
        lines = read_lines(path)
        assert [line["data"]["n"] for line in lines[3:]] == list(range(3000))

    events = log_events(daemon)
    stages = [e["event"] for e in events if e["event"] in STAGES]
    assert stages == STAGES, stages
    closed = [e for e in events if e["event"] == "session_closed"]
    assert sorted(e["session_id"] for e in closed) == sorted(s for s, _ in sessions)
    assert all(e["error"] is None for e in closed)
    assert not os.path.exists(daemon.socket)


def test_frames_still_in_the_socket_buffer_at_sigterm_land(daemon: DaemonProcess) -> None:
    """Records the client sent before the signal land even when the daemon had not
    read them yet: here its reader is held back (the session's actor waits for the
    client to read big checkpoint replies) until after shutdown has begun."""
    with RawClient(daemon.socket) as client:
        opened = create(client, "inflight.jsonl")
        run = begin(client, opened.session_id)
        saved = client.request(
            SaveCheckpoint(
                id=client.next_id(),
                session_id=opened.session_id,
                run_id=run.run_id,
                time=now(),
                snapshot=b'{"big":"%s"}' % (b"c" * 64 * 1024),
            )
        )
        assert isinstance(saved, Ack), saved
        loads = b"".join(
            encode_frame(LoadCheckpoint(id=client.next_id(), session_id=opened.session_id))
            for _ in range(400)
        )
        client.sock.sendall(loads)
        # The actor now waits for the client to read its replies; the reader fills
        # the actor's mailbox and then waits too; the rest stays in the socket.
        client.sock.setblocking(False)
        pad = b"r" * 1000
        ends: list[int] = []  # where each record's frame ends in the stream
        stream = bytearray()
        accepted = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(stream) - accepted < 64 * 1024:
                for _ in range(64):
                    n = len(ends)
                    data = b'{"n":%d,"pad":"%s"}' % (n, pad)
                    stream += encode_frame(fact(opened.session_id, run.run_id, data=data))
                    ends.append(len(stream))
            try:
                accepted += client.sock.send(stream[accepted:])
            except BlockingIOError:
                # Full for now; once the daemon's mailbox is full it stays full.  (A
                # daemon slowed by a loaded machine can also leave it so for a while,
                # before its mailbox is full: then it reads on.)
                _, writable, _ = select.select([], [client.sock], [], 0.5)
                if not writable and sum(1 for end in ends if end <= accepted) > 1024 + 64:
                    break
        sent = sum(1 for end in ends if end <= accepted)  # a torn last frame never lands
        assert sent > 1024 + 64  # more than the mailbox holds
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        wait_for_log(daemon, event="shutdown_started")
        # Only now may the daemon go on: read what it sends, to the end.
        client.sock.setblocking(True)
        assert client.closed_by_daemon(timeout=30)
    assert daemon.proc.wait(timeout=30) == 0, daemon.log
    lines = read_lines(daemon.root / "inflight.jsonl")
    assert [line["data"]["n"] for line in lines[3:]] == list(range(sent))
    assert check_file(daemon.root / "inflight.jsonl").sound


def test_sigterm_when_idle_exits_0(daemon: DaemonProcess) -> None:
    assert daemon.terminate() == 0
    stages = [e["event"] for e in log_events(daemon) if e["event"] in STAGES]
    assert stages == STAGES


def _stall(client: RawClient) -> None:
    """Send status requests and never read a reply, until the daemon stops reading
    this connection: its replies fill the socket, its outbox fills, its reader waits."""
    client.sock.setblocking(False)
    frame = encode_frame(Status(id=1))
    burst = frame * 1000
    while True:
        try:
            client.sock.send(burst)
        except BlockingIOError:
            return
        except OSError as exc:  # pragma: no cover - nothing else is expected
            assert exc.errno == errno.EAGAIN
            return


def test_connection_that_never_drains_is_cancelled_after_the_grace_period(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp, "--shutdown-grace", "0.2").start()
    with RawClient(daemon.socket) as writer, RawClient(daemon.socket) as staller:
        opened = create(writer, "grace.jsonl")
        run = begin(writer, opened.session_id)
        for n in range(10):
            writer.send(fact(opened.session_id, run.run_id, n))
        _stall(staller)
        assert daemon.terminate() == 0, daemon.log
    events = [e["event"] for e in log_events(daemon)]
    assert "connections_cancelled" in events
    assert events[-1] == "stopped"
    report = check_file(daemon.root / "grace.jsonl")
    assert report.sound and report.last_seq == 12, report


def test_second_sigterm_during_a_slow_drain_exits_at_once(short_tmp: Path) -> None:
    # A grace period far longer than the test's patience: only the forced exit ends it.
    daemon = DaemonProcess(short_tmp, "--shutdown-grace", "600").start()
    with RawClient(daemon.socket) as staller:
        _stall(staller)
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        wait_for_log(daemon, event="shutdown_started")
        assert daemon.alive()  # held by the stalled connection
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=30) == 2
    wait_for_log(daemon, event="forced_exit", signal="SIGTERM")


@pytest.mark.parametrize("option", ["--read-window", "--idle-timeout", "--shutdown-grace"])
@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_a_duration_option_that_is_no_number_of_seconds_is_a_usage_error(
    option: str, value: str, short_tmp: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flightlog.daemon", "--socket", str(short_tmp / "s"), option, value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"argument {option}: {value!r} is not a number of seconds >= 0" in done.stderr
    assert not (short_tmp / "s").exists()


@pytest.mark.parametrize("value", ["0", "0.05", "nan", "soon"])
def test_a_refusal_window_under_a_tenth_of_a_second_is_a_usage_error(
    value: str, short_tmp: Path
) -> None:
    """Each window wakes the daemon once: 0 would wake it without end."""
    socket_path = str(short_tmp / "s")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flightlog.daemon",
            "--socket",
            socket_path,
            "--refusal-window",
            value,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"argument --refusal-window: {value!r} is not a number of seconds >= 0.1" in (
        done.stderr
    )
    assert not (short_tmp / "s").exists()


def test_sigterm_as_soon_as_the_socket_is_there_drains(short_tmp: Path) -> None:
    """Regression: the signal handlers were installed after the socket was bound, so a
    SIGTERM sent the moment the daemon was reachable killed it (status -15)."""
    for attempt in range(5):
        daemon = DaemonProcess(short_tmp / str(attempt)).start(wait=False)
        deadline = time.monotonic() + 30
        while not os.path.exists(daemon.socket):
            assert daemon.alive() and time.monotonic() < deadline, daemon.log
            time.sleep(0.0002)
        assert daemon.terminate() == 0, daemon.log
