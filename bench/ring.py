"""What handing a frame over costs: a ``sendall`` on a Unix socket against the ring.

``uv run python -m bench.ring [--frames N] [--rounds R] [--size BYTES]`` times, in one
process and a reader it forks, the hand-over alone: no codec, no daemon rules.  The
sender hands ``N`` frames of ``--size`` bytes (353 by default: a small record's
frame) to the reader, once with ``sendall`` per frame on a socket pair, once with
:class:`~flightlog.protocol.ring.RingWriter` per frame into a 128 KiB ring, alternating
``R`` times (the order swapped every round).  The reader does what flightlogd does
for a streaming client under its read window: it wakes every 0.5 ms and takes
everything there in bulk (``recv`` of up to 256 KiB, or
:meth:`~flightlog.protocol.RingReader.take` into a ``bytearray``), so the sender never
has to wake it (the ring's ``asleep`` flag stays clear; the socket's reader is not in
``recv`` when the sender sends).

Printed: the medians over rounds of the sender's and the reader's CPU per frame
(``time.thread_time`` in each), both ways, and their ratio.

Then the same through the whole path (unless ``--no-sdk``): a real flightlogd
(default options) and two SDK clients of this process, one asking for a ring and
one not (``SocketTransport(ring=...)``), each recording into its own session;
``--sdk-rounds`` rounds of ``--sdk-events`` small events (the bench's scenario 1
event) alternate between them, each round ended by a ``sync()``.  Printed: the
medians of the agent's CPU per ``record()`` (this thread) and of the daemon's CPU
per event (``/proc/PID/stat``, in clock ticks: rounds of 100,000 events make a tick
~0.1 µs an event).
"""

from __future__ import annotations

import argparse
import mmap
import os
import socket
import statistics
import threading
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from flightlog.protocol.ring import (
    RING_HEADER,
    RingReader,
    RingWriter,
)

from ._daemon import Daemon
from ._events import small_event
from ._procs import cpu_seconds

RING = 128 * 1024
WINDOW = 0.0005
_SOCKET, _RING = 0, 1
# Words of the control mapping: phase asked, phase done, reader CPU ns per phase.
_ASKED, _DONE, _CPU = 0, 1, 8


def _reader(sock: socket.socket, ring: RingReader, control: memoryview) -> None:
    sock.setblocking(False)
    buf = bytearray()
    phase = 0
    start = time.thread_time_ns()
    while True:
        time.sleep(WINDOW)
        while True:
            try:
                data = sock.recv(256 * 1024)
            except BlockingIOError:
                break
            if not data:
                return
            buf += data
        ring.take(buf.extend, ring.size)
        buf.clear()
        asked = control[_ASKED]
        if asked != phase:
            now = time.thread_time_ns()
            control[_CPU + phase % 64] = now - start
            start, phase = now, asked
            control[_DONE] = asked


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ring", description=__doc__)
    parser.add_argument("--frames", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--size", type=int, default=353)
    parser.add_argument("--sdk-events", type=int, default=100_000)
    parser.add_argument("--sdk-rounds", type=int, default=7)
    parser.add_argument("--no-sdk", action="store_true")
    args = parser.parse_args()
    _hand_over(args)
    if not args.no_sdk:
        _through_the_sdk(args.sdk_events, args.sdk_rounds)


def _hand_over(args: argparse.Namespace) -> None:
    fd = os.memfd_create("bench-ring")
    os.ftruncate(fd, RING_HEADER + RING)
    mapping = mmap.mmap(fd, RING_HEADER + RING)
    control_map = mmap.mmap(-1, 8 * 80)
    control = memoryview(control_map).cast("Q")
    reader_ring = RingReader(memoryview(mapping), RING, threading.Lock())
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        ours.close()
        _reader(theirs, reader_ring, control)
        os._exit(0)
    theirs.close()
    writer = RingWriter(memoryview(mapping), threading.Lock())
    frame = b"x" * args.size
    sendall = ours.sendall
    write = writer.write
    sender: dict[int, list[float]] = {_SOCKET: [], _RING: []}
    reader: dict[int, list[float]] = {_SOCKET: [], _RING: []}
    phase = 0

    def settle() -> None:
        # Let the reader take the phase's last bytes, then start a new phase.
        nonlocal phase
        phase += 1
        control[_ASKED] = phase
        while control[_DONE] != phase:
            time.sleep(0.001)

    settle()
    for round_ in range(args.rounds):
        order = (_SOCKET, _RING) if round_ % 2 == 0 else (_RING, _SOCKET)
        for how in order:
            start = time.thread_time_ns()
            if how == _SOCKET:
                for _ in range(args.frames):
                    sendall(frame)
            else:
                for _ in range(args.frames):
                    taken, _poke = write(frame)
                    while taken < len(frame):
                        time.sleep(0.0001)
                        more, _poke = write(frame[taken:])
                        taken += more
            sender[how].append((time.thread_time_ns() - start) / args.frames / 1000)
            settle()
            reader[how].append(control[_CPU + (phase - 1) % 64] / args.frames / 1000)
    ours.close()
    os.waitpid(pid, 0)
    print(f"{args.rounds} rounds of {args.frames:,} frames of {args.size} bytes; CPU µs per frame")
    _table(
        ("sendall per frame", "ring per frame", "ring / sendall"),
        (("sender", sender), ("reader", reader)),
    )


def _table(
    header: tuple[str, str, str], sides: tuple[tuple[str, dict[int, list[float]]], ...]
) -> None:
    """One row per side: the medians without and with the ring, and their ratio ("—"
    when the first is below what was measured: a daemon's CPU is counted in clock
    ticks, and a short run can see none)."""
    print(f"| side | {' | '.join(header)} |")
    print("| --- | --- | --- | --- |")
    for name, figures in sides:
        plain, ring = statistics.median(figures[_SOCKET]), statistics.median(figures[_RING])
        ratio = f"{ring / plain:.2f}x" if plain else "—"
        print(f"| {name} | {plain:.2f} | {ring:.2f} | {ratio} |")


def _through_the_sdk(events: int, rounds: int) -> None:
    from flightlog.sdk import SocketTransport, connect

    event = small_event()
    with TemporaryDirectory(prefix="flring-") as base:
        daemon = Daemon(Path(base)).start()
        try:
            runs = []
            for ring in (False, True):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(daemon.socket)
                client = connect(transport=SocketTransport(sock, ring=ring))
                assert (client.welcome.ring > 0) == ring, client.welcome
                session = client.create(f"ring-{ring}.jsonl")
                runs.append((session, session.begin_run()))
            agent: dict[int, list[float]] = {_SOCKET: [], _RING: []}
            served: dict[int, list[float]] = {_SOCKET: [], _RING: []}
            for round_ in range(rounds):
                order = (_SOCKET, _RING) if round_ % 2 == 0 else (_RING, _SOCKET)
                for how in order:
                    session, run = runs[how]
                    record = run.record
                    daemon_before = cpu_seconds(daemon.pid)
                    start = time.thread_time_ns()
                    for _ in range(events):
                        record(event)
                    agent[how].append((time.thread_time_ns() - start) / events / 1000)
                    session.sync()
                    served[how].append((cpu_seconds(daemon.pid) - daemon_before) / events * 1e6)
        finally:
            daemon.stop()
    print()
    print(f"{rounds} rounds of {events:,} record() of a small event, one daemon; CPU µs per event")
    _table(("socket", "ring", "ring / socket"), (("agent (record())", agent), ("daemon", served)))


if __name__ == "__main__":
    main()
