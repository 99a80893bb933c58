"""The Python path the C accelerators replace runs too, in a pytest of its own with
``FLIGHTLOG_NO_SPEEDUPS=1`` (its daemons, forked from that pytest's fork server or
started fresh, inherit it). That pytest checks, before any test, that no accelerator
was loaded (tests/conftest.py, ``pytest_sessionstart``).

The whole suite runs the tests of what the accelerators replace (:data:`ACCELERATED`):
the protocol's (the codec, the frame encoder, the ring's ends, the JSON and time
checks, the record lines, the server connection, the reader), the SDK's client against
its in-memory daemon and against a real daemon (records framed and sent through the
ring), and the daemon's record path (the actor's record lines and the file layer in
process, refusals and the ring through a real daemon), their property tests with fewer
examples (:data:`EXAMPLES`). ``--soak`` runs the protocol's,
the SDK's and the daemon's tests again, all of them (about 330 s of CPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import EXAMPLES_VARIABLE, fewer_examples
from hypothesis import given, settings
from hypothesis import strategies as st

from support import TESTS

#: What the whole suite runs again with the accelerators off: the tests of where the
#: accelerated functions (flightlog.protocol._accel) are called: the JSON and time
#: checks, the record lines, the server connection's records, the frame encoder, the
#: ring's writer, and the codec and reader above them. (The tests of the C twins
#: themselves, test_speedups.py and test_sender.py, skip with the accelerators off.)
ACCELERATED = {
    "protocol": tuple(
        f"tests/protocol/test_{name}.py"
        for name in (
            "codec",
            "framing",
            "json",
            "lines",
            "reader",
            "records",
            "ring_ends",
            "server",
            "time_cache",
        )
    ),
    "sdk": (
        "tests/sdk/test_client_sync.py",
        "tests/sdk/test_connection.py",
        "tests/sdk/test_e2e.py",
    ),
    "daemon": (
        "tests/daemon/test_record_lines.py",
        "tests/daemon/test_storage.py",
        "tests/daemon/test_bad_input.py",
        "tests/daemon/test_ring.py",
    ),
}
#: Tests of those modules that run the Python path with the accelerators on too, and
#: pass only if it ran (a 16 MiB payload whose passes it counts, and its refusal, which
#: only Python makes): not run again here.
PYTHON_EITHER_WAY = (
    "tests/protocol/test_json.py::test_a_deep_16_mib_payload_is_checked_in_one_pass",
)
#: Their property tests run at most this many examples here (as many as in the whole
#: suite with the accelerators on, and in --soak's run with them off).
EXAMPLES = 50


def _pytest_without_accelerators(*args: str, examples: int | None = None) -> None:
    env = {**os.environ, "FLIGHTLOG_NO_SPEEDUPS": "1"}
    if examples is not None:
        env[EXAMPLES_VARIABLE] = str(examples)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-n", "0", "-q"],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "accelerators off" in done.stdout, done.stdout[-2000:]


@pytest.mark.timeout(3000)
def test_the_accelerated_paths_pass_with_the_accelerators_off() -> None:
    # One pytest for all three parts: each pytest started costs about 7 s of CPU before
    # its first test (its imports and collection) and a fork server of its own.
    _pytest_without_accelerators(
        *(path for part in ACCELERATED.values() for path in part),
        *(f"--deselect={test}" for test in PYTHON_EITHER_WAY),
        examples=EXAMPLES,
    )


@pytest.mark.soak
@pytest.mark.timeout(3000)
@pytest.mark.parametrize("directory", ["protocol", "sdk", "daemon"])
def test_the_tests_pass_with_the_accelerators_off(directory: str) -> None:
    _pytest_without_accelerators(f"tests/{directory}")


def test_the_examples_variable_caps_every_property_test() -> None:
    """What ``FLIGHTLOG_TEST_EXAMPLES`` does (tests/conftest.py) to each property test
    of a run, whatever its own settings, and only to property tests."""
    calls: list[int] = []

    @settings(max_examples=500, database=None)
    @given(st.integers())
    def many(n: int) -> None:
        calls.append(n)

    def plain() -> None:
        pass

    class Item:
        def __init__(self, obj: object) -> None:
            self.obj = obj

    fewer_examples([Item(many), Item(many), Item(plain)], 7)
    many()
    assert 0 < len(calls) <= 7
    assert not hasattr(plain, "_hypothesis_internal_use_settings")
