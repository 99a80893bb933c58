"""flightlogd starts glibc's malloc at its final thresholds: freed buffers are reused."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from flightlog.daemon._budget import ConnectionBudget, MemoryBudget

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


def test_the_budget_trims_once_use_falls_after_a_high_and_again_at_zero() -> None:
    """The trim when use falls under an eighth leaves what the last eighth held: the
    daemon trims again once nothing is held (before: 8 MiB of 64 MiB stayed).  A high
    is over a quarter of the budget (subscriptions take at most half of it)."""
    trims: list[int] = []
    budget = MemoryBudget(800, trim=lambda: trims.append(budget.used))
    big, small = ConnectionBudget(budget), ConnectionBudget(budget)
    small.charge(50)
    big.charge(100)
    big.discharge(100)
    assert trims == []  # never over a quarter
    big.charge(500)
    big.discharge(500)
    assert trims == [50]  # under an eighth
    small.discharge(50)
    assert trims == [50, 0]  # and nothing held
    small.charge(10)
    small.discharge(10)
    assert trims == [50, 0]  # once per high
