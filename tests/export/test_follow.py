"""``flightlog export --follow``: live export with a cursor per session, across kill -9 of
the exporter and of the daemon, into a real Arize Phoenix.

What the backend must hold in the end is computed from the final file by the same span
builder the exporter uses: every span exactly once, none missing, none extra.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.cli._spans import SpanBuilder
from flightlog.sdk import read
from support import DaemonProcess, read_lines, wait_for

from .phoenix_backend import Phoenix, free_port
from .test_export import new_project

AGENT = Path(__file__).with_name("agent_runs.py")


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


class Exporter:
    """``flightlog export --follow`` as a child process."""

    def __init__(self, daemon: DaemonProcess, endpoint: str, state: Path, project: str) -> None:
        self.args = [
            sys.executable,
            "-m",
            "flightlog.cli",
            "export",
            "--follow",
            "--root",
            str(daemon.root),
            "--socket",
            daemon.socket,
            "--endpoint",
            endpoint,
            "--state",
            str(state),
            "--interval",
            "0.5",
        ]
        self.env = {
            **os.environ,
            "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={project}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        }
        self.log = state.parent / f"exporter-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Exporter:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def cursor_of(state: Path, session_id: str) -> int:
    try:
        return int(json.loads((state / f"{session_id}.cursor").read_text())["seq"])
    except FileNotFoundError:
        return 0


def expected_spans(path: Path) -> dict[str, str]:
    builder = SpanBuilder(path=str(path))
    return {
        f"{span.span_id:016x}": span.name for record in read(path) for span in builder.add(record)
    }


def start_agent(
    daemon: DaemonProcess, relative: str, runs: int, pause: float
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(AGENT), daemon.socket, relative, str(runs), str(pause)],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_follow_exports_every_span_once_across_kill_9(phoenix: Phoenix, base: Path) -> None:
    daemon = DaemonProcess(base, "--log-format", "json").start()
    state = base / "state"
    project = new_project()
    exporter = Exporter(daemon, phoenix.endpoint, state, project).start()
    relative = "follow/live.jsonl"
    path = daemon.root / relative
    agent = start_agent(daemon, relative, runs=30, pause=0.02)
    try:
        wait_for(lambda: path.exists() and len(read_lines(path)) > 40, timeout=60)
        session_id = read_lines(path)[0]["session_id"]
        wait_for(lambda: cursor_of(state, session_id) > 0, timeout=60)

        # The exporter dies mid-run; records keep coming; a new one takes over.
        exporter.kill()
        seq_at_kill = cursor_of(state, session_id)
        exporter = Exporter(daemon, phoenix.endpoint, state, project).start()
        wait_for(lambda: cursor_of(state, session_id) > seq_at_kill, timeout=60)

        # The daemon dies mid-run; the agent waits for a new one and goes on.
        daemon.kill()
        daemon.start()
        assert agent.stdout is not None
        assert agent.stdout.readline().strip() == "done"
        assert agent.wait(timeout=60) == 0

        last_seq = read_lines(path)[-1]["seq"]
        wait_for(lambda: cursor_of(state, session_id) == last_seq, timeout=90)
        expected = expected_spans(path)
        wait_for(lambda: len(phoenix.spans(project)) >= len(expected), timeout=90, interval=0.5)
        spans = phoenix.spans(project)
        got = [span["context"]["span_id"] for span in spans]
        assert len(got) == len(set(got)), "a span was stored twice"
        assert {span["context"]["span_id"]: span["name"] for span in spans} == expected
        assert exporter.stop() in (0, 130)
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.wait()
        assert agent.stdout is not None
        agent.stdout.close()
        if exporter.proc is not None and exporter.proc.poll() is None:
            exporter.kill()
        daemon.stop()


def test_follow_keeps_the_cursor_while_the_backend_is_away(base: Path) -> None:
    daemon = DaemonProcess(base, "--log-format", "json").start()
    state = base / "state"
    absent = f"http://127.0.0.1:{free_port()}"
    exporter = Exporter(daemon, absent, state, new_project()).start()
    relative = "follow/offline.jsonl"
    agent = start_agent(daemon, relative, runs=2, pause=0)
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline().strip() == "done"
        wait_for(lambda: "did not take the spans" in exporter.log.read_text(), timeout=60)
        session_id = read_lines(daemon.root / relative)[0]["session_id"]
        assert cursor_of(state, session_id) == 0
        assert not list(state.glob("*.cursor"))
        assert exporter.proc is not None and exporter.proc.poll() is None  # still trying
        assert exporter.stop() in (0, 130)
    finally:
        agent.wait(timeout=30)
        assert agent.stdout is not None
        agent.stdout.close()
        if exporter.proc is not None and exporter.proc.poll() is None:
            exporter.kill()
        daemon.stop()
