"""Arize Phoenix as a real OTLP backend for the export tests: ``phoenix serve`` on loopback
ports with a temporary working directory, and its REST API to read the spans back."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

#: Phoenix takes about 20 s to start on a loaded 2-core machine.
START_TIMEOUT = 180.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def phoenix_command() -> str | None:
    """The ``phoenix`` script of this environment, when arize-phoenix is installed."""
    script = Path(sys.executable).parent / "phoenix"
    return str(script) if script.exists() else shutil.which("phoenix")


class Phoenix:
    """``phoenix serve`` as a child process; :attr:`endpoint` takes OTLP over HTTP."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.grpc_port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "phoenix.log"

    def start(self) -> Phoenix:
        command = phoenix_command()
        assert command is not None
        env = {
            **os.environ,
            "PHOENIX_WORKING_DIR": str(self.workdir),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [command, "serve"], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"phoenix exited with {self.proc.returncode}:\n{self.log}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/healthz", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"phoenix did not start within {START_TIMEOUT}s:\n{self.log}")

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span Phoenix holds for ``project`` (``[]`` when it has none yet)."""
        spans: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            query = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
            url = (
                f"{self.endpoint}/v1/projects/{urllib.parse.quote(project)}/spans?"
                + urllib.parse.urlencode(query)
            )
            try:
                with urllib.request.urlopen(url, timeout=30) as reply:
                    page = json.load(reply)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:  # the project appears with its first span
                    return []
                raise
            spans.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                return spans
