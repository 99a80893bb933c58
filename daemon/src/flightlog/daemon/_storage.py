"""Session files on disk: create, validate and open, append, sync.

A compressed session file (``flightlog.sdk._compression``) is opened as it is: its
plain bytes are read through a decompressor (from where its index stops, as a plain
file's are), and it is given its plain form again only at the first write, in a disk
thread, so the next run goes on after what it held; a session opened and closed
without a write stays compressed.

Everything here is blocking; the actor calls the slow parts (open, sync, reading a
checkpoint) through a worker thread so one slow disk does not stall other sessions.
A :class:`SessionFile` is owned by exactly one actor.  Its descriptor may be closed
while the session is idle and reopened later; reopening checks that the file is still
the same inode and the same size, so a change made behind the daemon's back is caught
instead of being appended to.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec
from msgspec import UNSET

from flightlog.protocol import (
    CHECKPOINT,
    ErrorCode,
    FileFormatError,
    FlightlogError,
    Origin,
    Record,
)
from flightlog.protocol._calls import CallLedger, OpenCall
from flightlog.protocol.format import (
    LineReader,
    ReadState,
    RunLedger,
    event_id_key,
    session_start_line,
)
from flightlog.sdk.storage import (
    FileBusy,
    InflatedFile,
    decompress_at,
    is_compressed,
    plain_size,
)

from ._index import (
    INDEX_FROM,
    INDEX_VERSION,
    REINDEX_AFTER,
    Pread,
    SessionIndex,
    line_digest,
    load_index,
    save_index,
)
from ._paths import ResolvedPath, Roots

__all__ = ["CheckpointRef", "SessionBusy", "SessionFile", "StorageError", "read_on"]

# Bytes of a file read at a time.
_READ_BYTES = 256 * 1024

# Bytes given to one write() at most.  A larger write makes the kernel fill the page
# cache with larger folios, and on a VM whose free memory goes back to the host (free
# page reporting) those come from memory the host must fault in again: on the bench's
# VM a batch of three 64 KiB records cost the daemon 64-86 µs of system time per
# record in one write, 40-51 µs in writes of this size (docs/benchmarks.md).  Three
# system calls for 192 KiB cost nothing beside that.
_WRITE_BYTES = 64 * 1024


# The two calls that put a session's bytes on disk.  Nothing in the daemon changes
# them; they are the seam through which the fault tests (tests/faults) make one file's
# writes stop part-way or fail with EIO, and its fsync fail.
def _os_write(fd: int, data: memoryview) -> int:
    return os.write(fd, data)


def _os_fsync(fd: int) -> None:
    os.fsync(fd)


class StorageError(FlightlogError):
    """A write, sync or reopen failed; final for the session (code ``write_failed``)."""

    def __init__(self, path: str, what: str, exc: OSError | str) -> None:
        reason = exc if isinstance(exc, str) else f"{exc.strerror or exc} (errno {exc.errno})"
        super().__init__(f"{what} of {path} failed: {reason}", code=ErrorCode.WRITE_FAILED)


class SessionBusy(FlightlogError):
    """Another process holds the file's lock."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} is locked by another process (another flightlogd?)",
            code=ErrorCode.SESSION_BUSY,
        )


@dataclass(frozen=True)
class CheckpointRef:
    """Where the latest checkpoint line lies in the file."""

    seq: int
    offset: int
    length: int


@dataclass(kw_only=True)
class SessionFile:
    """One session file, opened for appending and exclusively ``flock``-ed."""

    roots: Roots
    resolved: ResolvedPath
    session_id: str
    meta: dict[str, object] = field(default_factory=dict)
    last_seq: int = 0
    size: int = 0
    fd: int | None = None
    ident: tuple[int, int] = (0, 0)
    checkpoint: CheckpointRef | None = None
    #: The file's runs: every run id, the interrupted runs, the last run and its items.
    ledger: RunLedger = field(default_factory=RunLedger)
    truncated_bytes: int = 0
    #: Written since the last fsync: a sync is owed, even after the descriptor closed.
    dirty: bool = False
    #: The ``session_start`` line, for a file this daemon created (tail_all sees it).
    created_line: bytes = b""
    #: The cut runs and open calls of the file up to ``calls_at`` (its offset, after
    #: the line with ``calls_seq``): gathered by the scan at open, caught up by
    #: :meth:`resume_calls`, so ``resume()`` never reads the file whole again.
    calls: CallLedger = field(default_factory=CallLedger)
    #: The runs of the file up to ``calls_at``, as its records say them (the index's:
    #: :attr:`ledger` also counts what the writer numbered and the file lacks).
    runs_read: RunLedger = field(default_factory=RunLedger)
    calls_at: int = 0
    calls_seq: int = 0
    #: The length of the line that ends at ``calls_at``, with its newline.
    last_line: int = 0
    #: The size the index beside the file was last written or taken at.
    indexed: int | None = None
    #: The event ids of the records it holds (``event_id_key``: 16 bytes each), so that
    #: a record with one of them is not written again.
    event_ids: set[bytes] = field(default_factory=set)
    #: The file is compressed (opened as it is): its plain bytes are read through
    #: ``inflated`` and ``stored_size`` is its size on disk, until the first write gives
    #: it its plain form again.
    compressed: bool = False
    stored_size: int = 0
    inflated: InflatedFile | None = None

    @property
    def path(self) -> str:
        return self.resolved.path

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(
        cls,
        roots: Roots,
        resolved: ResolvedPath,
        *,
        session_id: str,
        meta: dict[str, object],
        time: str,
        origin: Origin | None = None,
    ) -> SessionFile:
        """Create the file, write ``session_start`` and sync file and directory entry.

        Raises :class:`LocalProtocolError` (``bad_message``) for a ``meta`` that cannot
        be written, :class:`FileExistsError`, :class:`PathRefused`, :class:`StorageError`.
        """
        line, written = session_start_line(session_id, time, meta, origin)
        session = cls(
            roots=roots,
            resolved=resolved,
            session_id=session_id,
            meta=written,
            created_line=line,
            calls_at=len(line),
            calls_seq=1,
            last_line=len(line),
        )

        def fill(fd: int) -> None:
            session.fd = fd
            session.ident = _ident(fd)
            session.write(line, count=1)
            session._fsync(fd)  # it has no name yet: linked once synced

        try:
            fd = roots.create_file(resolved, fill)
        finally:
            session.fd = None  # the descriptor that wrote it is closed
        try:
            _lock(fd, resolved.path)
        except BaseException:
            os.close(fd)
            raise
        session.fd = fd
        return session

    @classmethod
    def open(cls, roots: Roots, resolved: ResolvedPath) -> SessionFile:
        """Open an existing file, validate it and truncate an unfinished tail.  A file
        with a sound index beside it (:mod:`._index`) is read from where the index
        stops; any other is read whole, and a big one gets an index.

        Raises :class:`FileNotFoundError`, :class:`PathRefused`, :class:`SessionBusy`,
        :class:`FileFormatError` (the reader's error, naming the line),
        :class:`StorageError`.
        """
        fd = _open_as_it_is(roots, resolved)
        inflated: InflatedFile | None = None
        try:
            if is_compressed(os.pread(fd, 4, 0)):
                inflated = InflatedFile(os.dup(fd))
            session = cls._scan(roots, resolved, fd, inflated)
        except BaseException:
            if inflated is not None:
                inflated.close()
            os.close(fd)
            raise
        # The session owns the descriptors from here: its close() lets go of them.
        session.fd, session.inflated = fd, inflated
        try:
            session.ident = _ident(fd)
            if inflated is not None:
                session.compressed, session.stored_size = True, os.fstat(fd).st_size
            if session.truncated_bytes:
                if session.compressed:
                    # The unfinished tail is cut from the plain form.
                    fd = session._restore(tail=session.truncated_bytes)
                try:
                    os.ftruncate(fd, session.size)
                except OSError as exc:
                    raise StorageError(
                        resolved.path, "truncating the unfinished tail", exc
                    ) from None
                session.dirty = True
                session.sync()
                session.indexed = None  # the file's mtime changed
            session.save_index()
        except BaseException:
            session.close()
            raise
        return session

    @classmethod
    def _scan(
        cls, roots: Roots, resolved: ResolvedPath, fd: int, inflated: InflatedFile | None
    ) -> SessionFile:
        pread = inflated.pread if inflated is not None else None
        index, meta = _index_of(roots, resolved, fd, pread)
        reader = LineReader()
        ledger, calls = RunLedger(), CallLedger()
        event_ids: set[bytes] = set()
        checkpoint: CheckpointRef | None = None
        if index is not None:
            try:
                ledger = RunLedger.from_state(index.runs)
            except ValueError:  # a state no file leaves: the index is not to be had
                index = None
        if index is not None:
            reader = LineReader.resume(index.session_id, index.last_seq, index.offset)
            calls = CallLedger.from_state(index.calls)
            ids = index.event_ids
            event_ids = {ids[i : i + 16] for i in range(0, len(ids), 16)}
            checkpoint = CheckpointRef(*index.checkpoint) if index.checkpoint else None
        last_line = index.last_line[0] if index is not None else 0
        for record in read_on(fd, reader, to_the_end=True, pread=pread):
            ledger.add(record.type, record.run_id)
            calls.feed(record)
            if record.event_id is not UNSET:
                event_ids.add(event_id_key(record.event_id))
            last_line = len(reader.line) + 1
            if record.type == CHECKPOINT:
                checkpoint = CheckpointRef(record.seq, reader.offset - last_line, last_line)
        assert reader.session_id is not None  # else the reader raised at the end
        return cls(
            roots=roots,
            resolved=resolved,
            session_id=reader.session_id,
            meta=dict(reader.meta) if index is None else meta,
            last_seq=reader.last_seq,
            size=reader.offset,
            checkpoint=checkpoint,
            ledger=ledger,
            truncated_bytes=reader.position - reader.offset,
            calls=calls,
            runs_read=RunLedger.from_state(ledger.state()),
            calls_at=reader.offset,
            calls_seq=reader.last_seq,
            last_line=last_line,
            event_ids=event_ids,
            # A compressed file's index may be another inode's (the plain file's): it
            # is written again once the file has its plain form.
            indexed=index.offset if index is not None else None,
        )

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes | bytearray, count: int) -> None:
        """Append ``data`` (``count`` complete lines), in ``write`` calls of at most
        :data:`_WRITE_BYTES`.  Raises :class:`StorageError`; a failure is final, and
        the lines before the failure point may be on disk with a torn last line, which
        readers ignore and the next open truncates.
        """
        fd = self.ensure_open()
        if self.compressed:
            fd = self._restore()
        self._check_size(fd, "write")
        view = memoryview(data)
        written = 0
        try:
            while written < len(view):
                n = _os_write(fd, view[written : written + _WRITE_BYTES])
                if n <= 0:
                    # A regular file that takes nothing would have this loop spin on the
                    # event loop for ever; no later write would fare better.
                    raise StorageError(
                        self.path, "write", f"the file took 0 of {len(view) - written} bytes"
                    )
                written += n
        except OSError as exc:
            raise StorageError(self.path, "write", exc) from None
        finally:
            view.release()
            self.size += written
            if written:
                self.dirty = True
        self.last_seq += count

    def sync(self) -> None:
        """fsync what was written since the last sync, reopening the file if its
        descriptor was closed meanwhile (fsync flushes the file, whichever descriptor
        wrote it).  Blocking: call from a worker thread.  Raises StorageError."""
        if not self.dirty:
            return
        fd = self.ensure_open()
        # What is synced is acknowledged: it must be the file at the session's path.
        self._check_in_place(fd, "fsync")
        self._fsync(fd)

    def _fsync(self, fd: int) -> None:
        try:
            _os_fsync(fd)
        except OSError as exc:
            raise StorageError(self.path, "fsync", exc) from None
        self.dirty = False

    def read_checkpoint(self) -> Record | None:
        """The latest checkpoint record, read back from the file (blocking)."""
        ref = self.checkpoint
        if ref is None:
            return None
        fd = self.ensure_open()
        self._check_in_place(fd, "reading a checkpoint")
        line = self._pread(fd, ref.length, ref.offset)
        try:
            record = msgspec.json.decode(line, type=Record)
        except msgspec.DecodeError:
            record = None
        if record is None or record.seq != ref.seq:
            raise StorageError(
                self.path, "reading a checkpoint", "the file changed outside flightlogd"
            )
        return record

    def resume_calls(self) -> tuple[list[str], list[OpenCall]]:
        """The file's cut runs and open calls (blocking): what was gathered, caught up
        with the lines written since, read from where it stopped."""
        self._catch_up(self.ensure_open())
        return self.calls.result()

    def _catch_up(self, fd: int) -> None:
        """Read the lines written since ``calls_at`` into the calls and the runs."""
        if self.calls_at >= self.size:
            return
        self._check_in_place(fd, "reading the calls")
        reader = LineReader.resume(self.session_id, self.calls_seq, self.calls_at)
        try:
            for record in read_on(fd, reader, to_the_end=False, pread=self._inflated_pread):
                self.calls.feed(record)
                self.runs_read.add(record.type, record.run_id)
                self.last_line = len(reader.line) + 1
                if reader.offset >= self.size:
                    break
        except (FileFormatError, OSError) as exc:
            raise StorageError(self.path, "reading the calls", str(exc)) from None
        self.calls_at, self.calls_seq = reader.offset, reader.last_seq

    @property
    def index_due(self) -> bool:
        """Whether :meth:`save_index` would write: a big file, grown
        :data:`REINDEX_AFTER` past its index (or without one)."""
        indexed = self.indexed
        if self.compressed:  # an index is written for the plain form
            return False
        return self.size >= INDEX_FROM and (indexed is None or self.size - indexed >= REINDEX_AFTER)

    def save_index(self) -> None:
        """Keep the index beside a big file, up to its end, unless it is there already
        or the file grew less than :data:`REINDEX_AFTER` past it (blocking).  Call only
        while every line written is in the file (and no write failed).  A file whose
        descriptor was closed is opened to read, never given its plain form again.
        Never raises: without its index the file is read whole next time."""
        if not self.index_due:
            return
        try:
            fd = self.fd if self.fd is not None else _open_locked(self.roots, self.resolved)
            try:
                self._catch_up(fd)
                self._check_in_place(fd, "writing the index")
                line = os.pread(fd, self.last_line, self.size - self.last_line)
                st = os.fstat(fd)
                ref = self.checkpoint
                index = SessionIndex(
                    version=INDEX_VERSION,
                    session_id=self.session_id,
                    offset=self.size,
                    last_seq=self.last_seq,
                    last_line=(self.last_line, line_digest(line)),
                    ident=self.ident,
                    mtime_ns=st.st_mtime_ns,
                    checkpoint=(ref.seq, ref.offset, ref.length) if ref is not None else None,
                    runs=self.runs_read.state(),
                    calls=self.calls.state(),
                    event_ids=b"".join(self.event_ids),
                )
                with self.roots.parent_dir(self.resolved, create=False) as dir_fd:
                    save_index(dir_fd, self.resolved.parts[-1], index, st)
            finally:
                if fd != self.fd:
                    os.close(fd)
        except (OSError, FlightlogError):
            return
        self.indexed = self.size

    def _check_size(self, fd: int, what: str) -> None:
        """Raise :class:`StorageError` unless the file holds exactly what was written
        to it: truncated, or appended to by someone else, it is not the session's."""
        try:
            size = os.fstat(fd).st_size
        except OSError as exc:
            raise StorageError(self.path, what, exc) from None
        if size != (self.stored_size if self.compressed else self.size):
            raise StorageError(
                self.path,
                what,
                f"the file is {size} bytes long where flightlogd wrote {self.size}: "
                "it was truncated or written outside flightlogd",
            )

    def _check_in_place(self, fd: int, what: str) -> None:
        """:meth:`_check_size`, and the file is still the one at the session's path (not
        renamed over, moved or removed)."""
        self._check_size(fd, what)
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != self.ident:
            raise StorageError(
                self.path, what, "the file at the session's path was replaced or removed"
            )

    @property
    def _inflated_pread(self) -> Pread | None:
        """How the plain bytes of a compressed file are read (None: ``os.pread``)."""
        return self.inflated.pread if self.compressed and self.inflated is not None else None

    def _pread(self, fd: int, size: int, offset: int) -> bytes:
        """``size`` bytes of the plain file at ``offset``."""
        pread = self._inflated_pread
        return pread(size, offset) if pread is not None else os.pread(fd, size, offset)

    def _restore(self, *, tail: int = 0) -> int:
        """Give the compressed file its plain form again (the same bytes), to append to:
        its lock is let go for the change of form, which takes it, then taken again on
        the plain file, which must hold exactly what was read (and the unfinished
        ``tail`` bytes the open found after it).  Blocking: a disk
        thread's (the actor writes to a compressed file from one).  Raises
        :class:`StorageError`."""
        self.close()
        try:
            fd = _open_plain(self.roots, self.resolved)
        except (OSError, FlightlogError) as exc:
            raise StorageError(self.path, "restoring the compressed file", str(exc)) from None
        st = os.fstat(fd)
        if st.st_size != self.size + tail:
            os.close(fd)
            raise StorageError(
                self.path, "restoring the compressed file", "it changed outside flightlogd"
            )
        self.fd, self.ident = fd, (st.st_dev, st.st_ino)
        self.compressed, self.stored_size, self.indexed = False, 0, None
        return fd

    def note_checkpoint(self, seq: int, offset: int, length: int) -> None:
        self.checkpoint = CheckpointRef(seq, offset, length)

    # ------------------------------------------------------- descriptor caching

    def ensure_open(self) -> int:
        """The descriptor, reopening the file if it was closed while idle.

        Raises :class:`StorageError` when the file is gone, was replaced, changed size
        or was locked behind the daemon's back (its lock is let go while it is closed).
        """
        if self.fd is not None:
            return self.fd
        try:
            fd = self.roots.open_file(self.resolved)
        except (OSError, FlightlogError) as exc:
            raise StorageError(self.path, "reopening", str(exc)) from None
        try:
            try:
                _lock(fd, self.path)
            except SessionBusy:
                raise StorageError(
                    self.path, "reopening", "the file is locked by another process"
                ) from None
            st = os.fstat(fd)
            if self.compressed:
                if (st.st_dev, st.st_ino) != self.ident or st.st_size != self.stored_size:
                    raise StorageError(
                        self.path,
                        "reopening",
                        "the file was replaced or changed outside flightlogd",
                    )
                self.inflated = InflatedFile(os.dup(fd))
                self.fd = fd
                return fd
            if (st.st_dev, st.st_ino) != self.ident and is_compressed(os.pread(fd, 4, 0)):
                # Compressed while its descriptor was closed (flightlog compress): the
                # same bytes, given their plain form again to be appended to.
                os.close(fd)
                fd = -1
                try:
                    fd = _open_plain(self.roots, self.resolved)
                except (OSError, FlightlogError) as exc:
                    raise StorageError(self.path, "reopening", str(exc)) from None
                st = os.fstat(fd)
                if st.st_size == self.size:
                    self.ident = (st.st_dev, st.st_ino)
            if (st.st_dev, st.st_ino) != self.ident or st.st_size != self.size:
                raise StorageError(
                    self.path, "reopening", "the file was replaced or changed outside flightlogd"
                )
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        self.fd = fd
        return fd

    def close(self) -> None:
        """Close the descriptor (and release the lock).  Never raises."""
        fd, self.fd = self.fd, None
        inflated, self.inflated = self.inflated, None
        if inflated is not None:
            inflated.close()  # its own descriptor: the lock goes with the last one
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def read_on(
    fd: int,
    reader: LineReader,
    *,
    to_the_end: bool,
    limit: int | None = None,
    pread: Pread | None = None,
) -> Iterator[Record]:
    """Feed ``reader`` the file at ``fd`` (or what ``pread(size, offset)`` reads: a
    compressed file's plain bytes) from its ``position`` on and yield its records
    (blocking).  At the end of the file, with ``to_the_end`` the input is over (an
    unfinished tail is set aside); without, the reader waits there for more, to be
    read on later.  With a ``limit``, it stops once it has read that many bytes (to be
    read on later).  Raises the reader's :class:`FileFormatError` and :class:`OSError`.
    """
    read = 0
    while True:
        item = reader.next()
        if isinstance(item, Record):
            yield item
            continue
        if item is ReadState.END_OF_FILE or (limit is not None and read >= limit):
            return
        position = reader.position
        data = pread(_READ_BYTES, position) if pread else os.pread(fd, _READ_BYTES, position)
        read += len(data)
        if data:
            reader.feed(data)
        elif to_the_end:
            reader.feed_eof()
        else:
            return


def _index_of(
    roots: Roots, resolved: ResolvedPath, fd: int, pread: Pread | None
) -> tuple[SessionIndex | None, dict[str, object]]:
    """The index of a big file, if it is sound (:func:`load_index`) and the file's first
    line names its session; with the meta that line holds.  A compressed file is read
    through ``pread`` (forward as far as can be: its first line, then the lines the
    index names), and its index is taken on what the lines say alone."""
    size = os.fstat(fd).st_size if pread is None else plain_size(fd)
    if size is None or size < INDEX_FROM:
        return None, {}
    reader = LineReader()
    try:
        for _ in read_on(fd, reader, to_the_end=True, pread=pread):
            break  # the first line: the reader checked it, and holds its meta
    except FileFormatError:
        return None, {}  # read whole, the scan says what is wrong
    with roots.parent_dir(resolved, create=False) as dir_fd:
        index = load_index(
            dir_fd, resolved.parts[-1], fd, restored=pread is not None, pread=pread, size=size
        )
    if index is None or reader.session_id != index.session_id:
        return None, {}
    return index, dict(reader.meta)


def _open_locked(roots: Roots, resolved: ResolvedPath) -> int:
    """The session file opened to read and locked, as it is (plain or not)."""
    fd = roots.open_file(resolved, write=False)
    try:
        _lock(fd, resolved.path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_as_it_is(roots: Roots, resolved: ResolvedPath) -> int:
    """Open the session file for appending, locked, plain or compressed: the file the
    descriptor holds is the one at the path once it is locked (a change of form renames
    over it holding the lock).  Raises as :meth:`SessionFile.open` does."""
    for _ in range(3):
        fd = roots.open_file(resolved)
        try:
            _lock(fd, resolved.path)
            st, here = os.fstat(fd), _named(resolved.path)
            if (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise StorageError(resolved.path, "opening", "the file kept being replaced")


def _open_plain(roots: Roots, resolved: ResolvedPath) -> int:
    """Open the session file for appending, locked, in its plain form: a compressed
    file is given its plain form first (a rename over it, as compressing made it).
    Raises as :meth:`SessionFile.open` does."""
    for _ in range(3):
        fd = _open_as_it_is(roots, resolved)
        try:
            if not is_compressed(os.pread(fd, 4, 0)):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        try:
            with roots.parent_dir(resolved, create=False) as dir_fd:
                decompress_at(dir_fd, resolved.parts[-1], label=resolved.path)
        except FileBusy:
            raise SessionBusy(resolved.path) from None
        except FlightlogError as exc:
            raise StorageError(
                resolved.path, "restoring the compressed file", exc.message
            ) from None
    raise StorageError(resolved.path, "opening", "the file kept being replaced")


def _lock(fd: int, path: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SessionBusy(path) from None


def _named(path: str) -> os.stat_result:
    """What ``path`` names now; a vacuum takes the lock, then removes or archives the
    file, so a file opened before and locked after that is no session file any more."""
    try:
        return os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "removed while it was being opened", path) from None


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)
