"""Where a durable acknowledgement's time goes: the floor under scenario 5.

``uv run python -m bench.roundtrip`` starts a daemon in a temporary directory and
times 300 of each request from one client, adding one hop at a time: ``status()``
(the socket and the connection), ``session.sync()`` with nothing to sync (+ the
session's actor), ``load_checkpoint()`` (+ a disk thread reading the file), and
``save_checkpoint()`` (+ the write and its fsync), next to the bare ``write`` +
``fsync`` of a line of the same size in this process.  It prints medians.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from flightlog.sdk import connect

from ._daemon import Daemon

__all__ = ["main"]

_CALLS = 300


def _median_us(call: Callable[[], object]) -> float:
    times = []
    for _ in range(_CALLS):
        begin = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - begin)
    return statistics.median(times) / 1e3


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="fl-rt-", dir="/tmp") as scratch:
        base = Path(scratch)
        daemon = Daemon(base / "d").start()
        try:
            with connect(daemon.socket) as client:
                session = client.create("rt.jsonl")
                run = session.begin_run()
                snapshot = {"messages": ["m" * 100] * 36}  # a ~4 KiB line, as scenario 5
                run.save_checkpoint(snapshot)
                rows = [
                    ("status()", _median_us(client.status)),
                    ("session.sync(), nothing to sync", _median_us(session.sync)),
                    ("session.load_checkpoint()", _median_us(session.load_checkpoint)),
                    (
                        "run.save_checkpoint(~4 KiB)",
                        _median_us(lambda: run.save_checkpoint(snapshot)),
                    ),
                ]
                run.close()
                session.close()
        finally:
            daemon.stop()
        fd = os.open(base / "bare.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        line = b"x" * 4096 + b"\n"

        def append() -> None:
            os.write(fd, line)
            os.fsync(fd)

        try:
            rows.append(("write + fsync in the agent", _median_us(append)))
        finally:
            os.close(fd)
    for name, median in rows:
        print(f"{name:34s} p50 {median:6.0f} µs")


if __name__ == "__main__":
    main()
