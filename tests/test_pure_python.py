"""The Python path the C accelerators replace runs too: the protocol's, the SDK's and
the daemon's tests again, in a pytest of their own with ``FLIGHTLOG_NO_SPEEDUPS=1``
(their daemons, forked from that pytest's fork server or started fresh, inherit it).
That pytest checks, before any test, that no accelerator was loaded
(tests/conftest.py, ``pytest_sessionstart``).

Opt-in for now (``--soak``): it repeats about 330 s of CPU, more than the whole tier's
budget leaves, and its first runs, on a machine loaded far past its 2 cores, failed 9
tests on timeouts and rates (the same kinds fail there with the accelerators on)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support import TESTS


@pytest.mark.soak
@pytest.mark.parametrize("directory", ["protocol", "sdk", "daemon"])
def test_the_tests_pass_with_the_accelerators_off(directory: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", f"tests/{directory}", "-n", "0", "-q"],
        cwd=TESTS.parent,
        env={**os.environ, "FLIGHTLOG_NO_SPEEDUPS": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "accelerators off" in done.stdout, done.stdout[-2000:]
