"""``find``'s byte scans: the C accelerator (``flightlog.protocol._scan``) is the exact
twin of the Python loops in ``flightlog.sdk._prefilter``, and ``flightlog find`` starts
without the modules of the other commands."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from flightlog.sdk import _prefilter
from flightlog.sdk._prefilter import lines_always, lines_with

scan = pytest.importorskip("flightlog.protocol._scan")

# Pieces that make the scans' cases: joins spelled every way, near misses, escapes.
PIECES = [
    b'},{"$type":"text"',
    b'},{"$type":"thinking"',
    b'} , {"$type":"text"',
    b'},\n{ "$type" :\t"text"',
    b'},{"$type":"tool_call"',
    b'},{"$type":"tex',
    b'{"$type":"text"',
    b',{"$type":"text"',
    b'"$type"',
    b"$",
    b"\\u00e9",
    b"\\/",
    b"\\\\u",
    b"\\",
    b"\\n",
    b"timed out",
    b"timed",
    b" ",
    b"\n",
    b"\t",
    b"}",
    b",",
    b'"',
    b"x",
]


def complete(body: bytes) -> tuple[bytes, int]:
    """``body`` with the complete lines' end as the scans take it."""
    return body, body.rfind(b"\n") + 1


blocks = st.lists(st.sampled_from(PIECES) | st.binary(max_size=6), max_size=40).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(body=blocks, joins=st.booleans())
def test_lines_always_in_c_is_its_twin(body: bytes, joins: bool) -> None:
    block, end = complete(body)
    assert scan.lines_always(block, end, joins) == lines_always(block, end, joins)


@settings(max_examples=400, deadline=None)
@given(
    body=blocks,
    needle=st.sampled_from([b"timed out", b"$", b"\\", b'"text"', b"x", b"xx", b"d o", b"out\n"]),
)
def test_lines_with_in_c_is_its_twin(body: bytes, needle: bytes) -> None:
    block, end = complete(body)
    assert scan.lines_with(block, end, needle) == lines_with(block, end, needle)


@pytest.mark.parametrize("needle", [b"ab", b"timed out", b"t" * 17, b"tx" * 20])
def test_lines_with_finds_the_needle_at_every_offset(needle: bytes) -> None:
    # Before, across and after each 16-byte step of the C scan, and in its last bytes
    # (where it hands over to memmem); near misses (the first and last byte only) too.
    miss = needle[:1] + b"-" * (len(needle) - 2) + needle[-1:]
    for size in range(len(needle), 70):
        for at in range(size - len(needle) + 1):
            line = bytearray(b"." * size)
            line[at : at + len(needle)] = needle
            for body in (b"x\n" + bytes(line) + b"\n", bytes(line) + b"\n" + miss + b"\n"):
                block, end = complete(body)
                assert scan.lines_with(block, end, needle) == lines_with(block, end, needle)
            if len(needle) > 2:
                assert scan.lines_with(miss + b"\n", len(miss) + 1, needle) == []


def test_the_scans_read_a_mapped_file_and_stop_at_end(tmp_path: Path) -> None:
    path = tmp_path / "lines"
    path.write_bytes(b'a\n{"x":[{},{"$type":"text"}]}\n\\u1 timed out\nno end timed out')
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        end = mapped.rfind(b"\n") + 1
        assert scan.lines_always(mapped, end, True) == lines_always(mapped, end, True) == [2, 30]
        assert scan.lines_with(mapped, end, b"timed out") == [30]
        assert lines_with(mapped, end, b"timed out") == [30]
    with pytest.raises(ValueError, match="outside the buffer"):
        scan.lines_with(b"a\n", 3, b"a")
    with pytest.raises(ValueError, match="empty"):
        scan.lines_with(b"a\n", 2, b"")


def test_the_prefilter_uses_the_c_scans_where_they_are_built() -> None:
    assert _prefilter.SCAN_IN_C


def test_without_speedups_only_the_twins_run() -> None:
    code = "from flightlog.sdk import _prefilter; print(_prefilter.SCAN_IN_C)"
    env = {**os.environ, "FLIGHTLOG_NO_SPEEDUPS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"


def test_find_starts_without_the_other_commands(tmp_path: Path) -> None:
    # What `flightlog find` imports is what it uses: not the client, the daemon link,
    # asyncio or the other commands' modules.
    code = (
        "import sys\n"
        "from flightlog.cli import run\n"
        f"status = run(['find', '--text', 'x', {str(tmp_path)!r}])\n"
        "heavy = ['asyncio', 'flightlog.sdk._sync', 'flightlog.sdk._sync_link',\n"
        "         'flightlog.cli._commands', 'flightlog.cli._export', 'flightlog.cli._html',\n"
        "         'flightlog.cli._listing', 'flightlog.cli._diff', 'flightlog.cli._sql',\n"
        "         'flightlog.sdk._cursor']\n"
        "print(status, [name for name in heavy if name in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "0 []"
