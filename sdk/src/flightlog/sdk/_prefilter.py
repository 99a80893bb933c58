"""Step 2 of ``find``'s theory of operation (:mod:`._find`): the lines of a block of
complete lines that may match, found on bytes.

A question gives *tests* (what every matching line holds: bytes, or a match of a
pattern; the first one, the *driver*, is looked for through the block, the others in
each line it finds) and patterns whose lines are decoded whatever the tests say
(:meth:`~._find.Query.always`): :data:`ESCAPE`, ``find --text``'s
:data:`~._text.JOINED_PARTS`, ``--agent``'s bounds.

The two scans every ``--text`` question makes over every byte (the driver's bytes, and
escapes with joined parts) run in C when :mod:`flightlog.protocol._scan` is built: one
memmem or memchr pass each, where the regular expression engine takes several times
longer.  :func:`lines_with` and :func:`lines_always` are their Python twins, the
definition (tests/sdk/test_find_scan.py holds the two equal on random input); with
``FLIGHTLOG_NO_SPEEDUPS`` set, only the twins run.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Callable, Iterator
from typing import Final, TypeAlias

from ._text import JOINED_PARTS

__all__ = ["ESCAPE", "Block", "Prefilter", "lines_always", "lines_with"]

#: Complete lines: read into memory, or a file mapped in place.
Block: TypeAlias = bytes | mmap.mmap

#: A ``\\u`` or ``\\/`` escape: a line that holds one may spell a string otherwise than
#: the writer does, so it skips the byte tests.
ESCAPE: Final = re.compile(rb"\\[u/]")


def lines_with(block: Block, end: int, needle: bytes) -> list[int]:
    """The start of each line of ``block[:end]`` that holds ``needle``, in order."""
    starts = []
    at = block.find(needle, 0, end)
    while at != -1:
        starts.append(block.rfind(b"\n", 0, at) + 1)
        at = block.find(needle, block.find(b"\n", at) + 1, end)
    return starts


def lines_always(block: Block, end: int, joins: bool) -> list[int]:
    """The start of each line of ``block[:end]`` that holds :data:`ESCAPE`, or with
    ``joins`` :data:`~._text.JOINED_PARTS` (placed by the line of its first byte), in
    order."""
    patterns = [ESCAPE] if block.find(b"\\", 0, end) != -1 else []  # one memchr
    if joins:
        patterns.append(JOINED_PARTS)
    starts: set[int] = set()
    for pattern in patterns:
        starts.update(lines_of(pattern, block, end))
    return sorted(starts)


_with: Callable[[Block, int, bytes], list[int]] = lines_with
_always: Callable[[Block, int, bool], list[int]] = lines_always
try:
    # Its import fails when FLIGHTLOG_NO_SPEEDUPS is set, or it was not built.
    from flightlog.protocol._scan import lines_always as _always
    from flightlog.protocol._scan import lines_with as _with
except ImportError:  # pragma: no cover - the build without a compiler
    pass

#: Whether the C scans are in use.
SCAN_IN_C: Final = _with is not lines_with


class Prefilter:
    """The lines of a block that may match (the module's docstring)."""

    def __init__(
        self, tests: list[bytes | re.Pattern[bytes]], always: tuple[re.Pattern[bytes], ...]
    ) -> None:
        self._joins = JOINED_PARTS in always
        self._others_always = [p for p in always if p is not ESCAPE and p is not JOINED_PARTS]
        self._driver = tests[0] if tests else None
        # Tested within one line each: as patterns, one call whatever the test.
        self._others = [
            re.compile(re.escape(test)) if isinstance(test, bytes) else test for test in tests[1:]
        ]

    def lines(self, block: Block, end: int) -> Iterator[tuple[int, int]]:
        """(start, stop) of each line of ``block[:end]`` that may match, in order,
        without its ``\\n``."""
        always = _always(block, end, self._joins)
        for pattern in self._others_always:
            always += lines_of(pattern, block, end)
        if not always:
            return self._tested(block, end)
        spans = {(start, block.find(b"\n", start)) for start in always}
        return iter(sorted(spans.union(self._tested(block, end))))

    def _tested(self, block: Block, end: int) -> Iterator[tuple[int, int]]:
        driver, others = self._driver, self._others
        if driver is None:
            start = 0
            while start < end:
                stop = block.find(b"\n", start)
                yield start, stop
                start = stop + 1
            return
        starts = (
            _with(block, end, driver) if isinstance(driver, bytes) else lines_of(driver, block, end)
        )
        for start in starts:
            stop = block.find(b"\n", start)
            for test in others:
                if test.search(block, start, stop) is None:
                    break
            else:
                yield start, stop


def lines_of(pattern: re.Pattern[bytes], block: Block, end: int) -> list[int]:
    """The start of each line of ``block[:end]`` where a match of ``pattern`` starts."""
    starts = []
    match = pattern.search(block, 0, end)
    while match is not None:
        starts.append(block.rfind(b"\n", 0, match.start()) + 1)
        match = pattern.search(block, block.find(b"\n", match.start()) + 1, end)
    return starts
