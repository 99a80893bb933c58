"""The README's quick start and CI agree (its examples run in tests/docs)."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_names_the_ci_test_command() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    command = "uv run --frozen --all-groups pytest"
    assert f"\n{command}\n" in ci
    assert f"```sh\npython3 -m pip install uv && {command}\n```" in README.read_text()


def test_the_readme_quick_start_sets_up_and_runs_the_demo() -> None:
    assert "```sh\npython3 -m pip install uv && uv run flightlog demo\n```" in README.read_text()


def test_the_ci_gets_uv_the_ways_the_readme_gives() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    text = " ".join(README.read_text().split())
    for way in (
        "pipx install uv",
        "python3 -m pip install --user uv",
        "python3 -m pip install --user --break-system-packages uv",
    ):
        assert f"`{way}`" in text
        assert way.replace(" --user", " --quiet --user") in ci or way in ci


def test_the_quick_start_ends_pointing_at_every_command() -> None:
    text = README.read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    last = quick.strip().split("\n\n")[-1]
    assert "flightlog COMMAND --help" in last
    assert "(docs/cli.md#every-command-on-a-real-session)" in last
    assert "## Every command on a real session" in (README.parent / "docs" / "cli.md").read_text()
