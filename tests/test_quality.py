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
