"""A tail's catch-up from the file: the complete lines of a session file a subscriber
has not had yet, read in batches from a disk thread (:class:`FileTail`)."""

from __future__ import annotations

import os

from flightlog.protocol import ErrorCode, FileFormatError, LocalProtocolError
from flightlog.protocol.format import LineReader
from flightlog.sdk.storage import InflatedFile, is_compressed

from ._paths import ResolvedPath, Roots
from ._storage import read_on

__all__ = ["FileTail"]

_BATCH_BYTES = 256 * 1024
#: Bytes of the file one step of a catch-up reads at most, lines or not: a file of
#: holes or of no newlines holds a disk thread for one step at a time.
_STEP_BYTES = 4 * 1024 * 1024


class FileTail:
    """Reads the complete lines with ``seq >= next_seq`` of a session file through a
    :class:`LineReader`, so a tail keeps every reading rule (blocking: call
    :meth:`read_batch` from a disk thread).

    At ``offset`` 0 the file is read from line 1; past it, the reader resumes there with
    the file's ``session_id`` (read from line 1) and the line number ``offset_seq``, the
    seq of the line at ``offset`` (line *n* holds seq *n* in the part of a file already
    read); lines before ``next_seq`` are read and skipped.  A broken line raises the
    reader's :class:`FileFormatError`, naming the line, once the lines before it are
    returned.  A final line without ``\\n`` is awaited (the writer may be finishing it),
    or ignored at the end of a file at rest; a file without a complete first line is
    refused.  The file is opened for each batch and closed before the batch is sent, so a
    subscriber that does not read holds no descriptor while it keeps the daemon waiting.
    Every batch must come from the same file (inode); only regular files are read; a
    line longer than ``max_line`` (what a frame carries) is refused, and no more than
    that of a line is held.
    """

    def __init__(
        self,
        roots: Roots,
        resolved: ResolvedPath,
        offset: int,
        offset_seq: int,
        next_seq: int,
        max_line: int,
    ) -> None:
        self.roots = roots
        self.resolved = resolved
        self.offset = offset
        self.offset_seq = offset_seq
        self.next_seq = next_seq
        self.max_line = max_line
        self._reader: LineReader | None = None
        self._ident: tuple[int, int] | None = None
        self._compressed = False
        #: A compressed file's plain bytes, read on from batch to batch (closed by
        #: :meth:`close`, or when the file changes form).
        self._inflated: InflatedFile | None = None
        #: The last :meth:`read_batch` reached the end of the file.
        self.at_end = False

    @property
    def held(self) -> int:
        """Bytes the reader holds past its last line (the rest of a read, the start
        of a long line) until the next batch, at most."""
        reader = self._reader
        return reader.position - reader.offset if reader is not None else 0

    def _open(self) -> int:
        try:
            fd = self.roots.open_file(self.resolved, write=False)
        except FileNotFoundError:
            raise LocalProtocolError(
                f"{self.resolved.path} does not exist", code=ErrorCode.SESSION_NOT_FOUND
            ) from None
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        compressed = is_compressed(os.pread(fd, 4, 0))
        if self._ident is None:
            self._ident, self._compressed = ident, compressed
        if ident != self._ident:
            if not (compressed or self._compressed):
                os.close(fd)
                raise LocalProtocolError(
                    f"{self.resolved.path} was replaced while it was read",
                    code=ErrorCode.SESSION_CORRUPT,
                )
            # Compressed, or given its plain form again to be written: the same bytes
            # (and more), at the same offsets; the reader checks every seq it reads on.
            self.close()
            self._ident, self._compressed = ident, compressed
        if compressed and self._inflated is None:
            self._inflated = InflatedFile(os.dup(fd))
        return fd

    def close(self) -> None:
        """Let go of a compressed file's reader.  Never raises."""
        inflated, self._inflated = self._inflated, None
        if inflated is not None:
            inflated.close()

    def read_batch(self) -> list[bytes]:
        """The next lines wanted, about ``_BATCH_BYTES`` of them; ``[]`` at the end of
        the file.  Raises :class:`FileFormatError` at a broken line."""
        lines: list[bytes] = []
        size = 0
        self.at_end = False
        fd = self._open()
        try:
            reader = self._reader or self._start(fd)
            start = reader.position
            pread = self._inflated.pread if self._inflated else None
            for record in read_on(fd, reader, to_the_end=False, limit=_STEP_BYTES, pread=pread):
                self.offset, self.offset_seq = reader.offset, record.seq + 1
                if record.seq >= self.next_seq:
                    self.next_seq = record.seq + 1
                    size += len(reader.line)
                    lines.append(reader.line)
                    if size >= _BATCH_BYTES:
                        break
            else:
                # Stopped at the end of the file, or after a step's worth of bytes
                # (a file of no newlines, or of holes, is read step by step).
                self.at_end = reader.position - start < _STEP_BYTES
                if self.at_end and reader.session_id is None:
                    # No first line, nor anything to wait for: flightlogd never
                    # leaves a session file without its first line.
                    reader.feed_eof()
                    reader.next()
        except FileFormatError:
            if not lines:
                raise
            # The lines before the broken one go first; the reader raises it again.
        finally:
            os.close(fd)
        return lines

    def _start(self, fd: int) -> LineReader:
        if self.offset == 0:
            reader = LineReader(max_line_bytes=self.max_line)
        else:
            # Read on where the subscriber is, with the session id of line 1.
            header = LineReader(max_line_bytes=self.max_line)
            pread = self._inflated.pread if self._inflated else None
            next(read_on(fd, header, to_the_end=True, pread=pread))
            assert header.session_id is not None
            reader = LineReader.resume(
                header.session_id, self.offset_seq - 1, self.offset, max_line_bytes=self.max_line
            )
        self._reader = reader
        return reader
