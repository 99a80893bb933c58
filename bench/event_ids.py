"""What a caller's event id costs ``record()`` and the daemon.

``uv run python -m bench.event_ids [--events N] [--rounds R]`` starts a real flightlogd
(default options) in a temporary directory and one SDK client that records the bench's
small event (scenario 1's) into three sessions, in alternating rounds of ``N`` calls
each ended by a ``sync()``: ``record(event)``; ``record(event, event_id=...)`` with an
id not seen before (``"<round>-<n>"``, made before the clock starts); and the same ids
again, which the daemon drops as repeats.  Printed: the medians over rounds of the
agent's CPU per call (this thread) and of the daemon's CPU per event
(``/proc/PID/stat``, in clock ticks: rounds of 100,000 events make a tick ~0.1 µs an
event).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from flightlog.sdk import connect

from ._daemon import Daemon
from ._events import small_event
from ._procs import cpu_seconds

__all__ = ["main"]

WAYS = ("no id", "new id", "repeated id")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.event_ids", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000, help="record() calls a round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of each way")
    args = parser.parse_args()
    agent, served = _measure(args.events, args.rounds)
    print(
        f"{args.rounds} rounds of {args.events:,} record() of a small event, one daemon; "
        "CPU µs per event, medians"
    )
    print("| side | " + " | ".join(WAYS) + " | new id / no id |")
    print("| --- |" + " --- |" * (len(WAYS) + 1))
    for side, figures in (("agent (record())", agent), ("daemon", served)):
        medians = [statistics.median(figures[way]) for way in WAYS]
        cells = " | ".join(f"{median:.2f}" for median in medians)
        ratio = f"{medians[1] / medians[0]:.2f}x" if medians[0] else "-"
        print(f"| {side} | {cells} | {ratio} |")


def _measure(events: int, rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    event = small_event()
    agent: dict[str, list[float]] = {way: [] for way in WAYS}
    served: dict[str, list[float]] = {way: [] for way in WAYS}
    with TemporaryDirectory(prefix="flids-") as base:
        daemon = Daemon(Path(base)).start()
        try:
            with connect(daemon.socket) as client:
                sessions = [client.create(f"ids-{n}.jsonl") for n in range(len(WAYS))]
                runs = [session.begin_run() for session in sessions]
                for round_ in range(rounds):
                    ids = [f"{round_}-{n}" for n in range(events)]
                    # The ids the repeats repeat, written once before the clock starts.
                    for event_id in ids:
                        runs[2].record(event, event_id=event_id)
                    sessions[2].sync()
                    order = range(len(WAYS)) if round_ % 2 == 0 else reversed(range(len(WAYS)))
                    for way in order:
                        record = runs[way].record
                        daemon_before = cpu_seconds(daemon.pid)
                        start = time.thread_time_ns()
                        if way == 0:
                            for _ in range(events):
                                record(event)
                        else:
                            for event_id in ids:
                                record(event, event_id=event_id)
                        spent = time.thread_time_ns() - start
                        sessions[way].sync()
                        used = cpu_seconds(daemon.pid) - daemon_before
                        agent[WAYS[way]].append(spent / events / 1000)
                        served[WAYS[way]].append(used / events * 1e6)
                for session, run in zip(sessions, runs, strict=True):
                    run.close()
                    session.close()
        finally:
            daemon.stop()
    return agent, served


if __name__ == "__main__":
    main()
