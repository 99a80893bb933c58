"""The C accelerators under AddressSanitizer and UBSan.

Both extensions (protocol/setup.py builds them) are compiled again with
``-fsanitize=address,undefined`` into a temporary copy of ``flightlog.protocol``, and
a driver process (libasan preloaded, Python's allocator off so that ASan sees every
buffer) runs the differential tests on them: the sender's (test_sender.py: the record
frame, and the ring writer against hostile headers, rewritten between calls, by
another process during them, and between any two loads: this build of the sender is
the scripted one, FLIGHTLOG_RING_SCRIPT) and the speedups' (test_speedups.py), with their
explicit examples and fewer random ones.  Any memory
error or undefined behaviour stops the driver with the sanitizer's report, which the
assertion shows.  Only a machine without gcc skips it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "protocol" / "src" / "flightlog" / "protocol"
TESTS = ["test_sender.py", "test_speedups.py"]
#: Random examples per property test in the driver (the explicit ones all run).
EXAMPLES = 300

# The driver: checks that the sanitized extensions are the ones imported, then runs
# pytest on the differential tests with fewer random examples.
_DRIVER = """
import sys
build, examples, tests = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
sys.path.insert(0, build)
import pytest
from flightlog.protocol import _accel, _sender, _speedups
for module in (_sender, _speedups):
    assert module.__file__.startswith(build), module.__file__
assert hasattr(_sender, "script"), "the sanitized sender is not the scripted build"
assert _accel.CRingWriter is _sender.RingWriter and _accel.SPEEDUPS
with open("/proc/self/maps") as maps:
    mapped = maps.read()
assert "libasan" in mapped and "libubsan" in mapped, "the sanitizers' runtimes are not loaded"

class Fewer:
    @staticmethod
    def pytest_collection_modifyitems(items):
        import hypothesis  # here: imported before pytest, it could not be rewritten

        for item in items:
            test = getattr(item, "obj", None)
            if getattr(test, "hypothesis", None) is None:
                continue
            settings = hypothesis.settings
            current = getattr(test, "_hypothesis_internal_use_settings", settings.default)
            fewer = min(current.max_examples, examples)
            test._hypothesis_internal_use_settings = settings(
                current, max_examples=fewer, deadline=None, database=None
            )

# -n 0: the plugin above is this process's; xdist's workers would run every example.
sys.exit(pytest.main(["-q", "-x", "-n", "0", "-p", "no:cacheprovider", *tests], plugins=[Fewer()]))
"""


def _compile(gcc: str, source: Path, target: Path) -> subprocess.CompletedProcess[str]:
    # The sender with its loads scripted (FLIGHTLOG_RING_SCRIPT): test_sender.py's
    # scripted test then runs on this build too.
    script = ["-DFLIGHTLOG_RING_SCRIPT"] if source.stem == "_sender" else []
    return subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-O1",
            "-g",
            "-fsanitize=address,undefined",
            "-fno-omit-frame-pointer",
            *script,
            f"-I{sysconfig.get_paths()['include']}",
            str(source),
            "-o",
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_c_tests_pass_under_address_and_undefined_behaviour_sanitizers(
    tmp_path: Path,
) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is absent: the sanitized build needs it")
    libasan = subprocess.run(
        [gcc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert os.path.isabs(libasan) and os.path.exists(libasan), f"gcc has no libasan: {libasan}"
    package = tmp_path / "flightlog" / "protocol"
    shutil.copytree(SOURCE, package, ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__"))
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    with ThreadPoolExecutor(2) as pool:
        builds = list(
            pool.map(
                lambda name: _compile(gcc, SOURCE / f"{name}.c", package / f"{name}{suffix}"),
                ["_sender", "_speedups"],
            )
        )
    for build in builds:
        assert build.returncode == 0, build.stderr
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTLOG_NO_SPEEDUPS"}
    env.update(
        LD_PRELOAD=libasan,
        ASAN_OPTIONS="detect_leaks=0",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
        PYTHONMALLOC="malloc",
    )
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _DRIVER,
            str(tmp_path),
            str(EXAMPLES),
            *(str(ROOT / "tests" / "protocol" / name) for name in TESTS),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    report = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, report
    assert "Sanitizer" not in result.stderr and "runtime error" not in result.stderr, report
