"""A client trusts only its daemon, and the daemon binds only where it is safe.

Without ``$XDG_RUNTIME_DIR`` the SDK, the CLI and flightlogd use
``/tmp/flightlog-$UID/flightlog.sock``, a directory anyone may make first.  Here a
squatter (a real process running as another uid) makes it, or a symlink to its own,
and listens there; the victim (a real process as its own uid) must get
:class:`UntrustedDaemon` and the squatter not one byte.  A daemon run by the victim
refuses such a directory; one the victim trusts (its own, root's, or a user named in
``$FLIGHTLOG_DAEMON_USER``) serves as ever.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from flightlog.daemon import _server
from flightlog.daemon.__main__ import main
from flightlog.protocol import FlightlogError, events
from flightlog.sdk import UntrustedDaemon, connect, read
from flightlog.sdk.aio import aconnect
from support import DaemonProcess, wait_for
from support.daemon import AsUid, as_uid, needs_root, shared_daemon

pytestmark = needs_root

# Uids of their own for each run, so that runs beside this one make other paths.
VICTIM = 47000 + os.getpid() % 900 * 2
SQUATTER = VICTIM + 1
SECRET = "victim-secret-7c1e"


def _fallback(uid: int) -> Path:
    return Path(f"/tmp/flightlog-{uid}")


@pytest.fixture
def fallback() -> Iterator[Path]:
    """The victim's ``/tmp`` fallback directory, removed before and after."""
    path = _fallback(VICTIM)

    def clean() -> None:
        if path.is_symlink():
            path.unlink()
        shutil.rmtree(path, ignore_errors=True)

    clean()
    yield path
    clean()


def _victim_env(**extra: str) -> None:
    """In the victim's child: the environment of a cron job or an ssh without pam."""
    for name in ("XDG_RUNTIME_DIR", "FLIGHTLOG_SOCKET", "FLIGHTLOG_DAEMON_USER"):
        os.environ.pop(name, None)
    os.environ.update(extra)


def _record_secret(trusted: tuple[int, ...] = (), **env: str) -> dict[str, Any]:
    """As the victim: connect with the defaults (and ``trusted`` uids) and record a
    secret; what happened."""
    _victim_env(**env)
    try:
        with connect(client_name="victim", reconnect_grace=0, trusted_uids=trusted) as client:
            session = client.session("victim.jsonl")
            with session, session.begin_run() as run:
                run.record(events.AgentStart(agent=SECRET))
            return {"ok": True, "path": client.path}
    except UntrustedDaemon as exc:
        return {
            "code": exc.code,
            "message": exc.message,
            "path": exc.path,
            "owner": exc.owner,
            "mode": exc.mode,
            "peer_uid": exc.peer_uid,
        }


def _record_secret_async(trusted: tuple[int, ...] = (), **env: str) -> dict[str, Any]:
    """:func:`_record_secret` through the async client."""
    _victim_env(**env)

    async def main() -> dict[str, Any]:
        try:
            async with aconnect(
                client_name="victim", reconnect_grace=0, trusted_uids=trusted
            ) as client:
                session = await client.session("victim.jsonl")
                async with session, session.begin_run() as run:
                    await run.record(events.AgentStart(agent=SECRET))
            return {"ok": True}
        except UntrustedDaemon as exc:
            return {"code": exc.code, "message": exc.message, "peer_uid": exc.peer_uid}

    return anyio.run(main)


class Squatter:
    """A listener as ``SQUATTER`` on ``path`` (its directory made by ``prepare``, in
    the child): counts the connections it accepts and the bytes it receives."""

    def __init__(self, path: Path, prepare: Callable[[], None]) -> None:
        self.path = path
        ready_r, ready_w = os.pipe()
        self._stop_r, self._stop_w = os.pipe()
        stop_r = self._stop_r

        def listen() -> dict[str, int]:
            prepare()
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            temporary = f"{path}.tmp"
            listener.bind(temporary)
            os.chmod(temporary, 0o777)
            listener.listen(16)
            os.rename(temporary, path)
            os.write(ready_w, b"!")
            accepted = received = 0
            peers: list[socket.socket] = []
            while True:
                readable, _, _ = select.select([listener, stop_r, *peers], [], [])
                if stop_r in readable:
                    for peer in peers:  # what was sent before the stop
                        peer.setblocking(False)
                        with contextlib.suppress(BlockingIOError):
                            received += len(peer.recv(1 << 20))
                    return {"accepted": accepted, "received": received}
                if listener in readable:
                    peers.append(listener.accept()[0])
                    accepted += 1
                for peer in peers:
                    if peer in readable:
                        received += len(peer.recv(1 << 20))
                        peers.remove(peer)  # hang up: the victim must not wait
                        peer.close()

        self._child = AsUid(SQUATTER, listen)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"!", "the squatter did not listen"
        os.close(ready_r)

    def stop(self) -> dict[str, int]:
        os.write(self._stop_w, b"!")
        result: dict[str, int] = self._child.result()
        os.close(self._stop_r)
        os.close(self._stop_w)
        return result


def _squatter_dir(path: Path, mode: int) -> Callable[[], None]:
    def prepare() -> None:
        path.mkdir(mode=mode)
        path.chmod(mode)

    return prepare


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o777])
def test_a_squatted_tmp_directory_gets_a_typed_error_and_not_one_byte(
    fallback: Path, mode: int
) -> None:
    squatter = Squatter(fallback / "flightlog.sock", _squatter_dir(fallback, 0o755 | mode))
    outcome = as_uid(VICTIM, _record_secret)
    seen = squatter.stop()
    assert outcome["code"] == "untrusted_daemon", outcome
    assert outcome["path"] == str(fallback / "flightlog.sock")
    assert outcome["owner"] == SQUATTER
    assert outcome["mode"] == 0o755 | mode
    assert f"owner uid {SQUATTER}" in outcome["message"]
    assert str(fallback) in outcome["message"]
    assert seen == {"accepted": 0, "received": 0}


def test_a_symlinked_tmp_directory_gets_a_typed_error(fallback: Path) -> None:
    own = Path(tempfile.mkdtemp(prefix="fl-squat-", dir="/tmp"))
    os.chown(own, SQUATTER, SQUATTER)

    def prepare() -> None:
        fallback.symlink_to(own)

    try:
        squatter = Squatter(fallback / "flightlog.sock", prepare)
        outcome = as_uid(VICTIM, _record_secret)
        seen = squatter.stop()
    finally:
        shutil.rmtree(own, ignore_errors=True)
    assert outcome["code"] == "untrusted_daemon", outcome
    assert "symlink" in outcome["message"]
    assert seen == {"accepted": 0, "received": 0}


@pytest.fixture
def trusted_dir() -> Iterator[Path]:
    """A root-owned directory (0755) that every uid trusts."""
    path = Path(tempfile.mkdtemp(prefix="fl-trust-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("record", [_record_secret, _record_secret_async])
def test_whoever_answers_must_be_trusted(
    trusted_dir: Path, record: Callable[..., dict[str, Any]]
) -> None:
    """The directory and the node pass (as if swapped in after the check): the peer's
    uid, from the kernel, is what refuses."""
    own = Path(tempfile.mkdtemp(prefix="fl-squat-", dir="/tmp"))
    os.chown(own, SQUATTER, SQUATTER)
    try:
        squatter = Squatter(own / "s.sock", lambda: None)
        target = trusted_dir / "flightlog.sock"
        os.rename(own / "s.sock", target)
        os.chown(target, 0, 0, follow_symlinks=False)
        outcome = as_uid(VICTIM, lambda: record(FLIGHTLOG_SOCKET=str(target)))
        seen = squatter.stop()
    finally:
        shutil.rmtree(own, ignore_errors=True)
    assert outcome["code"] == "untrusted_daemon", outcome
    assert outcome["peer_uid"] == SQUATTER
    assert f"as uid {SQUATTER}" in outcome["message"]
    assert seen["received"] == 0


class ChildDaemon:
    """flightlogd's ``main`` in a child forked from the test as ``uid`` (the
    workspace's Python may not be executable by other uids), logging to a file."""

    def __init__(self, uid: int, base: Path, socket_path: Path, *args: str) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.socket = str(socket_path)
        self.log_path = base / "flightlogd.log"
        self.log_path.touch()
        for path in (base, self.log_path):
            os.chown(path, uid, uid)
        root = base / "root"
        argv = ["--socket", self.socket, "--root", str(root), "--log-format", "json", *args]

        def run() -> object:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND)
            os.dup2(fd, 2)
            sys.stderr = os.fdopen(fd, "w", buffering=1)
            try:
                main(argv)
            except SystemExit as exc:
                return exc.code
            return 0

        self.child = AsUid(uid, run)

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self) -> None:
        def accepts() -> bool:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(self.socket)
                except OSError:
                    return False
                return True

        wait_for(accepts, timeout=30)

    def stop(self) -> object:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child.pid, signal.SIGTERM)
        return self.child.result()


def _own_user_daemon(trusted_dir: Path, uid: int) -> ChildDaemon:
    """A shared daemon running as ``uid``, its socket 0666 in a directory of its own."""
    run = trusted_dir / "run"
    run.mkdir()
    os.chown(run, uid, uid)
    return ChildDaemon(uid, trusted_dir / "d", run / "s.sock", "--socket-mode", "0666")


def test_a_daemon_user_named_in_the_environment_is_trusted(trusted_dir: Path) -> None:
    """A shared daemon running as its own user, socket 0666 in a root-owned directory:
    refused until ``$FLIGHTLOG_DAEMON_USER`` names that user, then it records."""
    daemon_uid = SQUATTER
    proc = _own_user_daemon(trusted_dir, daemon_uid)
    try:
        proc.wait_ready()
        refused = as_uid(VICTIM, lambda: _record_secret(FLIGHTLOG_SOCKET=proc.socket))
        assert refused["code"] == "untrusted_daemon", refused
        assert refused["owner"] == daemon_uid
        served = as_uid(
            VICTIM,
            lambda: _record_secret(
                FLIGHTLOG_SOCKET=proc.socket, FLIGHTLOG_DAEMON_USER=f"nobody,{daemon_uid}"
            ),
        )
        assert served.get("ok"), served
    finally:
        assert proc.stop() == 0, proc.log
    files = list((trusted_dir / "d" / "root" / "uid" / str(VICTIM)).glob("*.jsonl"))
    assert [r.type for r in read(files[0])][-2] == "agent_start"


def test_a_daemon_uid_given_to_connect_is_trusted(trusted_dir: Path) -> None:
    """``connect(trusted_uids=...)``, beside ``$FLIGHTLOG_DAEMON_USER``: a shared
    daemon running as its own user serves a client that names its uid, sync and
    async, and another uid named there does not make it trusted."""
    daemon_uid = SQUATTER
    proc = _own_user_daemon(trusted_dir, daemon_uid)
    try:
        proc.wait_ready()
        other = as_uid(
            VICTIM, lambda: _record_secret((daemon_uid + 2,), FLIGHTLOG_SOCKET=proc.socket)
        )
        assert other["code"] == "untrusted_daemon", other
        served = as_uid(VICTIM, lambda: _record_secret((daemon_uid,), FLIGHTLOG_SOCKET=proc.socket))
        assert served.get("ok"), served
        served = as_uid(
            VICTIM, lambda: _record_secret_async((daemon_uid,), FLIGHTLOG_SOCKET=proc.socket)
        )
        assert served.get("ok"), served
    finally:
        assert proc.stop() == 0, proc.log
    files = list((trusted_dir / "d" / "root" / "uid" / str(VICTIM)).glob("*.jsonl"))
    assert len(files) == 1 and [r.type for r in read(files[0])].count("agent_start") == 2


def test_an_unknown_daemon_user_is_a_clear_error(daemon: DaemonProcess) -> None:
    def attempt() -> str:
        _victim_env(FLIGHTLOG_SOCKET=daemon.socket, FLIGHTLOG_DAEMON_USER="no-such-user-x")
        try:
            connect(reconnect_grace=0)
        except FlightlogError as exc:
            return f"{exc.code}: {exc.message}"
        return "connected"

    assert as_uid(VICTIM, attempt).startswith("daemon_user_unknown: ")


def test_the_victims_own_daemon_makes_the_tmp_fallback_and_serves(
    fallback: Path, trusted_dir: Path
) -> None:
    proc = ChildDaemon(VICTIM, trusted_dir / "d", fallback / "flightlog.sock")
    try:
        proc.wait_ready()
        st = fallback.lstat()
        assert (st.st_uid, st.st_mode & 0o7777) == (VICTIM, 0o700)
        served = as_uid(VICTIM, _record_secret)
        assert served == {"ok": True, "path": str(fallback / "flightlog.sock")}
    finally:
        assert proc.stop() == 0, proc.log


@pytest.mark.parametrize("planted", ["directory", "open directory", "symlink"])
def test_the_daemon_refuses_a_fallback_it_does_not_own(
    fallback: Path, trusted_dir: Path, planted: str
) -> None:
    own = trusted_dir / "own"
    own.mkdir()
    if planted == "directory":
        fallback.mkdir(mode=0o700)
        os.chown(fallback, SQUATTER, SQUATTER)
    elif planted == "open directory":  # the victim's own, but anyone may write in it
        fallback.mkdir()
        fallback.chmod(0o777)
        os.chown(fallback, VICTIM, VICTIM)
    else:
        os.chown(own, VICTIM, VICTIM)
        fallback.symlink_to(own)
    proc = ChildDaemon(VICTIM, trusted_dir / "d", fallback / "flightlog.sock")
    assert proc.child.result() == 1
    assert "refusing to listen in" in proc.log, proc.log
    assert not os.path.lexists(fallback / "flightlog.sock")
    assert not any(os.scandir(own))


# ------------------------------------------------------ the path appears listening


def test_the_socket_path_appears_only_once_the_daemon_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At every chmod of the bind, the socket's path is absent or accepts."""
    path = str(tmp_path / "run" / "s.sock")
    seen: list[str] = []
    chmod = os.chmod

    def probing_chmod(target: Any, mode: int, **kwargs: Any) -> None:
        chmod(target, mode, **kwargs)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except OSError as exc:
                seen.append(errno.errorcode[exc.errno or 0])
            else:
                seen.append("accepted")

    monkeypatch.setattr(os, "chmod", probing_chmod)
    sock = _server._bind(path, 0o600)
    monkeypatch.undo()
    try:
        assert seen and set(seen) <= {"ENOENT"}, seen
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
        assert sorted(os.listdir(tmp_path / "run")) == ["s.sock"]
        assert os.stat(path).st_mode & 0o777 == 0o600
    finally:
        sock.close()


_TIGHT_LOOP = """
import errno, os, socket, sys
path = sys.argv[1]
os.write(1, b"go\\n")
while True:
    if not os.path.lexists(path):
        continue
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError as exc:
            print(errno.errorcode[exc.errno])
            sys.exit(1)
    print("connected")
    sys.exit(0)
"""


def test_a_client_connecting_in_a_tight_loop_never_sees_econnrefused(short_tmp: Path) -> None:
    for attempt in range(5):
        base = short_tmp / str(attempt)
        proc = DaemonProcess(base)
        prober = subprocess.Popen(
            [sys.executable, "-c", _TIGHT_LOOP, proc.socket],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert prober.stdout is not None
            assert prober.stdout.readline() == "go\n"
            proc.start(wait=False)
            out, _ = prober.communicate(timeout=60)
            assert out.strip() == "connected", out
        finally:
            prober.kill()
            prober.communicate()
            proc.stop()


def test_a_socket_out_of_reach_is_a_connect_error_not_a_crash(daemon: DaemonProcess) -> None:
    """The checks look at what they can; a directory the caller may not enter leaves the
    verdict to the connect (a permission), as before."""

    def attempt() -> str:
        _victim_env(FLIGHTLOG_SOCKET=daemon.socket)
        try:
            connect(reconnect_grace=0)
        except FlightlogError as exc:
            return exc.code
        return "connected"

    assert as_uid(VICTIM, attempt) == "connect_failed"


def test_a_shared_root_daemon_serves_other_uids_with_nothing_to_configure() -> None:
    """A daemon run as root, socket 0666 in a root-owned 0755 directory: root is
    trusted, so another uid's agent records through it."""
    with shared_daemon() as shared:
        served = as_uid(VICTIM, lambda: _record_secret(FLIGHTLOG_SOCKET=shared.socket))
        assert served == {"ok": True, "path": shared.socket}
        [path] = (shared.root / "uid" / str(VICTIM)).glob("*.jsonl")
        assert SECRET in path.read_text()
