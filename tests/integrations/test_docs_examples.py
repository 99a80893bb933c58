"""The framework examples of README.md and docs/integrations.md run as written, twice, and
record what they say, against a real daemon."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flightlog.sdk import check
from support import DaemonProcess, run_python

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def readme_examples() -> list[str]:
    section = (ROOT / "README.md").read_text().split("## With your framework", 1)[1]
    return python_blocks(section.split("\n## ", 1)[0])


EXAMPLES = {
    **{f"readme-{n}": code for n, code in enumerate(readme_examples())},
    **{
        f"integrations-{n}": code
        for n, code in enumerate(python_blocks((ROOT / "docs" / "integrations.md").read_text()))
    },
}


def test_every_framework_has_an_example() -> None:
    code = "\n".join(EXAMPLES.values())
    for name in (
        "Flightlog()",
        "add_trace_processor(FlightlogProcessor())",
        "FlightlogCallbackHandler()",
    ):
        assert name in code


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_example_runs_twice_and_records(name: str, daemon: DaemonProcess) -> None:
    env = {"FLIGHTLOG_SOCKET": daemon.socket, "OPENAI_API_KEY": ""}
    for _ in range(2):
        proc = run_python(EXAMPLES[name], env=env)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        assert b"flightlog could not record" not in err, err.decode()
        assert out.strip()
    files = sorted(daemon.root.rglob("*.jsonl"))
    if (
        "import Flightlog" in EXAMPLES[name]
        or "Processor()" in EXAMPLES[name]
        or "Handler()" in EXAMPLES[name]
    ):
        assert files, "the example recorded nothing"
    for path in files:
        report = check(path)
        assert report.sound and report.open_runs == [], (path, report)
        assert report.runs >= 2
