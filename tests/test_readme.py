"""The README's recording example runs as written, against a real daemon."""

from __future__ import annotations

import re
from pathlib import Path

from flightlog.sdk import check, read
from support import DaemonProcess, run_python

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_recording_example_works(daemon: DaemonProcess) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    example = next(block for block in blocks if "connect()" in block)
    agent = run_python(example, env={"FLIGHTLOG_SOCKET": daemon.socket})
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err.decode()
    path = daemon.root / "demo" / "hello.jsonl"
    assert check(path).sound
    assert [r.type for r in read(path)] == [
        "session_start",
        "run_start",
        "agent_start",
        "agent_end",
        "run_close",
    ]


def test_the_readme_names_the_ci_test_command() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    command = "uv run --frozen pytest"
    assert command in ci
    assert f"python3 -m pip install uv && {command}" in README.read_text()
