"""Reading session files from a file object: :class:`Reader`, :func:`read_records` and
:func:`check`.

They read a binary file object the caller opened, a piece at a time, and apply the
reading rules through a :class:`LineReader` (``_lines.py``), which states them once:
nothing but one piece and the current line is held, so a file of any size reads in
constant memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, Protocol

import msgspec

from ._errors import ErrorCode, FileFormatError, LocalProtocolError
from ._lines import MAX_LINE_BYTES, LineReader, ReadState
from ._records import CHECKPOINT, RUN_CLOSE, RUN_START, Record

__all__ = [
    "BinaryReadable",
    "CheckReport",
    "Reader",
    "check",
    "read_records",
]

# Files are read in pieces of this size.
_CHUNK: Final = 256 * 1024


class BinaryReadable(Protocol):
    """What the reader needs of a file object: ``read`` returning bytes."""

    def read(self, size: int = -1, /) -> bytes: ...


class Reader:
    """Streams the records of a session file, applying the reading rules.

    ``fileobj`` is a binary file object the caller opened (anything with a ``read``
    returning bytes), positioned at the start of the file.  Iterating yields every
    :class:`Record`, ``session_start`` first, and raises :class:`FileFormatError` at the
    first line that breaks a rule; after that the reader raises the same error again.
    Raises :class:`LocalProtocolError` for a file object in text mode.

    Attributes, kept current while iterating: those of :class:`LineReader`
    (``session_id``, ``meta``, ``format_version``, ``last_seq``, ``lines``, ``offset``,
    ``tail``, ``tail_size``, ``error``) and ``done``, whether the end of the file was
    reached.
    """

    def __init__(self, fileobj: BinaryReadable, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._file = fileobj
        self._lines = LineReader(max_line_bytes=max_line_bytes)
        self._header: Record | None = None
        self._header_pending = False
        self.done = False

    @property
    def session_id(self) -> str | None:
        return self._lines.session_id

    @property
    def meta(self) -> dict[str, Any]:
        return self._lines.meta

    @property
    def format_version(self) -> int | None:
        return self._lines.format_version

    @property
    def last_seq(self) -> int:
        return self._lines.last_seq

    @property
    def lines(self) -> int:
        return self._lines.lines

    @property
    def offset(self) -> int:
        return self._lines.offset

    @property
    def tail(self) -> bytes:
        return self._lines.tail

    @property
    def tail_size(self) -> int:
        return self._lines.tail_size

    @property
    def error(self) -> FileFormatError | None:
        return self._lines.error

    def __iter__(self) -> Reader:
        return self

    def __next__(self) -> Record:
        if self._header_pending:
            self._header_pending = False
            assert self._header is not None
            return self._header
        lines = self._lines
        while True:
            item = lines.next()
            if not isinstance(item, ReadState):
                return item
            if item is ReadState.END_OF_FILE:
                self.done = True
                raise StopIteration
            chunk = self._read()
            if chunk:
                lines.feed(chunk)
            else:
                lines.feed_eof()

    def read_header(self) -> Record:
        """Read line 1 (if not read yet) and return the ``session_start`` record.

        Iterating afterwards still yields it first.  Raises :class:`FileFormatError`
        when the file is refused.
        """
        if self._header is None:
            self._header = next(self)
            self._header_pending = True
        return self._header

    def _read(self) -> bytes:
        chunk = self._file.read(_CHUNK)
        if type(chunk) is bytes:
            return chunk
        if isinstance(chunk, bytes | bytearray | memoryview):
            return bytes(chunk)
        raise LocalProtocolError(
            "the reader needs a binary file object: open the file with mode 'rb'",
            code=ErrorCode.BAD_MESSAGE,
        )


def read_records(fileobj: BinaryReadable) -> Iterator[Record]:
    """The records of a session file, as :class:`Reader` yields them.

    Raises :class:`FileFormatError` at the first line that breaks a reading rule.
    """
    yield from Reader(fileobj)


class CheckReport(msgspec.Struct, kw_only=True, frozen=True):
    """What :func:`check` found.

    ``sound`` says whether every complete line keeps the reading rules; an unfinished
    tail does not make a file unsound (it is reported in ``unfinished_tail`` and
    ``tail_bytes``).  ``valid_bytes`` is the length of the readable prefix: where a
    writer would truncate.  ``open_runs`` lists run ids with a ``run_start`` and no
    ``run_close``, in file order: interrupted runs, or the one still being written.
    ``warnings`` notes records that keep the reading rules but make no sense (a record of
    a run that never started, a record after its run's ``run_close``).
    """

    sound: bool
    session_id: str | None = None
    format_version: int | None = None
    records: int = 0
    runs: int = 0
    open_runs: list[str] = []
    checkpoints: int = 0
    last_seq: int = 0
    valid_bytes: int = 0
    error: str | None = None
    error_line: int | None = None
    unfinished_tail: bool = False
    tail_bytes: int = 0
    warnings: list[str] = []


#: At most this many warnings are kept by :func:`check`.
_MAX_WARNINGS: Final = 100


def check(fileobj: BinaryReadable) -> CheckReport:
    """Read a whole session file and report whether it is sound.

    Never raises :class:`FileFormatError`: a broken line is reported in ``error`` and
    ``error_line``.  Raises :class:`LocalProtocolError` for a file object in text mode.
    """
    reader = Reader(fileobj)
    records = runs = checkpoints = 0
    open_runs: dict[str, None] = {}  # insertion-ordered set
    closed_runs: set[str] = set()
    warnings: list[str] = []

    def warn(text: str) -> None:
        if len(warnings) < _MAX_WARNINGS:
            warnings.append(text)

    error: FileFormatError | None = None
    try:
        for record in reader:
            records += 1
            run_id = record.run_id
            if record.type == RUN_START:
                runs += 1
                if run_id is None:
                    warn(f"seq {record.seq}: run_start without a run_id")
                    continue
                if run_id in open_runs or run_id in closed_runs:
                    warn(f"seq {record.seq}: run {run_id} starts a second time")
                open_runs[run_id] = None
                continue
            if record.type == CHECKPOINT:
                checkpoints += 1
            if run_id is None:
                continue
            if run_id in closed_runs:
                warn(f"seq {record.seq}: {record.type} in run {run_id} after its run_close")
            elif run_id not in open_runs:
                warn(f"seq {record.seq}: {record.type} in run {run_id}, which never started")
            if record.type == RUN_CLOSE:
                open_runs.pop(run_id, None)
                closed_runs.add(run_id)
    except FileFormatError as exc:
        error = exc
    return CheckReport(
        sound=error is None,
        session_id=reader.session_id,
        format_version=reader.format_version,
        records=records,
        runs=runs,
        open_runs=list(open_runs),
        checkpoints=checkpoints,
        last_seq=reader.last_seq,
        valid_bytes=reader.offset,
        error=None if error is None else error.reason,
        error_line=None if error is None else error.line,
        unfinished_tail=reader.tail_size > 0,
        tail_bytes=reader.tail_size,
        warnings=warnings,
    )
