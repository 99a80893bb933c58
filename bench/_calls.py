"""Scenarios 3 and 5: what one call costs the agent.

3. ``record()`` of a small event, one agent: each call is timed on its own, paced at
   10,000 calls/s so that the daemon keeps up and the figure is the call's own cost in
   the agent (encoding, framing, the ``send``), not backpressure; the row is the mean
   (what the calls cost in total, divided by their number).  The baseline is the
   same call on the in-process JSONL recorder (encoding, the ``write``).
5. A durable acknowledgement: ``save_checkpoint`` (round trip to the daemon, which
   writes the line, fsyncs in a worker thread and replies) against the bare durable
   append in the agent, ``write`` + ``fsync`` of the same checkpoint line to its own
   file.  Ten small events precede every checkpoint, so each fsync has the same
   fresh data to flush.  The SQLite column commits the checkpoint row with
   ``synchronous=FULL`` (its durable commit).

Both scenarios also run against a second daemon started with ``--read-window 0``
(rows 3c and 5c): what the read window, on by default, buys the agent's ``record()``,
and that a client making requests does not pay for it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flightlog.protocol.events import (
    AssistantMessage,
    TextPart,
    ToolCallPart,
    UserMessage,
)

from ._context import Context
from ._daemon import Daemon
from ._events import small_event
from ._procs import StartSignal, run_agents
from ._report import Row, Target, percentile
from ._systems import System

__all__ = ["READ_WINDOW", "client_cost", "durable_ack"]

#: The ``flightlogd --read-window`` of rows 3c and 5c: off.
READ_WINDOW = "0"


def _systems(
    ctx: Context, directory: Path, daemon: Daemon, window_off_daemon: Daemon, run: int
) -> list[tuple[System, bool]]:
    """The three systems of the run, then flightlogd with the read window off (True)."""
    systems = [(system, False) for system in ctx.systems(directory, daemon, run)]
    systems.append(
        (System("flightlog", str(window_off_daemon.root), window_off_daemon.socket), True)
    )
    return systems


def _measure(
    ctx: Context,
    label: str,
    agent: Callable[[_Calls, StartSignal], list[int]],
    load: Callable[[System, int], _Calls],
    summary: Callable[[list[int]], tuple[float, float, str]],
    rows: tuple[Row, Row, Row],
) -> list[Row]:
    """Every run of a scenario: each system, then flightlogd with the read window off.
    ``summary`` turns one agent's timings into (the row's value, its p99, a line)."""
    row, p99, off_row = rows
    directory = ctx.scratch(label.split()[-1])
    daemon = ctx.daemon(directory).start()
    window_off_daemon = Daemon(
        directory / "w", "--read-window", READ_WINDOW, *ctx.daemon_args
    ).start()
    try:
        for run in range(ctx.runs):
            for system, window_off in _systems(ctx, directory, daemon, window_off_daemon, run):
                (timings,) = run_agents(agent, [load(system, run)], timeout=120)
                value, tail, text = summary(timings)
                if window_off:
                    off_row.add(system.name, value)
                else:
                    row.add(system.name, value)
                    p99.add(system.name, tail)
                    if system.name == "jsonl":  # the baseline of the window_off_daemon row
                        off_row.add(system.name, value)
                window = f" --read-window {READ_WINDOW}" if window_off else ""
                ctx.say(f"{label} run {run + 1}/{ctx.runs} {system.name}{window}: {text}")
                ctx.clean(system, run)
    finally:
        daemon.stop()
        window_off_daemon.stop()
    return [row, p99, off_row]


@dataclass(frozen=True)
class _Calls:
    system: System
    run: int
    calls: int
    interval_ns: int = 0
    per_checkpoint: int = 0


def _record_agent(load: _Calls, start: StartSignal) -> list[int]:
    event = small_event()
    agent = load.system.agent(0)
    try:
        sink = agent.session(f"r{load.run}/cost.jsonl")
        for _ in range(200):  # warm-up: connection, caches, file
            sink.record(event)
        sink.drain()
        start()
        timings = []
        clock = time.perf_counter_ns
        due = clock()
        for _ in range(load.calls):
            while clock() < due:
                pass
            begin = clock()
            sink.record(event)
            timings.append(clock() - begin)
            due = max(due + load.interval_ns, begin)
        sink.drain()
    finally:
        agent.close()
    return timings


def client_cost(ctx: Context) -> list[Row]:
    """Scenario 3: µs per ``record()`` of a small event in one agent."""
    calls = 1000 if ctx.quick else 5000
    row = Row(
        "3",
        "client cost of one record() (small event, 1 agent, paced 10k/s)",
        "mean per call",
        "µs",
        fmt="{:.1f}",
        targets=[Target("<=", 1.5, "jsonl")],
    )
    p99 = Row("3b", "↳ same calls, 99th percentile", "p99 per call", "µs", fmt="{:.1f}")
    off_row = Row(
        "3c",
        f"↳ same calls, flightlogd --read-window {READ_WINDOW} (the window off)",
        "mean per call",
        "µs",
        fmt="{:.1f}",
        targets=[Target("<=", 1.5, "jsonl")],
    )

    def load(system: System, run: int) -> _Calls:
        return _Calls(system, run, calls, interval_ns=100_000)

    def summary(timings: list[int]) -> tuple[float, float, str]:
        mean = statistics.mean(timings) / 1e3
        text = f"mean {mean:.1f} µs, p50 {percentile(timings, 50) / 1e3:.1f} µs"
        return mean, percentile(timings, 99) / 1e3, text

    return _measure(ctx, "record() cost", _record_agent, load, summary, (row, p99, off_row))


def _snapshot() -> dict[str, object]:
    """An agent's state as it checkpoints it mid-run: about 4 KiB of JSON."""
    messages: list[object] = []
    for turn in range(6):
        messages.append(UserMessage(content=f"Step {turn}: look at module {turn} and fix it."))
        messages.append(
            AssistantMessage(
                content=[
                    TextPart(text="Reading the module first; then I will run the tests. " * 4),
                    ToolCallPart(id=f"call_{turn}", name="read_file", arguments={"path": "a.py"}),
                ],
                model="claude-sonnet",
                stop_reason="tool_use",
            )
        )
    return {"turn": 6, "messages": messages, "usage": {"input": 18234, "output": 2211}}


def _checkpoint_agent(load: _Calls, start: StartSignal) -> list[int]:
    event = small_event()
    snapshot = _snapshot()
    agent = load.system.agent(0)
    try:
        sink = agent.session(f"r{load.run}/durable.jsonl")
        for _ in range(3):  # warm-up
            sink.checkpoint(snapshot)
        start()
        timings = []
        clock = time.perf_counter_ns
        for _ in range(load.calls):
            for _ in range(load.per_checkpoint):
                sink.record(event)
            sink.drain()
            begin = clock()
            sink.checkpoint(snapshot)
            timings.append(clock() - begin)
    finally:
        agent.close()
    return timings


def durable_ack(ctx: Context) -> list[Row]:
    """Scenario 5: ``save_checkpoint`` round trip against a bare write + fsync."""
    calls = 15 if ctx.quick else 200
    row = Row(
        "5",
        "durable ack: save_checkpoint vs write+fsync of the same line (~4 KiB)",
        "median round trip",
        "ms",
        fmt="{:.2f}",
        targets=[Target("<=", 1.5, "jsonl")],
    )
    p99 = Row("5b", "↳ same calls, 99th percentile", "p99 round trip", "ms", fmt="{:.2f}")
    off_row = Row(
        "5c",
        f"↳ same calls, flightlogd --read-window {READ_WINDOW} (the window off)",
        "median round trip",
        "ms",
        fmt="{:.2f}",
        targets=[Target("<=", 1.5, "jsonl")],
    )

    def load(system: System, run: int) -> _Calls:
        return _Calls(system, run, calls, per_checkpoint=10)

    def summary(timings: list[int]) -> tuple[float, float, str]:
        median = percentile(timings, 50) / 1e6
        return median, percentile(timings, 99) / 1e6, f"p50 {median:.2f} ms"

    return _measure(ctx, "durable ack", _checkpoint_agent, load, summary, (row, p99, off_row))
