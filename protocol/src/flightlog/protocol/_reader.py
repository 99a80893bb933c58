"""Reading session files from a file object: :class:`Reader` and :func:`read_records`
(:func:`~._check.check` reads a whole file with them).

They read a binary file object the caller opened, a piece at a time, and apply the
reading rules through a :class:`LineReader` (``_lines.py``), which states them once:
nothing but one piece and the current line is held, so a file of any size reads in
constant memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, Protocol

from ._errors import ErrorCode, FileFormatError, LocalProtocolError
from ._lines import MAX_LINE_BYTES, LineReader, ReadState
from ._records import Record

__all__ = ["BinaryReadable", "Reader", "read_records"]

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
