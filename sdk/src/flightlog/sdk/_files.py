"""Reading session files directly, without the daemon."""

from __future__ import annotations

import os
from collections.abc import Iterator

from flightlog.protocol import CheckReport, Reader, Record
from flightlog.protocol import check as check_file

__all__ = ["check", "read"]


def read(path: str | os.PathLike[str]) -> Iterator[Record]:
    """Stream the records of the session file at ``path``, ``session_start`` first.

    A piece of the file and one line are held at a time, so a file of any size reads in
    constant memory; a file still being written reads up to its last complete line.
    The file is opened at the first iteration, relative to the current directory (not
    the daemon's data root).  Raises :class:`FileFormatError` at the first line that
    breaks a reading rule (bytes that are not UTF-8 included: no other decoding error
    escapes), and :class:`OSError` when the file cannot be opened or read.
    """
    with open(path, "rb") as fileobj:
        yield from Reader(fileobj)


def check(path: str | os.PathLike[str]) -> CheckReport:
    """Verify the session file at ``path``; ``report.sound`` says whether it is sound.

    A broken line is reported (``error``, ``error_line``), never raised; an unfinished
    tail does not make a file unsound.  Raises :class:`OSError` when the file cannot be
    opened.
    """
    with open(path, "rb") as fileobj:
        return check_file(fileobj)
