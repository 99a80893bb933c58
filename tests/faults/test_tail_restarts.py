"""Tails ride through daemon restarts: every record once, in order.

Agent processes (``restart_agent.py``) record while a follower process
(``tail_follower.py``) tails one session or every session, with the sync or the async
client, and the daemon is killed (SIGKILL, and once stopped with SIGTERM) and started
again on the same socket and root.  Afterwards the follower has every line of each
file exactly once, in order: what was written while it was away included.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from flightlog.protocol import (
    Execution,
)
from flightlog.protocol.events import (
    ToolExecStart,
    TurnStart,
)
from flightlog.sdk import connect
from flightlog.sdk.aio import aconnect
from support import DaemonProcess, read_lines, wait_for

from .harness import assert_every_file_sound
from .test_restarts import grown, spawn_agent, written

FOLLOWER = Path(__file__).with_name("tail_follower.py")
#: Restarts per test: SIGKILL but for one SIGTERM.
RESTARTS = 5
SIGTERM_AT = 2


def spawn_follower(
    socket: str, out: Path, target: str, flavour: str, grace: float = 30.0
) -> subprocess.Popen[str]:
    follower = subprocess.Popen(
        [sys.executable, str(FOLLOWER), socket, str(out), target, flavour, str(grace)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: bool(followed(out)) or follower.poll() is not None, timeout=30)
    assert follower.poll() is None, follower.communicate()[1]
    return follower


def followed(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")]


def has_all_of(out: Path, files: list[Path]) -> bool:
    """Whether the follower has the last line of each file (it may be cut by a kill)."""
    got = {(item.get("path"), item.get("seq")) for item in followed(out)}
    return all((str(path), read_lines(path)[-1]["seq"]) in got for path in files)


def caught_up(out: Path, path: Path) -> bool:
    """Whether the follower has what the file holds now."""
    last = read_lines(path)[-1]["seq"]
    return any(item.get("seq", 0) >= last for item in followed(out))


def assert_every_line_once(out: Path, files: list[Path]) -> None:
    items = [item for item in followed(out) if "seq" in item]
    for path in files:
        lines = read_lines(path)
        seqs = [item["seq"] for item in items if item["path"] == str(path)]
        assert seqs == [line["seq"] for line in lines], (path, seqs[:5], len(seqs), len(lines))
        assert {item["session_id"] for item in items if item["path"] == str(path)} == {
            lines[0]["session_id"]
        }


def stop(process: subprocess.Popen[str] | None) -> str:
    if process is None:
        return ""
    if process.poll() is None:
        process.kill()
    return process.communicate()[1]


def restart(
    base: Path, daemon: DaemonProcess, rng: random.Random, how: signal.Signals
) -> DaemonProcess:
    goal = written(daemon.root) + rng.randrange(20_000, 80_000)
    wait_for(partial(grown, daemon.root, goal), timeout=60)
    if how is signal.SIGKILL:
        daemon.kill()
    else:
        daemon.terminate()
    return DaemonProcess(base).start()


def restarts(base: Path, daemon: DaemonProcess, seed: str) -> DaemonProcess:
    """``RESTARTS`` restarts, each once the agents wrote a seeded amount more."""
    rng = random.Random(seed)
    for n in range(RESTARTS):
        daemon = restart(base, daemon, rng, signal.SIGTERM if n == SIGTERM_AT else signal.SIGKILL)
    return daemon


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_tail_of_one_session_rides_through_restarts(short_tmp: Path, flavour: str) -> None:
    daemon = DaemonProcess(short_tmp).start()
    stop_file = short_tmp / "stop"
    out = short_tmp / "followed.jsonl"
    path = daemon.root / "restart" / "agent-0.jsonl"
    follower = agent = None
    try:
        # Started first: it waits for the session, then reads it from its start.
        follower = spawn_follower(daemon.socket, out, str(path), flavour)
        agent = spawn_agent(daemon.socket, 0, stop_file)
        # Connecting the first time is not retried: the agent is in before the kills.
        wait_for(path.exists, timeout=60)
        daemon = restarts(short_tmp, daemon, flavour)
        wait_for(partial(grown, daemon.root, written(daemon.root) + 20_000), timeout=60)
        # Subscribed to the last daemon before the session closes (a session closed
        # while the tail was away is not known to be closed: docs/protocol.md).
        wait_for(partial(caught_up, out, path), timeout=60, interval=0.1)
        stop_file.touch()
        report = json.loads(agent.communicate(timeout=120)[0])
        # The agent closed its session: the tail ends there, having had every line.
        assert follower.wait(timeout=60) == 0
    finally:
        stop_file.touch()
        errors = stop(agent), stop(follower)
        daemon.stop()
    assert report["error"] is None, (report, errors)
    assert_every_file_sound(daemon.root, tail_allowed=False)
    assert_every_line_once(out, [path])
    assert followed(out)[-1] == {"end": "session_closed"}
    # It reconnected (one reconnect may span restarts close together: the daemon was
    # killed again while the follower was subscribing anew).
    assert max(item.get("reconnects", 0) for item in followed(out)) >= 1


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_tail_of_every_session_rides_through_restarts(short_tmp: Path, flavour: str) -> None:
    daemon = DaemonProcess(short_tmp).start()
    stop_file = short_tmp / "stop"
    out = short_tmp / "followed.jsonl"
    early = daemon.root / "early.jsonl"
    # Written before the follower subscribes: only what comes later is its to see.
    with connect(daemon.socket) as client:
        session = client.create(str(early))
        with session.begin_run() as run:
            run.record(TurnStart(turn_index=0))
        session.close()
    before = read_lines(early)[-1]["seq"]
    files = [daemon.root / "restart" / f"agent-{n}.jsonl" for n in range(3)]
    follower, agents, writer = None, [], None
    try:
        follower = spawn_follower(daemon.socket, out, "all", flavour)
        agents = [spawn_agent(daemon.socket, n, stop_file) for n in range(2)]
        wait_for(lambda: files[0].exists() and files[1].exists(), timeout=60)
        daemon = restarts(short_tmp, daemon, flavour)
        # Away while the daemon restarts, a third agent creates its session and
        # records, and the early session is opened and recorded again: the follower
        # reads the new one from its start, the early one after its old end.
        wait_for(partial(grown, daemon.root, written(daemon.root) + 20_000), timeout=60)
        os.kill(follower.pid, signal.SIGSTOP)
        daemon.kill()
        daemon = DaemonProcess(short_tmp).start()
        writer = connect(daemon.socket)
        session = writer.open(str(early))
        with session.begin_run() as run:
            run.record(TurnStart(turn_index=1))
        agents.append(spawn_agent(daemon.socket, 2, stop_file))
        wait_for(files[2].exists, timeout=30)
        wait_for(partial(grown, daemon.root, written(daemon.root) + 50_000), timeout=60)
        os.kill(follower.pid, signal.SIGCONT)
        wait_for(partial(grown, daemon.root, written(daemon.root) + 20_000), timeout=60)
        stop_file.touch()
        reports = [json.loads(agent.communicate(timeout=120)[0]) for agent in agents]
        with contextlib.suppress(TimeoutError):  # the assertions below say what is missing
            wait_for(partial(has_all_of, out, [*files, early]), timeout=60)
        session.close()
    finally:
        stop_file.touch()
        if writer is not None:
            writer.close()
        if follower is not None:
            os.kill(follower.pid, signal.SIGCONT)
        errors = [stop(agent) for agent in agents], stop(follower)
        daemon.stop()
    assert [report["error"] for report in reports] == [None] * 3, (reports, errors)
    assert_every_file_sound(daemon.root, tail_allowed=False)
    assert [item for item in followed(out) if "error" in item or "end" in item] == []
    assert_every_line_once(out, files[:2])
    again = [item["seq"] for item in followed(out) if item.get("path") == str(early)]
    assert again == [line["seq"] for line in read_lines(early) if line["seq"] > before]
    assert again
    # It reconnected (one reconnect may span restarts close together: the daemon was
    # killed again while the follower was subscribing anew).
    assert max(item.get("reconnects", 0) for item in followed(out)) >= 1
    # The third agent may have closed its session before the follower was back: the
    # new daemon's status lists it among those it closed.
    assert_every_line_once(out, files[2:])


def test_a_tail_of_every_session_reads_one_created_and_closed_while_it_was_away(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp).start()
    first, brief = daemon.root / "first.jsonl", daemon.root / "brief.jsonl"
    got: list[tuple[str, int]] = []

    async def follow() -> None:
        nonlocal daemon
        async with (
            aconnect(daemon.socket, reconnect_grace=30) as client,
            client.tail_all(follow=True) as every,
        ):
            with connect(daemon.socket) as writer:
                writer.create(str(first)).close()
            path, record = await anext(aiter(every))
            got.append((path, record.seq))
            # The follower does nothing (its loop is busy here) while the daemon is
            # killed and a new one creates, writes and closes a session.
            daemon.kill()
            daemon = DaemonProcess(short_tmp).start()
            with connect(daemon.socket) as writer:
                session = writer.create(str(brief))
                with session.begin_run() as run:
                    run.record(TurnStart(turn_index=0))
                session.close()
            with anyio.move_on_after(30):  # what is missing is asserted below
                async for path, record in every:
                    got.append((path, record.seq))
                    if len(got) == 1 + len(read_lines(brief)):
                        break

    try:
        anyio.run(follow)
    finally:
        daemon.stop()
    assert got[0] == (str(first), 1)
    assert got[1:] == [(str(brief), line["seq"]) for line in read_lines(brief)]


def test_a_tail_whose_daemon_stays_away_past_the_grace_ends_with_one_error(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp).start()
    stop_file = short_tmp / "stop"
    out = short_tmp / "followed.jsonl"
    path = daemon.root / "restart" / "agent-0.jsonl"
    follower = agent = None
    try:
        agent = spawn_agent(daemon.socket, 0, stop_file, grace=0.5)
        follower = spawn_follower(daemon.socket, out, str(path), "sync", grace=0.5)
        wait_for(partial(grown, daemon.root, 50_000), timeout=60)
        # The follower has records of its own before the daemon goes (50 KB take the
        # agent a few milliseconds, less than the follower may need to get any).
        wait_for(lambda: any("seq" in item for item in followed(out)), timeout=60)
        daemon.kill()
        assert follower.wait(timeout=60) == 0
    finally:
        stop_file.touch()
        errors = stop(agent), stop(follower)
        daemon.stop()
    ends = [item for item in followed(out) if "seq" not in item and "ready" not in item]
    assert len(ends) == 1, (ends, errors)
    error = ends[0].get("error", "")
    assert error.startswith("ConnectionLost: the daemon at "), ends
    assert "within 0.5 s" in error and "[daemon_unreachable]" in error, error
    seqs = [item["seq"] for item in followed(out) if "seq" in item]
    assert seqs == list(range(1, len(seqs) + 1)) and seqs


def test_flightlog_tail_f_keeps_printing_across_a_restart(short_tmp: Path) -> None:
    rng = random.Random(3)
    daemon = DaemonProcess(short_tmp).start()
    stop_file = short_tmp / "stop"
    path = daemon.root / "restart" / "agent-0.jsonl"
    out = short_tmp / "tail.out"
    command = ["tail", "-f", "--json", str(path)]
    with out.open("wb") as stdout:
        tail = subprocess.Popen(
            [sys.executable, "-m", "flightlog.cli", "--socket", daemon.socket, *command],
            stdout=stdout,
            stderr=subprocess.PIPE,
        )
    agent = None
    try:
        agent = spawn_agent(daemon.socket, 0, stop_file)
        wait_for(path.exists, timeout=60)
        # Connecting the first time is not retried: it is in before the restarts.
        wait_for(lambda: len(out.read_bytes().splitlines()) > 100, timeout=60)
        printed = len(out.read_bytes().splitlines())
        for how in (signal.SIGKILL, signal.SIGTERM):
            daemon = restart(short_tmp, daemon, rng, how)
        # It goes on printing what the new daemon writes.
        wait_for(lambda: len(out.read_bytes().splitlines()) > printed + 100, timeout=60)
        last = read_lines(path)[-1]["seq"]
        wait_for(lambda: len(out.read_bytes().splitlines()) >= last, timeout=60, interval=0.1)
        stop_file.touch()
        assert json.loads(agent.communicate(timeout=120)[0])["error"] is None
        _, err = tail.communicate(timeout=60)
    finally:
        stop_file.touch()
        stop(agent)
        if tail.poll() is None:
            tail.kill()
            tail.communicate()
        daemon.stop()
    assert tail.returncode == 0, err
    assert b"the writer closed the session" in err, err
    seqs = [json.loads(line)["seq"] for line in out.read_bytes().splitlines()]
    assert seqs == [line["seq"] for line in read_lines(path)]


def test_a_tail_of_every_session_that_falls_behind_reads_on_from_the_files(
    short_tmp: Path,
) -> None:
    # Frames of at most 1 MiB: a subscriber of every session falls behind past about
    # 6 MiB of live lines (4 MiB and room for two of the longest), past 8 MiB of
    # pushes queued for its connection.
    daemon = DaemonProcess(
        short_tmp, "--max-frame-size", str(1 << 20), "--send-timeout", "120"
    ).start()
    path = daemon.root / "fast.jsonl"
    seqs: list[int] = []
    try:
        with (
            connect(daemon.socket) as client,
            client.tail_all(follow=True) as every,
            connect(daemon.socket) as writer,
        ):
            session = writer.create(str(path))
            with session.begin_run() as run:
                # 30 MiB written while the tail reads nothing.
                for n in range(3000):
                    execution = Execution(id=f"t{n}", kind="tool")
                    run.record(
                        ToolExecStart(
                            execution=execution,
                            tool_call_id=f"c{n}",
                            name="echo",
                            arguments={"blob": "x" * 10_000},
                        )
                    )
            last = session.sync()
            for _, record in every:
                seqs.append(record.seq)
                if record.seq == last:
                    break
            session.close()
    finally:
        daemon.stop()
    assert seqs == [line["seq"] for line in read_lines(path)]
