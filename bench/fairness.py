"""One uid's agent while another uid floods a shared daemon with work, not bytes.

``sudo uv run python -m bench.fairness [--events N] [--rounds N] [--flood KIND]
[--connections N]`` (root: the clients take throwaway uids) starts a real flightlogd
shared by every uid (socket mode 0666), and measures an agent of uid 41002 (small
records, a checkpoint every 100, as ``tests/daemon/test_fairness.py``'s) alone and
while uid 41001 floods it from two connections (or N) with each kind of work: records
the daemon refuses, status requests a thousand in flight, opens of missing sessions,
and records at its bytes per second.  Rounds alone and flooded alternate (the
flooders SIGSTOPped, then SIGCONTed), so the rest of the machine's load weighs alike
on both.  Prints, per kind, the agent's events per second (best of the rounds) and
the median and worst over all rounds of its checkpoint round trips (the fsync
included), of its status round trips (the loop alone), and of an fsync the agent
timed of its own after each checkpoint, on the daemon's file system: the part of a
checkpoint's round trip that is the disk's.
"""

from __future__ import annotations

import argparse
import functools
import os
import pickle
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    Ack,
    BeginRun,
    Create,
    Hello,
    Message,
    Open,
    RecordEvent,
    SaveCheckpoint,
    SessionOpened,
    Status,
    client_decoder,
    encode_frame,
)

from ._daemon import Daemon

__all__ = ["main"]

FLOODER, VICTIM = 41001, 41002


class _Client:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.decoder = client_decoder()
        self.ids = 0
        self.request(Hello(id=0, version=PROTOCOL_VERSION, client="bench", pid=os.getpid()))

    def next_id(self) -> int:
        self.ids += 1
        return self.ids

    def receive(self) -> Any:
        while (message := self.decoder.next_message()) is None:
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError
            self.decoder.feed(data)
        return message

    def request(self, message: Message) -> Any:
        self.sock.sendall(encode_frame(message))
        wanted = getattr(message, "id", None)
        while getattr(reply := self.receive(), "id", None) != wanted:
            pass
        return reply

    def session(self, path: str) -> tuple[str, str]:
        opened = self.request(Create(id=self.next_id(), path=path, meta={}))
        assert isinstance(opened, SessionOpened), opened
        run = self.request(BeginRun(id=self.next_id(), session_id=opened.session_id, time=now()))
        return opened.session_id, run.run_id


def _as_uid(uid: int, action: Callable[[], Any]) -> int:
    """Fork a child that takes ``uid`` and runs ``action``; its pid.  The result (if
    it returns) is pickled into ``/tmp/fl-bench-PID``."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            result = action()
            Path(f"/tmp/fl-bench-{os.getpid()}").write_bytes(pickle.dumps(result))
        finally:
            os._exit(0)
    return pid


def _result(pid: int) -> Any:
    os.waitpid(pid, 0)
    path = Path(f"/tmp/fl-bench-{pid}")
    try:
        return pickle.loads(path.read_bytes())
    finally:
        path.unlink()


def _agent(
    path: str, name: str, events: int
) -> tuple[float, list[float], list[float], list[float]]:
    """Events per second, every checkpoint and every status round trip, and an fsync
    of the agent's own after each checkpoint (seconds): what the disk alone costs at
    the same moments, on the same file system."""
    client = _Client(path)
    sid, rid = client.session(name)
    note = b"x" * 200
    checkpoints: list[float] = []
    statuses: list[float] = []
    fsyncs: list[float] = []
    # Beside the daemon's root (under /tmp): the same file system.
    probe, probe_path = tempfile.mkstemp(prefix="fl-bench-fsync-", dir="/tmp")
    start = time.perf_counter()
    for n in range(events):
        data = b'{"turn_index":%d,"note":"%s"}' % (n, note)
        client.sock.sendall(
            encode_frame(
                RecordEvent(
                    session_id=sid, run_id=rid, event_type="turn_start", time=now(), data=data
                )
            )
        )
        if n % 100 == 99:
            began = time.perf_counter()
            saved = client.request(
                SaveCheckpoint(
                    id=client.next_id(), session_id=sid, run_id=rid, time=now(), snapshot=b"{}"
                )
            )
            assert isinstance(saved, Ack), saved
            checkpoints.append(time.perf_counter() - began)
            os.write(probe, note + b"\n")
            began = time.perf_counter()
            os.fsync(probe)
            fsyncs.append(time.perf_counter() - began)
            began = time.perf_counter()
            client.request(Status(id=client.next_id()))
            statuses.append(time.perf_counter() - began)
    rate = events / (time.perf_counter() - start)
    client.sock.close()
    os.close(probe)
    os.unlink(probe_path)
    return rate, checkpoints, statuses, fsyncs


def _refused(path: str) -> None:
    client = _Client(path)
    sid, rid = client.session(f"refused-{os.getpid()}.jsonl")
    record = RecordEvent(
        session_id=sid, run_id=rid, event_type="not_a_fact", time=now(), data=b"{}"
    )
    burst = encode_frame(record) * 2000
    while True:
        client.sock.sendall(burst)


def _statuses(path: str) -> None:
    client = _Client(path)
    burst = b"".join(encode_frame(Status(id=n + 1)) for n in range(1000))
    while True:
        client.sock.sendall(burst)
        for _ in range(1000):
            client.receive()


def _opens(path: str) -> None:
    client = _Client(path)
    burst = b"".join(encode_frame(Open(id=n + 1, path=f"none/{n}.jsonl")) for n in range(100))
    while True:
        client.sock.sendall(burst)
        for _ in range(100):
            client.receive()


def _bytes(path: str) -> None:
    client = _Client(path)
    sid, rid = client.session(f"bytes-{os.getpid()}.jsonl")
    data = b'{"blob":"' + b"y" * 65536 + b'"}'
    record = RecordEvent(session_id=sid, run_id=rid, event_type="turn_start", time=now(), data=data)
    frame = encode_frame(record)
    while True:
        client.sock.sendall(frame)


_FLOODS: dict[str, Callable[[str], None]] = {
    "refused records": _refused,
    "status requests": _statuses,
    "opens of missing sessions": _opens,
    "64 KiB records": _bytes,
}


def _times(rounds: list[Any], index: int) -> str:
    """The median and the worst of every round's ``index``-th list of seconds."""
    times = sorted(t for r in rounds for t in r[index])
    return f"{times[len(times) // 2] * 1000:.0f}, {times[-1] * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=2, help="the flooder's connections (2)")
    parser.add_argument(
        "--flood",
        action="append",
        choices=[kind.split()[0] for kind in _FLOODS],
        help="only this kind of flood (by its first word; repeatable)",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("acting as several uids takes root")
    base = Path(tempfile.mkdtemp(prefix="fl-bench-", dir="/tmp"))
    base.chmod(0o755)
    (base / "run").mkdir(mode=0o755)
    daemon = Daemon(base, "--socket-mode", "0666").start()
    print(
        f"| flood (uid 41001, {args.connections} connections) | agent alone | agent flooded | "
        "ratio | "
        "checkpoint median, worst alone / flooded | status median, worst alone / flooded | "
        "fsync of the agent's own median, worst alone / flooded |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    try:
        for kind, flood in _FLOODS.items():
            if args.flood and kind.split()[0] not in args.flood:
                continue
            flooders = [
                _as_uid(FLOODER, functools.partial(flood, daemon.socket))
                for _ in range(args.connections)
            ]
            time.sleep(0.5)
            alone, flooded = [], []
            for n in range(args.rounds):
                for stop, rounds in ((signal.SIGSTOP, alone), (signal.SIGCONT, flooded)):
                    for pid in flooders:
                        os.kill(pid, stop)
                    name = f"{kind.split()[0]}-{stop.name}-{n}.jsonl"
                    agent = functools.partial(_agent, daemon.socket, name, args.events)
                    rounds.append(_result(_as_uid(VICTIM, agent)))
            for pid in flooders:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            solo, during = max(r[0] for r in alone), max(r[0] for r in flooded)
            cells = " | ".join(f"{_times(alone, n)} / {_times(flooded, n)}" for n in (1, 2, 3))
            print(
                f"| {kind} | {solo:,.0f} events/s | {during:,.0f} events/s | "
                f"{during / solo:.2f}x | {cells} |",
                flush=True,
            )
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
