"""Helpers shared by the daemon's tests: sessions spoken frame by frame, file checks,
the daemon's JSON log and what /proc says about its process."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from flightlog.protocol import (
    CheckReport,
    check,
    now,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    Ack,
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    Hello,
    Message,
    Open,
    RecordEvent,
    RecordFailed,
    RunStarted,
    SaveCheckpoint,
    SessionOpened,
    Subscribe,
    Sync,
    client_decoder,
    encode_frame,
)
from support import DaemonProcess, RawClient, read_lines, wait_for, with_support

__all__ = [
    "FAVOURED",
    "AsUid",
    "Signal",
    "agent_report",
    "alone_and_flooded",
    "as_uid",
    "assert_refusal_logged",
    "assert_serving",
    "begin",
    "check_file",
    "checkpoint",
    "create",
    "expect_record_failed",
    "fact",
    "favour",
    "log_events",
    "needs_root",
    "never_reading",
    "open_fds",
    "open_when_released",
    "proc_status_kb",
    "push",
    "ring_hello",
    "send_until_stuck",
    "shared_daemon",
    "spawn_agent",
    "synced_seq",
    "wait_for_log",
]


def create(client: RawClient, path: str, **meta: Any) -> SessionOpened:
    opened = client.request(Create(id=client.next_id(), path=path, meta=meta))
    assert isinstance(opened, SessionOpened), opened
    return opened


def begin(client: RawClient, session_id: str) -> RunStarted:
    run = client.request(BeginRun(id=client.next_id(), session_id=session_id, time=now()))
    assert isinstance(run, RunStarted), run
    return run


def fact(
    session_id: str,
    run_id: str,
    n: int = 0,
    *,
    event_type: str = "turn_start",
    time: str | None = None,
    data: bytes | None = None,
) -> RecordEvent:
    """A record of one agent fact; ``data`` defaults to a small valid JSON object."""
    return RecordEvent(
        session_id=session_id,
        run_id=run_id,
        event_type=event_type,
        time=time or now(),
        data=b'{"turn_index":%d}' % n if data is None else data,
    )


def push(client: RawClient, timeout: float = 10.0) -> Message:
    """The next message, which the test expects to be a push."""
    return client.receive(timeout)


def checkpoint(client: RawClient, session_id: str, run_id: str, snapshot: bytes) -> Ack:
    """Save a checkpoint (``snapshot``: JSON) and wait until it is durable."""
    saved = client.request(
        SaveCheckpoint(
            id=client.next_id(), session_id=session_id, run_id=run_id, time=now(), snapshot=snapshot
        )
    )
    assert isinstance(saved, Ack), saved
    return saved


def synced_seq(client: RawClient, session_id: str) -> int:
    ack = client.request(Sync(id=client.next_id(), session_id=session_id))
    assert isinstance(ack, Ack), ack
    return ack.seq


def check_file(path: Path | str) -> CheckReport:
    with open(path, "rb") as file:
        return check(file)


def assert_serving(daemon: DaemonProcess, *, records: int = 5) -> None:
    """The daemon still serves: on a new connection, a create, records, a run close and
    a session close land in a sound file."""
    assert daemon.alive(), daemon.log
    path = f"serving/{uuid.uuid4().hex}.jsonl"
    with RawClient(daemon.socket, client="serving-check") as client:
        opened = create(client, path)
        run = begin(client, opened.session_id)
        for n in range(records):
            client.send(fact(opened.session_id, run.run_id, n))
        closed = client.request(
            CloseRun(
                id=client.next_id(), session_id=opened.session_id, run_id=run.run_id, time=now()
            )
        )
        assert closed == Ack(id=closed.id, seq=records + 3), closed
        done = client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
        assert isinstance(done, Ack), done
        assert not client.pending, client.pending
    lines = read_lines(daemon.root / path)
    assert [line["seq"] for line in lines] == list(range(1, records + 4))
    report = check_file(daemon.root / path)
    assert report.sound and not report.unfinished_tail, report


def expect_record_failed(client: RawClient, code: str, session_id: str) -> RecordFailed:
    failed = push(client)
    assert isinstance(failed, RecordFailed), failed
    assert failed.code == code, failed
    assert failed.session_id == session_id
    return failed


def log_events(daemon: DaemonProcess) -> list[dict[str, Any]]:
    """The daemon's JSON log lines, parsed (lines that are not JSON are skipped)."""
    events = []
    for line in daemon.log.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def wait_for_log(daemon: DaemonProcess, **fields: Any) -> dict[str, Any]:
    """Wait until the daemon logs an event with all of ``fields``; return it."""
    found: list[dict[str, Any]] = []

    def logged() -> bool:
        found[:] = [e for e in log_events(daemon) if all(e.get(k) == v for k, v in fields.items())]
        return bool(found)

    try:
        wait_for(logged)
    except TimeoutError:
        raise AssertionError(f"no log line with {fields}:\n{daemon.log}") from None
    return found[0]


def assert_refusal_logged(daemon: DaemonProcess, code: str) -> dict[str, Any]:
    """A refusal with ``code`` was logged with this process's pid and uid as the peer."""
    return wait_for_log(daemon, code=code, pid=os.getpid(), uid=os.getuid())


def send_until_stuck(socks: list[socket.socket], data: bytes, patience: float = 1.0) -> list[int]:
    """Send ``data`` on every socket at once, without blocking, until each has sent it
    all or none took a byte for ``patience`` seconds; the bytes each sent."""
    sent = dict.fromkeys(socks, 0)
    for sock in socks:
        sock.setblocking(False)
    while busy := [sock for sock in socks if sent[sock] < len(data)]:
        _, writable, _ = select.select([], busy, [], patience)
        if not writable:
            break
        for sock in writable:
            with contextlib.suppress(BlockingIOError):
                sent[sock] += sock.send(data[sent[sock] : sent[sock] + 65536])
    return [sent[sock] for sock in socks]


def ring_hello(path: str) -> tuple[socket.socket, int, list[int]]:
    """A connection whose hello asks for a ring: the socket, the ring's size the
    welcome gives (0: none), and the descriptors that came with it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    hello = Hello(id=1, version=PROTOCOL_VERSION, client="ring", pid=os.getpid(), ring=True)
    sock.sendall(encode_frame(hello))
    decoder = client_decoder()
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
    decoder.feed(data)
    while (welcome := decoder.next_message()) is None:
        decoder.feed(sock.recv(1 << 16))
    return sock, getattr(welcome, "ring", 0), fds


def never_reading(path: str, subscribe_to: list[str]) -> socket.socket:
    """A connection that follows each of ``subscribe_to`` and never reads a byte.

    Its requests are sent as far as the daemon reads them: one whose replies (the
    catch-ups of sessions already written) fill its queue is read no further, and a
    blocking send would wait for good."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(path)
    hello = Hello(id=1, version=PROTOCOL_VERSION, client="never reads", pid=os.getpid())
    subscribes = [
        Subscribe(id=2 + n, path=session, follow=True) for n, session in enumerate(subscribe_to)
    ]
    send_until_stuck([sock], b"".join(encode_frame(m) for m in [hello, *subscribes]))
    return sock


def proc_status_kb(pid: int, key: str) -> int:
    """A ``kB`` field of /proc/PID/status, such as VmRSS or VmHWM."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def spawn_agent(*args: str) -> subprocess.Popen[str]:
    """An agent process (:mod:`support.agent_writer`) that reports on stdout, one JSON
    line per fact, and waits on stdin where it is told to."""
    return subprocess.Popen(
        [sys.executable, "-m", "support.agent_writer", *args],
        env=with_support(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def agent_report(agent: subprocess.Popen[str]) -> dict[str, Any]:
    """The agent's next report line; fails with its stderr if it died instead."""
    assert agent.stdout is not None
    line = agent.stdout.readline()
    if not line:
        agent.wait(timeout=10)
        assert agent.stderr is not None
        raise AssertionError(f"agent exited with {agent.returncode}: {agent.stderr.read()}")
    result: dict[str, Any] = json.loads(line)
    return result


def open_when_released(client: RawClient, path: str, timeout: float = 10.0) -> SessionOpened:
    """Open ``path`` once its writer's disconnect has reached the daemon: until then
    the open is refused with session_busy, which is polled, not slept on."""
    replies: list[Message] = []

    def opened() -> bool:
        reply = client.request(Open(id=client.next_id(), path=path))
        replies.append(reply)
        if isinstance(reply, SessionOpened):
            return True
        assert getattr(reply, "code", None) == "session_busy", reply
        return False

    wait_for(opened, timeout=timeout)
    result = replies[-1]
    assert isinstance(result, SessionOpened)
    return result


# ------------------------------------------------------------ several uids

#: Tests that act as several uids run as root (CI does): a forked child takes a
#: throwaway uid with setuid, which needs no entry in /etc.
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as several uids takes root (setuid in a forked child)"
)


@contextlib.contextmanager
def shared_daemon(*args: str) -> Iterator[DaemonProcess]:
    """A shared daemon, as root, whose socket every uid may connect to (mode 0666 in
    a directory every uid may traverse), with ``args`` besides."""
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    base.chmod(0o755)
    (base / "run").mkdir()
    (base / "run").chmod(0o755)
    proc = DaemonProcess(base, "--log-format", "json", "--socket-mode", "0666", *args)
    try:
        yield proc.start()
    finally:
        proc.stop()
        shutil.rmtree(base, ignore_errors=True)


T = TypeVar("T")


#: The CPU priority a test of fair shares gives the daemon and the agent whose rates it
#: compares (:func:`favour`, ``as_uid(..., nice=FAVOURED)``): above the flooders'
#: processes, so that a ratio shows how the daemon shares its time, not how the
#: kernel shares a loaded machine's cores between the flooders' processes and the
#: others (at a load of 12, a status flood's two clients took an agent to 0.28x).
FAVOURED = -5


def favour(pid: int) -> None:
    """Run ``pid`` (a daemon under test) at :data:`FAVOURED`."""
    os.setpriority(os.PRIO_PROCESS, pid, FAVOURED)


def as_uid(
    uid: int, action: Callable[[], T], *, groups: tuple[int, ...] = (), nice: int | None = None
) -> T:
    """Run ``action`` in a forked child as ``uid`` (gid the same number, with
    ``groups``, at CPU priority ``nice`` if given) and return what it returns; what it
    raises fails the test here."""
    return AsUid(uid, action, groups=groups, nice=nice).result()


def alone_and_flooded(
    flooders: list[AsUid],
    started: list[Signal],
    measure: Callable[[str], float],
    rounds: int,
    settle: Callable[[], None] = lambda: None,
) -> tuple[float, float]:
    """The best of ``rounds`` of ``measure`` with ``flooders`` stopped (SIGSTOP;
    ``settle`` runs first in each such round), and the best of as many while they flood,
    the rounds alternating so that the rest of the machine's load weighs alike on
    both; ``measure`` is given ``"alone-N"`` or ``"flooded-N"``.  The flooders are
    waited for (``started``) and killed at the end, whatever happens."""
    alone, flooded = [], []
    try:
        for signal_ in started:
            signal_.wait()
        for n in range(rounds):
            for flooder in flooders:
                os.kill(flooder.pid, signal.SIGSTOP)
            settle()
            alone.append(measure(f"alone-{n}"))
            for flooder in flooders:
                os.kill(flooder.pid, signal.SIGCONT)
            flooded.append(measure(f"flooded-{n}"))
    finally:
        for flooder in flooders:
            flooder.kill()
    return max(alone), max(flooded)


class AsUid:
    """``action`` running in a forked child as ``uid``; :meth:`result` waits for it."""

    def __init__(
        self,
        uid: int,
        action: Callable[[], Any],
        *,
        groups: tuple[int, ...] = (),
        nice: int | None = None,
    ) -> None:
        self.uid = uid
        read_end, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child
            os.close(read_end)
            try:
                if nice is not None:  # while still root, who may raise it
                    os.setpriority(os.PRIO_PROCESS, 0, nice)
                os.setgroups(list(groups))
                os.setgid(uid)
                os.setuid(uid)
                outcome: tuple[str, Any] = ("ok", action())
            except BaseException:
                outcome = ("error", traceback.format_exc())
            with os.fdopen(write_end, "wb") as out:
                pickle.dump(outcome, out)
            os._exit(0)
        os.close(write_end)
        self._read_end = read_end

    def kill(self) -> None:
        """SIGKILL the child (one that runs until stopped) and reap it."""
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self._read_end)

    def result(self, timeout: float | None = None) -> Any:
        """What the action returned; with ``timeout``, a child that has not answered
        within it is killed and :class:`TimeoutError` raised."""
        if timeout is not None and not select.select([self._read_end], [], [], timeout)[0]:
            self.kill()
            raise TimeoutError(f"as uid {self.uid}: no answer within {timeout}s")
        with os.fdopen(self._read_end, "rb") as result:
            data = result.read()
        os.waitpid(self.pid, 0)
        kind, value = pickle.loads(data)
        if kind == "error":
            raise AssertionError(f"as uid {self.uid}:\n{value}")
        return value


class Signal:
    """A one-way signal between processes: a pipe, set once."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()

    def set(self) -> None:
        os.write(self._write, b"x")

    def fileno(self) -> int:
        """What to select on: readable once set."""
        return self._read

    def is_set(self) -> bool:
        """Whether it was set (not taken: :meth:`wait` still returns at once)."""
        return bool(select.select([self], [], [], 0)[0])

    def wait(self, timeout: float = 60.0) -> None:
        """Raises :class:`TimeoutError` when nobody set it in time (a failed child)."""
        ready, _, _ = select.select([self._read], [], [], timeout)
        if not ready:
            raise TimeoutError(f"not signalled within {timeout}s")
        assert os.read(self._read, 1) == b"x"
