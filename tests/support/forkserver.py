"""Daemons started by forking a Python that has imported flightlogd already.

Starting ``python -m flightlog.daemon`` costs about a second of CPU, nearly all of it
imports (structlog, anyio, msgspec, the daemon's own modules), and the suite starts
hundreds of daemons. The fork server imports them once per test process and forks one
child per daemon. The child is a real, separate process: it runs the daemon's own
``main()`` with the command's arguments, in the caller's working directory, with the
caller's environment, its output in the log file; its signals, its SIGKILL and its exit
status are its own (reported by the server, which reaps it; :class:`DaemonHandle` gives
them the shape of ``subprocess.Popen``, and signals through a pidfd, so never to
another process that took its pid).

:func:`spawn_daemon` uses the server only where the child cannot differ from
``python -m flightlog.daemon``: the workspace's daemon, no ``preexec_fn``, and an
environment that differs from the server's only in variables the daemon reads while it
runs (:data:`RUNTIME_VARIABLES`), not in ones read at start-up (``FLIGHTLOG_NO_SPEEDUPS``
is read by the C accelerator's import, ``MALLOC_*`` by the C library). Everything else
starts a fresh interpreter, and so does everything when ``FLIGHTLOG_TEST_EXEC`` is set
(``FLIGHTLOG_TEST_EXEC=1 pytest ...``). tests/test_forkserver.py holds a forked daemon to
what a fresh one does.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["RUNTIME_VARIABLES", "DaemonHandle", "ForkServer", "spawn_daemon"]

#: The command :func:`spawn_daemon` forks for; any other is started as it is.
DAEMON_COMMAND = (sys.executable, "-m", "flightlog.daemon")
#: Prefixes of the variables a forked daemon may have of its own: read while it runs
#: (or never: pytest's own, ``PYTEST_CURRENT_TEST`` changes with every test).
RUNTIME_VARIABLES = (
    "FLIGHTLOG_",
    "XDG_",
    "HOME",
    "NOTIFY_SOCKET",
    "LISTEN_",
    "WATCHDOG_",
    "PYTEST_",
)
#: Read when the accelerator is imported: a daemon with another value is started fresh.
STARTUP_VARIABLES = ("FLIGHTLOG_NO_SPEEDUPS",)


def _runtime_only(ours: Mapping[str, str], theirs: Mapping[str, str]) -> bool:
    """Whether the environments differ only in variables read while the daemon runs."""
    for key in ours.keys() | theirs.keys():
        if ours.get(key) == theirs.get(key):
            continue
        if key in STARTUP_VARIABLES or not key.startswith(RUNTIME_VARIABLES):
            return False
    return True


class ForkServer:
    """A Python (:func:`serve`) that has imported the daemon and
    forks it on request; one per test process, started on first use."""

    def __init__(self) -> None:
        tests = str(Path(__file__).resolve().parent.parent)
        self.env = dict(os.environ)
        paths = [tests, *filter(None, self.env.get("PYTHONPATH", "").split(os.pathsep))]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from support.forkserver import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**self.env, "PYTHONPATH": os.pathsep.join(paths)},
        )
        self._lock = threading.Lock()
        self._buffer = b""
        self._exits: dict[int, int] = {}
        self._replies: list[str] = []
        #: The CPU seconds (user and system) of the daemons that have exited, as the
        #: server reaped them: not this process's children, so not in its rusage.
        self.daemons_cpu = 0.0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, argv: Sequence[str], log: Path, env: Mapping[str, str]) -> DaemonHandle:
        request = {"argv": list(argv), "log": str(log), "env": dict(env), "cwd": os.getcwd()}
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            while not self._replies:
                if not self._read(timeout=30.0):
                    raise RuntimeError("the fork server did not answer")
            reply = self._replies.pop(0)
        if not reply.startswith("pid "):
            raise RuntimeError(f"the fork server could not fork: {reply}")
        return DaemonHandle(self, int(reply.split()[1]))

    def status(self, pid: int, timeout: float | None) -> int | None:
        """The exit status of ``pid`` (as ``Popen.returncode``), or None when it has not
        exited within ``timeout`` seconds (None: wait for it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if pid in self._exits:
                    return self._exits[pid]
                left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
                if left <= 0:
                    self._read(timeout=0)
                    return self._exits.get(pid)
                self._read(timeout=left)

    def _read(self, timeout: float) -> bool:
        """Read what the server said within ``timeout``; whether it said anything."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        if not select.select([fd], [], [], timeout)[0]:
            return False
        data = os.read(fd, 65536)
        if not data:
            raise RuntimeError(f"the fork server exited with {self.proc.wait()}")
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            kind, _, rest = line.decode().partition(" ")
            if kind == "exit":
                pid, code, cpu = rest.split()
                self._exits[int(pid)] = int(code)
                self.daemons_cpu += float(cpu)
            else:
                self._replies.append(line.decode())
        return True

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class DaemonHandle:
    """A forked daemon, with the parts of ``subprocess.Popen`` the tests use."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None
        self.args = ("flightlogd", pid)
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already: its status is on its way
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._done(self.server.status(self.pid, timeout=0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._done(self.server.status(self.pid, timeout))
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def abandon(self) -> None:
        """SIGKILL without asking the server first (its lock may be held by the
        thread a garbage collection interrupted); the server reaps the child."""
        if self.returncode is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def _done(self, code: int | None) -> None:
        self.returncode = code
        if code is not None and self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)


_server: ForkServer | None = None
_server_lock = threading.Lock()


def forked_daemons_cpu() -> float:
    """The CPU seconds of the daemons this process's fork server has reaped so far."""
    return 0.0 if _server is None else _server.daemons_cpu


def _fork_server() -> ForkServer:
    global _server
    with _server_lock:
        if _server is None or not _server.alive():
            _server = ForkServer()
            atexit.register(_server.close)
        return _server


def spawn_daemon(
    command: Sequence[str],
    log: Path,
    env: Mapping[str, str],
    *,
    preexec_fn: Callable[[], Any] | None = None,
) -> subprocess.Popen[bytes] | DaemonHandle:
    """``command`` (``python -m flightlog.daemon ARGS``) running with its output in
    ``log``: forked by the server where that cannot differ, started as it is otherwise."""
    forkable = (
        preexec_fn is None
        and not os.environ.get("FLIGHTLOG_TEST_EXEC")
        and tuple(command[: len(DAEMON_COMMAND)]) == DAEMON_COMMAND
    )
    if forkable:
        server = _fork_server()
        if _runtime_only(server.env, env):
            return server.fork(command[len(DAEMON_COMMAND) :], log, env)
    with log.open("wb") as out:
        return subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            preexec_fn=preexec_fn,
        )


# ---------------------------------------------------------------- the server's side


def _child(request: dict[str, Any], entry: Any, pidfds: Sequence[int]) -> None:
    """In the forked child: become ``python -m flightlog.daemon ARGV``; never returns."""
    code = 1
    try:
        for fd in pidfds:
            os.close(fd)
        out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [entry.__file__, *request["argv"]]
        try:
            entry.main(request["argv"])
            code = 0
        except SystemExit as exit:
            if exit.code is None or isinstance(exit.code, int):
                code = exit.code or 0
            else:
                print(exit.code, file=sys.stderr)
        except KeyboardInterrupt:
            # As CPython does: die of the signal, as a fresh interpreter would.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """Read one JSON request a line on stdin, fork a daemon for it and answer
    ``pid N``; answer ``exit N STATUS CPU`` when one exits (CPU: its user and system
    seconds); stop at the end of stdin."""
    import flightlog.daemon.__main__ as entry  # what every daemon imports first

    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401  (the daemon's event loop, imported when it runs)

    children: dict[int, int] = {}  # pidfd: pid
    buffer = b""
    while True:
        ready = select.select([0, *children], [], [])[0]
        for fd in ready:
            if fd != 0:
                pid = children.pop(fd)
                os.close(fd)
                _, status, usage = os.wait4(pid, 0)
                code = os.waitstatus_to_exitcode(status)
                os.write(1, f"exit {pid} {code} {usage.ru_utime + usage.ru_stime}\n".encode())
                continue
            data = os.read(0, 65536)
            if not data:
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                request = json.loads(line)
                try:
                    pid = os.fork()
                except OSError as error:
                    os.write(1, f"error {error}\n".encode())
                    continue
                if pid == 0:
                    _child(request, entry, list(children))
                children[os.pidfd_open(pid)] = pid
                os.write(1, f"pid {pid}\n".encode())
