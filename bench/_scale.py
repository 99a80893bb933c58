"""Scenarios 6 and 7: what the daemon holds (memory, descriptors) under load.

6. Scale: 100 agent processes hold 10,000 open sessions between them (100 each, one
   connection each), with a run open in every one, and write slowly: each session
   records one small event every 2 s.  The harness samples the daemon's descriptors
   (``/proc/PID/fd``) every 50 ms and reads its peak RSS (``VmHWM``) at the end; the
   daemon runs with its default ``--idle-timeout`` and ``--max-open-files``.  For the
   baselines the same agents hold their sessions themselves; their column is the
   descriptors the agents hold for sessions, summed over all agents.
7. Backpressure: one agent floods a session with 64 KiB model requests as fast as it
   can while a second process subscribes to it (``follow=True``), reads one record
   and then stops reading.  The daemon's peak RSS must stay under a fixed bound while
   it writes far more than that; the same flood without a subscriber is the control.

A fresh daemon serves every run, so each run's peak is its own.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ._context import Context
from ._daemon import Daemon
from ._events import large_event, small_event
from ._procs import StartSignal, fd_count, peak_rss_bytes, rss_bytes, run_agents
from ._report import Row, Target
from ._systems import System

__all__ = ["RSS_BOUND_MB", "backpressure", "scale"]

MB = 1e6
#: The bound scenario 7 holds the daemon to: an idle daemon (about 35 MB) plus what its
#: byte budgets let one writer and one stalled subscriber hold (4 MiB of live tail
#: chunks, an 8 MiB outbox, 8 MiB handed to the actor: 21 MB), twice over for the
#: allocator's slack, rounded up.  It does not grow with the volume written.
RSS_BOUND_MB = 100


class _Watch:
    """Samples a process's descriptors and RSS; keeps the peaks."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fds = 0
        self.rss = 0

    def __call__(self) -> None:
        try:
            self.fds = max(self.fds, fd_count(self.pid))
            self.rss = max(self.rss, rss_bytes(self.pid))
        except FileNotFoundError:  # pragma: no cover - the daemon died; the run fails
            pass


@dataclass(frozen=True)
class _Holder:
    system: System
    index: int
    run: int
    sessions: int
    period: float
    seconds: float


def _held_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _holder(load: _Holder, start: StartSignal) -> tuple[int, float]:
    event = small_event()
    fds_before = _held_fds()
    agent = load.system.agent(load.index)
    try:
        began = time.monotonic()
        sinks = [
            agent.session(f"r{load.run}/a{load.index}/s{j}.jsonl") for j in range(load.sessions)
        ]
        setup = time.monotonic() - began
        start()
        # One event every period/sessions seconds, round robin: each session writes
        # once per period.  Agents start at different phases.
        step = load.period / load.sessions
        due = time.monotonic() + step * (load.index % 10) / 10
        end = time.monotonic() + load.seconds
        j = 0
        while due < end:
            time.sleep(max(0.0, due - time.monotonic()))
            sinks[j % load.sessions].record(event)
            j += 1
            due += step
        held = _held_fds() - fds_before
    finally:
        agent.close()
    return held, setup


def scale(ctx: Context) -> list[Row]:
    """Scenario 6: 10,000 open sessions over 100 processes, writing slowly."""
    agents, sessions = (10, 30) if ctx.quick else (100, 100)
    period, seconds = (0.5, 0.8) if ctx.quick else (2.0, 6.0)
    total = agents * sessions
    title = f"{total:,} open sessions, {agents} processes, 1 event/session/{period:g}s"
    rss = Row(
        "6",
        f"scale: {title}",
        "daemon peak RSS",
        "MB",
        fmt="{:,.0f}",
        targets=[Target("<", 300, None)],
    )
    fds = Row(
        "6b",
        "↳ same run: descriptors (baselines: held by the agents)",
        "daemon peak fds",
        "fds",
        fmt="{:,.0f}",
        targets=[Target("<", 1100, None)],
    )
    setup = Row(
        "6c",
        f"↳ same run: time to open {total:,} sessions, each with a run",
        "setup time",
        "s",
        fmt="{:.1f}",
    )
    directory = ctx.scratch("scale")
    for run in range(ctx.runs):
        daemon = ctx.daemon(directory / f"r{run}").start()
        try:
            for system in ctx.systems(directory, daemon, run):
                Path(system.directory).mkdir(parents=True, exist_ok=True)
                loads = [_Holder(system, i, run, sessions, period, seconds) for i in range(agents)]
                watch = _Watch(daemon.pid)
                results = run_agents(_holder, loads, timeout=300 + seconds, sample=watch)
                held = sum(r[0] for r in results)
                slowest = max(r[1] for r in results)
                if system.name == "flightlog":
                    watch()
                    rss.add(system.name, peak_rss_bytes(daemon.pid) / MB)
                    fds.add(system.name, watch.fds)
                    ctx.say(
                        f"scale run {run + 1}/{ctx.runs} flightlog: peak RSS "
                        f"{peak_rss_bytes(daemon.pid) / MB:,.0f} MB, peak fds {watch.fds}, "
                        f"setup {slowest:.1f} s"
                    )
                else:
                    fds.add(system.name, held)
                    ctx.say(
                        f"scale run {run + 1}/{ctx.runs} {system.name}: agents hold {held} fds, "
                        f"setup {slowest:.1f} s"
                    )
                setup.add(system.name, slowest)
                ctx.clean(system, run)
        finally:
            daemon.stop(timeout=120)
    return [rss, fds, setup]


@dataclass(frozen=True)
class _Flood:
    socket: str
    name: str
    writer: bool
    seconds: float
    subscriber: bool


def _flood(load: _Flood, start: StartSignal) -> float:
    from flightlog.sdk import connect

    if not load.writer:
        root = os.path.dirname(os.path.dirname(load.socket))
        while not os.path.exists(os.path.join(root, "root", load.name)):
            time.sleep(0.005)
        with (
            connect(load.socket, client_name="bench-stalled") as client,
            client.tail(load.name, follow=True) as tail,
        ):
            next(tail)  # live, and now it stops reading
            start()
            start()  # stalled until the writer is done: its flood, and its close
        return 0.0
    event = large_event()
    with connect(load.socket, client_name="bench-flood") as client:
        session = client.create(load.name)
        run = session.begin_run()
        start()
        end = time.monotonic() + load.seconds
        count = 0
        while time.monotonic() < end:
            for _ in range(4):
                run.record(event)
            count += 4
        run.close()
        session.close()
    start()  # the stalled subscriber may go
    return count * 65.3e3


def backpressure(ctx: Context) -> list[Row]:
    """Scenario 7: a flooding writer and a stalled subscriber: peak RSS stays bounded."""
    seconds = 0.5 if ctx.quick else 3.0
    stalled = Row(
        "7",
        "backpressure: 64 KiB flood, 1 stalled tail subscriber",
        "daemon peak RSS",
        "MB",
        fmt="{:,.0f}",
        targets=[Target("<", RSS_BOUND_MB, None)],
    )
    control = Row(
        "7b", "↳ control: same flood, no subscriber", "daemon peak RSS", "MB", fmt="{:,.0f}"
    )
    written = Row(
        "7c",
        "↳ written during the flood (with the stalled subscriber)",
        "volume",
        "MB",
        fmt="{:,.0f}",
    )
    directory = ctx.scratch("flood")
    for run in range(ctx.runs):
        for with_subscriber in (True, False):
            base = directory / f"r{run}{'s' if with_subscriber else 'c'}"
            daemon: Daemon = ctx.daemon(base).start()
            try:
                loads = [_Flood(daemon.socket, "flood.jsonl", True, seconds, with_subscriber)]
                if with_subscriber:
                    loads.append(_Flood(daemon.socket, "flood.jsonl", False, seconds, True))
                watch = _Watch(daemon.pid)
                results = run_agents(_flood, loads, timeout=120 + seconds, sample=watch)
                peak = peak_rss_bytes(daemon.pid) / MB
            finally:
                daemon.stop(timeout=120)
            (stalled if with_subscriber else control).add("flightlog", peak)
            if with_subscriber:
                written.add("flightlog", results[0] / MB)
            ctx.say(
                f"backpressure run {run + 1}/{ctx.runs} "
                f"{'stalled subscriber' if with_subscriber else 'control'}: "
                f"peak RSS {peak:,.0f} MB, wrote {results[0] / MB:,.0f} MB"
            )
            shutil.rmtree(base, ignore_errors=True)
    return [stalled, control, written]
