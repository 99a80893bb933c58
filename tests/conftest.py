from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from support import DaemonProcess

TESTS = Path(__file__).resolve().parent

#: The fast tier (``pytest -m fast``, the inner loop): the tests of these directories
#: and files that start no process and run no long property test.
FAST_DIRECTORIES = ("protocol", "sdk")
FAST_FILES = ("test_import_cycles.py", "test_readme.py")
#: A module whose source names one of these may start a process (a daemon, a Python,
#: a command): none of its tests is fast.
STARTS_PROCESSES = (
    "DaemonProcess",
    "subprocess",
    "run_python",
    "Popen",
    "os.fork",
    "multiprocessing",
    "spawn",
)
#: Fixtures that start a daemon.
DAEMON_FIXTURES = frozenset({"daemon", "module_daemon"})
#: A property test of more examples than this is not fast (the fast tier's property
#: tests run as many examples as in the whole suite, so the longer ones stay there).
FAST_EXAMPLES = 30
#: Tests of the fast places that take seconds each by themselves (the whole suite runs
#: them): a 16 MiB payload checked, a file of 100,000s of lines read.
NOT_FAST = frozenset(
    {
        "protocol/test_json.py::test_a_deep_16_mib_payload_is_checked_in_one_pass",
        "protocol/test_reader.py::test_reading_a_very_large_file_takes_constant_memory",
    }
)
#: The modules that take longest, started first so that, on several workers
#: (``pytest -n auto``), none of them is left to run alone at the end.
LONGEST = (
    "test_pure_python.py",
    "test_quality.py",
    "test_bench.py",
    "install/test_install.py",
    "docs/test_examples.py",
)
#: Modules that measure a daemon's memory: their daemons start as fresh interpreters,
#: not forked from the fork server that has imported the daemon (support.forkserver).
FRESH_DAEMONS = (
    "daemon/test_backpressure.py",
    "daemon/test_malloc.py",
    "faults/test_adversarial.py",
    "faults/test_client_faults.py",
    "faults/test_hostile_input.py",
    "faults/test_memory_budget.py",
)


#: With this set (to a number), no property test runs more examples than that: for
#: runs that repeat tests whose full runs are elsewhere (tests/test_pure_python.py).
EXAMPLES_VARIABLE = "FLIGHTLOG_TEST_EXAMPLES"


def _speedups_off() -> bool:
    return os.environ.get("FLIGHTLOG_NO_SPEEDUPS", "") not in ("", "0")


def pytest_sessionstart(session: pytest.Session) -> None:
    """With ``FLIGHTLOG_NO_SPEEDUPS`` set (tests/test_pure_python.py), no accelerator
    may be loaded: every test then runs the Python path.

    SIGINT is not left ignored: a shell starts a background job (``pytest &``, and so
    every process the suite starts) with it ignored, and a Python started so has no
    KeyboardInterrupt, so the tests of what Ctrl-C does would test the launcher."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _speedups_off():
        from flightlog.protocol import _accel

        loaded = [name for name in ("fast_check_json", "encode_record") if getattr(_accel, name)]
        if loaded:
            raise pytest.UsageError(f"FLIGHTLOG_NO_SPEEDUPS is set but {loaded} are loaded")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _speedups_off():
        terminalreporter.write_line("accelerators off: every test ran the Python path")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="run the long soak tests")
    parser.addoption(
        "--fast",
        action="store_true",
        help="the fast tier: only tests marked fast, without collecting the other modules",
    )
    parser.addoption(
        "--cpu-report",
        action="store_true",
        help="the CPU of each test, its processes and daemons included, and the top 40",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode is written, whatever the environment says: the suite starts hundreds of
    Pythons (the workers, the CLI, agents, fresh daemons), and with
    ``PYTHONDONTWRITEBYTECODE`` set (as some images do) each compiled every module it
    imported again, the frameworks' among them: about half of the integration and docs
    tests' CPU. Set before the workers start, so they and all they start inherit it."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    if config.getoption("--cpu-report"):
        from support.cputime import CpuReport

        config.pluginmanager.register(CpuReport(), "flightlog-cpu-report")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` (pyproject.toml) with ``--fast``: one process. The fast tier's tests
    are short, and each worker would import and collect them all again, which costs
    more than the second core gives back."""
    return 0 if config.getoption("--fast") else None


def _in_fast_places(path: Path) -> bool:
    relative = path.relative_to(TESTS)
    return relative.parts[0] in FAST_DIRECTORIES or relative.as_posix() in FAST_FILES


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if not config.getoption("--fast") or not collection_path.is_relative_to(TESTS):
        return None
    if collection_path == TESTS or _in_fast_places(collection_path):
        return None
    return True


@cache
def _may_start_processes(path: Path) -> bool:
    text = path.read_text()
    return any(name in text for name in STARTS_PROCESSES)


def is_fast(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to the fast tier: where it lives, and what it may start."""
    path = item.path
    if not path.is_relative_to(TESTS) or not _in_fast_places(path):
        return False
    if DAEMON_FIXTURES & set(getattr(item, "fixturenames", ())):
        return False
    if item.nodeid.removeprefix("tests/").split("[")[0] in NOT_FAST:
        return False
    hypothesis = getattr(getattr(item, "obj", None), "_hypothesis_internal_use_settings", None)
    if hypothesis is not None and hypothesis.max_examples > FAST_EXAMPLES:
        return False
    return not _may_start_processes(path)


def shared_fixture(item: pytest.Item) -> str | None:
    """The widest fixture of this repository's tests that ``item`` shares with other
    tests (scope module, package or session), so that its tests run on one worker and
    it starts once: Phoenix for tests/export, a module's daemon."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    found: list[tuple[int, str]] = []
    for name in getattr(item, "fixturenames", ()):
        if name == "_fresh_daemons":  # every module's, and it holds nothing
            continue
        for fixturedef in info.name2fixturedefs.get(name, ()):
            scope = fixturedef.scope
            if scope != "function" and fixturedef.baseid.startswith("tests"):
                width = ("module", "package", "session").index(scope)
                # A module's fixture is the module's own, wherever it is defined.
                where = item.nodeid.split("::")[0] if scope == "module" else fixturedef.baseid
                found.append((width, f"{where}::{name}"))
    return max(found)[1] if found else None


def _longest_first(item: pytest.Item) -> int:
    if not item.path.is_relative_to(TESTS):
        return len(LONGEST)
    relative = item.path.relative_to(TESTS).as_posix()
    return next((i for i, name in enumerate(LONGEST) if relative == name), len(LONGEST))


def fewer_examples(items: list[pytest.Item], examples: int) -> None:
    """At most ``examples`` examples for each property test of ``items``."""
    from hypothesis import settings

    for test in {id(obj): obj for item in items if (obj := getattr(item, "obj", None))}.values():
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if getattr(test, "hypothesis", None) is not None and current is not None:
            fewer = min(current.max_examples, examples)
            test._hypothesis_internal_use_settings = settings(current, max_examples=fewer)


# First: pytest-xdist's worker reads the xdist_group marks in its own hook.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    distributed = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if is_fast(item):
            item.add_marker(pytest.mark.fast)
        if distributed and (group := shared_fixture(item)):
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_longest_first)  # stable: the rest keep their order
    if examples := os.environ.get(EXAMPLES_VARIABLE):
        fewer_examples(items, int(examples))
    if config.getoption("--fast"):
        slow = [item for item in items if "fast" not in item.keywords]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if "fast" in item.keywords]
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def _fresh_daemons(request: pytest.FixtureRequest) -> Iterator[None]:
    """``FLIGHTLOG_TEST_EXEC`` for the modules of :data:`FRESH_DAEMONS`."""
    path = request.path
    if path.is_relative_to(TESTS) and path.relative_to(TESTS).as_posix() in FRESH_DAEMONS:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("FLIGHTLOG_TEST_EXEC", "1")
            yield
    else:
        yield


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.contextmanager
def _daemon(*args: str) -> Iterator[DaemonProcess]:
    # Short base path: AF_UNIX socket paths are limited to 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    proc = DaemonProcess(base, "--log-format", "json", *args).start()
    try:
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    """A real flightlogd on a socket in a fresh temporary directory, the test's own:
    for a test that stops, kills, floods or reads the whole log of its daemon."""
    with _daemon() as proc:
        yield proc


@pytest.fixture(scope="module")
def module_daemon(request: pytest.FixtureRequest) -> Iterator[DaemonProcess]:
    """One flightlogd for all the tests of a module, each of which writes files of its
    own (or reads what a module fixture recorded): ``--log-format json`` and the
    module's ``DAEMON_ARGS`` (a tuple of options) besides. Its tests run on one worker."""
    with _daemon(*getattr(request.module, "DAEMON_ARGS", ())) as proc:
        yield proc


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path (for sockets)."""
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
