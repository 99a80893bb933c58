"""Scenarios 1 and 2: aggregate throughput of several agent processes.

Every agent writes its own session as fast as it can for a fixed time, after a short
warm-up and a barrier that starts all agents together.  For flightlogd an agent's
clock stops only once the daemon has written all its lines to the file (the file
reaches its exact expected size), so the figure is records in the files per second,
as it is for the baselines; no system fsyncs.  The aggregate is all records over the
span from the first agent's start to the last agent's finish.

The syslog peers (:mod:`bench._syslog`), when found, run alongside as two more
systems, with their daemons' CPU metered like flightlogd's.

The CPU rows explain the figures: on a machine with fewer cores than processes the
throughput is the machine's CPU divided by the CPU every event costs, summed over the
agents and (for flightlogd) the daemon.  Both are metered up to the drain, closing
left out on both sides: the daemon's CPU is read once every agent has drained (a
second barrier), before any agent closes its session.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from flightlog.protocol import new_id

from ._context import Context
from ._events import LineEncoder, large_event, small_event
from ._procs import StartSignal, cpu_seconds, run_agents
from ._report import Row, Target
from ._systems import System, peer_systems

__all__ = ["large_events", "small_events"]

WARMUP = 20


@dataclass(frozen=True)
class _Load:
    system: System
    index: int
    run: int
    large: bool
    seconds: float
    #: The daemon whose CPU is metered (flightlogd's or a peer's), if any.
    daemon_pid: int | None


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _agent(load: _Load, start: StartSignal) -> tuple[int, int, int, int, float, float]:
    event = large_event() if load.large else small_event()
    batch = 4 if load.large else 64
    agent = load.system.agent(load.index)
    try:
        sink = agent.session(f"r{load.run}/agent-{load.index}.jsonl")
        for _ in range(WARMUP):
            sink.record(event)
        sink.drain()
        start()
        cpu = _cpu()
        begin = time.monotonic_ns()
        end = begin + int(load.seconds * 1e9)
        count = 0
        while True:
            for _ in range(batch):
                sink.record(event)
            count += batch
            if time.monotonic_ns() >= end:
                break
        sink.drain()
        finish = time.monotonic_ns()
        cpu = _cpu() - cpu
        # The daemon's CPU up to here, once every agent drained and before any closes:
        # closing is no part of the figure on either side (flightlogd's daemon fsyncs
        # at run close, the JSONL writer in its agent).
        start()
        daemon_cpu = cpu_seconds(load.daemon_pid) if load.daemon_pid else 0.0
    finally:
        agent.close()
    line = len(LineEncoder(new_id(), new_id(), first_seq=100).line(event))
    return begin, finish, count, count * line, cpu, daemon_cpu


def _measure(ctx: Context, *, large: bool, agents: int, seconds: float, rows: list[Row]) -> None:
    name = "large" if large else "small"
    directory = ctx.scratch(f"tp-{name}")
    daemon = ctx.daemon(directory).start()
    peers = ctx.peer_daemons(directory)
    try:
        peers.start()
        for run in range(ctx.runs):
            for system in ctx.systems(directory, daemon, run, peer_systems(peers)):
                peer = peers.get(system.name)
                pid = peer.pid if peer else daemon.pid if system.name == "flightlog" else None
                loads = [_Load(system, i, run, large, seconds, pid) for i in range(agents)]
                cpu_before = cpu_seconds(pid) if pid else 0.0
                results = run_agents(_agent, loads, timeout=120 + 10 * seconds)
                # The first reading after the agents' second barrier precedes every close.
                daemon_cpu = min(r[5] for r in results) - cpu_before if pid else 0.0
                span = (max(r[1] for r in results) - min(r[0] for r in results)) / 1e9
                count = sum(r[2] for r in results)
                nbytes = sum(r[3] for r in results)
                agents_cpu = sum(r[4] for r in results)
                rows[0].add(system.name, count / span if not large else nbytes / span / 1e6)
                if pid:
                    # The daemon's CPU also covers the warm-up records.
                    per_event = daemon_cpu * 1e6 / (count + agents * WARMUP)
                    rows[1].add(system.name, agents_cpu * 1e6 / count + per_event)
                    rows[2].add(system.name, per_event)
                else:
                    rows[1].add(system.name, agents_cpu * 1e6 / count)
                ctx.say(
                    f"{name} events run {run + 1}/{ctx.runs} {system.name}: "
                    f"{count / span:,.0f} events/s, {nbytes / span / 1e6:,.1f} MB/s"
                )
                ctx.clean(system, run)
                if peer:
                    peer.close_files()
    finally:
        daemon.stop()
        peers.stop()


def small_events(ctx: Context) -> list[Row]:
    """Scenario 1: ~350-byte lines, 8 agents, 8 sessions: aggregate events/s."""
    agents = 8
    seconds = 0.3 if ctx.quick else 1.5
    line = len(LineEncoder(new_id(), new_id(), first_seq=100).line(small_event()))
    rows = [
        Row(
            "1",
            f"small events ({line} B lines), {agents} agents, {agents} sessions",
            "aggregate",
            "events/s",
            fmt="{:,.0f}",
            targets=[Target(">=", 0.5, "jsonl"), Target(">=", 20, "sqlite")],
        ),
        Row(
            "1b",
            "↳ CPU per event, all processes (agents + daemon)",
            "CPU time",
            "µs/event",
            fmt="{:.1f}",
        ),
        Row("1c", "↳ of which flightlogd", "daemon CPU", "µs/event", fmt="{:.1f}"),
    ]
    _measure(ctx, large=False, agents=agents, seconds=seconds, rows=rows)
    return rows


def large_events(ctx: Context) -> list[Row]:
    """Scenario 2: 64 KiB model requests, 4 agents: aggregate MB/s."""
    agents = 4
    seconds = 0.3 if ctx.quick else 1.0
    rows = [
        Row(
            "2",
            f"large events (64 KiB model requests), {agents} agents",
            "aggregate",
            "MB/s",
            fmt="{:,.0f}",
            targets=[Target(">=", 0.6, "jsonl"), Target(">=", 5, "sqlite")],
        ),
        Row(
            "2b",
            "↳ CPU per event, all processes (agents + daemon)",
            "CPU time",
            "µs/event",
            fmt="{:.0f}",
        ),
        Row("2c", "↳ of which flightlogd", "daemon CPU", "µs/event", fmt="{:.0f}"),
    ]
    _measure(ctx, large=True, agents=agents, seconds=seconds, rows=rows)
    return rows
