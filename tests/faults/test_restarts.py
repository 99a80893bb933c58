"""Agents ride through daemon restarts: reconnect, exactly-once delivery.

Eight agent processes (``restart_agent.py``) record through the SDK while the daemon is
killed (SIGKILL, or stopped with SIGTERM) and started again on the same socket and
root, again and again.  Each kill lands once the agents have written a seeded number
of bytes since the daemon started.  Afterwards: no agent met an exception, every file
passes ``check``, and each agent's events are in its file exactly once and in order,
as many as its ``record()`` returned for; every acknowledged checkpoint is there.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from support import DaemonProcess, read_lines, wait_for

from .harness import assert_every_file_sound, session_files

AGENTS = 8
AGENT = Path(__file__).with_name("restart_agent.py")
#: Restarts per CI run, and in the soak.
CI_RESTARTS, SOAK_RESTARTS = 50, 500


def spawn_agents(socket: str, stop_file: Path, grace: float = 30.0) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, str(AGENT), socket, str(n), str(stop_file), str(grace)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(AGENTS)
    ]


def reports(agents: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    done = []
    for agent in agents:
        out, err = agent.communicate(timeout=120)
        assert agent.returncode == 0, err
        done.append(json.loads(out))
    return done


def written(root: Path) -> int:
    return sum(path.stat().st_size for path in session_files(root))


def grown(root: Path, goal: int) -> bool:
    return written(root) >= goal


def assert_exactly_once(root: Path, report: dict[str, Any]) -> None:
    """The agent's events are in its file once each, in order, all of them."""
    lines = read_lines(root / "restart" / f"agent-{report['agent']}.jsonl")
    events = [line["data"]["arguments"]["i"] for line in lines if line["type"] == "tool_exec_start"]
    assert events == list(range(report["recorded"])), report
    seqs = {line["seq"] for line in lines if line["type"] == "checkpoint"}
    assert set(report["checkpoints"]) <= seqs, report
    # Every run is closed: each cut run went on after a run_resume and closed later.
    starts = {line["run_id"] for line in lines if line["type"] == "run_start"}
    closes = {line["run_id"] for line in lines if line["type"] == "run_close"}
    assert starts == closes, report


def restart_under_load(base: Path, restarts: int, how: signal.Signals, seed: int) -> None:
    rng = random.Random(seed)
    stop_file = base / "stop"
    daemon = DaemonProcess(base).start()
    agents = spawn_agents(daemon.socket, stop_file)
    try:
        # Connecting the first time is not retried: the agents are in before the kills.
        wait_for(lambda: len(session_files(daemon.root)) == AGENTS, timeout=60)
        for _ in range(restarts):
            goal = written(daemon.root) + rng.randrange(0, 60_000)
            wait_for(partial(grown, daemon.root, goal), timeout=60)
            if how is signal.SIGKILL:
                daemon.kill()
            else:
                daemon.terminate()
            assert_every_file_sound(daemon.root)
            daemon = DaemonProcess(base).start()
        stop_file.touch()
        done = reports(agents)
    finally:
        stop_file.touch()
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        daemon.stop()
    assert [report["error"] for report in done] == [None] * AGENTS
    assert_every_file_sound(daemon.root, tail_allowed=False)
    for report in done:
        assert report["recorded"] > 0, report
        assert_exactly_once(daemon.root, report)
    # The connections broke at every restart (a kill between two sends of an agent may
    # cost it no reconnect of its own, but most cost each agent one).
    assert sum(report["reconnects"] for report in done) >= restarts


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_agents_ride_through_restarts(short_tmp: Path, how: signal.Signals) -> None:
    restart_under_load(short_tmp, CI_RESTARTS, how, seed=int(how))


@pytest.mark.soak
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_agents_ride_through_restarts_soak(short_tmp: Path, how: signal.Signals) -> None:
    restart_under_load(short_tmp, SOAK_RESTARTS, how, seed=int(how) + time.time_ns() % 1000)
