"""The fork server (tests/support/forkserver.py) starts daemons that behave as fresh
``python -m flightlog.daemon`` processes: the same exit statuses, the same log, signals
to the process itself; and it starts a fresh one where a fork could differ."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
from pathlib import Path

import pytest

from flightlog.sdk import connect
from support import DaemonProcess, wait_for
from support.daemon import log_events
from support.forkserver import DaemonHandle


def _both(short_tmp: Path, *args: str) -> tuple[DaemonProcess, DaemonProcess]:
    forked = DaemonProcess(short_tmp / "forked", *args)
    fresh = DaemonProcess(short_tmp / "fresh", *args, env={"FLIGHTLOG_TEST_EXEC": "1"})
    return forked, fresh


def test_a_forked_daemon_serves_and_drains_as_a_fresh_one(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forked = DaemonProcess(short_tmp / "forked", "--log-format", "json").start()
    assert isinstance(forked.proc, DaemonHandle)
    monkeypatch.setenv("FLIGHTLOG_TEST_EXEC", "1")
    fresh = DaemonProcess(short_tmp / "fresh", "--log-format", "json").start()
    assert isinstance(fresh.proc, subprocess.Popen)
    for daemon in (forked, fresh):
        with connect(daemon.socket) as client:
            session = client.create("a.jsonl")
            with session.begin_run():
                pass
            session.close()
        assert (daemon.root / "a.jsonl").exists()
        assert daemon.terminate() == 0, daemon.log
        assert not daemon.alive()
    # The same log, event for event (times, pids and paths aside).
    events = [[event["event"] for event in log_events(d)] for d in (forked, fresh)]
    assert events[0] == events[1]
    assert len(events[0]) > 2, forked.log


def test_a_forked_daemon_dies_of_sigkill_and_is_refused_bad_arguments_as_a_fresh_one(
    short_tmp: Path,
) -> None:
    forked, fresh = _both(short_tmp)
    for daemon in (forked, fresh):
        daemon.start()
        daemon.kill()
        assert daemon.proc is not None and daemon.proc.returncode == -signal.SIGKILL
    forked, fresh = _both(short_tmp / "bad", "--max-frame-size", "12")
    codes = []
    for daemon in (forked, fresh):
        daemon.start(wait=False)
        assert daemon.proc is not None
        codes.append(daemon.proc.wait(timeout=60))
    assert codes == [2, 2]
    assert forked.log.splitlines()[-1] == fresh.log.splitlines()[-1]
    assert "is not a whole number" in forked.log


def test_a_daemon_whose_start_up_could_differ_is_started_fresh(short_tmp: Path) -> None:
    pure = DaemonProcess(short_tmp / "pure", env={"FLIGHTLOG_NO_SPEEDUPS": "1"})
    other = DaemonProcess(short_tmp / "malloc", env={"MALLOC_ARENA_MAX": "2"})
    runtime = DaemonProcess(short_tmp / "runtime", env={"FLIGHTLOG_RING": "0"})
    limited = DaemonProcess(short_tmp / "limited")
    try:
        pure.start()
        other.start()
        runtime.start()
        limited.start(preexec_fn=os.setpgrp)
        assert isinstance(pure.proc, subprocess.Popen)
        assert isinstance(other.proc, subprocess.Popen)
        assert isinstance(limited.proc, subprocess.Popen)
        assert isinstance(runtime.proc, DaemonHandle)
    finally:
        for daemon in (pure, other, runtime, limited):
            daemon.stop()


def test_a_daemon_dropped_while_it_runs_is_killed_not_leaked(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that fails before it stops its daemon drops the DaemonProcess later, in
    another test: its daemon is killed then, and a fresh one's Popen is not collected
    while its process runs (a ResourceWarning, an error in whichever test ran)."""
    forked = DaemonProcess(short_tmp / "forked").start()
    monkeypatch.setenv("FLIGHTLOG_TEST_EXEC", "1")
    fresh = DaemonProcess(short_tmp / "fresh").start()
    assert isinstance(forked.proc, DaemonHandle)
    assert isinstance(fresh.proc, subprocess.Popen)
    pids = [forked.pid, fresh.pid]
    del forked, fresh
    gc.collect()
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids))
