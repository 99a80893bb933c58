"""The project's own checks, run as tests so the README's one test command covers them."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: mypy's cache, kept for the next checkout on this machine: a checkout without one
#: checks the source's third-party packages too (pydantic-ai, the OpenAI Agents SDK
#: and what they import: about 110 s of CPU). Another checkout's cache is only a head
#: start, never trusted: mypy takes a module's cached result only when the source
#: file's hash is the one it checked (its path and time may differ).
SHARED_MYPY_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flightlog" / "mypy"
)


#: A deadline, not a measurement: mypy without a cache takes about 110 s of CPU, which
#: is a quarter of an hour on a loaded machine.
DEADLINE = 3000


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE
    )


@pytest.mark.parametrize(
    "command",
    [("ruff", "check", "."), ("ruff", "format", "--check", ".")],
    ids=["ruff-check", "ruff-format"],
)
def test_ruff(command: tuple[str, ...]) -> None:
    result = _run(*command)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(DEADLINE)
def test_mypy_strict_on_the_source() -> None:
    cache = ROOT / ".mypy_cache"  # mypy's own, in the checkout
    if not cache.exists():
        with contextlib.suppress(OSError):
            shutil.copytree(SHARED_MYPY_CACHE, cache)
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
    _keep_for_the_next_checkout(cache)


def _keep_for_the_next_checkout(cache: Path) -> None:
    """Copy ``cache`` to :data:`SHARED_MYPY_CACHE`, replacing it in one rename (a run
    beside this one reads the old cache or the new one, never half of one)."""
    new = SHARED_MYPY_CACHE.with_name(f"mypy.new.{os.getpid()}")
    old = SHARED_MYPY_CACHE.with_name(f"mypy.old.{os.getpid()}")
    with contextlib.suppress(OSError):
        SHARED_MYPY_CACHE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(cache, new)
        with contextlib.suppress(FileNotFoundError):
            SHARED_MYPY_CACHE.rename(old)
        new.rename(SHARED_MYPY_CACHE)
    for left in (new, old):
        shutil.rmtree(left, ignore_errors=True)


def _git(*args: str) -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): nothing is committed here")
    done = subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.splitlines()


def test_gitignore_keeps_measurements_out_and_no_source() -> None:
    measurements = [
        "perf.data",
        "perf.data.old",
        "alone.data",
        "bench/loaded.data",
        "perf-1234.map",
        "profile.prof",
        "callgrind.out.77",
        "alone.txt",
        "bench.json",
        ".coverage",
    ]
    assert _git("check-ignore", "--no-index", *measurements) == measurements
    # Sources and docs stay visible, wherever they are.
    assert _git("ls-files", "--cached", "--ignored", "--exclude-standard") == []
    for kept in ("docs/figures.txt", "sdk/src/flightlog/sdk/schema.json", "bench/_new.py"):
        result = subprocess.run(["git", "check-ignore", "--no-index", "-q", kept], cwd=ROOT)
        assert result.returncode == 1, kept


def test_no_measurement_is_committed() -> None:
    tracked = _git("ls-files")
    assert [name for name in tracked if name.endswith((".data", ".prof", ".pstats"))] == []
    assert [name for name in tracked if "/" not in name and name.endswith((".txt", ".json"))] == []
