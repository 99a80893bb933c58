"""What one ``send`` costs when it must wake the reader: the floor under scenario 3.

``uv run python -m bench.wakeup [--frames N]`` sends 5,000 frames (or ``N``) of 360
bytes over a Unix socket pair, paced at 10,000/s like scenario 3, to a forked reader
that either sleeps in ``epoll_wait`` between frames (as an idle flightlogd does) or
spins on a non-blocking ``recv`` (never asleep).  The difference is what the kernel
(and, in a VM, the hypervisor) charges the *sender* for waking a sleeping process on
another CPU.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import time

__all__ = ["main"]

_FRAMES = 5000
_INTERVAL = 0.0001


def _reader(sock: socket.socket, *, sleep: bool) -> None:
    sock.setblocking(False)
    epoll = select.epoll()
    epoll.register(sock.fileno(), select.EPOLLIN)
    while True:
        if sleep:
            epoll.poll()
        try:
            if not sock.recv(1 << 16):
                return
        except BlockingIOError:
            pass


def _send_times(frames: int, *, sleep: bool) -> list[int]:
    sender, receiver = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        sender.close()
        _reader(receiver, sleep=sleep)
        os._exit(0)
    receiver.close()
    frame = b"x" * 360
    times = []
    clock = time.perf_counter_ns
    for _ in range(frames):
        begin = clock()
        sender.send(frame)
        times.append(clock() - begin)
        due = time.perf_counter() + _INTERVAL
        while time.perf_counter() < due:
            pass
    sender.close()
    os.waitpid(pid, 0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wakeup", description=__doc__)
    parser.add_argument(
        "--frames", type=int, default=_FRAMES, help="frames per round (default: %(default)s)"
    )
    frames = parser.parse_args().frames
    for sleep in (True, False, True, False):
        times = _send_times(frames, sleep=sleep)
        reader = "asleep in epoll_wait" if sleep else "spinning on recv   "
        print(
            f"reader {reader}: send p50 {statistics.median(times) / 1e3:.1f} µs, "
            f"mean {statistics.mean(times) / 1e3:.1f} µs"
        )


if __name__ == "__main__":
    main()
