"""Scenario 4: tail latency, from ``record()`` in one process to a live subscriber in
another, at a steady rate.

The writer stamps every event with ``time.monotonic_ns()`` just before recording it;
the subscriber (``client.tail(path, follow=True)`` in its own process) takes the
difference on arrival.  Both read the same CLOCK_MONOTONIC, so no clock sync enters.
The writer paces itself against an absolute schedule by sleeping, so a late event does
not push the later ones back (at 20,000/s, sleeps are coarser than the 50 µs interval
and events go out in small bursts).

The SQLite column is the durable event log's live tail: a reader polling
``SELECT … WHERE seq > ?`` every 200 ms.  The in-process JSONL recorder has no live
tail.  The first 2% of the events (at least 20) are warm-up and not counted.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from ._context import Context
from ._events import stamped_event, stamped_ns
from ._procs import StartSignal, run_agents
from ._report import Row, Target, percentile
from ._systems import System, open_sqlite

__all__ = ["tail_latency"]

POLL_INTERVAL = 0.2


@dataclass(frozen=True)
class _Role:
    system: System
    writer: bool
    name: str
    rate: int
    count: int


def _pace(due_ns: int) -> None:
    # Sleep, never spin: a spinning writer would take one of the machine's cores from
    # the daemon and the subscriber.  Events that fall due during a longer sleep go out
    # back to back, as an agent's bursts do.
    left = due_ns - time.monotonic_ns()
    if left > 0:
        time.sleep(left / 1e9)


def _writer(role: _Role, start: StartSignal) -> float:
    agent = role.system.agent(0)
    try:
        sink = agent.session(role.name)
        start()
        time.sleep(0.05)  # the subscriber has caught up with session_start and run_start
        interval = 1_000_000_000 // role.rate
        begin = due = time.monotonic_ns()
        for _ in range(role.count):
            _pace(due)
            sink.record_new(stamped_event(time.monotonic_ns()))
            due += interval
        elapsed = (time.monotonic_ns() - begin) / 1e9
    finally:
        agent.close()
    return role.count / elapsed


def _flightlog_subscriber(role: _Role, start: StartSignal) -> list[int]:
    from flightlog.sdk import connect

    latencies = []
    # Subscribe once the session exists: a follow subscription made before the file
    # exists fails in this daemon version instead of waiting (reported).
    while not os.path.exists(os.path.join(role.system.directory, role.name)):
        time.sleep(0.005)
    with connect(role.system.socket, client_name="bench-tail") as client:
        tail = client.tail(role.name, follow=True)
        with tail:  # subscribed before the writer starts
            start()
            for record in tail:
                if record.type == "tool_exec_start":
                    latencies.append(time.monotonic_ns() - stamped_ns(record.data))
                    if len(latencies) == role.count:
                        break
    return latencies


def _sqlite_subscriber(role: _Role, start: StartSignal) -> list[int]:
    path = os.path.join(role.system.directory, "agent-0.db")
    start()
    while not os.path.exists(path):
        time.sleep(0.01)
    conn: sqlite3.Connection = open_sqlite(path)
    latencies: list[int] = []
    seq = 0
    try:
        while len(latencies) < role.count:
            time.sleep(POLL_INTERVAL)
            rows = conn.execute(
                "SELECT log.seq, events.type, events.line FROM log JOIN events USING (event_id)"
                " WHERE log.seq > ? ORDER BY log.seq",
                (seq,),
            ).fetchall()
            arrived = time.monotonic_ns()
            for seq, type, line in rows:  # noqa: B007 - the last seq is the next query's
                if type == "tool_exec_start":
                    data = line[line.index(b'"data":') + 7 : -2]
                    latencies.append(arrived - stamped_ns(data))
    finally:
        conn.close()
    return latencies


def _subscriber(role: _Role, start: StartSignal) -> list[int]:
    if role.system.name == "flightlog":
        return _flightlog_subscriber(role, start)
    return _sqlite_subscriber(role, start)


def _agent(role: _Role, start: StartSignal) -> object:
    return _writer(role, start) if role.writer else _subscriber(role, start)


def tail_latency(ctx: Context) -> list[Row]:
    """Scenario 4: record() to a live subscriber at 1,000 and 20,000 events/s."""
    seconds = {1000: 0.5 if ctx.quick else 3.0, 20000: 0.25 if ctx.quick else 1.0}
    rows: list[Row] = []
    directory = ctx.scratch("tail")
    daemon = ctx.daemon(directory).start()
    try:
        for rate, duration in seconds.items():
            count = int(rate * duration)
            p50 = Row(
                f"4-{rate // 1000}k",
                f"tail latency at {rate:,} events/s, p50",
                "record → subscriber, p50",
                "ms",
                fmt="{:.2f}",
            )
            p99 = Row(
                f"4-{rate // 1000}k-p99",
                f"tail latency at {rate:,} events/s, p99",
                "record → subscriber, p99",
                "ms",
                fmt="{:.2f}",
                targets=[Target("<", 2, None)] if rate == 1000 else [],
            )
            achieved = Row(
                f"4-{rate // 1000}k-rate",
                f"↳ rate the writer achieved (goal {rate:,}/s)",
                "writer rate",
                "events/s",
                fmt="{:,.0f}",
            )
            for run in range(ctx.runs):
                for system in ctx.systems(directory, daemon, run):
                    if system.name == "jsonl":
                        continue  # no live tail in the in-process recorder
                    name = f"r{run}/tail-{rate}.jsonl"
                    Path(system.directory).mkdir(parents=True, exist_ok=True)
                    roles = [
                        _Role(system, True, name, rate, count),
                        _Role(system, False, name, rate, count),
                    ]
                    writer_rate, latencies = run_agents(_agent, roles, timeout=60 + 3 * duration)
                    assert isinstance(latencies, list)
                    assert isinstance(writer_rate, float)
                    kept = latencies[max(20, count // 50) :]
                    p50.add(system.name, percentile(kept, 50) / 1e6)
                    p99.add(system.name, percentile(kept, 99) / 1e6)
                    achieved.add(system.name, writer_rate)
                    ctx.say(
                        f"tail {rate}/s run {run + 1}/{ctx.runs} {system.name}: "
                        f"p50 {percentile(kept, 50) / 1e6:.2f} ms, "
                        f"p99 {percentile(kept, 99) / 1e6:.2f} ms, writer {writer_rate:,.0f}/s"
                    )
                    ctx.clean(system, run)
            rows += [p50, p99, achieved]
    finally:
        daemon.stop()
    return rows
