"""Resolving session paths under the data root and the allowed roots, safely.

Relative paths resolve under the data root; absolute paths must lie under the root or
an allowed root.  Every component is opened with ``O_NOFOLLOW`` relative to the one
before it, so neither a ``..`` nor a symlink anywhere in the path can lead out of a
root (``O_NOFOLLOW`` alone guards only the last component).

A client of another uid than the daemon's has its relative paths resolved under
``uid/UID/`` of the data root: its own directory (docs/operations.md, "Who may write,
who may read").  The ``uid`` directory and those in it are the daemon's own: a
directory there that the daemon's uid does not own is refused, so that nobody who may
write a root on disk can put one in place first.  A ``uid`` directory of a root that
is not the daemon's, or a symlink, file or FIFO by that name that is not the daemon's
(planted by someone who may write the root, perhaps after moving the daemon's away) is
moved aside and replaced, logged (``planted_directory_moved``); where the daemon may
not move it (a sticky root it does not own) every path under it is refused, logged as
``planted_directory``.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import structlog

from flightlog.protocol import ErrorCode, FlightlogError

__all__ = ["USERS_DIR", "PathRefused", "ResolvedPath", "Roots", "write_then_rename"]

log = structlog.get_logger("flightlogd.paths")

#: The directory of a root that holds one directory per uid, named by the number.
USERS_DIR = "uid"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_MAX = 4096
_FILE_FLAGS = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
# A file with no name yet is linked into place through /proc (see open(2), O_TMPFILE).
_PROC_FD = os.path.isdir("/proc/self/fd")


class PathRefused(FlightlogError):
    """A session path lies outside the roots, climbs with ``..`` or crosses a symlink."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"path {path!r} refused: {reason}", code=ErrorCode.PATH_REFUSED)


@dataclass(frozen=True)
class ResolvedPath:
    """A session path split into its root and the components below it."""

    root: str
    parts: tuple[str, ...]

    @property
    def path(self) -> str:
        return os.path.join(self.root, *self.parts)


class Roots:
    """The data root and the allowed roots, resolved once at start."""

    def __init__(self, root: str, allow: tuple[str, ...] = ()) -> None:
        self.root = os.path.realpath(root)
        self.allowed = tuple(dict.fromkeys([self.root, *(os.path.realpath(a) for a in allow)]))

    def resolve(self, path: str, *, uid: int | None = None) -> ResolvedPath:
        """Split ``path`` into a root and components; with ``uid``, a relative path
        resolves under that uid's directory of the data root (``uid/UID/``).

        Raises :class:`PathRefused` for an empty path, a NUL byte, a path of 4096 bytes
        or more, a ``..`` or ``.`` component, or an absolute path under no root.
        """
        if not path or "\x00" in path:
            raise PathRefused(path, "empty or contains a NUL byte")
        if len(path.encode(errors="surrogatepass")) >= _PATH_MAX:
            # Also bounds how many directories one create may make.
            raise PathRefused(path[:64] + "...", f"longer than {_PATH_MAX - 1} bytes")
        if os.path.isabs(path):
            for root in sorted(self.allowed, key=len, reverse=True):
                if path == root or path.startswith(root.rstrip("/") + "/"):
                    rest = path[len(root) :]
                    break
            else:
                roots = ", ".join(self.allowed)
                raise PathRefused(path, f"absolute paths must lie under an allowed root ({roots})")
        else:
            root, rest = self.root, path
        parts = tuple(p for p in rest.split("/") if p)
        if not parts:
            raise PathRefused(path, "names a root directory, not a file")
        if any(p in ("..", ".") for p in parts):
            raise PathRefused(path, "'.' and '..' components are not allowed")
        if uid is not None and not os.path.isabs(path):
            parts = (USERS_DIR, str(uid), *parts)
        return ResolvedPath(root, parts)

    @staticmethod
    def owner(resolved: ResolvedPath) -> int | None:
        """The uid whose directory holds the session (``uid/UID/...``), or None for a
        session elsewhere in a root: the daemon's own uid's."""
        parts = resolved.parts
        if parts[0] != USERS_DIR:
            return None
        name = parts[1] if len(parts) > 2 else ""
        if name.isascii() and name.isdigit() and str(int(name)) == name:
            return int(name)
        # A file in the users' directory itself, or under a name that is not a uid
        # as the daemon writes it (``007``, ``x``): nobody's.
        return -1

    def owner_of(self, path: str) -> int | None:
        """:meth:`owner` of a resolved, absolute ``path``."""
        for root in self.allowed:
            if path.startswith(root.rstrip("/") + "/"):
                parts = tuple(p for p in path[len(root) :].split("/") if p)
                return self.owner(ResolvedPath(root, parts)) if parts else None
        return None

    @contextmanager
    def parent_dir(self, resolved: ResolvedPath, *, create: bool) -> Iterator[int]:
        """A descriptor of the directory holding the session file, walked without
        following symlinks; with ``create``, missing directories are made (mode 0700).

        Raises :class:`PathRefused` when a component is a symlink or not a directory,
        and :class:`FileNotFoundError` when a directory is missing and not created.
        """
        fd = os.open(resolved.root, _DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            for depth, part in enumerate(resolved.parts[:-1]):
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                    os.fsync(fd)
                    next_fd = self._open_dir(resolved, part, fd)
                except OSError as exc:
                    planted = _planted_entry(fd, part, exc) if depth == 0 else None
                    if planted is None:
                        raise self._refusal(resolved, part, exc) from None
                    # A symlink, a file or a FIFO in the users' directory's place.
                    next_fd = _replant(resolved, fd, planted, create=create)
                if depth == 0 and part == USERS_DIR and not _daemons(next_fd):
                    st = os.fstat(next_fd)
                    os.close(next_fd)
                    next_fd = _replant(resolved, fd, st, create=create)
                os.close(fd)
                fd = next_fd
                if depth < 2 and resolved.parts[0] == USERS_DIR:
                    _check_daemons(resolved, part, fd)
            yield fd
        finally:
            os.close(fd)

    def _open_dir(self, resolved: ResolvedPath, part: str, dir_fd: int) -> int:
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise self._refusal(resolved, part, exc) from None

    def open_file(self, resolved: ResolvedPath, *, write: bool = True) -> int:
        """Open an existing session file for appending (or, without ``write``, for
        reading), never through a symlink.

        A fifo, a device or a directory by that name is never opened (opening one can
        block, rewind a tape, or make a terminal the daemon's own), only refused.
        Raises :class:`PathRefused` for a symlink, a file that is not regular or a name
        too long, :class:`FileNotFoundError` and :class:`OSError`.
        """
        name = resolved.parts[-1]
        flags = _FILE_FLAGS if write else _READ_FLAGS
        with self.parent_dir(resolved, create=False) as dir_fd:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                    raise PathRefused(resolved.path, f"{name!r} is {kind}")
                fd = os.open(name, flags, dir_fd=dir_fd)
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise self._refusal(resolved, name, exc) from None
            try:
                # It may have been swapped since the stat: the descriptor decides.
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise PathRefused(resolved.path, "not a regular file")
            except BaseException:
                os.close(fd)
                raise
            return fd

    def create_file(self, resolved: ResolvedPath, fill: Callable[[int], None]) -> int:
        """Create the session file whole: ``fill`` writes and syncs its first line into
        a file that has no name yet, and only then does it appear under its name (mode
        0600), so a crash never leaves a file without its first line behind, which
        could be neither opened nor created again.  Missing directories are made (mode
        0700); the new directory entry is synced.

        Returns a descriptor of the file, opened by its name for appending.  Raises
        :class:`PathRefused` when a symlink, fifo, device or directory has the name,
        :class:`FileExistsError` when a regular file has it, what ``fill`` raises, and
        :class:`OSError`.
        """
        name = resolved.parts[-1]
        with self.parent_dir(resolved, create=True) as dir_fd:
            fd, temp = _unnamed_file(dir_fd)
            try:
                fill(fd)
                try:
                    if temp is None:
                        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd)
                    else:
                        os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                except FileExistsError:
                    # A symlink, fifo or directory by that name is no session to keep.
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode):
                        raise PathRefused(
                            resolved.path, f"{name!r} is not a regular file"
                        ) from None
                    raise
                except OSError as exc:
                    raise self._refusal(resolved, name, exc) from None
                try:
                    os.fsync(dir_fd)
                    # The descriptor that wrote the file knows it by no name (or by the
                    # temporary one): /proc/PID/fd and lsof would show a deleted file.
                    named = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
                except BaseException:
                    # The client is told the create failed: take the name back.
                    with suppress(OSError):
                        if _same_file(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), fd):
                            os.unlink(name, dir_fd=dir_fd)
                    raise
                if not _same_file(os.fstat(named), fd):
                    os.close(named)
                    raise PathRefused(resolved.path, "replaced by another file while created")
                return named
            finally:
                os.close(fd)
                if temp is not None:
                    with suppress(OSError):
                        os.unlink(temp, dir_fd=dir_fd)

    @staticmethod
    def _refusal(resolved: ResolvedPath, part: str, exc: OSError) -> Exception:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            return PathRefused(resolved.path, f"{part!r} is a symlink or not a directory")
        if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EISDIR):
            return PathRefused(resolved.path, f"{part!r} is not a regular file")
        if exc.errno == errno.ENAMETOOLONG:
            return PathRefused(resolved.path, f"{part[:40]!r}... is too long a name")
        return exc


def write_then_rename(
    dir_fd: int,
    temp: str,
    name: str,
    data: bytes | memoryview,
    *,
    sync: bool,
    owner: os.stat_result | None = None,
) -> None:
    """Write ``data`` to the new file ``temp`` of the directory ``dir_fd`` (mode 0600,
    given ``owner``'s uid and gid where the daemon may), fsync it with ``sync``, and
    rename it to ``name``: ``name`` is the old file or the new one whole, never a part.
    The temporary is removed on failure.  Raises :class:`OSError`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
    try:
        try:
            if owner is not None:
                with suppress(PermissionError):
                    os.fchown(fd, owner.st_uid, owner.st_gid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def _daemons(fd: int) -> bool:
    """Whether the directory is the daemon's own: its uid's, and nobody else's to write."""
    st = os.fstat(fd)
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _check_daemons(resolved: ResolvedPath, part: str, fd: int) -> None:
    """Refuse a directory of the users' tree that the daemon's uid does not own, or
    that others may write: someone else made it, and could swap what is in it."""
    if not _daemons(fd):
        raise PathRefused(resolved.path, f"{part!r} is not flightlogd's own directory")


def _planted_entry(root_fd: int, part: str, exc: OSError) -> os.stat_result | None:
    """What stands in the users' directory's place when it is no directory (opening it
    failed with ``exc``): its ``lstat`` when it is not the daemon's (a symlink, a file
    or a FIFO someone who may write the root put there first), else None."""
    if part != USERS_DIR or exc.errno not in (errno.ELOOP, errno.ENOTDIR):
        return None
    try:
        st = os.stat(part, dir_fd=root_fd, follow_symlinks=False)
    except OSError:
        return None
    return st if st.st_uid != os.geteuid() else None


def _replant(resolved: ResolvedPath, root_fd: int, st: os.stat_result, *, create: bool) -> int:
    """The users' directory of a root is not the daemon's (``st``): someone who may
    write the root made it, or a symlink, file or FIFO by its name (or renamed the
    daemon's away and made their own).  Move it aside, under a name that says whose it
    is, and make the daemon's own in its place; a descriptor of that one.  Where the
    daemon may not move it (a sticky root it does not own) the path is refused, and
    both are logged: an administrator must remove it.
    """
    aside = f"{USERS_DIR}.planted-by-{st.st_uid}-{secrets.token_hex(4)}"
    try:
        os.rename(USERS_DIR, aside, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    except OSError as exc:
        log.error(
            "planted_directory",
            root=resolved.root,
            owner=st.st_uid,
            mode=oct(stat.S_IMODE(st.st_mode)),
            reason=f"not flightlogd's own, and it cannot be moved aside: {exc.strerror}; "
            f"remove {os.path.join(resolved.root, USERS_DIR)!r}",
        )
        refusal = f"{USERS_DIR!r} is not flightlogd's own directory"
        raise PathRefused(resolved.path, refusal) from None
    log.warning(
        "planted_directory_moved",
        root=resolved.root,
        owner=st.st_uid,
        mode=oct(stat.S_IMODE(st.st_mode)),
        moved_to=os.path.join(resolved.root, aside),
    )
    if not create:
        raise FileNotFoundError(errno.ENOENT, "no users' directory", resolved.path)
    with suppress(FileExistsError):
        os.mkdir(USERS_DIR, 0o700, dir_fd=root_fd)
    os.fsync(root_fd)
    fd = os.open(USERS_DIR, _DIR_FLAGS, dir_fd=root_fd)
    if not _daemons(fd):  # planted again meanwhile: refused, not raced
        os.close(fd)
        raise PathRefused(resolved.path, f"{USERS_DIR!r} is not flightlogd's own directory")
    return fd


def _unnamed_file(dir_fd: int) -> tuple[int, str | None]:
    """A new, empty file in the directory, with no name yet (O_TMPFILE), or, where the
    file system cannot make one, with a hidden temporary name (returned) to link from."""
    flags = os.O_RDWR | os.O_CLOEXEC
    if _PROC_FD:
        try:
            return os.open(".", flags | os.O_TMPFILE, 0o600, dir_fd=dir_fd), None
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    temp = f".flightlog-{secrets.token_hex(8)}.creating"
    return os.open(temp, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd), temp


def _same_file(st: os.stat_result, fd: int) -> bool:
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)
