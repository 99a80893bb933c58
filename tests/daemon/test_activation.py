"""flightlogd under systemd's socket activation and notify protocol, for real.

``systemd-socket-activate`` listens on a path and starts the daemon on the first
connection with the socket as fd 3, exactly as a ``.socket`` unit does; a datagram
socket in the test stands in for systemd's ``NOTIFY_SOCKET``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    RecordEvent,
)
from support import DaemonProcess, RawClient, read_lines

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate not installed"
)


class NotifySocket:
    """A datagram socket collecting what the daemon tells 'systemd'."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[str] = []

    def wait_for(self, needle: str, timeout: float = 20.0) -> list[str]:
        """Collect datagrams until one contains ``needle``; all collected so far."""
        deadline = time.monotonic() + timeout
        while not any(needle in m for m in self.messages):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {needle!r} in {self.messages}")
            self.sock.settimeout(remaining)
            self.messages.append(self.sock.recv(4096).decode())
        return self.messages

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(short_tmp: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(short_tmp / "notify")
    yield sock
    sock.close()


def _activate(base: Path, notify: NotifySocket, *env: str) -> subprocess.Popen[bytes]:
    socket_path = base / "act.sock"
    command = [
        "systemd-socket-activate",
        "--listen",
        str(socket_path),
        "-E",
        f"NOTIFY_SOCKET={notify.path}",
        "-E",
        "WATCHDOG_USEC=200000",
        "-E",
        f"PYTHONPATH={os.pathsep.join(sys.path)}",
        *(arg for item in env for arg in ("-E", item)),
        sys.executable,
        "-m",
        "flightlog.daemon",
        "--root",
        str(base / "root"),
        "--socket",
        str(base / "unused.sock"),
    ]
    with (base / "daemon.log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    # The socket's file appears at bind(), before listen(): until then a connection is
    # refused.  A probe that connects and leaves is a client the daemon takes in stride.
    deadline = time.monotonic() + 20
    while True:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            proc.wait()
            raise RuntimeError((base / "daemon.log").read_text())
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(socket_path))
            return proc
        except (FileNotFoundError, ConnectionRefusedError):
            time.sleep(0.01)


def _record_session(socket_path: str, path: str, count: int) -> str:
    with RawClient(socket_path) as client:
        opened = client.request(Create(id=client.next_id(), path=path))
        run = client.request(
            BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
        )
        for n in range(count):
            client.send(
                RecordEvent(
                    session_id=opened.session_id,
                    run_id=run.run_id,
                    event_type="turn_start",
                    time=now(),
                    data=b'{"turn_index":%d}' % n,
                )
            )
        client.request(
            CloseRun(
                id=client.next_id(), session_id=opened.session_id, run_id=run.run_id, time=now()
            )
        )
        client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
        return str(opened.session_id)


def test_activated_daemon_records_and_notifies_in_order(
    short_tmp: Path, notify: NotifySocket
) -> None:
    proc = _activate(short_tmp, notify)
    try:
        # The first connection starts the daemon, which serves it on the inherited socket.
        _record_session(str(short_tmp / "act.sock"), "activated.jsonl", 50)
        lines = read_lines(short_tmp / "root" / "activated.jsonl")
        assert [line["seq"] for line in lines] == list(range(1, 54))
        assert not (short_tmp / "unused.sock").exists(), "--socket must be ignored when activated"
        notify.wait_for("READY=1")
        messages = notify.wait_for("WATCHDOG=1")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        messages = notify.wait_for("STOPPING=1")
        states = [
            m for m in messages if m.split("\n")[0] in ("READY=1", "WATCHDOG=1", "STOPPING=1")
        ]
        first = {
            name: next(i for i, m in enumerate(states) if m.startswith(name))
            for name in ("READY=1", "WATCHDOG=1", "STOPPING=1")
        }
        assert first["READY=1"] < first["WATCHDOG=1"] < first["STOPPING=1"]
        assert any(m.startswith("STATUS=") or "\nSTATUS=" in m for m in messages)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_under_activation_drains_a_connected_writer(
    short_tmp: Path, notify: NotifySocket
) -> None:
    proc = _activate(short_tmp, notify)
    try:
        with RawClient(str(short_tmp / "act.sock")) as client:
            opened = client.request(Create(id=client.next_id(), path="draining.jsonl"))
            run = client.request(
                BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
            )
            for n in range(2000):
                client.send(
                    RecordEvent(
                        session_id=opened.session_id,
                        run_id=run.run_id,
                        event_type="turn_start",
                        time=now(),
                        data=b'{"turn_index":%d}' % n,
                    )
                )
            notify.wait_for("READY=1")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        lines = read_lines(short_tmp / "root" / "draining.jsonl")
        # Everything the writer sent before the signal is on disk; the run was
        # interrupted, so it has no run_close.
        assert [line["seq"] for line in lines] == list(range(1, 2003))
        assert lines[-1]["type"] == "turn_start"
        notify.wait_for("STOPPING=1")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_log_lines_carry_syslog_priorities_when_stderr_is_the_journal(short_tmp: Path) -> None:
    # journald sets JOURNAL_STREAM to the device and inode of the stream it hands the
    # service as stderr; here that stream is the log file itself.
    log_path = short_tmp / "journal.log"
    log_path.touch()
    st = log_path.stat()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flightlog.daemon",
                "--socket",
                str(short_tmp / "j.sock"),
                "--root",
                str(short_tmp / "root"),
            ],
            stderr=log,
            env={**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"},
        )
    try:
        deadline = time.monotonic() + 20
        while not (short_tmp / "j.sock").exists():
            assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()
            time.sleep(0.01)
        with RawClient(str(short_tmp / "j.sock")) as client:
            client.request(Create(id=client.next_id(), path="../escape.jsonl"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = log_path.read_text().splitlines()
    assert lines
    priorities = {line[: line.index(">") + 1] for line in lines}
    assert priorities <= {"<3>", "<4>", "<6>", "<7>"}
    assert any(line.startswith("<6>") and '"listening"' in line for line in lines)
    assert any(line.startswith("<4>") and '"refused"' in line for line in lines)


def test_plain_json_lines_when_stderr_is_not_the_journal(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket):
        pass
    first = daemon.log.splitlines()[0]
    assert first.startswith("{")
    assert json.loads(first)["event"] == "listening"
