"""The C accelerators are built and in use wherever they are expected: a build that silently
fell back to the Python path would pass every other test (tests/protocol/test_speedups.py
skips without it), so on CI and in any checkout with a compiler this one fails.  And each
C source builds without a warning at -Wall -Wextra -Wshadow (the build itself does not
make warnings errors: a newer compiler's new warning must not cost an install its
accelerator)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from flightlog.protocol import _accel, _json, _records, _server


def test_the_extension_is_in_use_unless_switched_off() -> None:
    if os.environ.get("FLIGHTLOG_NO_SPEEDUPS", "") not in ("", "0"):
        pytest.skip("FLIGHTLOG_NO_SPEEDUPS is set: the Python path alone runs")
    assert _accel.SPEEDUPS, "flightlog.protocol._speedups was not built or does not import"
    assert _json.fast_check_json is not None and _records.fast_is_time is not None
    assert _server.take_records is not None
    assert _accel.encode_record is not None, "flightlog.protocol._sender was not built"
    assert _accel.CRingWriter is not None


SOURCE = Path(__file__).resolve().parents[2] / "protocol" / "src" / "flightlog" / "protocol"


@pytest.mark.parametrize(
    ("source", "defines"),
    [("_speedups.c", []), ("_sender.c", []), ("_sender.c", ["-DFLIGHTLOG_RING_SCRIPT"])],
)
def test_the_c_source_compiles_without_a_warning(source: str, defines: list[str]) -> None:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    result = subprocess.run(
        [
            compiler,
            "-fsyntax-only",
            "-Wall",
            "-Wextra",
            "-Wshadow",
            "-Werror",
            *defines,
            f"-I{sysconfig.get_paths()['include']}",
            str(SOURCE / source),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
