"""Resolving session paths under the data root and the allowed roots, safely.

Relative paths resolve under the data root; absolute paths must lie under the root or
an allowed root.  Every component is opened with ``O_NOFOLLOW`` relative to the one
before it, so neither a ``..`` nor a symlink anywhere in the path can lead out of a
root (``O_NOFOLLOW`` alone guards only the last component).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from flightlog.protocol import ErrorCode, FlightlogError

__all__ = ["PathRefused", "ResolvedPath", "Roots"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_MAX = 4096
_FILE_FLAGS = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


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

    def resolve(self, path: str) -> ResolvedPath:
        """Split ``path`` into a root and components.

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
        return ResolvedPath(root, parts)

    @contextmanager
    def parent_dir(self, resolved: ResolvedPath, *, create: bool) -> Iterator[int]:
        """A descriptor of the directory holding the session file, walked without
        following symlinks; with ``create``, missing directories are made (mode 0700).

        Raises :class:`PathRefused` when a component is a symlink or not a directory,
        and :class:`FileNotFoundError` when a directory is missing and not created.
        """
        fd = os.open(resolved.root, _DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            for part in resolved.parts[:-1]:
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
                    raise self._refusal(resolved, part, exc) from None
                os.close(fd)
                fd = next_fd
            yield fd
        finally:
            os.close(fd)

    def _open_dir(self, resolved: ResolvedPath, part: str, dir_fd: int) -> int:
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise self._refusal(resolved, part, exc) from None

    def open_file(self, resolved: ResolvedPath, *, create: bool) -> int:
        """Open the session file for appending, never through a symlink.

        With ``create`` the file must not exist yet and is made with mode 0600, and the
        new directory entry is synced.  Raises :class:`PathRefused` for a symlink or a
        file that is not regular (a fifo, a device, a directory), also when creating;
        :class:`FileExistsError` (a regular file exists) and :class:`FileNotFoundError`
        as for ``open``.
        """
        name = resolved.parts[-1]
        with self.parent_dir(resolved, create=create) as dir_fd:
            flags = _FILE_FLAGS | (os.O_CREAT | os.O_EXCL if create else 0)
            try:
                fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
            except FileExistsError:
                # A symlink, fifo or directory by that name is no session to keep.
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise PathRefused(resolved.path, f"{name!r} is not a regular file") from None
                raise
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise self._refusal(resolved, name, exc) from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise PathRefused(resolved.path, "not a regular file")
                if create:
                    os.fsync(dir_fd)
            except BaseException:
                os.close(fd)
                raise
            return fd

    def unlink_file(self, resolved: ResolvedPath, fd: int) -> None:
        """Remove the session file, if its directory entry is still the file open as
        ``fd``.  Raises :class:`OSError` and :class:`PathRefused`."""
        name = resolved.parts[-1]
        with self.parent_dir(resolved, create=False) as dir_fd:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            own = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino):
                os.unlink(name, dir_fd=dir_fd)
                os.fsync(dir_fd)

    @staticmethod
    def _refusal(resolved: ResolvedPath, part: str, exc: OSError) -> Exception:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            return PathRefused(resolved.path, f"{part!r} is a symlink or not a directory")
        if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EISDIR):
            return PathRefused(resolved.path, f"{part!r} is not a regular file")
        if exc.errno == errno.ENAMETOOLONG:
            return PathRefused(resolved.path, f"{part[:40]!r}... is too long a name")
        return exc
