"""What the fault tests share: flightlogd in process (so faults can be injected into its
storage layer), faults for one file at a time, a small file system of the test's own,
and checks of every file under a root.

The daemon runs in process only where a fault must be injected from inside it; every
other fault test runs the real ``flightlogd`` process (``support.DaemonProcess``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import os
import resource
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest
import structlog

from flightlog.daemon import _storage
from flightlog.daemon._config import Config
from flightlog.daemon._logging import configure_logging
from flightlog.daemon._server import Daemon, serve
from flightlog.protocol import CheckReport
from flightlog.sdk._compression import INDEX_SUFFIX
from support.daemon import check_file

__all__ = [
    "DiskFaults",
    "InProcessDaemon",
    "assert_every_file_sound",
    "raised_nofile",
    "session_files",
    "tmpfs",
]


class InProcessDaemon:
    """``serve()`` on an event loop in a thread of the test process, on a real socket.

    Quacks like ``support.DaemonProcess`` where the shared helpers need it (``socket``,
    ``root``, ``alive()``, ``log``), so ``assert_serving`` works on it.
    """

    def __init__(self, base: Path, **settings: Any) -> None:
        self.base = base
        self.socket = str(base / "run" / "flightlog.sock")
        self.root = base / "root"
        self.config = Config(socket_path=self.socket, root=str(self.root), **settings)
        self.pid = os.getpid()
        self._log = io.StringIO()
        self._stack = contextlib.ExitStack()
        self._future: Future[Any] | None = None
        self.daemon: Daemon | None = None

    def start(self) -> InProcessDaemon:
        configure_logging(format="json", stream=self._log)
        self._stack.callback(structlog.reset_defaults)
        portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal("asyncio"))
        stop = portal.call(anyio.Event)
        self._stop = functools.partial(portal.call, stop.set)
        self._future, self.daemon = portal.start_task(
            functools.partial(serve, self.config, shutdown_trigger=stop.wait), name="flightlogd"
        )
        return self

    def alive(self) -> bool:
        return self._future is not None and not self._future.done()

    @property
    def log(self) -> str:
        return self._log.getvalue()

    def stop(self) -> None:
        """The orderly shutdown; raises what ``serve`` raised."""
        try:
            if self._future is not None:
                if not self._future.done():
                    self._stop()
                self._future.result(timeout=60)
        finally:
            self._stack.close()

    def __enter__(self) -> InProcessDaemon:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@dataclass
class _FileFaults:
    #: Writes stop once the file holds this many bytes (0: at once): the write that
    #: crosses it is cut short there, and every later one fails with ``write_errno``.
    write_limit: int | None = None
    write_errno: int = errno.EIO
    zero_writes: bool = False
    fsync_errno: int | None = None
    #: fsync waits for this event (a disk that hangs), then runs.
    fsync_gate: threading.Event | None = None
    writes: int = 0
    short_writes: int = 0
    failed_writes: int = 0
    fsyncs: int = 0
    failed_fsyncs: int = 0


class DiskFaults:
    """Faults in the daemon's storage layer (its write and fsync), for the files named:
    every other file is written and synced for real."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._files: dict[str, _FileFaults] = {}
        self._lock = threading.Lock()
        self._real_write = _storage._os_write
        self._real_fsync = _storage._os_fsync
        monkeypatch.setattr(_storage, "_os_write", self._write)
        monkeypatch.setattr(_storage, "_os_fsync", self._fsync)

    def on(self, path: Path | str) -> _FileFaults:
        """The faults of ``path`` (made on first use); set their fields to inject.  A
        directory's faults apply to every file in it, named or not yet (O_TMPFILE), that
        has no faults of its own."""
        key = os.path.realpath(path)
        with self._lock:
            return self._files.setdefault(key, _FileFaults())

    def clear(self, path: Path | str) -> None:
        with self._lock:
            self._files.pop(os.path.realpath(path), None)

    def _faults(self, fd: int) -> _FileFaults | None:
        if not self._files:
            return None
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        with self._lock:
            faults = self._files.get(target)
            if faults is None:
                # " (deleted)": a file with no name yet, or one unlinked since.
                faults = self._files.get(os.path.dirname(target.removesuffix(" (deleted)")))
            return faults

    def _write(self, fd: int, data: Any) -> int:
        faults = self._faults(fd)
        if faults is None:
            return self._real_write(fd, data)
        faults.writes += 1
        if faults.zero_writes:
            return 0
        if faults.write_limit is not None:
            room = faults.write_limit - os.fstat(fd).st_size
            if room <= 0:
                faults.failed_writes += 1
                raise OSError(faults.write_errno, os.strerror(faults.write_errno))
            if len(data) > room:
                faults.short_writes += 1
                return self._real_write(fd, data[:room])
        return self._real_write(fd, data)

    def _fsync(self, fd: int) -> None:
        faults = self._faults(fd)
        if faults is None:
            return self._real_fsync(fd)
        faults.fsyncs += 1
        if faults.fsync_gate is not None:
            faults.fsync_gate.wait(60)
        if faults.fsync_errno is not None:
            faults.failed_fsyncs += 1
            raise OSError(faults.fsync_errno, os.strerror(faults.fsync_errno))
        return self._real_fsync(fd)


@contextlib.contextmanager
def tmpfs(size: str, *, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``) mounted for the test; skips without root."""
    mountpoint = Path(tempfile.mkdtemp(prefix="fl-fs-", dir="/tmp"))
    options = f"size={size},mode=0700" + (f",nr_inodes={inodes}" if inodes else "")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        mountpoint.rmdir()
        pytest.skip(f"cannot mount a small tmpfs (needs root): {result.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        mountpoint.rmdir()


def session_files(root: Path) -> list[Path]:
    """Every regular file under ``root`` but the daemon's lock file and the indexes it
    keeps beside big sessions (tests/faults/test_index_kill.py holds those whole)."""
    return sorted(
        path
        for path in root.rglob("*")
        if path.is_file()
        and not path.is_symlink()
        and path.name != ".flightlogd.lock"
        and not path.name.endswith(INDEX_SUFFIX)
    )


def assert_every_file_sound(
    root: Path, *, tail_allowed: bool = True, skip: Callable[[Path], bool] | None = None
) -> dict[Path, CheckReport]:
    """Every session file under ``root`` passes ``check``; an unfinished tail only when
    ``tail_allowed``.  Returns the reports."""
    reports = {}
    for path in session_files(root):
        if skip is not None and skip(path):
            continue
        report = check_file(path)
        assert report.sound, (path, report, path.read_bytes()[:300])
        if not tail_allowed:
            assert not report.unfinished_tail, (path, report)
        reports[path] = report
    return reports


@contextlib.contextmanager
def raised_nofile(soft: int) -> Iterator[int]:
    """This process's descriptor limit raised to ``soft`` (at most the hard limit)."""
    old_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(soft, hard) if hard != resource.RLIM_INFINITY else soft
    if wanted < soft:
        pytest.skip(f"needs {soft} descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(wanted, old_soft), hard))
    try:
        yield wanted
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (old_soft, hard))
