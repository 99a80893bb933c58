"""The project's own checks, run as tests so the README's one test command covers them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "command",
    [("ruff", "check", "."), ("ruff", "format", "--check", ".")],
    ids=["ruff-check", "ruff-format"],
)
def test_ruff(command: tuple[str, ...]) -> None:
    result = _run(*command)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_the_source() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


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
