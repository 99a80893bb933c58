"""Reading session files: every reading rule of file format version 1, while streaming.

Theory of operation
-------------------
A session file is read one line at a time from a binary file object the caller opened;
nothing but the current line is held, so a file of any size reads in constant memory.

* Lines end with ``\\n`` only.  A line holding ``\\r`` is refused, whether it is a CRLF
  ending or a raw carriage return: no writer of this format produces one.
* Line 1 is ``session_start``, with seq 1 and a supported ``format_version``, else the
  file is refused.  It gives the file its ``session_id``.
* Every later complete line parses as a record, has the file's ``session_id`` and
  ``seq`` = previous + 1.  A corrupt complete line, a foreign session id, a gap or a
  repeated seq fails with a :class:`FileFormatError` naming the line.
* A final line without ``\\n`` is the unfinished tail of an interrupted write (a crash,
  or a power cut that left NUL bytes): readers ignore it, even when it happens to be
  valid JSON, and a writer truncates it away (to :attr:`Reader.offset`) and nothing else.

A reader is sticky: after an error it raises the same error again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, Protocol

import msgspec

from ._errors import ErrorCode, FileFormatError, LocalProtocolError
from ._records import (
    CHECKPOINT,
    FORMAT_VERSION,
    RUN_CLOSE,
    RUN_START,
    SESSION_START,
    Record,
)

__all__ = [
    "MAX_LINE_BYTES",
    "SUPPORTED_FORMAT_VERSIONS",
    "BinaryReadable",
    "CheckReport",
    "Reader",
    "check",
    "parse_line",
    "read_records",
]

#: The format versions this reader reads.
SUPPORTED_FORMAT_VERSIONS: Final = frozenset({FORMAT_VERSION})

#: A complete line longer than this is refused; a writer must never write one.
MAX_LINE_BYTES: Final = 256 * 1024 * 1024

# Lines are read in pieces of at most this size, so that a huge unfinished tail (a file
# padded with NUL bytes after a crash) is skipped without being held.
_CHUNK: Final = 1024 * 1024


class _SessionStart(msgspec.Struct):
    # Like SessionStartData, but a file must say which format version it is in.
    format_version: int
    meta: dict[str, Any] = {}


_record_decoder: Final = msgspec.json.Decoder(Record)
_session_start_decoder: Final = msgspec.json.Decoder(_SessionStart)


class BinaryReadable(Protocol):
    """What the reader needs of a file object: ``readline`` returning bytes."""

    def readline(self, size: int = -1, /) -> bytes: ...


def parse_line(
    line: bytes, *, lineno: int, session_id: str | None, expected_seq: int | None
) -> Record:
    """Parse one complete line, given without its ``\\n``.

    Checks that it is a record whose ``data`` is a JSON object, that it has
    ``session_id`` and ``seq`` == ``expected_seq`` (each when not None).  Raises
    :class:`FileFormatError` naming ``lineno`` and what is wrong.
    """
    if b"\r" in line:
        if line.endswith(b"\r"):
            reason = "line ends with \\r\\n: CRLF line endings are not allowed, only \\n"
        else:
            reason = "raw carriage return (\\r) in the line: not allowed"
        raise FileFormatError(lineno, reason)
    if not line:
        raise FileFormatError(lineno, "empty line")
    try:
        record = _record_decoder.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        if line.count(0) == len(line):
            reason = "a line of NUL bytes (was the file cut short by a crash before a sync?)"
        elif b"\x00" in line:
            reason = "NUL bytes in the line (was it cut short by a crash before a sync?)"
        else:
            reason = f"not a valid record: {exc}"
        raise FileFormatError(lineno, reason) from None
    except RecursionError:
        raise FileFormatError(lineno, "not a valid record: JSON nested too deeply") from None
    if bytes(memoryview(record.data)[:1]) != b"{":
        raise FileFormatError(lineno, "not a valid record: data must be a JSON object")
    if session_id is not None and record.session_id != session_id:
        raise FileFormatError(
            lineno,
            f"session_id {record.session_id!r} is not the file's session_id {session_id!r}",
        )
    if expected_seq is not None and record.seq != expected_seq:
        previous = expected_seq - 1
        if record.seq == previous:
            reason = f"seq {record.seq} repeats the seq of the line before"
        elif record.seq < previous:
            reason = f"seq {record.seq} goes backwards: the line before has seq {previous}"
        else:
            reason = (
                f"seq {record.seq} leaves a gap: expected {expected_seq}, "
                f"{record.seq - expected_seq} record(s) missing"
            )
        raise FileFormatError(lineno, reason)
    return record


class Reader:
    """Streams the records of a session file, applying the reading rules.

    ``fileobj`` is a binary file object the caller opened (anything with a ``readline``
    returning bytes), positioned at the start of the file.  Iterating yields every
    :class:`Record`, ``session_start`` first, and raises :class:`FileFormatError` at the
    first line that breaks a rule; after that the reader raises the same error again.

    Attributes, kept current while iterating:

    * ``session_id``, ``meta``, ``format_version``: from ``session_start`` (None and
      ``{}`` until line 1 is read);
    * ``last_seq``: seq of the last record read (0 before any);
    * ``lines``: complete lines read and accepted;
    * ``offset``: byte offset just past the last accepted line, where a writer truncates
      the file when it opens it for writing;
    * ``tail``: the unfinished tail (a final line without ``\\n``), once the end is
      reached, else ``b""``; at most ``max_line_bytes`` of it, ``tail_size`` is its length;
    * ``error``: the :class:`FileFormatError` that stopped the reader, or None;
    * ``done``: whether the end of the file was reached.
    """

    def __init__(self, fileobj: BinaryReadable, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._file = fileobj
        self._max_line_bytes = max_line_bytes
        self._header: Record | None = None
        self._header_pending = False
        self.session_id: str | None = None
        self.meta: dict[str, Any] = {}
        self.format_version: int | None = None
        self.last_seq = 0
        self.lines = 0
        self.offset = 0
        self.tail = b""
        self.tail_size = 0
        self.error: FileFormatError | None = None
        self.done = False

    def __iter__(self) -> Reader:
        return self

    def __next__(self) -> Record:
        if self._header_pending:
            self._header_pending = False
            assert self._header is not None
            return self._header
        if self.error is not None:
            raise self.error
        if self.done:
            raise StopIteration
        try:
            return self._next_record()
        except FileFormatError as exc:
            self.error = exc
            raise

    def read_header(self) -> Record:
        """Read line 1 (if not read yet) and return the ``session_start`` record.

        Iterating afterwards still yields it first.  Raises :class:`FileFormatError`
        when the file is refused.
        """
        if self._header is None:
            self._header = next(self)
            self._header_pending = True
        return self._header

    def _next_record(self) -> Record:
        line = self._read_line()
        if line is None:
            self.done = True
            if self._header is None:
                if self.tail_size:
                    raise FileFormatError(
                        1, "no complete line: the session_start line is unfinished"
                    )
                raise FileFormatError(0, "empty file: no session_start")
            raise StopIteration
        lineno = self.lines + 1
        if self._header is None:
            record = self._parse_header(line)
        else:
            record = parse_line(
                line, lineno=lineno, session_id=self.session_id, expected_seq=self.last_seq + 1
            )
            if record.type == SESSION_START:
                raise FileFormatError(lineno, "session_start is allowed on line 1 only")
        self.lines = lineno
        self.last_seq = record.seq
        self.offset += len(line) + 1
        return record

    def _parse_header(self, line: bytes) -> Record:
        record = parse_line(line, lineno=1, session_id=None, expected_seq=None)
        if record.type != SESSION_START:
            raise FileFormatError(
                1, f"line 1 is a {record.type!r} record: a session file starts with session_start"
            )
        if record.seq != 1:
            raise FileFormatError(1, f"session_start has seq {record.seq}: it must be seq 1")
        if not record.session_id:
            raise FileFormatError(1, "session_start has an empty session_id")
        try:
            data = _session_start_decoder.decode(record.data)
        except msgspec.DecodeError as exc:
            raise FileFormatError(1, f"session_start data is not valid: {exc}") from None
        if data.format_version not in SUPPORTED_FORMAT_VERSIONS:
            supported = ", ".join(str(v) for v in sorted(SUPPORTED_FORMAT_VERSIONS))
            raise FileFormatError(
                1,
                f"format_version {data.format_version} is not supported "
                f"(this reader reads version {supported})",
            )
        self._header = record
        self.session_id = record.session_id
        self.meta = data.meta
        self.format_version = data.format_version
        return record

    def _read_line(self) -> bytes | None:
        """The next complete line without its ``\\n``, or None at the end of the file.

        At the end, an unfinished tail is kept in ``tail`` and ``tail_size``.
        """
        chunk = self._readline()
        if chunk.endswith(b"\n") and len(chunk) <= self._max_line_bytes:
            return chunk[:-1]  # the common case: one short complete line
        parts: list[bytes] = []
        size = 0
        while chunk:
            size += len(chunk)
            if size <= self._max_line_bytes + 1:  # the line and its "\n"
                parts.append(chunk)
            # else too long to keep: read on, to learn whether it is the tail
            if chunk.endswith(b"\n"):
                if size - 1 > self._max_line_bytes:
                    raise FileFormatError(
                        self.lines + 1,
                        f"line is {size - 1} bytes long, more than {self._max_line_bytes}",
                    )
                return b"".join(parts)[:-1]
            chunk = self._readline()
        self.tail = b"".join(parts)
        self.tail_size = size
        return None

    def _readline(self) -> bytes:
        chunk = self._file.readline(_CHUNK)
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
