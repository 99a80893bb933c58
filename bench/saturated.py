"""The daemon's CPU per record when records come faster than it takes them.

``uv run python -m bench.saturated [--quick]`` starts a real flightlogd, opens a
session and a run with a raw client, then sends the same record frame (the codec's
small or 64 KiB event, as :mod:`bench.steps` uses) with ``sendall`` in 256 KiB bursts
until a count is reached, and a ``sync`` whose reply says every record is written.
The daemon's user and system time over that stretch (``/proc/PID/stat``, in clock
ticks) divided by the records is its CPU per record, and its minor page faults per
record.  No agent work is in it and the daemon never waits for one: its batches are
as full as a busy daemon's, so the figure moves little between runs (best and median
of several rounds are printed), where :mod:`bench.steps` with one agent moves with
how the two take turns.  It measures one change against its parent.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import tempfile
from pathlib import Path

from flightlog.protocol import (
    Event,
    default_codec,
    now,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    BeginRun,
    Create,
    FrameDecoder,
    FrameEncoder,
    Hello,
    Message,
    RecordEvent,
    Sync,
    client_decoder,
)

from ._daemon import Daemon
from ._events import large_event, small_event

__all__ = ["main"]

_BURST = 256 * 1024
_encoder = FrameEncoder()


def _stat(pid: int) -> tuple[int, int, int]:
    """Minor faults, user and system clock ticks of ``pid``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[7]), int(fields[11]), int(fields[12])


class _Client:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.decoder: FrameDecoder[Message] = client_decoder()

    def call(self, message: Message) -> Message:
        self.sock.sendall(_encoder.encode(message))
        while (reply := self.decoder.next_message()) is None:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the daemon closed the connection")
            self.decoder.feed(data)
        return reply


def _round(daemon: Daemon, event: Event, count: int, name: str) -> tuple[float, float, float]:
    """(user µs, system µs, minor faults) per record for ``count`` records."""
    client = _Client(daemon.socket)
    try:
        client.call(Hello(id=1, version=PROTOCOL_VERSION, client="saturated", pid=os.getpid()))
        opened = client.call(Create(id=2, path=name))
        session_id = getattr(opened, "session_id", None)
        assert isinstance(session_id, str), opened
        started = client.call(BeginRun(id=3, session_id=session_id, time=now()))
        run_id = getattr(started, "run_id", None)
        assert isinstance(run_id, str), started
        encoded = default_codec.encode_event(event)
        frame = _encoder.encode(
            RecordEvent(
                session_id=session_id,
                run_id=run_id,
                event_type=encoded.type,
                time=encoded.time,
                data=encoded.data,
            )
        )
        per_burst = max(1, _BURST // len(frame))
        burst = frame * per_burst
        bursts = max(1, count // per_burst)
        before = _stat(daemon.pid)
        for _ in range(bursts):
            client.sock.sendall(burst)
        client.call(Sync(id=4, session_id=session_id, durable=False))
        after = _stat(daemon.pid)
    finally:
        client.sock.close()
    records = bursts * per_burst
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    return (
        (after[1] - before[1]) * tick / records,
        (after[2] - before[2]) * tick / records,
        (after[0] - before[0]) / records,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.saturated", description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="two rounds (coarser): each round keeps its full count, so that it spans several "
        "clock ticks of the daemon's CPU",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds per event size")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    base = Path(tempfile.mkdtemp(prefix="flsat-"))
    try:
        with Daemon(base) as daemon:
            for title, event, count in (
                ("small event (353 B line)", small_event(), 200_000),
                ("64 KiB event", large_event(), 10_000),
            ):
                results = []
                for number in range(rounds):
                    path = f"saturated-{count}-{number}.jsonl"
                    results.append(_round(daemon, event, count, path))
                    (daemon.root / path).unlink()
                totals = [user + system for user, system, _ in results]
                print(f"{title}, {count:,} records a round, {rounds} rounds:")
                print(
                    f"  daemon CPU per record: best {min(totals):.2f} µs, median "
                    f"{statistics.median(totals):.2f} µs (user "
                    f"{statistics.median(r[0] for r in results):.2f} + system "
                    f"{statistics.median(r[1] for r in results):.2f}); minor faults "
                    f"{statistics.median(r[2] for r in results):.3f}"
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
