"""flightlogd as a real subprocess of the harness, on a socket in a temporary directory."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["Daemon"]

START_TIMEOUT = 30.0


class Daemon:
    """``python -m flightlog.daemon`` on ``base/run/fl.sock``, data under ``base/root``.

    Its structured log goes to ``base/flightlogd.log`` at the default level, as in
    production.  Use as a context manager: the exit is the orderly SIGTERM shutdown.
    """

    title = "flightlogd"  # in error messages
    env: dict[str, str] | None = None  # None: the harness's environment

    def __init__(self, base: Path, *args: str) -> None:
        self.base = base
        self.socket = str(base / "run" / "fl.sock")
        self.root = base / "root"
        self.args = args
        self.log_path = base / "flightlogd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "flightlog.daemon",
            "--socket",
            self.socket,
            "--root",
            str(self.root),
            *self.args,
        ]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Daemon:
        self.base.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.title} exited with {self.proc.returncode}: {self.log()}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.connect(self.socket)
                return self
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.01)
        self.kill()
        raise RuntimeError(f"{self.title} did not listen within {START_TIMEOUT}s: {self.log()}")

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait for the orderly shutdown; SIGKILL when it takes too long."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
