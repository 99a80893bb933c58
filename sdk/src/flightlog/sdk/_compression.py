"""Compressed session files: reading them transparently, compressing and restoring them.

A compressed session keeps its path; the file then holds one zstd frame whose content
is the plain file's exact bytes (``zstdcat FILE`` gives them back, ``| jq`` reads them).
A reader tells the two apart by the first four bytes: a plain file starts with ``{``,
a compressed one with zstd's magic number.  Offsets and line numbers are those of the
plain bytes, so a reader that stopped at an offset of the plain file reads on at the
same offset of the compressed one, and the other way round.

A file changes form only by a rename over it, of a complete, synced file whose content
was checked against the original, while holding the original's ``flock`` (the lock
flightlogd holds while it writes a session): a reader with the file open keeps reading
the same records, a crash at any point leaves either form whole beside at most a
temporary file (``.NAME.*.flightlog-tmp``, which no reader lists), and a writer never
appends to a file that is being replaced (it checks, once it holds the lock, that the
file it opened is still the one at the path).

zstandard is an extra (``flightlog-sdk[zstd]``); flightlogd always installs it.  Without
it a plain file reads as always and a compressed one raises :class:`MissingExtra`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Final

from flightlog.protocol import FlightlogError

from ._exceptions import MissingExtra

__all__ = [
    "INDEX_SUFFIX",
    "TEMP_SUFFIX",
    "ZSTD_MAGIC",
    "Compressed",
    "FileBusy",
    "InflatedFile",
    "NotRegularFile",
    "compress_at",
    "compress_path",
    "compressed_reader",
    "decompress_at",
    "index_name",
    "is_compressed",
    "open_regular",
    "open_session_file",
    "plain_size",
    "remove_leftovers",
    "session_files",
    "walk_session_files",
]

#: The first four bytes of every zstd frame.
ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
#: The ending of the temporary file a change of form writes before its rename.
TEMP_SUFFIX: Final = ".flightlog-tmp"
#: How the name of an index flightlogd keeps beside a session ends (:func:`index_name`).
INDEX_SUFFIX: Final = ".flightlog-index"

#: zstd's level: 9 with long-distance matching beats 19 without on agent sessions,
#: at a fraction of the CPU (docs/benchmarks.md, "Compression").
LEVEL: Final = 9
#: A 128 MiB window (2**27): the largest ``zstd -d`` and ``zstdcat`` read without
#: ``--long``, so the files stay readable by the stock tools.
WINDOW_LOG: Final = 27

_CHUNK: Final = 1024 * 1024
#: How a session file's name ends.
_SUFFIX: Final = ".jsonl"
#: A reader's open: never waits (a FIFO opens at once, with or without a writer, and is
#: then refused) and never takes a terminal as its controlling one.
_READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def index_name(name: str) -> str:
    """The name of the index flightlogd keeps beside the session file ``name`` (no
    reader lists it; a vacuum removes it with the file)."""
    return f".{name[:200]}{INDEX_SUFFIX}"


class FileBusy(FlightlogError):
    """The session file is locked: a writer (flightlogd) holds it."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} is being written (flightlogd holds its lock); it is left as it is",
            code="session_busy",
        )


class NotRegularFile(OSError):
    """A path named like a session file that is not a regular file (a FIFO, a socket,
    a device): no reader opens it for reading, no listing yields it."""

    def __init__(self, path: str | os.PathLike[str], mode: int) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({_kind(mode)})", os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a file"


@dataclass(frozen=True)
class Compressed:
    """What a change of form did: the file's size before and after."""

    before: int
    after: int


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:
        raise MissingExtra("zstd", "zstandard") from None
    return zstandard


def is_compressed(head: bytes) -> bool:
    """Whether a file starting with ``head`` (its first bytes) is a compressed session."""
    return head[:4] == ZSTD_MAGIC


def compressed_reader(fileobj: IO[bytes]) -> IO[bytes]:
    """A binary file object reading the plain bytes of the compressed ``fileobj`` (from
    its start); closing it closes ``fileobj``.  Raises :class:`MissingExtra`."""
    zstandard = _zstd()
    fileobj.seek(0)
    reader: IO[bytes] = zstandard.ZstdDecompressor().stream_reader(
        fileobj, read_size=_CHUNK, read_across_frames=True, closefd=True
    )
    return reader


class InflatedFile:
    """The plain bytes of the compressed file at ``fd`` (which it owns), read with
    ``pread`` as a plain file is: forward from where the last read ended costs only what
    is read, and so does a read within the last :data:`_CHUNK` bytes decompressed; one
    further behind decompresses from the start again.  Raises :class:`MissingExtra`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._source: IO[bytes] | None = None
        self._at = 0
        #: The plain bytes just before ``_at``, at most ``_CHUNK`` of them.
        self._recent = b""

    def pread(self, size: int, offset: int) -> bytes:
        if self._source is None or offset < self._at - len(self._recent):
            self._close_source()
            self._source = compressed_reader(os.fdopen(os.dup(self._fd), "rb"))
            self._at, self._recent = 0, b""
        while self._at < offset:
            if not self._advance(min(_CHUNK, offset - self._at)):
                return b""
        held = self._recent[len(self._recent) - (self._at - offset) :] if offset < self._at else b""
        if len(held) >= size:
            return held[:size]
        return held + self._advance(size - len(held))

    def _advance(self, size: int) -> bytes:
        """Decompress up to ``size`` bytes more (fewer at the end)."""
        assert self._source is not None
        data = self._source.read(size)
        self._at += len(data)
        if len(data) >= _CHUNK:
            self._recent = data[-_CHUNK:]
        else:
            self._recent = self._recent[len(self._recent) + len(data) - _CHUNK :] + data
        return data

    def _close_source(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def close(self) -> None:
        self._close_source()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_regular(
    path: str | os.PathLike[str], *, dir_fd: int | None = None, follow_symlinks: bool = True
) -> int:
    """A descriptor reading the regular file at ``path`` (blocking reads).

    Every reader of a session file opens it here.  A FIFO, a socket or a device named
    like one raises :class:`NotRegularFile` (a directory :class:`IsADirectoryError`)
    without being opened, as ``stat`` says; what takes its place meanwhile is opened
    without waiting (a FIFO opens at once, with or without a writer) and refused on what
    ``fstat`` says of the opened file.  Other errors are ``open``'s :class:`OSError`."""
    with contextlib.suppress(FileNotFoundError):
        _regular(path, os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks).st_mode)
    fd = os.open(
        path, _READ_FLAGS if follow_symlinks else _READ_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd
    )
    try:
        _regular(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _regular(path: str | os.PathLike[str], mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, mode)


def plain_size(fd: int) -> int | None:
    """The size of the plain bytes of the compressed file at ``fd``, as its first
    frame's header says (every frame a change of form writes says it); None when it does
    not say.  Raises :class:`MissingExtra`."""
    zstandard = _zstd()
    try:
        size = zstandard.frame_content_size(os.pread(fd, 18, 0))
    except (OSError, zstandard.ZstdError):
        return None
    return size if isinstance(size, int) and size >= 0 else None


@contextlib.contextmanager
def open_session_file(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """Open a session file for reading its plain bytes, compressed or not.

    Raises :class:`OSError` as :func:`open_regular` does, and :class:`MissingExtra`
    for a compressed file when zstandard is not installed.
    """
    fileobj = os.fdopen(open_regular(path), "rb")
    try:
        head = fileobj.read(4)
        if not is_compressed(head):
            fileobj.seek(0)
            with fileobj:
                yield fileobj
            return
        reader = compressed_reader(fileobj)
    except BaseException:
        fileobj.close()
        raise
    with reader:
        yield reader


# ---------------------------------------------------------------------- listing


def session_files(
    paths: Iterable[str | os.PathLike[str]],
    *,
    skipped: Callable[[str, OSError], None] | None = None,
) -> Iterator[str]:
    """Every session file (``*.jsonl``) of ``paths``: a file as it is, a directory's
    files at any depth (:func:`walk_session_files`), in sorted order.  A path that
    does not exist is skipped; a path given that is not a directory is yielded whatever
    it is (opening it says what is wrong with it)."""
    for path in (os.fspath(p) for p in paths):
        if os.path.isdir(path):
            yield from walk_session_files(path, skipped=skipped)
        elif os.path.exists(path):
            yield path


def walk_session_files(
    top: str,
    *,
    skipped: Callable[[str, OSError], None] | None = None,
    onerror: Callable[[OSError], None] | None = None,
    descend: Callable[[str], bool] | None = None,
) -> Iterator[str]:
    """The session files under the directory ``top``, at any depth: a directory's files
    (sorted by name) before its subdirectories (each sorted, walked when ``descend``
    says so; a symbolic link to one is not).  A ``*.jsonl`` that is not a regular file
    (a FIFO, a socket, a device) is no session: left out, and ``skipped(path,
    NotRegularFile)`` hears of it.  A directory that cannot be listed is left out, or
    ``onerror(OSError)`` decides (it may raise).  The walk keeps its own stack, not
    Python's: a tree thousands of directories deep (a client may name a session
    ``d/d/.../x.jsonl``) is walked like any other."""
    # Each directory's subdirectories still to walk, the deepest last.
    pending: list[Iterator[str]] = [iter([top])]
    while pending:
        directory = next(pending[-1], None)
        if directory is None:
            pending.pop()
            continue
        subdirs = yield from _directory_files(directory, skipped, onerror, descend)
        if subdirs:
            pending.append(iter(subdirs))


def _directory_files(
    top: str,
    skipped: Callable[[str, OSError], None] | None,
    onerror: Callable[[OSError], None] | None,
    descend: Callable[[str], bool] | None,
) -> Generator[str, None, list[str]]:
    """The session files of the directory ``top`` (see :func:`walk_session_files`);
    returns its subdirectories to walk."""
    try:
        with os.scandir(top) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError as exc:
        if onerror is not None:
            onerror(exc)
        return []
    subdirs: list[str] = []
    for entry in entries:
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            if not entry.is_symlink() and (descend is None or descend(entry.path)):
                subdirs.append(entry.path)
        elif entry.name.endswith(_SUFFIX):
            try:
                regular = entry.is_file()
            except OSError:  # a link that cannot be followed (a loop): opening it says so
                regular = True
            if not regular:
                try:
                    mode = entry.stat().st_mode
                except OSError:
                    mode = stat.S_IFREG  # a dangling link: opening it says so
                if not stat.S_ISREG(mode):
                    if skipped is not None:
                        skipped(entry.path, NotRegularFile(entry.path, mode))
                    continue
            yield entry.path
    return subdirs


# ------------------------------------------------------------ changing the form


def compress_at(dir_fd: int, name: str, *, label: str | None = None) -> Compressed | None:
    """Compress the session file ``name`` of the directory ``dir_fd`` in place.

    Returns the sizes, or None when the file is compressed already.  Blocking.  Raises
    :class:`FileBusy` while a writer holds the file, :class:`MissingExtra`,
    :class:`FlightlogError` when the file changed meanwhile, and :class:`OSError`.
    """
    zstandard = _zstd()

    def write(source: int, size: int, target: IO[bytes]) -> bytes:
        params = zstandard.ZstdCompressionParameters.from_level(
            LEVEL, source_size=size, window_log=WINDOW_LOG, enable_ldm=True, write_checksum=1
        )
        digest = hashlib.sha256()
        compressor = zstandard.ZstdCompressor(compression_params=params)
        with compressor.stream_writer(target, size=size, closefd=False) as out:
            for chunk in _chunks(source, size):
                digest.update(chunk)
                out.write(chunk)
        return digest.digest()

    return _change_form(dir_fd, name, label or name, compress=True, write=write)


def compress_path(path: str | os.PathLike[str]) -> Compressed | None:
    """:func:`compress_at` for a path (its last component is not followed)."""
    path = os.fspath(path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return compress_at(directory, os.path.basename(path), label=path)
    finally:
        os.close(directory)


def decompress_at(dir_fd: int, name: str, *, label: str | None = None) -> Compressed | None:
    """Give the compressed session file ``name`` of ``dir_fd`` its plain form again (to
    append to it).  Returns the sizes, or None when the file is plain already.  Raises
    as :func:`compress_at` does."""
    zstandard = _zstd()

    def write(source: int, size: int, target: IO[bytes]) -> bytes:
        digest = hashlib.sha256()
        with os.fdopen(os.dup(source), "rb") as raw:
            reader = zstandard.ZstdDecompressor().stream_reader(
                raw, read_size=_CHUNK, read_across_frames=True
            )
            while chunk := reader.read(_CHUNK):
                digest.update(chunk)
                target.write(chunk)
        return digest.digest()

    return _change_form(dir_fd, name, label or name, compress=False, write=write)


def _change_form(
    dir_fd: int, name: str, label: str, *, compress: bool, write: Any
) -> Compressed | None:
    try:
        fd = open_regular(name, dir_fd=dir_fd, follow_symlinks=False)
    except (NotRegularFile, IsADirectoryError) as exc:
        raise FlightlogError(f"{label}: {exc.strerror}", code="path_refused") from None
    try:
        st = os.fstat(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FileBusy(label) from None
        _check_in_place(dir_fd, name, fd, label)
        prefix = f".{name[:200]}."
        remove_leftovers(dir_fd, prefix)
        if is_compressed(os.pread(fd, 4, 0)) == compress:
            return None
        temp = f"{prefix}{secrets.token_hex(6)}{TEMP_SUFFIX}"
        out = os.open(
            temp,
            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
        try:
            with contextlib.suppress(PermissionError):
                # The owner and mode of the session (a root's `flightlog compress`
                # must not take a uid's file from it).
                os.fchown(out, st.st_uid, st.st_gid)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            with os.fdopen(out, "wb", closefd=False) as target:
                digest = write(fd, st.st_size, target)
            os.fsync(out)
            if _plain_digest(out, compressed=compress) != digest:
                raise FlightlogError(
                    f"{label}: the {'compressed' if compress else 'restored'} copy does not "
                    "read back as the original; the original is kept",
                    code="write_failed",
                )
            if os.fstat(fd).st_size != st.st_size:
                raise FlightlogError(f"{label} changed while it was copied", code="write_failed")
            _check_in_place(dir_fd, name, fd, label)
            after = os.fstat(out).st_size
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        finally:
            os.close(out)
        os.fsync(dir_fd)
        return Compressed(st.st_size, after)
    finally:
        os.close(fd)


def remove_leftovers(dir_fd: int, prefix: str) -> None:
    """Remove what a change of form of this file (or flightlogd's write of its index)
    that was killed left behind: ``.NAME.<12 hex>.flightlog-tmp``, ``prefix`` being
    ``.NAME.``.  Safe while holding the file's lock with the file in place: any other
    change of form of it holds that lock, or has given up on finding the file
    replaced."""
    for entry in os.scandir(dir_fd):
        token = entry.name[len(prefix) : -len(TEMP_SUFFIX)]
        if (
            entry.name.startswith(prefix)
            and entry.name.endswith(TEMP_SUFFIX)
            and len(token) == 12
            and all(c in "0123456789abcdef" for c in token)
        ):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.name, dir_fd=dir_fd)


def _check_in_place(dir_fd: int, name: str, fd: int, label: str) -> None:
    here = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    own = os.fstat(fd)
    if (here.st_dev, here.st_ino) != (own.st_dev, own.st_ino):
        raise FlightlogError(f"{label} was replaced meanwhile", code="write_failed")


def _chunks(fd: int, size: int) -> Iterator[bytes]:
    at = 0
    while at < size:
        chunk = os.pread(fd, min(_CHUNK, size - at), at)
        if not chunk:
            break
        at += len(chunk)
        yield chunk


def _plain_digest(fd: int, *, compressed: bool) -> bytes:
    """SHA-256 of the plain bytes the file at ``fd`` holds (read back from the disk)."""
    digest = hashlib.sha256()
    with os.fdopen(os.dup(fd), "rb") as raw:
        raw.seek(0)
        source: IO[bytes] = compressed_reader(raw) if compressed else raw
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.digest()
