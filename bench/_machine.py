"""The machine, the date and the command: printed with every table."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["CpuMeter", "describe"]


class CpuMeter:
    """CPU time the rest of the machine used while the harness measured.

    The machine's busy time (``/proc/stat``) minus the CPU of the harness, its agents
    and its daemons (``os.times``: its own and its waited-for children's): what other
    users of the machine took, the noise behind a run's figures.
    """

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal: everything but idle and iowait
        busy = sum(fields[:8]) - fields[3] - fields[4]
        times = os.times()
        mine = times.user + times.system + times.children_user + times.children_system
        return busy / os.sysconf("SC_CLK_TCK"), mine, time.monotonic()

    def others(self) -> tuple[float, float]:
        """CPU-seconds others used since the meter started, and their share of the
        machine's CPU over that time (0 to 1)."""
        busy, mine, moment = self._read()
        used = max(0.0, (busy - self._start[0]) - (mine - self._start[1]))
        capacity = (moment - self._start[2]) * (os.cpu_count() or 1)
        return used, used / capacity if capacity else 0.0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return 0.0


def _filesystem(path: str) -> str:
    """The mount holding ``path``: its device and type, from /proc/mounts."""
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                device, mount, fstype = line.split()[:3]
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best[0]):
                    best = (mount, device, fstype)
    except OSError:
        pass
    return f"{best[2]} on {best[1]} (mounted at {best[0]})"


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def _revision() -> str:
    """The repository's commit, and whether the measured code (protocol, SDK, daemon)
    had changes not in it."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--", "protocol", "sdk", "daemon"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit} (with uncommitted changes)" if dirty else commit or "unknown"


def describe(scratch: str) -> dict[str, Any]:
    """Everything a reader needs to place the figures."""
    load = os.getloadavg()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": "python -m bench " + shlex.join(sys.argv[1:]),
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gb": round(_memory_gb(), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "revision": _revision(),
        "filesystem": _filesystem(scratch),
        "load_average_at_start": [round(x, 2) for x in load],
        "versions": {
            name: _version(name)
            for name in ("flightlogd", "flightlog-sdk", "flightlog-protocol", "msgspec")
        },
        "sqlite": __import__("sqlite3").sqlite_version,
    }
