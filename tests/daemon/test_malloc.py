"""flightlogd starts glibc's malloc at its final thresholds: freed buffers are reused."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# Rounds of the daemon's pattern, batch after batch: buffers of a few hundred KiB,
# all freed at the end of the round.  Minor page faults over the later rounds.
_ROUNDS = """
import resource, sys
from flightlog.daemon.__main__ import tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def round():
    buffers = [bytearray(200 * 1024) for _ in range(40)]
    del buffers
round(); round()
before = faults()
for _ in range(20):
    round()
print(faults() - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_buffers_are_reused_without_faulting_them_in_again() -> None:
    tuned, untuned = _faults("tuned"), _faults("untuned")
    # 20 rounds of 8 MiB: ~40,000 pages faulted in again when glibc trims them.
    assert untuned > 10_000, untuned
    assert tuned < untuned // 100, (tuned, untuned)
