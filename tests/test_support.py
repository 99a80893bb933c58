"""The support package's own promises: a process a test started does not outlive it."""

from __future__ import annotations

import signal
import subprocess

import pytest

from support import communicate, reaped, run_python

SLEEPS = "import time; time.sleep(600)"


def test_a_process_that_outlives_the_timeout_is_killed_and_reaped() -> None:
    proc = run_python(SLEEPS)
    with pytest.raises(subprocess.TimeoutExpired):
        communicate(proc, timeout=0.1)
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout is not None and proc.stdout.closed


def test_processes_still_running_when_a_block_fails_are_killed_and_reaped() -> None:
    done = run_python("pass")
    done.communicate(timeout=60)
    running = run_python(SLEEPS)
    with pytest.raises(AssertionError), reaped(done, running):
        raise AssertionError("a failed test")
    assert done.returncode == 0
    assert running.returncode == -signal.SIGKILL
