"""Agent processes, and what ``/proc`` says about a process.

Agents are real processes, forked from the harness (so a hundred of them start in a
fraction of a second and share the harness's imported modules copy-on-write).  Each
runs one function with one payload: it sets itself up, waits at a barrier so that all
agents start their measured phase together, and sends its result back.  The harness
keeps calling a ``sample`` function while it waits, to watch the daemon.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "AgentFailed",
    "StartSignal",
    "cpu_seconds",
    "fd_count",
    "peak_rss_bytes",
    "rss_bytes",
    "run_agents",
]

# Fork: the harness has no threads when it starts agents, and forking is what lets a
# hundred agents start at once on two cores.
_CTX = multiprocessing.get_context("fork")

BARRIER_TIMEOUT = 120.0

#: What an agent calls once it is set up; returns when every agent is.  Called again,
#: it waits for every agent to call it again (the barrier is reused).
StartSignal = Callable[[], None]


class AgentFailed(RuntimeError):
    """An agent process raised, or did not finish in time."""


def _child(
    fn: Callable[[Any, StartSignal], Any],
    payload: Any,
    barrier: Any,
    results: Any,
    index: int,
) -> None:
    try:
        result = fn(payload, lambda: barrier.wait(BARRIER_TIMEOUT))
    except BaseException:
        barrier.abort()
        results.put((index, False, traceback.format_exc()))
    else:
        results.put((index, True, result))


def run_agents(
    fn: Callable[[Any, StartSignal], Any],
    payloads: Sequence[Any],
    *,
    timeout: float,
    sample: Callable[[], None] | None = None,
    sample_interval: float = 0.05,
) -> list[Any]:
    """Run ``fn(payload, start)`` in one process per payload; their results, in order.

    Every agent must call ``start()`` once, and as often as every other agent.  Raises
    :class:`AgentFailed` with the agent's traceback when one raises, and when they take
    longer than ``timeout``.
    """
    barrier = _CTX.Barrier(len(payloads))
    results = _CTX.Queue()
    procs = [
        _CTX.Process(target=_child, args=(fn, payload, barrier, results, i), daemon=True)
        for i, payload in enumerate(payloads)
    ]
    for proc in procs:
        proc.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < len(procs):
            if sample is not None:
                sample()
            try:
                index, ok, value = results.get(timeout=sample_interval)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise AgentFailed(f"agents did not finish within {timeout:.0f}s") from None
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise AgentFailed(f"agent exited with status {dead[0].exitcode}") from None
                continue
            if not ok:
                raise AgentFailed(f"agent {index} failed:\n{value}")
            out[index] = value
        for proc in procs:
            proc.join(10)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        results.close()
    return [out[i] for i in range(len(procs))]


# --------------------------------------------------------------------------- /proc


def _status_field(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(name):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes(pid: int) -> int:
    """Resident set size now."""
    return _status_field(pid, "VmRSS:")


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set size over the process's life (the kernel's high-water mark)."""
    return _status_field(pid, "VmHWM:")


def fd_count(pid: int) -> int:
    """Open file descriptors now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time the process has used."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks
