"""systemd integration: socket activation, sd_notify, the watchdog loop, journal detection.

Everything runs against real kernel objects: activated sockets are real listening sockets
placed at fd 3 in a child process (by ``systemd-socket-activate`` or by the child itself),
and notifications land on real ``AF_UNIX`` datagram sockets, with the sender's
credentials checked the way systemd's ``NotifyAccess=main`` checks them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from flightlog.daemon._systemd import (
    SD_LISTEN_FDS_START,
    Notifier,
    SystemdError,
    listen_fds,
    listen_fds_with_names,
    stderr_is_journal,
    watchdog_loop,
)

LISTEN_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite may itself run under systemd; never let its variables leak into a test.
    for name in (*LISTEN_VARIABLES, "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)


# --------------------------------------------------------------------------- activation

# Runs in a child: moves the passed descriptors to 3, 4, ... (as systemd would), sets the
# variables (LISTEN_PID must be the child's own pid), calls listen_fds_with_names() and
# prints what it got as JSON.
CHILD = r"""
import fcntl, json, os, sys

spec = json.loads(sys.argv[1])
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in spec["fds"]]
for fd in spec["fds"]:
    os.close(fd)
for offset, fd in enumerate(high):
    os.dup2(fd, 3 + offset)
    os.close(fd)
pid = {"self": os.getpid(), "parent": os.getppid()}.get(spec["pid"], spec["pid"])
if pid is not None:
    os.environ["LISTEN_PID"] = str(pid)
os.environ.update(spec["env"])

from flightlog.daemon._systemd import SystemdError, listen_fds_with_names

def is_open(fd):
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True

report = {"error": None}
try:
    taken = listen_fds_with_names()
except SystemdError as exc:
    report["error"] = str(exc)
    taken = []
report["sockets"] = [
    {
        "name": name,
        "fd": sock.fileno(),
        "family": int(sock.family),
        "type": int(sock.type),
        "inheritable": os.get_inheritable(sock.fileno()),
    }
    for name, sock in taken
]
report["environ"] = {k: os.environ.get(k) for k in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")}
report["open"] = {fd: is_open(fd) for fd in range(3, 3 + len(spec["fds"]))}
report["inheritable"] = {
    fd: os.get_inheritable(fd) for fd, is_o in report["open"].items() if is_o
}
for _, sock in taken:
    sock.close()
print(json.dumps(report))
"""


def run_child(
    fds: list[int], *, env: dict[str, str] | None = None, pid: str | int | None = "self"
) -> dict[str, Any]:
    """Hand ``fds`` to a child as activated sockets 3.. and return its report."""
    spec = {
        "fds": fds,
        "pid": pid,
        "env": env if env is not None else {"LISTEN_FDS": str(len(fds))},
    }
    child_env = {k: v for k, v in os.environ.items() if k not in LISTEN_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)],
        pass_fds=fds,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    report["open"] = {int(fd): value for fd, value in report["open"].items()}
    report["inheritable"] = {int(fd): value for fd, value in report["inheritable"].items()}
    return report


def unix_listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.fspath(path))
    sock.listen()
    return sock


def test_listen_fds_takes_the_socket_from_systemd_socket_activate(tmp_path: Path) -> None:
    tool = shutil.which("systemd-socket-activate")
    if tool is None:
        pytest.skip("systemd-socket-activate is not installed")
    path = tmp_path / "a.sock"
    # The child reports over the activated socket itself: accepting the connection that
    # triggered it proves it got the real listening socket.
    child = (
        "import json, os\n"
        "from socket import SO_ACCEPTCONN, SOL_SOCKET\n"
        "from flightlog.daemon._systemd import listen_fds_with_names\n"
        "env = {k: os.environ.get(k) for k in ('LISTEN_PID', 'LISTEN_FDS', 'LISTEN_FDNAMES')}\n"
        "taken = listen_fds_with_names()\n"
        "after = {k: os.environ.get(k) for k in env}\n"
        "[(name, sock)] = taken\n"
        "conn, _ = sock.accept()\n"
        "report = {'name': name, 'fd': sock.fileno(), 'pid': os.getpid(), 'before': env,\n"
        "          'after': after, 'inheritable': os.get_inheritable(sock.fileno()),\n"
        "          'listening': sock.getsockopt(SOL_SOCKET, SO_ACCEPTCONN)}\n"
        "conn.sendall(json.dumps(report).encode())\n"
        "conn.close(); sock.close()\n"
    )
    proc = subprocess.Popen(
        [tool, "--listen", os.fspath(path), "--fdname=flightlog", sys.executable, "-c", child],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        # The socket's file appears at bind(), before listen(): until then a connection
        # is refused.
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "systemd-socket-activate never listened"
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                client.connect(os.fspath(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                client.close()
                time.sleep(0.01)
        with client:
            client.settimeout(30)
            chunks = []
            while chunk := client.recv(65536):
                chunks.append(chunk)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    report = json.loads(b"".join(chunks))
    assert report["before"] == {
        "LISTEN_PID": str(report["pid"]),
        "LISTEN_FDS": "1",
        "LISTEN_FDNAMES": "flightlog",
    }
    assert report["after"] == {"LISTEN_PID": None, "LISTEN_FDS": None, "LISTEN_FDNAMES": None}
    assert report["name"] == "flightlog"
    assert report["fd"] == SD_LISTEN_FDS_START
    assert report["inheritable"] is False
    assert report["listening"] == 1


def test_listen_fds_takes_every_socket_in_order_with_names(tmp_path: Path) -> None:
    with unix_listener(tmp_path / "a.sock") as a, unix_listener(tmp_path / "b.sock") as b:
        report = run_child(
            [a.fileno(), b.fileno()],
            env={"LISTEN_FDS": "2", "LISTEN_FDNAMES": "records:tail"},
        )
    assert report["error"] is None
    assert report["sockets"] == [
        {
            "name": "records",
            "fd": 3,
            "family": socket.AF_UNIX,
            "type": socket.SOCK_STREAM,
            "inheritable": False,
        },
        {
            "name": "tail",
            "fd": 4,
            "family": socket.AF_UNIX,
            "type": socket.SOCK_STREAM,
            "inheritable": False,
        },
    ]
    assert report["environ"] == dict.fromkeys(LISTEN_VARIABLES)


def test_listen_fds_names_are_unknown_without_fdnames(tmp_path: Path) -> None:
    with unix_listener(tmp_path / "a.sock") as a:
        report = run_child([a.fileno()])
    assert [s["name"] for s in report["sockets"]] == ["unknown"]


def test_listen_fds_ignores_sockets_meant_for_another_process(tmp_path: Path) -> None:
    # The parent was activated and we inherited its environment: not ours to take.
    with unix_listener(tmp_path / "a.sock") as a:
        report = run_child([a.fileno()], pid="parent")
    assert report["error"] is None
    assert report["sockets"] == []
    assert report["environ"] == dict.fromkeys(LISTEN_VARIABLES)
    # Left exactly as it was: open and not touched (still inheritable).
    assert report["open"] == {3: True}
    assert report["inheritable"] == {3: True}


def test_listen_fds_refuses_a_datagram_socket(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dgram:
        dgram.bind(os.fspath(tmp_path / "d.sock"))
        report = run_child([dgram.fileno()])
    assert report["error"] is not None
    assert "SOCK_DGRAM" in report["error"]
    assert "fd 3" in report["error"]
    assert report["environ"] == dict.fromkeys(LISTEN_VARIABLES)
    assert report["open"] == {3: False}


def test_listen_fds_refuses_a_socket_that_does_not_listen(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(os.fspath(tmp_path / "s.sock"))
        report = run_child([bound.fileno()])
    assert report["error"] is not None
    assert "not listening" in report["error"]


def test_listen_fds_refuses_an_internet_socket() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as inet:
        inet.bind(("127.0.0.1", 0))
        inet.listen()
        report = run_child([inet.fileno()])
    assert report["error"] is not None
    assert "AF_INET" in report["error"]


def test_listen_fds_refuses_a_descriptor_that_is_no_socket() -> None:
    read_end, write_end = os.pipe()
    try:
        report = run_child([read_end])
    finally:
        os.close(read_end)
        os.close(write_end)
    assert report["error"] is not None
    assert "not a usable socket" in report["error"]


def test_listen_fds_closes_sockets_taken_before_a_bad_one(tmp_path: Path) -> None:
    with (
        unix_listener(tmp_path / "a.sock") as good,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as bad,
    ):
        report = run_child([good.fileno(), bad.fileno()], env={"LISTEN_FDS": "2"})
    assert report["error"] is not None
    assert "fd 4" in report["error"]
    assert report["sockets"] == []
    assert report["open"] == {3: False, 4: False}


def test_listen_fds_returns_nothing_when_not_activated() -> None:
    assert listen_fds() == []
    assert listen_fds_with_names() == []


def test_listen_fds_in_process_for_another_pid_returns_nothing_and_unsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LISTEN_PID", str(os.getppid()))
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_FDNAMES", "flightlog")
    assert listen_fds() == []
    for name in LISTEN_VARIABLES:
        assert name not in os.environ


def test_listen_fds_with_zero_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    monkeypatch.setenv("LISTEN_FDS", "0")
    assert listen_fds() == []
    assert "LISTEN_PID" not in os.environ


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"LISTEN_PID": "me", "LISTEN_FDS": "1"}, "LISTEN_PID='me'"),
        ({"LISTEN_FDS": "two"}, "LISTEN_FDS='two'"),
        ({"LISTEN_FDS": "-1"}, "negative"),
        ({"LISTEN_FDS": "2", "LISTEN_FDNAMES": "only-one"}, "LISTEN_FDNAMES"),
    ],
)
def test_listen_fds_refuses_malformed_variables_and_still_unsets_them(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], message: str
) -> None:
    # These fail before any descriptor is looked at, so they are safe in-process.
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemdError, match=message):
        listen_fds()
    for name in LISTEN_VARIABLES:
        assert name not in os.environ


def test_systemd_error_is_a_runtime_error() -> None:
    assert issubclass(SystemdError, RuntimeError)


# --------------------------------------------------------------------------- notify

UCRED = struct.Struct("3i")  # pid, uid, gid


class Manager:
    """The service manager's end: a datagram socket that sees the sender's credentials."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address

    def receive(self) -> tuple[bytes, int]:
        """One datagram and the pid that sent it (what NotifyAccess=main checks)."""
        data, ancillary, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(UCRED.size))
        pid = -1
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, _, _ = UCRED.unpack(payload[: UCRED.size])
        return data, pid

    def pending(self) -> list[bytes]:
        """Every datagram already queued, without waiting."""
        received = []
        timeout = self.sock.gettimeout()
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    received.append(self.sock.recv(65536))
                except BlockingIOError:
                    return received
        finally:
            self.sock.settimeout(timeout)


def make_manager(address: str, bind_to: str | bytes) -> Iterator[Manager]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind(bind_to)
        sock.settimeout(10)
        yield Manager(sock, address)


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Manager]:
    path = os.fspath(tmp_path / "notify")
    yield from make_manager(path, path)


@pytest.fixture
def abstract_manager() -> Iterator[Manager]:
    name = f"flightlog-test-{uuid.uuid4().hex}"
    yield from make_manager(f"@{name}", b"\0" + name.encode())


def test_notifier_sends_each_state_to_a_filesystem_socket(
    manager: Manager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", manager.address)
    notifier = Notifier.from_environment()
    assert notifier is not None
    assert notifier.address == manager.address

    assert notifier.ready() is True
    assert manager.receive() == (b"READY=1", os.getpid())
    assert notifier.status("listening on /run/flightlog/flightlog.sock") is True
    assert manager.receive() == (b"STATUS=listening on /run/flightlog/flightlog.sock", os.getpid())
    assert notifier.watchdog() is True
    assert manager.receive() == (b"WATCHDOG=1", os.getpid())
    assert notifier.stopping() is True
    assert manager.receive() == (b"STOPPING=1", os.getpid())


def test_notifier_sends_to_an_abstract_socket(
    abstract_manager: Manager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", abstract_manager.address)
    notifier = Notifier.from_environment()
    assert notifier is not None
    assert notifier.ready("3 sessions") is True
    assert abstract_manager.receive() == (b"READY=1\nSTATUS=3 sessions", os.getpid())
    assert notifier.watchdog() is True
    assert abstract_manager.receive()[0] == b"WATCHDOG=1"
    assert notifier.stopping("draining 2 sessions") is True
    assert abstract_manager.receive()[0] == b"STOPPING=1\nSTATUS=draining 2 sessions"


def test_status_text_stays_on_one_line(manager: Manager) -> None:
    notifier = Notifier(manager.address)
    assert notifier.status("write failed:\nNo space left on device\r\n") is True
    assert manager.receive()[0] == b"STATUS=write failed: No space left on device"


def test_notify_sends_fields_in_one_datagram(manager: Manager) -> None:
    notifier = Notifier(manager.address)
    assert notifier.notify(READY=1, STATUS="up", MAINPID=os.getpid()) is True
    assert manager.receive()[0] == f"READY=1\nSTATUS=up\nMAINPID={os.getpid()}".encode()
    assert notifier.send("RELOADING=1\nSTATUS=reloading") is True
    assert manager.receive()[0] == b"RELOADING=1\nSTATUS=reloading"


def test_status_text_that_is_not_valid_unicode_is_still_sent(manager: Manager) -> None:
    notifier = Notifier(manager.address)
    undecodable = os.fsdecode(b"/var/lib/flightlog/\xff.jsonl")
    assert notifier.status(f"write failed: {undecodable}") is True
    assert manager.receive()[0] == b"STATUS=write failed: /var/lib/flightlog/\xff.jsonl"
    assert notifier.status("lone \ud800 surrogate") is True
    assert manager.receive()[0] == b"STATUS=lone \\ud800 surrogate"


def test_notify_refuses_a_value_with_a_newline_or_no_field(manager: Manager) -> None:
    notifier = Notifier(manager.address)
    with pytest.raises(ValueError, match="STATUS"):
        notifier.notify(STATUS="one\nREADY=1")
    with pytest.raises(ValueError, match="at least one"):
        notifier.notify()
    assert manager.pending() == []


def test_extend_timeout_sends_microseconds(manager: Manager) -> None:
    assert Notifier(manager.address).extend_timeout(2.5) is True
    assert manager.receive()[0] == b"EXTEND_TIMEOUT_USEC=2500000"


def test_from_environment_without_notify_socket_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Notifier.from_environment() is None
    monkeypatch.setenv("NOTIFY_SOCKET", "")
    assert Notifier.from_environment() is None


@pytest.mark.parametrize("address", ["vsock:2:1234", "relative/notify", "@", ""])
def test_notifier_refuses_unsupported_addresses(address: str) -> None:
    with pytest.raises(SystemdError, match="NOTIFY_SOCKET"):
        Notifier(address)


def test_send_to_a_missing_socket_returns_false(tmp_path: Path) -> None:
    notifier = Notifier(os.fspath(tmp_path / "nobody-listens"))
    assert notifier.ready() is False
    assert notifier.watchdog() is False
    assert Notifier("@flightlog-test-nobody-" + uuid.uuid4().hex).stopping() is False


def test_send_to_a_full_queue_returns_false_without_blocking(manager: Manager) -> None:
    # The manager is not reading: once its queue is full a blocking send would hang the
    # event loop; ours must fail at once instead.
    notifier = Notifier(manager.address)
    started = time.monotonic()
    sent = 0
    while notifier.watchdog():
        sent += 1
        assert sent < 100_000, "the manager's queue never filled"
    assert sent > 0
    assert time.monotonic() - started < 30
    # Once the manager catches up, sending works again.
    assert len(manager.pending()) == sent
    assert notifier.watchdog() is True


def test_send_survives_descriptor_exhaustion(manager: Manager) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    notifier = Notifier(manager.address)
    held: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        assert notifier.watchdog() is False
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert notifier.watchdog() is True


# --------------------------------------------------------------------------- watchdog


def test_watchdog_interval_is_half_of_watchdog_usec(
    manager: Manager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", manager.address)
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    notifier = Notifier.from_environment()
    assert notifier is not None
    assert notifier.watchdog_interval() == 15.0


def test_watchdog_applies_when_watchdog_pid_is_ours(
    manager: Manager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", manager.address)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notifier = Notifier.from_environment()
    assert notifier is not None
    assert notifier.watchdog_interval() == 0.5


def test_watchdog_does_not_apply_to_another_pid(
    manager: Manager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", manager.address)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getppid()))
    notifier = Notifier.from_environment()
    assert notifier is not None
    assert notifier.watchdog_interval() is None


def test_no_watchdog_without_watchdog_usec(
    manager: Manager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", manager.address)
    notifier = Notifier.from_environment()
    assert notifier is not None
    assert notifier.watchdog_interval() is None
    assert Notifier(manager.address).watchdog_interval() is None


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"WATCHDOG_USEC": "soon"}, "WATCHDOG_USEC"),
        ({"WATCHDOG_USEC": "0"}, "not positive"),
        ({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "me"}, "WATCHDOG_PID"),
    ],
)
def test_malformed_watchdog_variables_are_refused(
    manager: Manager,
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
    message: str,
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", manager.address)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemdError, match=message):
        Notifier.from_environment()


@pytest.mark.anyio
async def test_watchdog_loop_pings_repeatedly(
    manager: Manager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", manager.address)
    monkeypatch.setenv("WATCHDOG_USEC", "20000")  # a ping every 10 ms
    notifier = Notifier.from_environment()
    assert notifier is not None
    pings: list[tuple[bytes, int]] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watchdog_loop, notifier)
            while len(pings) < 3:
                await anyio.wait_readable(manager.sock)
                pings.append(manager.receive())
            tg.cancel_scope.cancel()
    assert pings == [(b"WATCHDOG=1", os.getpid())] * 3


@pytest.mark.anyio
async def test_watchdog_loop_returns_at_once_without_a_watchdog(manager: Manager) -> None:
    with anyio.fail_after(5):
        await watchdog_loop(Notifier(manager.address))
        async with anyio.create_task_group() as tg:
            await tg.start(watchdog_loop, Notifier(manager.address))
    assert manager.pending() == []


@pytest.mark.anyio
async def test_a_wedged_event_loop_stops_the_pings(manager: Manager) -> None:
    interval = 0.1
    notifier = Notifier(manager.address, watchdog_usec=int(2 * interval * 1_000_000))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(watchdog_loop, notifier)
            # The first ping goes out as the loop starts.
            assert manager.pending() == [b"WATCHDOG=1"]
            # Wedge the event loop: this is what the watchdog exists to notice.
            time.sleep(5 * interval)  # noqa: ASYNC251
            assert manager.pending() == []
            # Once the loop runs again, one ping, not a burst to catch up.
            await anyio.wait_readable(manager.sock)
            assert manager.pending() == [b"WATCHDOG=1"]
            tg.cancel_scope.cancel()


# --------------------------------------------------------------------------- journal


def test_stderr_is_journal_when_journal_stream_names_fd_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stat = os.fstat(2)
    monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
    assert stderr_is_journal() is True


def test_stderr_is_not_journal_when_fd_2_was_redirected(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # JOURNAL_STREAM names a stream, but fd 2 is something else now.
    other = tmp_path / "elsewhere"
    other.touch()
    stat = os.stat(other)
    monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
    assert stderr_is_journal() is False


@pytest.mark.parametrize("value", [None, "", "12", "a:b", "12:", ":34", "1:2:3"])
def test_stderr_is_not_journal_without_a_valid_journal_stream(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    else:
        monkeypatch.setenv("JOURNAL_STREAM", value)
    assert stderr_is_journal() is False


def test_stderr_is_journal_in_a_child_whose_stderr_is_the_named_stream(tmp_path: Path) -> None:
    # As under systemd: the variable is set by whoever connected fd 2, and a child that
    # keeps fd 2 sees it; one that redirects fd 2 elsewhere does not.
    log = tmp_path / "stream"
    log.touch()
    stat = os.stat(log)
    code = (
        "import os\n"
        "from flightlog.daemon._systemd import stderr_is_journal\n"
        "print(stderr_is_journal())\n"
    )
    env = dict(os.environ, JOURNAL_STREAM=f"{stat.st_dev}:{stat.st_ino}")
    with open(log, "ab") as stream:
        kept = subprocess.run(
            [sys.executable, "-c", code],
            stderr=stream,
            env=env,
            stdout=subprocess.PIPE,
            check=True,
            timeout=60,
        )
    redirected = subprocess.run(
        [sys.executable, "-c", code],
        stderr=subprocess.DEVNULL,
        env=env,
        stdout=subprocess.PIPE,
        check=True,
        timeout=60,
    )
    assert kept.stdout.strip() == b"True"
    assert redirected.stdout.strip() == b"False"
