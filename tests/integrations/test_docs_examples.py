"""The framework examples of README.md and docs/integrations.md (run, twice, against a
real daemon by tests/docs/test_examples.py) cover every integration."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)


def test_every_framework_has_a_runnable_example() -> None:
    readme = (ROOT / "README.md").read_text().split("## With your framework", 1)[1]
    assert "Flightlog(" in "".join(python_blocks(readme.split("\n## ", 1)[0]))
    code = "".join(python_blocks((ROOT / "docs" / "integrations.md").read_text()))
    for line in (
        "capabilities=[Flightlog()]",
        "add_trace_processor(FlightlogProcessor())",
        '"callbacks": [FlightlogCallbackHandler()]',
    ):
        assert line in code
