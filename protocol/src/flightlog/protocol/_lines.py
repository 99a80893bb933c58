"""The reading rules of session files, stated once: a line reader you feed bytes.

Theory of operation
-------------------
:class:`LineReader` holds no file.  Its caller feeds it a session file's bytes in order,
in pieces of any size (:meth:`~LineReader.feed`), and says when there are no more
(:meth:`~LineReader.feed_eof`); :meth:`~LineReader.next` returns the next record,
:data:`NEED_DATA` when it needs more bytes, or :data:`END_OF_FILE` once the input is
over.  Every path that reads a session file (``check``, ``Reader``, the SDK's ``read``,
the daemon's open and its tail) drives one, so they agree on every file and name the
same line.  The rules (docs/format.md, section 5):

* Lines end with ``\\n`` only.  A complete line is at most ``max_line_bytes`` long,
  valid UTF-8, holds no ``\\r`` (neither a CRLF ending nor a raw carriage return) and
  parses as a record whose ``data`` is a JSON object.
* Line 1 is ``session_start``, with seq 1, a non-empty ``session_id`` and a supported
  ``format_version``; it gives the file its ``session_id``.  An empty file, or one whose
  only line is unfinished, is refused.
* Every later line has the file's ``session_id``, ``seq`` = previous + 1 (no gap, no
  repeat) and is not a second ``session_start``.
* A final line without ``\\n`` is the unfinished tail of an interrupted write: at the
  end of the input it is set aside (``tail``, ``tail_size``), never read.  So is a
  long run of NUL bytes left by a power cut: only ``max_line_bytes`` of it are held.

A broken line raises :class:`FileFormatError` naming its 1-based line number and what
is wrong; the reader is sticky and raises the same error from every later call.  No
other exception leaves it.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import msgspec

from ._errors import FileFormatError, LocalProtocolError
from ._records import FORMAT_VERSION, SESSION_START, Record

__all__ = [
    "END_OF_FILE",
    "MAX_LINE_BYTES",
    "NEED_DATA",
    "SUPPORTED_FORMAT_VERSIONS",
    "LineReader",
    "ReadState",
    "parse_line",
]

#: The format versions this reader reads.
SUPPORTED_FORMAT_VERSIONS: Final = frozenset({FORMAT_VERSION})

#: A complete line longer than this is refused; a writer must never write one.
MAX_LINE_BYTES: Final = 256 * 1024 * 1024


class ReadState(enum.Enum):
    """What :meth:`LineReader.next` returns when it has no record to give."""

    #: Feed more bytes (or call :meth:`LineReader.feed_eof`), then call ``next`` again.
    NEED_DATA = "need_data"
    #: The input is over; an unfinished tail, if any, is in ``tail``/``tail_size``.
    END_OF_FILE = "end_of_file"


NEED_DATA: Final = ReadState.NEED_DATA
END_OF_FILE: Final = ReadState.END_OF_FILE


class _SessionStart(msgspec.Struct):
    # Like SessionStartData, but a file must say which format version it is in.
    format_version: int
    meta: dict[str, Any] = {}


_record_decoder: Final = msgspec.json.Decoder(Record)
_session_start_decoder: Final = msgspec.json.Decoder(_SessionStart)


def parse_line(
    line: bytes, *, lineno: int, session_id: str | None, expected_seq: int | None
) -> Record:
    """Parse one complete line, given without its ``\\n``.

    Checks that it is valid UTF-8 holding a record whose ``data`` is a JSON object, and
    that it has ``session_id`` and ``seq`` == ``expected_seq`` (each when not None).
    Raises :class:`FileFormatError` naming ``lineno`` and what is wrong.
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
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError, OverflowError) as exc:
        if line.count(0) == len(line):
            reason = "a line of NUL bytes (was the file cut short by a crash before a sync?)"
        elif b"\x00" in line:
            reason = "NUL bytes in the line (was it cut short by a crash before a sync?)"
        else:
            reason = f"not a valid record: {exc}"
        raise FileFormatError(lineno, reason) from None
    except RecursionError:
        raise FileFormatError(lineno, "not a valid record: JSON nested too deeply") from None
    if not line.isascii():
        # The decoder checks the strings it reads, not the bytes of ``data`` it keeps
        # raw or of members it skips: a file is UTF-8 throughout.
        try:
            line.decode()
        except UnicodeDecodeError as exc:
            raise FileFormatError(
                lineno, f"invalid UTF-8 at byte {exc.start + 1} of the line"
            ) from None
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


class LineReader:
    """Turns the bytes of a session file into its records; see the module docstring.

    Attributes, kept current as records are returned:

    * ``session_id``, ``meta``, ``format_version``: from ``session_start`` (None and
      ``{}`` until line 1 is read);
    * ``last_seq``: seq of the last record returned (0 before any);
    * ``lines``: complete lines read and accepted;
    * ``offset``: bytes from the start of the file to the end of the last accepted line,
      where a writer truncates the file when it opens it for writing;
    * ``line``: the last accepted line as it is in the file, without its ``\\n``;
    * ``position``: where in the file the next bytes to feed start (``offset`` plus
      the bytes fed past it);
    * ``tail``, ``tail_size``: the unfinished tail once the input is over (at most
      ``max_line_bytes`` of it held), else ``b""`` and 0;
    * ``error``: the :class:`FileFormatError` that stopped the reader, or None.
    """

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self.session_id: str | None = None
        self.meta: dict[str, Any] = {}
        self.format_version: int | None = None
        self.last_seq = 0
        self.lines = 0
        self.offset = 0
        self.position = 0
        self.line = b""
        self.tail = b""
        self.tail_size = 0
        self.error: FileFormatError | None = None
        self._buf = b""
        self._pos = 0
        # The start of a line not complete yet, in pieces (held only up to the limit).
        self._parts: list[bytes] = []
        self._partial = 0  # its size so far, held or not
        self._held = 0
        self._eof = False
        self._ended = False

    @classmethod
    def resume(
        cls, session_id: str, last_seq: int, offset: int, *, max_line_bytes: int = MAX_LINE_BYTES
    ) -> LineReader:
        """A reader that goes on in the middle of a file this reader accepted so far.

        ``offset`` is where the line after the one with ``last_seq`` starts: feed the
        file's bytes from there.  Line numbers go on from ``last_seq`` (in a sound file
        line *n* holds seq *n*), and every line must have ``session_id``.
        """
        reader = cls(max_line_bytes=max_line_bytes)
        reader.session_id = session_id
        reader.last_seq = reader.lines = last_seq
        reader.offset = reader.position = offset
        return reader

    def feed(self, data: bytes) -> None:
        """Add the next bytes of the file.

        Call :meth:`next` until it returns :data:`NEED_DATA` before feeding more, so
        that no byte is copied twice.  Raises :class:`LocalProtocolError` after
        :meth:`feed_eof`.
        """
        if self._eof:
            raise LocalProtocolError("bytes fed to a LineReader after feed_eof()")
        self.position += len(data)
        if self._pos < len(self._buf):
            self._buf = self._buf[self._pos :] + data
        else:
            self._buf = bytes(data)
        self._pos = 0

    def feed_eof(self) -> None:
        """Say the input is over: :meth:`next` then returns :data:`END_OF_FILE` once
        every complete line has been returned."""
        self._eof = True

    def next(self) -> Record | ReadState:
        """The next record, :data:`NEED_DATA` or :data:`END_OF_FILE`.

        Raises :class:`FileFormatError` at the first line that breaks a rule (and at the
        end of an input without a complete ``session_start`` line), and again from every
        later call.
        """
        if self.error is not None:
            raise self.error
        try:
            return self._next()
        except FileFormatError as exc:
            self.error = exc
            raise

    def _next(self) -> Record | ReadState:
        buf, pos = self._buf, self._pos
        end = buf.find(b"\n", pos)
        if end == -1:
            self._hold(buf[pos:])
            self._buf, self._pos = b"", 0
            if not self._eof:
                return NEED_DATA
            return self._end()
        self._pos = end + 1
        if self._partial:
            size = self._partial + end - pos
            if size > self.max_line_bytes:
                raise self._too_long(size)
            self._parts.append(buf[pos:end])
            line = b"".join(self._parts)
            self._parts.clear()
            self._partial = self._held = 0
        else:
            if end - pos > self.max_line_bytes:
                raise self._too_long(end - pos)
            line = buf[pos:end]
        lineno = self.lines + 1
        if self.session_id is None:
            record = self._header(line)
        else:
            record = parse_line(
                line, lineno=lineno, session_id=self.session_id, expected_seq=self.last_seq + 1
            )
            if record.type == SESSION_START:
                raise FileFormatError(lineno, "session_start is allowed on line 1 only")
        self.lines = lineno
        self.last_seq = record.seq
        self.offset += len(line) + 1
        self.line = line
        return record

    def _hold(self, rest: bytes) -> None:
        """Keep the start of an unfinished line, up to the limit; count the rest."""
        if not rest:
            return
        room = self.max_line_bytes - self._held
        if room > 0:
            self._parts.append(rest[:room])
            self._held += min(room, len(rest))
        self._partial += len(rest)

    def _too_long(self, size: int) -> FileFormatError:
        return FileFormatError(
            self.lines + 1, f"line is {size} bytes long, more than {self.max_line_bytes}"
        )

    def _end(self) -> ReadState:
        if not self._ended:
            self._ended = True
            self.tail = b"".join(self._parts)
            self.tail_size = self._partial
            self._parts.clear()
            if self.session_id is None:
                if self.tail_size:
                    raise FileFormatError(
                        1, "no complete line: the session_start line is unfinished"
                    )
                raise FileFormatError(0, "empty file: no session_start")
        return END_OF_FILE

    def _header(self, line: bytes) -> Record:
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
        except (msgspec.DecodeError, ValueError, OverflowError) as exc:
            raise FileFormatError(1, f"session_start data is not valid: {exc}") from None
        except RecursionError:
            raise FileFormatError(1, "session_start data is nested too deeply") from None
        if data.format_version not in SUPPORTED_FORMAT_VERSIONS:
            supported = ", ".join(str(v) for v in sorted(SUPPORTED_FORMAT_VERSIONS))
            raise FileFormatError(
                1,
                f"format_version {data.format_version} is not supported "
                f"(this reader reads version {supported})",
            )
        self.session_id = record.session_id
        self.meta = data.meta
        self.format_version = data.format_version
        return record
