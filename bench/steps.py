"""Where the CPU of one event goes, step by step, for flightlogd and the syslog peers.

``uv run python -m bench.steps [--syslog-ng DIR]`` runs, in this one process, the
steps an agent of scenarios 1 and 2 takes per event, and times each on its own:

* the codec (``default_codec.encode_event``), which every system runs in the agent;
* the envelope around it (:class:`bench._events.LineEncoder`, minus the codec): the
  syslog agents build the whole line, flightlogd builds it in the daemon;
* the rest of a record call, sending included: ``record()`` through the SDK for
  flightlogd, the message and its ``sendall`` for the peers (:mod:`bench._syslog`),
  split into user and system (kernel) time, and the daemon's user and system time
  for the same events (``/proc/PID/stat``).

One agent records as fast as it can into a real daemon of each system (started
here, as in the bench), then waits until its file holds every line; the figures are
CPU per event over that stretch (the daemon's in clock ticks: ~0.05 µs per small
event, ~2 µs per large one).  One agent, so the daemon is asleep more often
than under the bench's eight: compare its steps, not its totals, with rows 1b/1c.

Last, for flightlogd alone, the CPU per event (agent + daemon) of 64 ``record()``
calls against one ``record_many()`` of the same 64 events: the batch call for callers
that hold several events at once; and ``record()``'s own work: the call timed with the
client's ``send`` left out (a no-op in its transport), minus the codec.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from flightlog.protocol import Event, default_codec, new_id

from ._daemon import Daemon
from ._events import LineEncoder, large_event, small_event
from ._report import SYSTEM_TITLES, markdown_table
from ._syslog import ENV_SYSLOG_NG, PeerDaemons, find_peers
from ._systems import System, peer_systems

__all__ = ["main"]


def _per_event(step: Callable[[], object], count: int) -> float:
    """CPU µs per call of ``step``, best of three."""
    best = float("inf")
    for _ in range(3):
        begin = time.process_time()
        for _ in range(count):
            step()
        best = min(best, time.process_time() - begin)
    return best * 1e6 / count


def _proc_times(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def _record(system: System, pid: int, event: Event, count: int) -> list[float]:
    """Agent user, agent system, daemon user, daemon system: µs per event."""
    agent = system.agent(0)
    try:
        sink = agent.session(f"steps-{new_id()[:8]}.jsonl")
        sink.record(event)
        sink.drain()
        mine, theirs = resource.getrusage(resource.RUSAGE_SELF), _proc_times(pid)
        for _ in range(count):
            sink.record(event)
        sink.drain()
        after = resource.getrusage(resource.RUSAGE_SELF)
        theirs_after = _proc_times(pid)
    finally:
        agent.close()
    spent = [
        after.ru_utime - mine.ru_utime,
        after.ru_stime - mine.ru_stime,
        theirs_after[0] - theirs[0],
        theirs_after[1] - theirs[1],
    ]
    return [seconds * 1e6 / count for seconds in spent]


def _batched(event: Event, count: int, base: Path, size: int = 64) -> str:
    """flightlogd's CPU per event, agent + daemon, for ``record()`` called ``size``
    times against one ``record_many()`` of ``size`` events (one frame each, one send)."""
    from flightlog.sdk import connect

    daemon = Daemon(base / "batch").start()
    lines = [f"{size} events a call, {count:,} events from one agent (CPU µs per event):"]
    try:
        with connect(daemon.socket) as client:
            session = client.create("batched.jsonl")
            run = session.begin_run()
            events = [event] * size
            ways: list[tuple[str, Callable[[], object]]] = [
                (f"record() x {size}", lambda: [run.record(event) for _ in events]),
                (f"record_many({size})", lambda: run.record_many(events)),
            ]
            for name, call in ways:
                call()
                session.sync()
                mine, theirs = resource.getrusage(resource.RUSAGE_SELF), _proc_times(daemon.pid)
                for _ in range(count // size):
                    call()
                session.sync()
                after, theirs_after = (
                    resource.getrusage(resource.RUSAGE_SELF),
                    _proc_times(daemon.pid),
                )
                agent = after.ru_utime - mine.ru_utime + after.ru_stime - mine.ru_stime
                spent = sum(theirs_after) - sum(theirs)
                lines.append(
                    f"  {name:<16} agent {agent * 1e6 / count:6.2f} + daemon "
                    f"{spent * 1e6 / count:5.2f} = {(agent + spent) * 1e6 / count:6.2f}"
                )
            run.close()
    finally:
        daemon.stop()
    return "\n".join(lines)


def _own_work(event: Event, count: int, base: Path) -> str:
    """``record()`` with its ``send`` left out, against a real daemon, minus the codec."""
    from flightlog.sdk import connect

    daemon = Daemon(base / "own").start()
    try:
        # Nothing is sent, so nothing is acknowledged: every frame stays kept.
        with connect(daemon.socket, max_unacked=2**62) as client:
            run = client.create("own.jsonl").begin_run()
            client._link.transport.send = lambda data: None  # type: ignore[method-assign]
            call = _per_event(lambda: run.record(event), count)
    finally:
        daemon.kill()
    codec = _per_event(lambda: default_codec.encode_event(event), count)
    return (
        f"record() without its send: {call:.2f} µs, of which the codec {codec:.2f}: "
        f"own work {call - codec:.2f} µs"
    )


def _steps(event: Event, count: int, syslog_ng: str | None, base: Path) -> str:
    codec = _per_event(lambda: default_codec.encode_event(event), count)
    lines = LineEncoder(new_id(), new_id())
    envelope = _per_event(lambda: lines.line(event), count) - codec
    daemon = Daemon(base / "d").start()
    peers = PeerDaemons(find_peers(syslog_ng), base)
    # (title, whether the agent builds the whole line, the four figures of _record)
    columns: list[tuple[str, bool, list[float]]] = []
    try:
        peers.start()
        system = System("flightlog", str(daemon.root), daemon.socket)
        figures = _record(system, daemon.pid, event, count)
        columns.append((SYSTEM_TITLES["flightlog"], False, figures))
        for system in peer_systems(peers):
            peer = peers.get(system.name)
            assert peer is not None
            columns.append((peer.peer.title, True, _record(system, peer.pid, event, count)))
    finally:
        daemon.stop()
        peers.stop()
    steps: list[tuple[str, list[float | None]]] = [
        ("agent: codec (encode_event)", [codec for _ in columns]),
        ("agent: envelope (the line)", [envelope if line else None for _, line, _ in columns]),
        (
            "agent: the rest, user (record(); message + sendall)",
            [fig[0] - codec - (envelope if line else 0.0) for _, line, fig in columns],
        ),
        ("agent: system (send, wake-ups)", [fig[1] for _, _, fig in columns]),
        ("daemon: user", [fig[2] for _, _, fig in columns]),
        ("daemon: system", [fig[3] for _, _, fig in columns]),
        ("agent + daemon", [sum(fig) for _, _, fig in columns]),
    ]
    table = [["step (CPU µs per event)", *(title for title, _, _ in columns)]]
    for name, values in steps:
        table.append([name, *("—" if x is None else f"{x:.2f}" for x in values)])
    return markdown_table(table)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__)
    parser.add_argument(
        "--syslog-ng", metavar="DIR", help=f"as for python -m bench (default: ${ENV_SYSLOG_NG})"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a hundredth of the records (coarse figures)"
    )
    args = parser.parse_args()
    scale = 100 if args.quick else 1
    for peer in find_peers(args.syslog_ng):
        if peer.skipped:
            print(f"{peer.name} skipped: {peer.skipped}")
    base = Path(tempfile.mkdtemp(prefix="flsteps-"))
    try:
        for title, event, count in (
            ("small event (353 B line)", small_event(), 200_000 // scale),
            ("64 KiB event", large_event(), 5_000 // scale),
        ):
            print(f"{title}, {count:,} records from one agent:")
            print()
            print(_steps(event, count, args.syslog_ng, base / str(count)))
            print()
            print(_batched(event, count, base / f"{count}-batched"))
            print(_own_work(event, count, base / f"{count}-own"))
            print()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
