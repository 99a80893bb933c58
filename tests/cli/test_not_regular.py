"""A FIFO, a socket or a device named like a session file (``x.jsonl``, ``x.jsonl.zst``)
in a data root: every command that lists the root leaves it out (and says so where it
reports skipped files), a direct path to one is a clear error, and nothing waits for a
writer that never comes.  Real ``flightlog`` processes over a real daemon's root, each
with a deadline: a reader opening a FIFO with no writer would block for ever."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol import events
from flightlog.sdk import connect
from support import DaemonProcess

#: Far past what any of these commands takes; only a hang reaches it.
DEADLINE = 120


@pytest.fixture(scope="module")
def daemon(module_daemon: DaemonProcess) -> DaemonProcess:
    return module_daemon


@pytest.fixture(scope="module")
def root(daemon: DaemonProcess) -> Iterator[Path]:
    """The daemon's root: one closed session ``proj/y.jsonl`` beside a FIFO named like a
    session, another named like a compressed one, and a socket named like one."""
    with connect(daemon.socket) as client:
        session = client.create("proj/y.jsonl", meta={"name": "real"})
        with session.begin_run() as run:
            run.record(events.AgentStart(agent="finder"))
        session.close()
    proj = daemon.root / "proj"
    os.mkfifo(proj / "x.jsonl")
    os.mkfifo(proj / "x.jsonl.zst")
    # A Unix socket's path must be short: bound from inside the directory.
    listener = socket.socket(socket.AF_UNIX)
    here = os.getcwd()
    os.chdir(proj)
    try:
        listener.bind("sock.jsonl")
    finally:
        os.chdir(here)
    try:
        yield daemon.root
    finally:
        listener.close()


def flightlog(
    daemon: DaemonProcess, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightlog.cli", *args],
        env={
            **os.environ,
            "FLIGHTLOG_SOCKET": daemon.socket,
            "FLIGHTLOG_ROOT": str(daemon.root),
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )


def copy_of(root: Path, tmp_path: Path) -> Path:
    """``proj`` of the root with its session, its FIFOs and a FIFO of its own."""
    copy = tmp_path / "proj"
    copy.mkdir()
    shutil.copy(root / "proj" / "y.jsonl", copy / "y.jsonl")
    os.mkfifo(copy / "x.jsonl")
    os.mkfifo(copy / "x.jsonl.zst")
    return copy


def test_listings_leave_them_out_and_say_so(root: Path, daemon: DaemonProcess) -> None:
    fifo, sock = root / "proj" / "x.jsonl", root / "proj" / "sock.jsonl"
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and stat.S_ISSOCK(sock.lstat().st_mode)

    found = flightlog(daemon, "find", str(root), "--type", "agent_start", "--json")
    assert found.returncode == 0, found.stderr
    assert '"agent":"finder"' in found.stdout
    assert f"{fifo}: not a regular file (a FIFO); skipped" in found.stderr
    assert f"{sock}: not a regular file (a socket); skipped" in found.stderr

    listed = flightlog(daemon, "sessions", str(root), "--json")
    assert listed.returncode == 0, listed.stderr
    assert [line for line in listed.stdout.splitlines() if "y.jsonl" in line]
    assert "x.jsonl" not in listed.stdout and "sock.jsonl" not in listed.stdout

    queried = flightlog(daemon, "sql", "SELECT count(*) AS n FROM records", str(root), "--csv")
    assert queried.returncode == 0, queried.stderr
    assert queried.stdout.splitlines()[-1] == "4"  # the real session's four records
    assert f"{fifo}" in queried.stderr and "not a regular file (a FIFO)" in queried.stderr

    dry = flightlog(daemon, "vacuum", str(root), "--max-age", "0s", "--protect", "0s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "y.jsonl" in dry.stdout and "x.jsonl" not in dry.stdout


def test_tail_all_replays_the_root_and_says_the_fifo_is_skipped(
    root: Path, daemon: DaemonProcess
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "flightlog.cli", "tail", "--all", "--after", "start", "--json"],
        env={**os.environ, "FLIGHTLOG_SOCKET": daemon.socket, "FLIGHTLOG_ROOT": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        # The replay reaches the real session's last record past the FIFO (listed
        # before it).
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if '"run_close"' in line:
                break
        assert any('"agent":"finder"' in line for line in lines)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    fifo = root / "proj" / "x.jsonl"
    assert f"{fifo}: cannot read: not a regular file (a FIFO); skipped" in stderr
    assert stderr.count(f"{fifo}:") == 1


def test_export_and_compress_skip_them(root: Path, daemon: DaemonProcess, tmp_path: Path) -> None:
    copy = copy_of(root, tmp_path)
    compressed = flightlog(daemon, "compress", str(copy))
    assert compressed.returncode == 0, compressed.stderr
    assert f"skipped     {copy / 'x.jsonl'}  not a regular file (a FIFO)" in compressed.stdout
    assert f"compressed  {copy / 'y.jsonl'}" in compressed.stdout
    os.unlink(copy / "y.jsonl")  # export sends nothing, so needs no backend
    exported = flightlog(
        daemon,
        "export",
        str(copy),
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        },
    )
    assert exported.returncode == 0, exported.stderr
    assert f"{copy / 'x.jsonl'}: cannot read: not a regular file (a FIFO); skipped" in (
        exported.stderr
    )


def test_vacuum_removes_the_sessions_and_leaves_the_fifos(
    root: Path, daemon: DaemonProcess, tmp_path: Path
) -> None:
    copy = copy_of(root, tmp_path)
    vacuumed = flightlog(daemon, "vacuum", str(copy), "--max-use", "0", "--protect", "0s")
    assert vacuumed.returncode == 0, vacuumed.stderr
    assert vacuumed.stdout.splitlines()[-1].startswith("1 files, freed")
    assert sorted(p.name for p in copy.iterdir()) == ["x.jsonl", "x.jsonl.zst"]


@pytest.mark.parametrize(
    "command",
    [
        ["show"],
        ["check"],
        ["inspect"],
        ["tail"],
        ["find", "--type", "agent_start"],
        ["compress"],
    ],
)
def test_a_direct_path_to_a_fifo_is_a_clear_error(
    root: Path, daemon: DaemonProcess, command: list[str]
) -> None:
    fifo = root / "proj" / "x.jsonl"
    result = flightlog(daemon, *command, str(fifo))
    said = result.stdout + result.stderr  # check reports on stdout
    assert result.returncode != 0
    assert f"{fifo}: " in said and "not a regular file (a FIFO)" in said


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_a_device_named_like_a_session_is_never_read(daemon: DaemonProcess, tmp_path: Path) -> None:
    device = tmp_path / "zero.jsonl"
    os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null
    listed = flightlog(daemon, "find", str(tmp_path), "--json")
    assert listed.returncode == 0, listed.stderr
    assert f"{device}: not a regular file (a character device); skipped" in listed.stderr
    shown = flightlog(daemon, "show", str(device))
    assert shown.returncode != 0 and "not a regular file (a character device)" in shown.stderr
