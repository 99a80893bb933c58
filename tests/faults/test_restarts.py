"""Agents ride through daemon restarts: reconnect, exactly-once delivery.

Eight agent processes (``restart_agent.py``) record through the SDK while the daemon is
killed (SIGKILL, or stopped with SIGTERM) and started again on the same socket and
root, again and again.  Each kill lands once the agents have written a seeded number
of bytes since the daemon started, every other one also once every agent is back.
Afterwards: no agent met an exception, every file passes ``check``, and each agent's
events are in its file exactly once and in order, as many as its ``record()``
returned for; every acknowledged checkpoint is there.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from flightlog.protocol.events import (
    TurnStart,
)
from flightlog.sdk import DaemonError, connect
from support import DaemonProcess, read_lines, wait_for

from .harness import assert_every_file_sound, session_files

AGENTS = 8
AGENT = Path(__file__).with_name("restart_agent.py")
#: Restarts per CI run, and in the soak: CI's six are each kind of kill point three
#: times (agents still reconnecting, and every agent back), the soak's are many more.
CI_RESTARTS, SOAK_RESTARTS = 6, 500
#: Restarts behind a socket that outlives the daemon, likewise.
ACTIVATED_RESTARTS, SOAK_ACTIVATED_RESTARTS = 6, 100


def spawn_agent(
    socket: str, agent: int, stop_file: Path, grace: float = 30.0, mode: str = "strict"
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(AGENT), socket, str(agent), str(stop_file), str(grace), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def spawn_agents(socket: str, stop_file: Path) -> list[subprocess.Popen[str]]:
    return [spawn_agent(socket, n, stop_file) for n in range(AGENTS)]


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


def sizes(root: Path) -> dict[Path, int]:
    return {path: path.stat().st_size for path in session_files(root)}


def all_back(root: Path, before: dict[Path, int]) -> bool:
    """Whether every agent's file grew past its size in ``before``: each agent has
    reconnected (and replayed) since."""
    now = sizes(root)
    return all(now.get(path, 0) > size for path, size in before.items())


def wait_for_kill(root: Path, goal: int, before: dict[Path, int] | None) -> None:
    """Wait until the agents wrote up to ``goal``, and, when ``before`` is given (the
    sizes right after the previous kill), until every agent is back since.

    Kills land as soon as the agents together wrote a seeded amount, so one agent may
    still be reconnecting (or replaying) when the next kill comes: a kill mid-replay is
    part of what is tested.  But an agent the machine starves could miss restart after
    restart, and its one outage would outlast any grace; so every other kill waits for
    every agent to be back, and no agent's outage spans more than two restarts.
    """
    wait_for(partial(grown, root, goal), timeout=60)
    if before is not None:
        wait_for(partial(all_back, root, before), timeout=60)


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
        before = None
        for n in range(restarts):
            goal = written(daemon.root) + rng.randrange(0, 60_000)
            wait_for_kill(daemon.root, goal, before if n % 2 else None)
            if how is signal.SIGKILL:
                daemon.kill()
            else:
                daemon.terminate()
            before = sizes(daemon.root)  # no daemon: nothing grows until the next
            assert_every_file_sound(daemon.root)
            daemon = DaemonProcess(base).start()
        stop_file.touch()
        done = reports(agents)
    finally:
        stop_file.touch()
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.communicate()
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


#: Puts the listening socket on descriptor 3 and becomes the daemon (same pid).
_HAND_OVER = """
import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.executable, [sys.executable, "-m", "flightlog.daemon", *sys.argv[2:]])
"""


class ActivatedDaemon:
    """flightlogd on a listening socket this test holds, as systemd's socket unit does:
    the socket is handed over as descriptor 3 (``LISTEN_FDS``), and outlives the daemon."""

    def __init__(self, base: Path, listener: socket.socket) -> None:
        self.base = base
        self.root = base / "root"
        self.listener = listener
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ActivatedDaemon:
        fd = self.listener.fileno()
        log = (self.base / f"flightlogd-{time.monotonic_ns()}.log").open("wb")
        with log:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-c", _HAND_OVER, str(fd)),
                    *("--root", str(self.root), "--socket", str(self.base / "unused.sock")),
                ],
                pass_fds=(fd,),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


def test_agents_ride_through_restarts_behind_an_activated_socket(short_tmp: Path) -> None:
    """The listening socket outlives each daemon: the agents' connects wait in its
    backlog for the next one instead of failing."""
    restart_behind_an_activated_socket(short_tmp, ACTIVATED_RESTARTS, seed=7)


@pytest.mark.soak
def test_agents_ride_through_restarts_behind_an_activated_socket_soak(short_tmp: Path) -> None:
    restart_behind_an_activated_socket(
        short_tmp, SOAK_ACTIVATED_RESTARTS, seed=7 + time.time_ns() % 1000
    )


def restart_behind_an_activated_socket(short_tmp: Path, restarts: int, seed: int) -> None:
    rng = random.Random(seed)
    path = str(short_tmp / "activated.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    stop_file = short_tmp / "stop"
    daemon = ActivatedDaemon(short_tmp, listener).start()
    agents = spawn_agents(path, stop_file)
    try:
        wait_for(lambda: len(session_files(daemon.root)) == AGENTS, timeout=60)
        before = None
        for n in range(restarts):
            goal = written(daemon.root) + rng.randrange(0, 60_000)
            wait_for_kill(daemon.root, goal, before if n % 2 else None)
            daemon.kill()
            before = sizes(daemon.root)
            daemon = ActivatedDaemon(short_tmp, listener).start()
        stop_file.touch()
        done = reports(agents)
    finally:
        stop_file.touch()
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.communicate()
        daemon.stop()
        listener.close()
    assert [report["error"] for report in done] == [None] * AGENTS
    assert_every_file_sound(daemon.root, tail_allowed=False)
    for report in done:
        assert_exactly_once(daemon.root, report)


def test_an_outage_longer_than_the_grace_raises_one_error_naming_what_was_lost(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp).start()
    stop_file = short_tmp / "stop"
    agent = spawn_agent(daemon.socket, 0, stop_file, grace=0.5)
    try:
        wait_for(partial(grown, daemon.root, 200_000), timeout=60)
        daemon.kill()
        # No daemon for longer than the agent's grace: it gives up and reports.
        out, err = agent.communicate(timeout=60)
    finally:
        stop_file.touch()
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    assert agent.returncode == 0, err
    report = json.loads(out)
    error = report["error"]
    assert error is not None and error.startswith("ConnectionLost: the daemon at "), report
    assert "within 0.5 s" in error and "[daemon_unreachable]" in error, error
    path = daemon.root / "restart" / "agent-0.jsonl"
    match = re.search(r"may lack them: (\d+) records of run ([0-9a-f]{32}) in (\S+) \[", error)
    if match is None:
        # The kill found the agent waiting for a reply that acknowledged everything.
        assert "every record sent was acknowledged" in error, error
        lost = 0
    else:
        lost = int(match[1])
        assert match[3] == str(path)
        assert match[2] in {line["run_id"] for line in read_lines(path)}
    # The file holds every event acknowledged, and of those never acknowledged (which
    # the error counts) a prefix: the one record() that raised had been sent too.
    events = [
        line["data"]["arguments"]["i"]
        for line in read_lines(path)
        if line["type"] == "tool_exec_start"
    ]
    assert events == list(range(len(events)))
    assert report["recorded"] - lost <= len(events) <= report["recorded"] + 1, (report, lost)


def test_a_client_killed_holding_unacknowledged_records_leaves_a_sound_prefix(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp).start()
    stop_file = short_tmp / "stop"
    try:
        agent = spawn_agent(daemon.socket, 0, stop_file)
        wait_for(partial(grown, daemon.root, 300_000), timeout=60)
        agent.kill()
        agent.communicate()
        path = daemon.root / "restart" / "agent-0.jsonl"
        # The daemon writes what it received and releases the session; another client
        # opens it: the cut run is interrupted, a new run records.
        with connect(daemon.socket) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    session = client.open(str(path))
                    break
                except DaemonError as exc:
                    assert exc.code == "session_busy" and time.monotonic() < deadline
                    time.sleep(0.01)
            # The agent closes a run and begins the next every 200 events: the kill cuts
            # one run, or none when it falls between a close and the next begin.
            interrupted = session.interrupted_runs
            assert len(interrupted) <= 1
            with session, session.begin_run() as run:
                run.record(TurnStart(turn_index=0))
    finally:
        daemon.stop()
    assert_every_file_sound(daemon.root, tail_allowed=False)
    lines = read_lines(path)
    started = [line["run_id"] for line in lines if line["type"] == "run_start"]
    closed = {line["run_id"] for line in lines if line["type"] == "run_close"}
    assert interrupted == [run_id for run_id in started if run_id not in closed]
    events = [line["data"]["arguments"]["i"] for line in lines if line["type"] == "tool_exec_start"]
    assert events == list(range(len(events))) and events
    assert lines[-2]["type"] == "turn_start"


def test_best_effort_drops_past_the_grace_counts_exactly_what_is_missing_and_goes_on(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp).start()
    stop_file = short_tmp / "stop"
    agent = spawn_agent(daemon.socket, 0, stop_file, grace=0.5, mode="best_effort")
    path = daemon.root / "restart" / "agent-0.jsonl"
    try:
        wait_for(partial(grown, daemon.root, 200_000), timeout=60)
        daemon.kill()
        # Past the grace the agent drops events instead of raising or waiting.
        wait_for(Path(f"{stop_file}.dropping").exists, timeout=60)
        daemon = DaemonProcess(short_tmp).start()
        # Back: the agent reconnects and its run goes on.
        wait_for(partial(grown, daemon.root, written(daemon.root) + 100_000), timeout=60)
        stop_file.touch()
        out, err = agent.communicate(timeout=60)
    finally:
        stop_file.touch()
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
        daemon.stop()
    assert agent.returncode == 0, err
    report = json.loads(out)
    assert report["error"] is None, report
    assert report["reconnects"] >= 1 and report["dropped"], report
    # Logged once, however many were dropped.
    assert err.count("flightlog dropped an event") == len(report["dropped"]), err
    assert_every_file_sound(daemon.root, tail_allowed=False)
    lines = read_lines(path)
    events = [line["data"]["arguments"]["i"] for line in lines if line["type"] == "tool_exec_start"]
    # In order, each at most once, and what is missing is exactly what was counted.
    assert events == sorted(set(events))
    assert report["recorded"] - len(events) == sum(report["dropped"].values()), report
    # One run, resumed after the outage, and its run_close names the loss.
    assert [line["type"] for line in lines].count("run_start") == 1
    assert any(line["type"] == "run_resume" for line in lines)
    close = lines[-1]
    assert close["type"] == "run_close", close
    dropped = sum(report["dropped"].values())
    assert close["data"]["error"].startswith(f"{dropped} events not recorded, the first for "), (
        close
    )


def test_unacknowledged_records_stay_within_their_bound(short_tmp: Path) -> None:
    """A run that only records (no request acknowledges anything) keeps at most
    ``max_unacked`` bytes: syncs that need no fsync acknowledge them as it goes."""
    daemon = DaemonProcess(short_tmp).start()
    bound = 64 * 1024
    kept: list[int] = []
    try:
        with connect(daemon.socket, max_unacked=bound) as client:
            session = client.create("bounded.jsonl")
            run = session.begin_run()
            for n in range(5000):
                run.record(TurnStart(turn_index=n))
                kept.append(sum(client._link.conn.replay_log.unacknowledged_bytes().values()))
            run.close()
            session.close()
    finally:
        daemon.stop()
    frame = 200  # a TurnStart frame is smaller
    assert max(kept) <= bound + frame, max(kept)
    lines = read_lines(daemon.root / "bounded.jsonl")
    turns = [line["data"]["turn_index"] for line in lines if line["type"] == "turn_start"]
    assert turns == list(range(5000))


def test_a_create_the_daemon_never_read_is_sent_again_after_its_restart(
    short_tmp: Path,
) -> None:
    """The create waits in the socket of a stopped daemon, which is then killed: the
    client sends it again to the new daemon, as a create (the file does not exist)."""
    daemon = DaemonProcess(short_tmp).start()
    client = connect(daemon.socket)
    created: dict[str, Any] = {}

    def create() -> None:
        try:
            session = client.create("unread.jsonl", meta={"n": 1})
            created["session"] = session
        except Exception as exc:
            created["error"] = exc

    try:
        os.kill(daemon.pid, signal.SIGSTOP)
        creating = threading.Thread(target=create)
        creating.start()
        # Sent (or about to be: a send to the dead daemon fails, and it goes again).
        wait_for(lambda: bool(client._link.conn._waiting), timeout=10)
        daemon.kill()  # never read
        daemon.start()
        creating.join(timeout=30)
        assert "error" not in created, created
        session = created["session"]
        with session.begin_run() as run:
            run.record(TurnStart(turn_index=0))
        session.close()
    finally:
        client.close()
        daemon.stop()
    lines = read_lines(daemon.root / "unread.jsonl")
    assert [line["type"] for line in lines] == [
        "session_start",
        "run_start",
        "turn_start",
        "run_close",
    ]
    assert lines[0]["session_id"] == session.session_id
    assert lines[0]["data"]["meta"] == {"n": 1}
