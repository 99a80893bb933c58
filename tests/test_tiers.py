"""The fast tier (``pytest --fast``, README) is what tests/conftest.py says: tests of the
protocol and the SDK (and the import-cycle and README checks) that start no process and
run no long property test."""

from __future__ import annotations

import contextlib
from functools import cache
from pathlib import Path

import pytest
from conftest import (
    FAST_DIRECTORIES,
    FAST_FILES,
    NOT_FAST,
    STARTS_PROCESSES,
    pytest_xdist_auto_num_workers,
)

TESTS = Path(__file__).resolve().parent

#: One worker for the module: its collections are made once and shared.
pytestmark = pytest.mark.xdist_group("test_tiers")


class _Collected:
    """A plugin that keeps the test ids a collection selected."""

    def __init__(self) -> None:
        self.nodes: tuple[str, ...] = ()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.nodes = tuple(item.nodeid for item in session.items)


@cache
def _collect(*args: str) -> tuple[str, ...]:
    """What ``pytest --collect-only ARGS`` selects, run in this process (a pytest of
    its own would cost seconds of imports before it collected anything), from the
    repository's root as the README's command runs."""
    collected = _Collected()
    with contextlib.chdir(TESTS.parent):
        # -n 0: xdist's workers would each collect everything again, to no purpose.
        code = pytest.main(
            ["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", *args],
            plugins=[collected],
        )
    assert code == pytest.ExitCode.OK, (code, args)
    return collected.nodes


def test_the_fast_tier_starts_no_process() -> None:
    nodes = _collect("--fast")
    assert len(nodes) > 500, nodes  # the protocol's and the SDK's own tests
    files = {node.split("::")[0] for node in nodes}
    for name in files:
        relative = Path(name).relative_to("tests")
        assert relative.parts[0] in FAST_DIRECTORIES or relative.as_posix() in FAST_FILES
        text = (TESTS.parent / name).read_text()
        assert not [word for word in STARTS_PROCESSES if word in text], name
    # A test with a daemon, and a long property test, of the same places are left out.
    assert not any("test_e2e.py" in node for node in nodes)
    long_property = (
        "test_speedups.py::"
        "test_json_is_accepted_as_python_accepts_it_and_never_where_python_refuses_once_mutated"
    )
    assert not any(node.endswith(long_property) for node in nodes)
    assert "tests/protocol/test_codec.py" in files
    assert "tests/sdk/test_client_sync.py" in files


def test_the_fast_marker_selects_the_same_tests() -> None:
    places = ["tests/protocol", "tests/sdk", *(f"tests/{name}" for name in FAST_FILES)]
    assert set(_collect("-m", "fast", *places)) == set(_collect("--fast"))


def test_the_tests_kept_out_of_the_fast_tier_are_there() -> None:
    """The slow tests of the fast places (:data:`conftest.NOT_FAST`) exist under their
    names, and run in the whole suite only."""
    files = sorted({f"tests/{name.split('::')[0]}" for name in NOT_FAST})
    collected = {node.removeprefix("tests/") for node in _collect(*files)}
    assert collected >= NOT_FAST
    assert not {f"tests/{name}" for name in NOT_FAST} & set(_collect("--fast"))


def test_the_fast_tier_runs_in_one_process() -> None:
    """``-n auto`` picks no worker for ``--fast``: each would import and collect it all
    again, for tests a few milliseconds long; any other run gets xdist's own count."""

    class Options:
        def __init__(self, fast: bool) -> None:
            self.fast = fast

        def getoption(self, name: str) -> bool:
            assert name == "--fast"
            return self.fast

    assert pytest_xdist_auto_num_workers(Options(fast=True)) == 0
    assert pytest_xdist_auto_num_workers(Options(fast=False)) is None


def test_a_group_runs_on_one_worker(request: pytest.FixtureRequest) -> None:
    """``--dist loadgroup`` (pyproject.toml) sends a group's tests to one worker: xdist
    adds the group to each test's id, which pytest 9.2 ignored (every module's daemon,
    and Phoenix, then started on each worker). Checked in the whole suite's own run."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by a worker of --dist loadgroup (-n 0)")
    assert request.node.nodeid.endswith("@test_tiers"), request.node.nodeid
