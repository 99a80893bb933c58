"""One uid's agent while another uid floods a shared daemon with work, not bytes.

``sudo uv run python -m bench.fairness [--events N] [--rounds N] [--flood KIND]
[--connections N]`` (root: the clients take throwaway uids) starts a real flightlogd
shared by every uid (socket mode 0666), and measures an agent of uid 41002 (small
records, a checkpoint every 100, as ``tests/daemon/test_fairness.py``'s) alone and
while uid 41001 floods it from two connections (or N) with each kind of work: records
the daemon refuses, status requests a thousand in flight, opens of missing sessions,
records at its bytes per second, small records it accepts as fast as it can, pokes on
a ring's socket, opens and closes of its sessions of 3 MiB in a loop (reopens), and a
session of its own followed by 64 subscriptions while it records into it.  Rounds
alone and flooded alternate (the flooders SIGSTOPped, then SIGCONTed), so the rest of
the machine's load weighs alike on both.  Prints, per kind, the agent's events per second
(best of the rounds) and the median and worst over all rounds of its checkpoint round
trips (the fsync included), of its status round trips (the loop alone), and of an
fsync the agent timed of its own after each checkpoint, on the daemon's file system:
the part of a checkpoint's round trip that is the disk's.
"""

from __future__ import annotations

import argparse
import functools
import os
import pickle
import select
import shutil
import signal
import socket
import tempfile
import time
import traceback
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
    CloseSession,
    Create,
    Hello,
    Message,
    Open,
    RecordEvent,
    SaveCheckpoint,
    SessionOpened,
    Status,
    Subscribe,
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
        except BaseException:
            traceback.print_exc()
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


#: Where a flooder says it floods from now on (set before it is forked).
_READY_FD = -1


def _ready() -> None:
    os.write(_READY_FD, b"x")


def _refused(path: str) -> None:
    client = _Client(path)
    sid, rid = client.session(f"refused-{os.getpid()}.jsonl")
    record = RecordEvent(
        session_id=sid, run_id=rid, event_type="not_a_fact", time=now(), data=b"{}"
    )
    burst = encode_frame(record) * 2000
    _ready()
    while True:
        client.sock.sendall(burst)


def _statuses(path: str) -> None:
    client = _Client(path)
    burst = b"".join(encode_frame(Status(id=n + 1)) for n in range(1000))
    _ready()
    while True:
        client.sock.sendall(burst)
        for _ in range(1000):
            client.receive()


def _opens(path: str) -> None:
    client = _Client(path)
    burst = b"".join(encode_frame(Open(id=n + 1, path=f"none/{n}.jsonl")) for n in range(100))
    _ready()
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
    _ready()
    while True:
        client.sock.sendall(frame)


def _small(path: str) -> None:
    client = _Client(path)
    sid, rid = client.session(f"small-{os.getpid()}.jsonl")
    data = b'{"note":"' + b"z" * 200 + b'"}'
    record = RecordEvent(session_id=sid, run_id=rid, event_type="turn_start", time=now(), data=data)
    burst = encode_frame(record) * 2000
    _ready()
    while True:
        client.sock.sendall(burst)


def _pokes(path: str) -> None:
    """A connection with a ring that pokes its socket without end (a ring's client
    pokes the daemon when it wrote into an empty ring)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    hello = Hello(id=0, version=PROTOCOL_VERSION, client="bench", pid=os.getpid(), ring=True)
    sock.sendall(encode_frame(hello))
    _, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
    assert fds, "the daemon gave no ring (flightlogd --ring-size 0?)"
    pokes = b"\0" * 65536
    _ready()
    while True:
        sock.sendall(pokes)


#: What each session of the reopens flood holds: under the size from which the
#: daemon keeps an index beside a file, so that each open reads it whole.
_REOPEN_BYTES = 3 * 1024 * 1024


def _reopens(path: str) -> None:
    """Eight sessions of its own of 3 MiB each opened and closed again in a loop, all
    eight at once."""
    client = _Client(path)
    names = [f"reopen-{os.getpid()}-{n}.jsonl" for n in range(8)]
    data = b'{"note":"' + b"r" * 250 + b'"}'
    for name in names:
        sid, rid = client.session(name)
        record = RecordEvent(
            session_id=sid, run_id=rid, event_type="turn_start", time=now(), data=data
        )
        client.sock.sendall(encode_frame(record) * (_REOPEN_BYTES // 330))
        client.request(CloseSession(id=client.next_id(), session_id=sid))
    _ready()
    while True:
        ids = [client.next_id() for _ in names]
        client.sock.sendall(
            b"".join(encode_frame(Open(id=i, path=n)) for i, n in zip(ids, names, strict=True))
        )
        sessions = [client.receive() for _ in names]
        ids = [client.next_id() for _ in sessions]
        client.sock.sendall(
            b"".join(
                encode_frame(CloseSession(id=i, session_id=opened.session_id))
                for i, opened in zip(ids, sessions, strict=True)
                if isinstance(opened, SessionOpened)
            )
        )
        for _ in range(sum(isinstance(opened, SessionOpened) for opened in sessions)):
            client.receive()


def _subscriptions(path: str) -> None:
    """Its own session, followed 64 times on the same connection, into which it
    records small records: each makes 64 pushes, which it reads."""
    client = _Client(path)
    name = f"followed-{os.getpid()}.jsonl"
    sid, rid = client.session(name)
    for _ in range(64):
        client.request(Subscribe(id=client.next_id(), path=name, follow=True))
    record = RecordEvent(
        session_id=sid, run_id=rid, event_type="turn_start", time=now(), data=b'{"n":1}'
    )
    burst = encode_frame(record) * 100
    sock, pending = client.sock, b""
    _ready()
    while True:
        readable, writable, _ = select.select([sock], [sock], [])
        if writable:
            pending = pending or burst
            pending = pending[sock.send(pending) :]
        if readable:
            sock.recv(1 << 20)


def _churn(first: bytes, path: str) -> None:
    """Connections opened in a loop, each sending ``first`` (or nothing) and hung up
    at once, without reading: what each costs the daemon (its accept, its hello, its
    refusal, its close, its log lines) is all the flood is."""
    _ready()
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            if first:
                sock.sendall(first)


#: A frame of 8 bytes that is no message.
_BAD_FRAME = (8).to_bytes(4, "big") + b"\xff" * 8
_HELLO = encode_frame(Hello(id=0, version=PROTOCOL_VERSION, client="bench", pid=0))

_FLOODS: dict[str, Callable[[str], None]] = {
    "refused records": _refused,
    "status requests": _statuses,
    "opens of missing sessions": _opens,
    "64 KiB records at the byte rate": _bytes,
    "small records accepted": _small,
    "pokes on a ring's socket": _pokes,
    "reopens of its sessions": _reopens,
    "subscriptions pushed to": _subscriptions,
    "churn: connections with a bad first frame": functools.partial(_churn, _BAD_FRAME),
    "churn: connections with a hello, then hung up": functools.partial(_churn, _HELLO),
    "churn: connections opened and closed": functools.partial(_churn, b""),
}


def _first_word(kind: str) -> str:
    return kind.split()[0].rstrip(":")


def _flooder(flood: Callable[[str], None], path: str) -> int:
    """A flooder's pid, once it floods (what it makes first, made)."""
    global _READY_FD
    ready, _READY_FD = os.pipe()
    pid = _as_uid(FLOODER, functools.partial(flood, path))
    os.close(_READY_FD)
    try:
        if not select.select([ready], [], [], 600)[0] or not os.read(ready, 1):
            raise SystemExit("a flooder ended before it flooded (its error is above)")
    finally:
        os.close(ready)
    return pid


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
        choices=sorted({_first_word(kind) for kind in _FLOODS}),
        help="only this kind of flood (by its first word, churn its three; repeatable)",
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
        for number, (kind, flood) in enumerate(_FLOODS.items()):
            if args.flood and _first_word(kind) not in args.flood:
                continue
            flooders = [_flooder(flood, daemon.socket) for _ in range(args.connections)]
            alone, flooded = [], []
            for n in range(args.rounds):
                for stop, rounds in ((signal.SIGSTOP, alone), (signal.SIGCONT, flooded)):
                    for pid in flooders:
                        os.kill(pid, stop)
                    name = f"{number}-{_first_word(kind)}-{stop.name}-{n}.jsonl"
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
