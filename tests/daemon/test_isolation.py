"""A shared daemon keeps its users apart: several real uids against one flightlogd.

The daemon runs as root with a socket every uid may connect to; each client runs in a
child forked from the test, which takes a throwaway uid, gid and groups (numbers that
need no entry in /etc) before it connects, so the daemon learns them from the kernel.
The owner records; another uid is refused everything of the owner's session and
learns nothing of it; a member of the readers' group reads but does not write; root
reads.  Hostile paths never reach another uid's files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    LoadCheckpoint,
    Open,
    RunStarted,
    SessionOpened,
    Status,
    StatusReply,
    Subscribe,
    Subscribed,
    TailBatch,
    TailEnd,
)
from support import DaemonProcess, RawClient, read_lines
from support.daemon import (
    AsUid,
    Signal,
    as_uid,
    begin,
    checkpoint,
    create,
    fact,
    needs_root,
    shared_daemon,
    synced_seq,
    wait_for_log,
)

pytestmark = needs_root

OWNER = 40001
OTHER = 40002
AUDITOR = 40003
READERS = 40100
SECRET = "the-owner's-secret-4f1d"


@pytest.fixture(scope="module")
def allow() -> Iterator[Path]:
    """An ``--allow`` root that every uid may write on disk, as /tmp."""
    allow = Path(tempfile.mkdtemp(prefix="fl-allow-", dir="/tmp"))
    allow.chmod(0o1777)
    yield allow
    shutil.rmtree(allow, ignore_errors=True)


@pytest.fixture(scope="module")
def shared(allow: Path) -> Iterator[DaemonProcess]:
    """A shared daemon with a readers' group and a shared ``--allow`` root."""
    with shared_daemon("--readers-group", str(READERS), "--allow", str(allow)) as proc:
        yield proc


def _record(socket: str, path: str) -> dict[str, Any]:
    """As the owner: create a session, a run with a secret, a checkpoint, closed."""
    with RawClient(socket, client="owner") as client:
        opened = create(client, path)
        run = client.request(
            BeginRun(id=client.next_id(), session_id=opened.session_id, time=now(), pid=1)
        )
        assert isinstance(run, RunStarted), run
        client.send(
            fact(opened.session_id, run.run_id, data=b'{"turn_index":"%s"}' % SECRET.encode())
        )
        checkpoint(client, opened.session_id, run.run_id, b'{"secret":"%s"}' % SECRET.encode())
        closed = client.request(
            CloseRun(
                id=client.next_id(), session_id=opened.session_id, run_id=run.run_id, time=now()
            )
        )
        assert isinstance(closed, Ack), closed
        done = client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
        assert isinstance(done, Ack), done
    return {"path": opened.path, "session_id": opened.session_id, "pid": os.getpid()}


def _hold(socket: str, path: str) -> str:
    """As the owner: create a session, a run with a checkpoint holding the secret,
    and go away without closing either."""
    with RawClient(socket, client="owner") as client:
        opened = create(client, path)
        run = begin(client, opened.session_id)
        checkpoint(client, opened.session_id, run.run_id, b'{"secret":"%s"}' % SECRET.encode())
    return opened.session_id


@pytest.fixture(scope="module")
def recorded(shared: DaemonProcess) -> dict[str, Any]:
    return as_uid(OWNER, lambda: _record(shared.socket, "agents/a.jsonl"))


def _tail(socket: str, path: str | None, *, follow: bool = False) -> Any:
    """Subscribe; the refusal (an error reply or an error's ``tail_end``), or every
    line up to the end (``follow``: up to a short quiet spell)."""
    with RawClient(socket, client="tail") as client:
        reply = client.request(Subscribe(id=client.next_id(), path=path, follow=follow))
        if not isinstance(reply, Subscribed):
            return reply
        lines: list[bytes] = []
        while True:
            try:
                message = client.receive(timeout=1.0 if follow else 10.0)
            except TimeoutError:
                return lines
            if isinstance(message, TailBatch):
                lines.extend(message.lines)
            elif isinstance(message, TailEnd):
                return message if message.reason == "error" else lines


def _refused(reply: Any, path: str, *secrets: str) -> None:
    assert isinstance(reply, ErrorReply), reply
    assert reply.code == "permission_denied", reply
    assert path in reply.message, reply.message
    for secret in (SECRET, *secrets):
        assert secret not in reply.message, reply.message


# ----------------------------------------------------------------- the owner


def test_the_owner_records_in_its_own_directory_with_the_kernels_credentials(
    shared: DaemonProcess, recorded: dict[str, Any]
) -> None:
    assert recorded["path"] == str(shared.root / "uid" / str(OWNER) / "agents" / "a.jsonl")
    directory = shared.root / "uid" / str(OWNER)
    for made in (directory.parent, directory):
        st = made.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    (run_start,) = [line for line in read_lines(recorded["path"]) if line["type"] == "run_start"]
    # The agent claimed pid 1; the kernel said who connected.
    assert run_start["data"] == {
        "pid": 1,
        "client": "",
        "peer_pid": recorded["pid"],
        "uid": OWNER,
        "gid": OWNER,
    }


def test_the_owner_reopens_reads_and_loads_its_checkpoint(
    shared: DaemonProcess, recorded: dict[str, Any]
) -> None:
    def again() -> tuple[Any, Any, list[bytes]]:
        with RawClient(shared.socket) as client:
            opened = client.request(Open(id=client.next_id(), path="agents/a.jsonl"))
            loaded = client.request(
                LoadCheckpoint(id=client.next_id(), session_id=opened.session_id)
            )
            client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
        return opened, loaded, _tail(shared.socket, "agents/a.jsonl")

    opened, loaded, lines = as_uid(OWNER, again)
    assert isinstance(opened, SessionOpened) and opened.path == recorded["path"], opened
    assert SECRET.encode() in loaded.snapshot
    assert len(lines) == 5 and SECRET.encode() in lines[2]


# ------------------------------------------------------------ another uid


def test_another_uid_cannot_open_create_tail_follow_or_show_the_session(
    shared: DaemonProcess, recorded: dict[str, Any]
) -> None:
    path = recorded["path"]
    before = Path(path).read_bytes()

    def intrude() -> dict[str, Any]:
        with RawClient(shared.socket) as client:
            return {
                "open": client.request(Open(id=client.next_id(), path=path)),
                "create": client.request(
                    Create(id=client.next_id(), path=path.replace("a.jsonl", "b.jsonl"), meta={})
                ),
                "tail": _tail(shared.socket, path),
                "follow": _tail(shared.socket, path, follow=True),
                "show": _tail(shared.socket, path),
                # A session that does not exist is refused the same way: the refusal
                # tells nothing, not even whether there is such a session.
                "missing": client.request(
                    Open(id=client.next_id(), path=path.replace("a.jsonl", "none.jsonl"))
                ),
            }

    refusals = as_uid(OTHER, intrude)
    for what, reply in refusals.items():
        expected = path.replace(
            "a.jsonl", {"create": "b.jsonl", "missing": "none.jsonl"}.get(what, "a.jsonl")
        )
        _refused(reply, expected, recorded["session_id"])
    assert Path(path).read_bytes() == before
    assert not Path(path.replace("a.jsonl", "b.jsonl")).exists()


def test_another_uid_cannot_load_the_checkpoint_of_a_session_open_in_the_daemon(
    shared: DaemonProcess,
) -> None:
    path = str(shared.root / "uid" / str(OWNER) / "held.jsonl")
    # Root follows the session from before it exists, which keeps it open in the daemon
    # (under its id) once its writer is gone.
    with RawClient(shared.socket) as root:
        reply = root.request(Subscribe(id=root.next_id(), path=path, follow=True))
        assert isinstance(reply, Subscribed), reply

        session_id = as_uid(OWNER, lambda: _hold(shared.socket, "held.jsonl"))

        def load() -> Any:
            with RawClient(shared.socket) as client:
                return client.request(LoadCheckpoint(id=client.next_id(), session_id=session_id))

        # To another uid the session is as unknown as one that does not exist.
        refused = as_uid(OTHER, load)
        assert isinstance(refused, ErrorReply) and refused.code == "session_not_found", refused
        assert SECRET not in refused.message and path not in refused.message
        # Root's subscription saw it all: the session was open all along.
        lines: list[bytes] = []
        while len(lines) < 3:
            message = root.receive()
            if isinstance(message, TailBatch):
                lines.extend(message.lines)
        assert SECRET.encode() in lines[2]


def test_tail_all_and_status_show_another_uid_only_its_own_sessions(
    shared: DaemonProcess, recorded: dict[str, Any]
) -> None:
    subscribed, recorded_meanwhile = Signal(), Signal()

    def watch() -> tuple[list[str], list[bytes], list[str]]:
        with RawClient(shared.socket) as client:
            reply = client.request(Subscribe(id=client.next_id(), path=None, follow=True))
            assert isinstance(reply, Subscribed), reply
            subscribed.set()
            recorded_meanwhile.wait()
            # Lines reach a subscriber in the order written: once this uid's own line
            # is in, every line of the owner's, written before it, would be too.
            own = create(client, "mine.jsonl")
            paths, lines = [], []
            while not lines:
                message = client.receive()
                if isinstance(message, TailBatch):
                    paths.append(message.path)
                    lines.extend(message.lines)
            status = client.request(Status(id=client.next_id()))
            assert isinstance(status, StatusReply), status
            client.request(CloseSession(id=client.next_id(), session_id=own.session_id))
        return paths, lines, [session.path for session in status.sessions]

    watched = str(shared.root / "uid" / str(OWNER) / "watched.jsonl")
    with RawClient(shared.socket) as root:
        # Root follows the owner's session, which keeps it open (and in status) after
        # its writer went away.
        reply = root.request(Subscribe(id=root.next_id(), path=watched, follow=True))
        assert isinstance(reply, Subscribed), reply
        watcher = AsUid(OTHER, watch)
        subscribed.wait()
        as_uid(OWNER, lambda: _hold(shared.socket, "watched.jsonl"))
        recorded_meanwhile.set()
        paths, lines, listed = watcher.result()
        status = root.request(Status(id=root.next_id()))
    mine = str(shared.root / "uid" / str(OTHER) / "mine.jsonl")
    assert paths == [mine]
    assert all(SECRET.encode() not in line for line in lines)
    assert listed == [mine]
    assert watched in [session.path for session in status.sessions]


def _follow(socket: str, path: str, subscribed: Signal, caught_up: Signal) -> list[bytes]:
    """Follow ``path``: set ``subscribed``, then ``caught_up`` once 2 lines arrived;
    returns the first 6."""
    with RawClient(socket, client="follow") as client:
        reply = client.request(Subscribe(id=client.next_id(), path=path, follow=True))
        assert isinstance(reply, Subscribed), reply
        subscribed.set()
        got: list[bytes] = []
        while len(got) < 6:
            message = client.receive()
            assert isinstance(message, TailBatch), message
            if len(got) < 2 <= len(got) + len(message.lines):
                caught_up.set()
            got.extend(message.lines)
        return got


def test_the_owner_and_a_reader_follow_the_session_live_as_it_is_written(
    shared: DaemonProcess,
) -> None:
    path = str(shared.root / "uid" / str(OWNER) / "live.jsonl")
    signals = [Signal() for _ in range(4)]
    # The owner follows by its relative path, the auditor by the full one, both from
    # before the session exists.
    followers = [
        AsUid(OWNER, lambda: _follow(shared.socket, "live.jsonl", *signals[:2])),
        AsUid(AUDITOR, lambda: _follow(shared.socket, path, *signals[2:]), groups=(READERS,)),
    ]
    signals[0].wait()
    signals[2].wait()

    def record(create_it: bool, facts: int) -> None:
        with RawClient(shared.socket, client="owner") as client:
            if create_it:
                opened = create(client, "live.jsonl")
            else:
                opened = client.request(Open(id=client.next_id(), path="live.jsonl"))
            run = begin(client, opened.session_id)
            for n in range(facts):
                client.send(fact(opened.session_id, run.run_id, n))
            synced_seq(client, opened.session_id)

    as_uid(OWNER, lambda: record(True, 0))
    # Both have read the file; what comes next reaches them live, as it is written.
    signals[1].wait()
    signals[3].wait()
    as_uid(OWNER, lambda: record(False, 3))
    owners, audited = (follower.result() for follower in followers)
    assert owners == audited
    assert [line.split(b'"type":"')[1].split(b'"')[0] for line in owners] == [
        b"session_start",
        b"run_start",
        b"run_start",
        b"turn_start",
        b"turn_start",
        b"turn_start",
    ]


# --------------------------------------------------------- readers and root


def test_a_member_of_the_readers_group_reads_every_session_but_writes_none(
    shared: DaemonProcess, recorded: dict[str, Any]
) -> None:
    path = recorded["path"]

    def audit() -> dict[str, Any]:
        with RawClient(shared.socket) as client:
            return {
                "tail": _tail(shared.socket, path),
                "open": client.request(Open(id=client.next_id(), path=path)),
                "create": client.request(
                    Create(id=client.next_id(), path=path.replace("a.jsonl", "c.jsonl"), meta={})
                ),
                "own": client.request(Create(id=client.next_id(), path="notes.jsonl", meta={})),
            }

    seen = as_uid(AUDITOR, audit, groups=(READERS,))
    assert len(seen["tail"]) == 5 and SECRET.encode() in seen["tail"][2]
    _refused(seen["open"], path)
    _refused(seen["create"], path.replace("a.jsonl", "c.jsonl"))
    assert isinstance(seen["own"], SessionOpened), seen["own"]
    assert seen["own"].path == str(shared.root / "uid" / str(AUDITOR) / "notes.jsonl")


def test_root_reads_every_session(shared: DaemonProcess, recorded: dict[str, Any]) -> None:
    lines = _tail(shared.socket, recorded["path"])
    assert len(lines) == 5 and SECRET.encode() in lines[2]
    with RawClient(shared.socket) as client:
        status = client.request(Status(id=client.next_id()))
        follow = client.request(Subscribe(id=client.next_id(), path=recorded["path"], follow=True))
    assert isinstance(follow, Subscribed), follow
    assert isinstance(status, StatusReply)


STRANGER = 40004


def test_status_shows_a_uid_only_its_own_figures(
    shared: DaemonProcess, recorded: dict[str, Any]
) -> None:
    """Daemon-wide counters told one uid the exact sizes of another's writes (issue 27)."""

    def figures(socket: str, record: bool) -> tuple[StatusReply, StatusReply]:
        with RawClient(socket, client="stranger") as client:
            before = client.request(Status(id=client.next_id()))
            if record:
                opened = create(client, "stranger.jsonl")
                begin(client, opened.session_id)
                synced_seq(client, opened.session_id)
            after = client.request(Status(id=client.next_id()))
        assert isinstance(before, StatusReply) and isinstance(after, StatusReply)
        return before, after

    before, after = as_uid(STRANGER, lambda: figures(shared.socket, True))
    with RawClient(shared.socket) as root:
        everything = root.request(Status(id=root.next_id()))
    assert isinstance(everything, StatusReply)
    assert (before.records_written, before.bytes_written, before.errors) == (0, 0, 0)
    assert before.connections == 1
    mine = shared.root / "uid" / str(STRANGER) / "stranger.jsonl"
    written = mine.read_bytes()
    assert after.records_written == written.count(b"\n") == 2
    assert after.bytes_written == len(written)
    # Root sees every uid's: the owner's secret-bearing session counts there.
    assert everything.records_written >= after.records_written + 5
    assert everything.bytes_written > after.bytes_written


# ----------------------------------------------------------- hostile paths


def test_hostile_paths_of_one_uid_never_reach_another_uids_files(
    shared: DaemonProcess, recorded: dict[str, Any]
) -> None:
    owner_dir = shared.root / "uid" / str(OWNER)
    other_dir = shared.root / "uid" / str(OTHER)
    before = {p: p.read_bytes() for p in owner_dir.rglob("*") if p.is_file()}
    # Someone who could write the data root on disk planted a symlink to the owner's
    # directory inside the other uid's own.
    as_uid(OTHER, lambda: _record(shared.socket, "first.jsonl"))
    (other_dir / "link").symlink_to(owner_dir / "agents")

    def attack() -> list[Any]:
        with RawClient(shared.socket) as client:
            return [
                client.request(Create(id=client.next_id(), path=path, meta={}))
                for path in (
                    f"../{OWNER}/agents/x.jsonl",
                    f"../../uid/{OWNER}/agents/a.jsonl",
                    "link/a.jsonl",
                    "link/new.jsonl",
                    f"{owner_dir}/agents/a.jsonl",
                    f"{owner_dir}/agents/../../{OTHER}/y.jsonl",
                )
            ] + [
                client.request(Open(id=client.next_id(), path="link/a.jsonl")),
                _tail(shared.socket, "link/a.jsonl"),
            ]

    replies = as_uid(OTHER, attack)
    codes = [getattr(reply, "code", reply) for reply in replies]
    assert codes == [
        "path_refused",
        "path_refused",
        "path_refused",
        "path_refused",
        "permission_denied",
        "path_refused",
        "path_refused",
        "path_refused",
    ], replies
    after = {p: p.read_bytes() for p in owner_dir.rglob("*") if p.is_file()}
    assert after == before


def test_a_directory_planted_in_a_shared_allowed_root_is_moved_aside(
    shared: DaemonProcess, allow: Path
) -> None:

    def plant() -> None:
        # /tmp-like: any uid may make the users' directory first, and one for another uid.
        (allow / "uid").mkdir(mode=0o777)
        (allow / "uid").chmod(0o777)
        (allow / "uid" / str(OWNER)).mkdir(mode=0o777)
        (allow / "uid" / str(OWNER)).chmod(0o777)

    as_uid(OTHER, plant)

    def record_there() -> Any:
        with RawClient(shared.socket) as client:
            return client.request(
                Create(id=client.next_id(), path=f"{allow}/uid/{OWNER}/s.jsonl", meta={})
            )

    # The daemon (root here, as the owner of its --allow root would be) moves the
    # planted directory aside and records in its own (tests/daemon/test_shared_root.py).
    reply = as_uid(OWNER, record_there)
    assert isinstance(reply, SessionOpened), reply
    moved = wait_for_log(shared, event="planted_directory_moved")
    assert moved["owner"] == OTHER
    assert list((Path(moved["moved_to"]) / str(OWNER)).iterdir()) == []
    for directory in (allow / "uid", allow / "uid" / str(OWNER)):
        st = directory.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)
