"""``flightlog tail`` where it used to differ from docs/cli.md: a local file is read
directly whether or not a daemon runs, ``--run`` matching nothing exits 2, a follow cut
short by the daemon's shutdown exits 4; and ``--version``, ``check``'s wording."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from flightlog.protocol.events import (
    TurnEnd,
    TurnStart,
)
from flightlog.sdk import connect
from support import DaemonProcess, read_lines, wait_for


def _flightlog_env(daemon: DaemonProcess) -> dict[str, str]:
    return {
        **os.environ,
        "FLIGHTLOG_SOCKET": daemon.socket,
        "FLIGHTLOG_ROOT": str(daemon.root),
    }


def flightlog(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightlog.cli", *args],
        capture_output=True,
        text=True,
        env=_flightlog_env(daemon),
        timeout=60,
    )


@contextlib.contextmanager
def _following(daemon: DaemonProcess, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``flightlog tail -f ARGS``, subscribed by the time this yields."""
    with connect(daemon.socket) as client:
        before = client.status().subscribers
        proc = subprocess.Popen(
            [sys.executable, "-m", "flightlog.cli", "tail", "-f", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_flightlog_env(daemon),
        )
        try:
            wait_for(lambda: client.status().subscribers > before, timeout=30)
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _record(daemon: DaemonProcess, path: str, *, runs: int = 1, close: bool = True) -> str:
    """A session of ``runs`` runs of two records each; returns the last run's id."""
    with connect(daemon.socket) as client:
        session = client.create(path)
        for _ in range(runs):
            with session.begin_run() as run:
                run.record(TurnStart(turn_index=0))
                run.record(TurnEnd(turn_index=0, stop_reason="end_turn"))
        if close:
            session.close()
    return run.run_id


def test_a_local_file_outside_the_roots_is_read_while_a_daemon_runs(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    _record(daemon, "s.jsonl")
    elsewhere = tmp_path / "copied.jsonl"  # no daemon root, no --allow
    elsewhere.write_bytes((daemon.root / "s.jsonl").read_bytes())
    result = flightlog(daemon, "tail", "--json", str(elsewhere))
    assert result.returncode == 0, result.stderr
    assert result.stdout.encode() == elsewhere.read_bytes()


def test_a_file_under_the_root_reads_the_same_with_or_without_a_daemon(
    daemon: DaemonProcess,
) -> None:
    _record(daemon, "t.jsonl")
    with_daemon = flightlog(daemon, "tail", "--json", "t.jsonl")
    daemon.stop()
    without = flightlog(daemon, "tail", "--json", "t.jsonl")
    assert with_daemon.returncode == without.returncode == 0, without.stderr
    assert with_daemon.stdout == without.stdout == (daemon.root / "t.jsonl").read_text()


@pytest.mark.parametrize("grace", ["-1", "nan"])
def test_a_negative_reconnect_grace_exits_2(daemon: DaemonProcess, grace: str) -> None:
    result = flightlog(daemon, "tail", "-f", "--reconnect-grace", grace, "g.jsonl")
    assert result.returncode == 2
    assert "--reconnect-grace takes a number of seconds, 0 or more" in result.stderr


def test_run_matching_nothing_exits_2(daemon: DaemonProcess) -> None:
    run_id = _record(daemon, "r.jsonl", runs=2)
    result = flightlog(daemon, "tail", "--run", "ffff", "r.jsonl")
    assert result.returncode == 2
    assert "no run 'ffff' in r.jsonl" in result.stderr
    assert result.stdout == ""
    # A run whose records are all filtered out by --type still exists.
    result = flightlog(daemon, "tail", "--run", run_id[:6], "--type", "checkpoint", "r.jsonl")
    assert (result.returncode, result.stdout) == (0, "")
    result = flightlog(daemon, "tail", "--json", "--run", run_id, "r.jsonl")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["type"] for r in lines] == ["run_start", "turn_start", "turn_end", "run_close"]


def test_a_follow_whose_run_never_came_exits_2(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("f.jsonl")
        with _following(daemon, "--run", "ffff", "f.jsonl") as proc:
            with session.begin_run() as run:
                run.record(TurnStart(turn_index=0))
            session.close()
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err
    assert "the writer closed the session" in err
    assert "no run 'ffff' in f.jsonl" in err


@pytest.mark.parametrize("args", [["d.jsonl"], ["--all"]])
def test_a_follow_cut_short_by_the_daemons_shutdown_exits_4(
    daemon: DaemonProcess, args: list[str]
) -> None:
    # The daemon does not come back within the grace (a restart within it is ridden
    # through: tests/faults/test_tail_restarts.py).
    with connect(daemon.socket) as client:
        session = client.create("d.jsonl")
        with _following(daemon, "--reconnect-grace", "0.2", *args) as proc:
            with session.begin_run() as run:
                run.record(TurnStart(turn_index=0))
            session.sync()
            assert proc.stdout is not None
            while " turn_start " not in proc.stdout.readline():
                pass
            assert daemon.terminate() == 0
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 4, err
    assert ("the daemon is shutting down" in err) or ("the daemon closed the connection" in err)
    assert "Traceback" not in err


def test_version(daemon: DaemonProcess) -> None:
    result = flightlog(daemon, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"flightlog {version('flightlog-sdk')}\n"


def test_check_counts_in_the_singular_and_the_plural(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("c.jsonl")
        with session.begin_run() as run:
            run.save_checkpoint({"step": 1})
        session.close()
    result = flightlog(daemon, "check", "c.jsonl")
    assert result.returncode == 0, result.stderr
    assert len(read_lines(daemon.root / "c.jsonl")) == 4
    assert "sound, 4 records (last seq 4), 1 run, 1 checkpoint\n" in result.stdout
