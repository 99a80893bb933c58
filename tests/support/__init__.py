"""Test support, one package for every test directory: a real flightlogd in a
subprocess, a raw protocol client, and (in its modules) the daemon tests' helpers
(:mod:`support.daemon`), an agent process (:mod:`support.agent_writer`), damaged files
(:mod:`support.damaged_files`) and the spawner that starts daemons
(:mod:`support.forkserver`).

Nothing here mocks the daemon: tests talk to a real process over a real Unix socket
in a temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import pty
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    ErrorReply,
    Hello,
    Message,
    client_decoder,
    encode_frame,
)

from .forkserver import DaemonHandle, spawn_daemon

T = TypeVar("T")

#: A deadline, not a measurement: a loaded machine (a second copy of the suite beside
#: this one) can take many seconds to start a Python.
DAEMON_START_TIMEOUT = 60.0
#: The tests directory: where ``support`` is found, for processes the tests start.
TESTS = Path(__file__).resolve().parent.parent


def with_support(env: dict[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` with ``env``, and ``PYTHONPATH`` such that a Python started with
    it imports ``support`` (``python -m support.agent_writer``)."""
    merged = {**os.environ, **(env or {})}
    paths = [str(TESTS), *filter(None, merged.get("PYTHONPATH", "").split(os.pathsep))]
    merged["PYTHONPATH"] = os.pathsep.join(paths)
    return merged


class DaemonProcess:
    """``flightlogd`` running as a child process on a socket under ``base``.

    ``program`` is the command that runs the daemon: the workspace's by default, an
    installed ``flightlogd`` in the install tests.
    """

    def __init__(
        self,
        base: Path,
        *args: str,
        env: dict[str, str] | None = None,
        program: Sequence[str] = (sys.executable, "-m", "flightlog.daemon"),
    ) -> None:
        self.base = base
        self.program = tuple(program)
        self.socket = str(base / "run" / "flightlog.sock")
        self.root = base / "root"
        self.log_path = base / f"flightlogd-{time.monotonic_ns()}.log"
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | DaemonHandle | None = None

    def start(self, *, wait: bool = True, preexec_fn: Any = None) -> DaemonProcess:
        self.base.mkdir(parents=True, exist_ok=True)
        command = [
            *self.program,
            "--socket",
            self.socket,
            "--root",
            str(self.root),
            *self.args,
        ]
        self.proc = spawn_daemon(command, self.log_path, self.env, preexec_fn=preexec_fn)
        # A test that fails before it stops its daemon drops this object later (pytest
        # keeps the failure's frames in sys.last_traceback until the next failure): the
        # daemon is killed then, not left running (or, for a Popen, warned about in
        # whichever test is running when it is collected).
        weakref.finalize(self, _reap, self.proc)
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.stop()  # not left running behind a failed test
                raise
        return self

    def wait_ready(self, timeout: float = DAEMON_START_TIMEOUT) -> None:
        """Wait until the daemon accepts connections (no blind sleeps)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"flightlogd exited with {self.proc.returncode}:\n{self.log}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.connect(self.socket)
                return
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.01)
        raise TimeoutError(f"flightlogd did not listen within {timeout}s:\n{self.log}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the orderly shutdown.  Returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _reap(proc: subprocess.Popen[bytes] | DaemonHandle) -> None:
    """SIGKILL the daemon of a :class:`DaemonProcess` dropped while it may still run."""
    if isinstance(proc, DaemonHandle):
        proc.abandon()
    elif proc.poll() is None:
        proc.kill()
        proc.wait()


class RawClient:
    """Speaks the wire protocol over a plain socket, frame by frame, for tests that
    need to send exactly the bytes they choose."""

    def __init__(self, socket_path: str, *, hello: bool = True, client: str = "raw") -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(socket_path)
        self.decoder = client_decoder()
        self.pending: list[Message] = []
        self._ids = 0
        self.welcome: Any = None
        if hello:
            self.welcome = self.request(
                Hello(id=self.next_id(), version=PROTOCOL_VERSION, client=client, pid=os.getpid())
            )

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def send(self, message: Message) -> None:
        self.sock.sendall(encode_frame(message))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, timeout: float = 10.0) -> Message:
        """The next message from the daemon (reply or push)."""
        if self.pending:
            return self.pending.pop(0)
        self.sock.settimeout(timeout)
        while (message := self.decoder.next_message()) is None:
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError("the daemon closed the connection")
            self.decoder.feed(data)
        return message

    def request(self, message: Message, timeout: float = 10.0) -> Any:
        """Send a request and return its reply; pushes met on the way are kept."""
        self.send(message)
        wanted = message.id  # type: ignore[attr-defined]
        skipped: list[Message] = []
        while True:
            reply = self.receive(timeout)
            if getattr(reply, "id", None) == wanted or (
                isinstance(reply, ErrorReply) and reply.id == 0
            ):
                self.pending = skipped + self.pending
                return reply
            skipped.append(reply)

    def closed_by_daemon(self, timeout: float = 10.0) -> bool:
        """Whether the daemon hangs up (reads and drops anything it still sends)."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(1 << 16):
                pass
        except ConnectionResetError:
            return True
        return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_lines(path: Path | str) -> list[dict[str, Any]]:
    """Every complete line of a session file, parsed, with no rules applied."""
    import json

    data = Path(path).read_bytes()
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.01) -> None:
    """Poll ``predicate`` until true; for conditions in another process only."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


def run_python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``python -c code`` with the workspace's interpreter."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def reap(proc: subprocess.Popen[Any]) -> None:
    """Kill (SIGKILL), reap and close the pipes of ``proc`` if it still runs: a test
    that fails or times out leaves no process behind, nor a ``Popen`` collected while
    its process runs (a ResourceWarning, which fails whichever test is running then)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen[Any]) -> Iterator[None]:
    """:func:`reap` each of ``procs`` when the block ends, however it ends."""
    try:
        yield
    finally:
        for proc in procs:
            reap(proc)


def communicate(proc: subprocess.Popen[T], timeout: float) -> tuple[T, T]:
    """``proc.communicate(timeout=timeout)``, the process killed and reaped if it
    outlives the timeout (as :func:`subprocess.run` does) before the error is raised."""
    with reaped(proc):
        return proc.communicate(timeout=timeout)


def chunks(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


__all__: Sequence[str] = [
    "TESTS",
    "DaemonProcess",
    "RawClient",
    "chunks",
    "communicate",
    "read_lines",
    "reap",
    "reaped",
    "run_python",
    "wait_for",
    "with_support",
]


def on_a_terminal(command: Sequence[str], env: dict[str, str]) -> bytes:
    """What ``command`` writes to its standard output when that is a terminal (a pty)."""
    controller, terminal = pty.openpty()
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, controller)
        proc = subprocess.Popen(command, stdout=terminal, stderr=subprocess.DEVNULL, env=env)
        stack.enter_context(reaped(proc))
        os.close(terminal)
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the program closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        proc.wait(timeout=30)
    return b"".join(chunks)
