"""The blob store: payloads taken out of records (``flightlog.protocol._blobs``), stored
once by SHA-256 beside the session files.

Where: ``.flightlog-blobs/sha256/<2 hex>/<64 hex>`` in the directory of the session's
owner: ``uid/UID/`` of the data root for a uid's sessions, else the root the session
lies under.  The directories are made and walked as the sessions' are (mode 0700, never
through a symlink, the users' directories the daemon's own), the files are 0600, so a
uid's blobs are as private as its sessions and nobody learns whether another uid
stored the same bytes.  A reader finds the store by walking up from a session file's
directory (``flightlog.sdk._blobs``).

A blob is written under a hidden temporary name, synced, renamed to its digest, and the
directory synced, before the line that refers to it is written: a crash never leaves a
reference whose blob is missing or partial (a temporary it leaves is removed by the next
store of that blob, once it is ten minutes old).  A blob already there, of the right
size, is not written again.

:meth:`BlobStore.save` returns the store's lock file (``BLOB_LOCK``), held shared: the
caller closes it once the lines that refer to the blobs are written.  A collection of
the blobs nobody refers to (``flightlog.sdk._blobs.collect_blobs``) removes only under
that lock held exclusive, after scanning again what was written meanwhile, so a blob
whose line is on its way is never taken (docs/operations.md).

:func:`open_blob` opens a blob for a reader that may read a session through the daemon
but cannot read the store (``load_blob``, docs/protocol.md): the store it looks in is
the session's owner's, the one whose sessions the reader may read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
import time

from flightlog.protocol import ErrorCode, FlightlogError, LocalProtocolError
from flightlog.protocol._blobs import BLOB_DIR, BLOB_LOCK, Blob

from ._paths import USERS_DIR, ResolvedPath, Roots, write_then_rename

__all__ = ["BlobStore", "open_blob", "read_blob", "store_parts"]

_DIGEST = re.compile(r"[0-9a-f]{64}")

_TEMP_SUFFIX = ".blob-tmp"
#: Seconds after which a temporary blob is taken for one a killed store left.
_STALE = 600.0


def store_parts(resolved: ResolvedPath) -> tuple[str, ...]:
    """The store's directory for the session at ``resolved``, below its root."""
    parts = resolved.parts
    owner = parts[:2] if parts[0] == USERS_DIR and len(parts) > 2 else ()
    return (*owner, BLOB_DIR, "sha256")


class BlobStore:
    """Stores blobs for the sessions under ``roots`` (blocking: call from a disk thread)."""

    def __init__(self, roots: Roots) -> None:
        self.roots = roots

    def save(self, resolved: ResolvedPath, blobs: list[Blob]) -> int:
        """Store ``blobs`` (of the session at ``resolved``) durably; the store's lock
        file, held shared, for the caller to close once the lines that refer to them
        are written.  Raises :class:`OSError` and :class:`PathRefused`."""
        lock = self._lock(resolved)
        try:
            done: set[str] = set()
            for blob in blobs:
                if blob.sha256 in done:
                    continue
                done.add(blob.sha256)
                where = ResolvedPath(
                    resolved.root, (*store_parts(resolved), blob.sha256[:2], blob.sha256)
                )
                with self.roots.parent_dir(where, create=True) as dir_fd:
                    if not _present(dir_fd, blob):
                        _write(dir_fd, blob)
        except BaseException:
            os.close(lock)
            raise
        return lock

    def _lock(self, resolved: ResolvedPath) -> int:
        where = ResolvedPath(resolved.root, (*store_parts(resolved)[:-1], BLOB_LOCK))
        with self.roots.parent_dir(where, create=True) as dir_fd:
            lock = os.open(
                BLOB_LOCK,
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dir_fd,
            )
        try:
            # Waits only while a collection removes blobs (it rescans what changed).
            fcntl.flock(lock, fcntl.LOCK_SH)
        except BaseException:
            os.close(lock)
            raise
        return lock


def _present(dir_fd: int, blob: Blob) -> bool:
    try:
        st = os.stat(blob.sha256, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == len(blob.data)


def _write(dir_fd: int, blob: Blob) -> None:
    now = time.time()
    for entry in os.scandir(dir_fd):
        if entry.name.startswith(f".{blob.sha256}.") and entry.name.endswith(_TEMP_SUFFIX):
            # Left by a store that was killed (nothing refers to it), unless another
            # session's actor is writing the same blob right now.
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat(follow_symlinks=False).st_mtime > _STALE:
                    os.unlink(entry.name, dir_fd=dir_fd)
    temp = f".{blob.sha256}.{secrets.token_hex(6)}{_TEMP_SUFFIX}"
    write_then_rename(dir_fd, temp, blob.sha256, blob.data, sync=True)
    os.fsync(dir_fd)


def open_blob(roots: Roots, resolved: ResolvedPath, sha256: str, most: int) -> tuple[int, int]:
    """A descriptor of the blob ``sha256`` in the store of the session at ``resolved``
    and its size, for the caller to read (:func:`read_blob`) and close (blocking).

    Raises :class:`LocalProtocolError` (``bad_message``: not a digest),
    :class:`FlightlogError` (``blob_not_found``; ``blob_too_large`` over ``most``
    bytes) and :class:`~._paths.PathRefused`."""
    if not _DIGEST.fullmatch(sha256):
        raise LocalProtocolError(
            f"{sha256!r} is not a blob's digest (64 lowercase hex digits)",
            code=ErrorCode.BAD_MESSAGE,
        )
    where = ResolvedPath(resolved.root, (*store_parts(resolved), sha256[:2], sha256))
    try:
        with roots.parent_dir(where, create=False) as dir_fd:
            fd = os.open(sha256, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        raise _not_found(resolved, sha256) from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise _not_found(resolved, sha256) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_found(resolved, sha256)
        if st.st_size > most:
            raise FlightlogError(
                f"blob {sha256} holds {st.st_size} bytes, more than a frame carries "
                f"({most}); read it from the store",
                code=ErrorCode.BLOB_TOO_LARGE,
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_blob(fd: int, size: int) -> bytes:
    """The ``size`` bytes of the blob opened at ``fd``, which it closes (blocking)."""
    try:
        return os.pread(fd, size, 0) if size else b""
    finally:
        os.close(fd)


def _not_found(resolved: ResolvedPath, sha256: str) -> FlightlogError:
    return FlightlogError(
        f"the blob store of {resolved.path} holds no blob {sha256}",
        code=ErrorCode.BLOB_NOT_FOUND,
    )
