"""flightlogd's retention (``--max-use``, ``--max-age``, ``--keep-free``): a real daemon
over a real data root holding sessions of several uids.  Nothing goes by default; with
a limit, exactly what ``flightlog vacuum --dry-run`` lists goes, each removal logged;
one uid's files never go for another's limit; held sessions stay; a SIGKILL in the
middle of a sweep leaves every file whole."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from flightlog.cli._render import Style
from flightlog.cli._status import _status_lines
from flightlog.protocol import events, format_time, new_id
from flightlog.protocol._blobs import BLOB_DIR
from flightlog.protocol.wire import (
    CloseSession,
    Create,
    SessionOpened,
    Status,
    StatusReply,
    UidStorage,
)
from flightlog.sdk import connect
from flightlog.sdk._retention import Removal, remove
from support import DaemonProcess, RawClient, wait_for
from support.daemon import as_uid, check_file, log_events, needs_root

OTHER, THIRD = 64001, 64002
_TOOL = "x" * 20_000


def session_bytes(days: float, *, payload: str = _TOOL) -> bytes:
    """A closed session whose records are ``days`` old."""
    moment = format_time(datetime.now(UTC) - timedelta(days=days))
    sid, run = new_id(), new_id()
    records: list[dict[str, Any]] = [
        {"type": "session_start", "run_id": None, "data": {"format_version": 1, "meta": {}}},
        {"type": "run_start", "run_id": run, "data": {"pid": 1, "client": "t"}},
        {"type": "agent_start", "run_id": run, "data": {"agent": "a", "note": payload}},
        {"type": "run_close", "run_id": run, "data": {"error": None}},
    ]
    return b"".join(
        msgspec.json.encode({"session_id": sid, "seq": n, "time": moment, **r}) + b"\n"
        for n, r in enumerate(records, 1)
    )


def aged(path: Path, days: float, *, payload: str = _TOOL) -> Path:
    """A session file at ``path`` whose records and mtime are ``days`` old."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(session_bytes(days, payload=payload))
    moment = (datetime.now(UTC) - timedelta(days=days)).timestamp()
    os.utime(path, (moment, moment))
    return path


@pytest.fixture
def base() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    base.chmod(0o755)
    (base / "run").mkdir()
    (base / "run").chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def daemon(base: Path, *args: str) -> DaemonProcess:
    return DaemonProcess(
        base, "--log-format", "json", "--socket-mode", "0666", "--vacuum-interval", "0.05", *args
    )


def storage(socket: str) -> list[UidStorage]:
    with RawClient(socket) as client:
        reply = client.request(Status(id=client.next_id()))
    assert isinstance(reply, StatusReply), reply
    return reply.storage


def swept(proc: DaemonProcess, times: int = 2) -> list[UidStorage]:
    """The storage ``status`` shows once the daemon has swept ``times`` times more."""
    last = storage(proc.socket)
    seen = {last[0].surveyed}

    def later() -> bool:
        last[:] = storage(proc.socket)
        seen.add(last[0].surveyed)
        return len(seen) > times

    wait_for(later, timeout=30)
    return last


def removed_in_log(proc: DaemonProcess) -> list[dict[str, Any]]:
    return [e for e in log_events(proc) if e.get("event") == "session_removed"]


def vacuum_dry_run(root: Path, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "vacuum", str(root), *args, "--dry-run", "--json"],
        env={**os.environ, "FLIGHTLOG_SOCKET": str(root / "no-daemon.sock")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in result.stdout.splitlines()]


@needs_root
def test_without_limits_nothing_goes_and_status_shows_each_uid_its_files(base: Path) -> None:
    root = base / "root"
    mine = aged(root / "old" / "a.jsonl", 400)
    theirs = [aged(root / "uid" / str(OTHER) / f"{n}.jsonl", 300 + n) for n in range(3)]
    aged(root / "uid" / str(THIRD) / "t.jsonl", 2)
    proc = daemon(base).start()
    try:
        seen = {s.uid: s for s in swept(proc)}
        assert mine.exists() and all(p.exists() for p in theirs)
        assert removed_in_log(proc) == []
        # Root reads every session: it sees every uid's files.
        assert sorted(seen) == [0, OTHER, THIRD]
        size = len(theirs[0].read_bytes())
        assert (seen[OTHER].files, seen[OTHER].bytes) == (3, 3 * size)
        assert (seen[0].files, seen[0].removed_files) == (1, 0)
        assert seen[0].max_use is None and seen[0].max_age is None and seen[0].keep_free is None
        assert seen[0].protect == 86400 and seen[0].available
        assert seen[OTHER].oldest is not None and seen[OTHER].oldest < seen[THIRD].oldest  # type: ignore[operator]

        # Another uid sees its own files only.
        def own() -> list[UidStorage]:
            return storage(proc.socket)

        [its] = as_uid(OTHER, own)
        assert its.uid == OTHER and its.files == 3
        with RawClient(proc.socket) as client:
            reply = client.request(Status(id=client.next_id()))
        assert isinstance(reply, StatusReply)
        shown = "\n".join(_status_lines(reply, proc.socket, Style(enabled=False)))
        assert f"uid {OTHER} files: 3 sessions," in shown and "retention: no limits" in shown
    finally:
        proc.stop()


@needs_root
def test_the_daemon_removes_what_vacuum_dry_run_lists_and_logs_each(base: Path) -> None:
    root = base / "root"
    for days in (3, 9, 1.5, 7, 0.1, 12, 30):
        aged(root / f"d{days}" / "s.jsonl", days)
    for days in (6, 2):
        aged(root / "uid" / str(OTHER) / f"o{days}.jsonl", days)
    damaged = aged(root / "damaged.jsonl", 8)
    lines = damaged.read_bytes().splitlines(keepends=True)
    damaged.write_bytes(b"".join(lines[:2]) + b'{"not json\n' + b'{"unfinished')
    os.utime(damaged, (1, 1))
    dry = vacuum_dry_run(root, "--max-age", "5d")
    assert len(dry) == 6
    proc = daemon(base, "--max-age", "5d").start()
    try:
        wait_for(lambda: len(removed_in_log(proc)) == len(dry), timeout=30)
        logged = removed_in_log(proc)
        assert [e["path"] for e in logged] == [r["path"] for r in dry]
        for event, planned in zip(logged, dry, strict=True):
            assert event["reason"] == "max-age" and event["size"] == planned["size"]
            assert event["last_activity"] == planned["last_activity"]
            assert abs(event["age_seconds"] - planned["age_seconds"]) < 600
            assert event["uid"] == (OTHER if "/uid/" in event["path"] else 0)
        assert not any(Path(r["path"]).exists() for r in dry)
        left = sorted(str(p.relative_to(root)) for p in root.rglob("*.jsonl"))
        assert left == ["d0.1/s.jsonl", "d1.5/s.jsonl", "d3/s.jsonl", f"uid/{OTHER}/o2.jsonl"]
        assert all(check_file(p).sound for p in root.rglob("*.jsonl"))
        seen = {s.uid: s for s in swept(proc)}
        assert seen[0].removed_files == 5 and seen[OTHER].removed_files == 1
        assert seen[0].files == 3 and seen[0].max_age == 5 * 86400
    finally:
        proc.stop()


@pytest.mark.parametrize("stamp", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-00:01"])
def test_a_time_edited_by_hand_stops_neither_the_sweep_nor_the_daemon(
    base: Path, stamp: str
) -> None:
    # The last line's time, edited by hand to an offset that moves it out of the years
    # 0001 to 9999: the sweep's OverflowError ended the daemon (exit 1) before, and
    # `flightlog vacuum` with a traceback.
    root = base / "root"
    damaged = aged(root / "damaged.jsonl", 8)
    lines = damaged.read_bytes().splitlines(keepends=True)
    head, _, rest = lines[-1].partition(b'"time":"')
    lines[-1] = head + b'"time":"' + stamp.encode() + rest[rest.index(b'"') :]
    damaged.write_bytes(b"".join(lines))
    os.utime(damaged, (1, 1))
    aged(root / "old.jsonl", 9)
    aged(root / "new.jsonl", 1)
    proc = daemon(base, "--max-age", "5d").start()
    try:
        # The damaged line's time is skipped: the one before it says 8 days.
        wait_for(lambda: len(removed_in_log(proc)) == 2 or not proc.alive(), timeout=30)
        assert proc.alive(), proc.log
        assert sorted(Path(e["path"]).name for e in removed_in_log(proc)) == [
            "damaged.jsonl",
            "old.jsonl",
        ]
        swept(proc)
        assert [p.name for p in root.rglob("*.jsonl")] == ["new.jsonl"]
    finally:
        proc.stop()
    damaged.write_bytes(b"".join(lines))
    os.utime(damaged, (1, 1))
    dry = vacuum_dry_run(root, "--max-age", "5d")
    assert [Path(r["path"]).name for r in dry] == ["damaged.jsonl"]


@needs_root
def test_a_session_thousands_of_directories_deep_stops_neither_the_sweep_nor_a_reader(
    base: Path,
) -> None:
    # Any uid may name its session d/d/.../x.jsonl: 1,800 directories deep (within
    # PATH_MAX), the sweep's walk (os.walk, recursive in Python 3.11) raised
    # RecursionError and ended the daemon (exit 1), at every start after too.
    deep = "d/" * 1800 + "x.jsonl"
    proc = daemon(base).start()
    try:

        def record() -> str:
            with RawClient(proc.socket) as client:
                reply = client.request(Create(id=client.next_id(), path=deep, meta={}))
                assert isinstance(reply, SessionOpened), reply
                client.request(CloseSession(id=client.next_id(), session_id=reply.session_id))
                return reply.path

        path = Path(as_uid(OTHER, record))
        seen = {s.uid: s for s in swept(proc)}
        assert proc.alive(), proc.log
        assert seen[OTHER].files == 1
    finally:
        proc.stop()
    for argv in (["find", "--json"], ["sessions", "--json"], ["vacuum", "--max-age", "9d"]):
        result = subprocess.run(
            [sys.executable, "-m", "flightlog.cli", *argv, str(base / "root")],
            env={**os.environ, "FLIGHTLOG_SOCKET": str(base / "no-daemon.sock")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, (argv, result.stderr[-2000:])
        assert argv[0] == "vacuum" or str(path) in result.stdout, (argv, result.stdout)
    # Archived, its directories are made again under the archive: os.makedirs
    # recursed as deep, and the daemon exited 1 there too.
    archive = base / "archive"
    proc = daemon(base, "--max-age", "1s", "--protect", "0s", "--archive", str(archive))
    os.utime(path, (1, 1))
    proc.start()
    try:

        def archived() -> list[dict[str, Any]]:
            return [e for e in log_events(proc) if e.get("event") == "session_archived"]

        wait_for(lambda: bool(archived()) or not proc.alive(), timeout=30)
        assert proc.alive(), proc.log
        copy = Path(archived()[0]["archived_to"])
    finally:
        proc.stop()
    assert copy.read_bytes().startswith(b'{"session_id"') and not path.exists()
    _take_down(copy, archive)
    _take_down(path, base / "root")


def _take_down(path: Path, top: Path) -> None:
    """Remove ``path`` (if there) and its directories up to ``top``, from the bottom:
    shutil.rmtree (the fixture's) recurses as deep as the tree."""
    path.unlink(missing_ok=True)
    for directory in path.parents:
        if directory == top:
            break
        directory.rmdir()


@needs_root
def test_max_use_counts_each_uids_files_alone_and_keep_free_is_global(base: Path) -> None:
    root = base / "root"
    mine = [aged(root / f"m{d}.jsonl", d) for d in (10, 11, 12, 13)]
    theirs = [aged(root / "uid" / str(OTHER) / f"o{d}.jsonl", d) for d in (20, 21)]
    size = len(mine[0].read_bytes())
    proc = daemon(base, "--max-use", str(3 * size)).start()
    try:
        wait_for(lambda: len(removed_in_log(proc)) == 1, timeout=30)
        swept(proc)
        [event] = removed_in_log(proc)
        # The other uid's files are older, but within its own limit: they stay.
        assert event["path"] == str(mine[3]) and event["reason"] == "max-use"
        assert all(p.exists() for p in [*mine[:3], *theirs])
    finally:
        proc.stop()
    # The operator's total cap: the oldest removable files go, whoever's.
    proc = daemon(base, "--max-use-total", str(4 * size)).start()
    try:
        wait_for(lambda: len(removed_in_log(proc)) == 1, timeout=30)
        [seen] = [s for s in swept(proc) if s.uid == OTHER]
        [event] = removed_in_log(proc)
        assert event["path"] == str(theirs[1]) and event["reason"] == "max-use-total"
        assert seen.max_use_total == 4 * size and seen.files == 1
    finally:
        proc.stop()
    # The disk's limit is the operator's too.
    proc = daemon(base, "--keep-free", "1000000T").start()
    try:
        wait_for(lambda: len(removed_in_log(proc)) == 4, timeout=30)
        assert [Path(e["path"]).name for e in removed_in_log(proc)] == [
            "o20.jsonl",
            "m12.jsonl",
            "m11.jsonl",
            "m10.jsonl",
        ]
        assert {e["reason"] for e in removed_in_log(proc)} == {"keep-free"}
    finally:
        proc.stop()


@needs_root
def test_sessions_the_daemon_holds_are_never_removed(base: Path) -> None:
    from support.daemon import begin, create, fact, synced_seq

    root = base / "root"
    old = aged(root / "old.jsonl", 40)
    proc = daemon(base, "--max-use", "0", "--protect", "0s", "--idle-timeout", "0.05").start()
    try:
        with RawClient(proc.socket) as client:
            opened = create(client, "held/live.jsonl")
            run = begin(client, opened.session_id)
            client.send(fact(opened.session_id, run.run_id, 1))
            synced_seq(client, opened.session_id)
            os.utime(root / "held" / "live.jsonl", (1, 1))
            wait_for(lambda: not old.exists(), timeout=30)
            swept(proc, times=3)
            assert (root / "held" / "live.jsonl").exists()
            client.send(fact(opened.session_id, run.run_id, 2))
            assert synced_seq(client, opened.session_id) == 4
        report = check_file(root / "held" / "live.jsonl")
        assert report.sound and report.records == 4, report
    finally:
        proc.stop()


def test_a_file_a_writer_has_locked_is_kept(tmp_path: Path) -> None:
    path = aged(tmp_path / "s.jsonl", 5)
    st = path.stat()
    removal = Removal(
        str(path), str(tmp_path), st.st_size, st.st_mtime_ns, datetime.now(UTC), "max-age", 0
    )
    with path.open("rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        remove(removal, None)
    assert removal.error == "locked by a writer: kept" and path.exists()
    busy = Removal(**{**removal.__dict__, "error": None})
    remove(busy, None, busy=lambda p: p == str(path))
    assert busy.error == "opened since it was planned: kept" and path.exists()
    remove(removal, None)  # nothing holds it now
    assert not path.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--max-use", "ten"],
        ["--max-age", "3 weeks"],
        ["--keep-free=-1G"],
        ["--protect", "x"],
        ["--vacuum-interval", "-1"],
    ],
)
def test_bad_limits_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.daemon", "--root", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "flightlogd: error: argument" in result.stderr


def test_an_archive_inside_the_root_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flightlog.daemon",
            "--root",
            str(tmp_path),
            "--max-age",
            "1d",
            "--archive",
            str(tmp_path / "archive"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "is inside the data root" in result.stderr


@needs_root
def test_sigkill_mid_sweep_leaves_every_file_whole(base: Path) -> None:
    from support.daemon import begin, create, fact, synced_seq

    root = base / "root"
    big = "x" * 400_000
    names = [f"s{i:03}/s.jsonl" for i in range(120)]
    for i, name in enumerate(names):
        aged(root / name, 10 + i / 100, payload=big)
    size = (root / names[0]).stat().st_size
    archive = Path(tempfile.mkdtemp(dir="/dev/shm")) / "archive"  # another filesystem
    proc = daemon(base, "--max-age", "1d", "--archive", str(archive))
    live: dict[str, int] = {}
    try:
        killed_midway = 0
        for attempt in range(6):
            proc.start()
            with RawClient(proc.socket) as client:  # a writer, busy while the sweep runs
                opened = create(client, f"live/{attempt}.jsonl")
                run = begin(client, opened.session_id)
                for n in range(20):
                    client.send(fact(opened.session_id, run.run_id, n))
                live[f"live/{attempt}.jsonl"] = synced_seq(client, opened.session_id)
                wait_for(
                    lambda: any(e.get("event") == "session_archived" for e in log_events(proc)),
                    timeout=60,
                )
                proc.kill()
            moved = {str(p.relative_to(archive)) for p in archive.rglob("*.jsonl")}
            here = {str(p.relative_to(root)) for p in root.rglob("s.jsonl")}
            assert moved | here == set(names)  # every file is somewhere, whole
            for path in [*(archive / n for n in moved), *(root / n for n in here)]:
                assert check_file(path).sound and path.stat().st_size == size, path
            for name, seq in live.items():  # what the writers had synced is there
                report = check_file(root / name)
                assert report.sound and report.last_seq >= seq, (name, report)
            killed_midway += bool(here and moved)
            if not here:
                break
        assert killed_midway
        # A daemon started again finishes the sweep: every old file archived, once.
        proc.start()
        wait_for(lambda: not list(root.rglob("s.jsonl")), timeout=120)
        assert sorted(str(p.relative_to(archive)) for p in archive.rglob("*.jsonl")) == names
        assert all(check_file(p).sound for p in archive.rglob("*.jsonl"))
        assert not [p for p in archive.rglob("*") if "partial" in p.name]
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*.jsonl")) == sorted(live)
    finally:
        proc.stop()
        shutil.rmtree(archive.parent, ignore_errors=True)


@pytest.mark.parametrize("archive", [False, True])
def test_an_open_that_loses_the_race_to_a_vacuum_refuses_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archive: bool
) -> None:
    """The vacuum takes the lock and removes (or archives) the file after the daemon
    opened it and before the daemon locked it: the daemon must not write to it."""
    from flightlog.daemon import _storage
    from flightlog.daemon._paths import Roots
    from flightlog.daemon._storage import SessionFile

    path = aged(tmp_path / "root" / "s.jsonl", 5)
    roots = Roots(str(tmp_path / "root"))
    st = path.stat()
    removal = Removal(
        str(path), roots.root, st.st_size, st.st_mtime_ns, datetime.now(UTC), "max-age", 0
    )
    lock = _storage._lock

    def vacuum_first(fd: int, locked: str) -> None:
        remove(removal, str(tmp_path / "archive") if archive else None)
        assert removal.error is None and not path.exists()
        lock(fd, locked)

    monkeypatch.setattr(_storage, "_lock", vacuum_first)
    with pytest.raises(FileNotFoundError, match="removed while it was being opened"):
        SessionFile.open(roots, roots.resolve("s.jsonl"))


@needs_root
def test_an_archive_command_gets_each_session_before_it_goes(base: Path) -> None:
    root, archive = base / "root", base / "archive"
    archive.mkdir()
    old = [aged(root / f"o{days}.jsonl", days) for days in (10, 11)]
    content = old[0].read_bytes()
    copy = f'sh -c \'cp "$1" "{archive}/"\' sh'
    proc = daemon(base, "--max-age", "1d", "--archive-command", copy).start()
    try:

        def archived_in_log() -> list[dict[str, Any]]:
            return [e for e in log_events(proc) if e.get("event") == "session_archived"]

        wait_for(lambda: len(archived_in_log()) == 2, timeout=30)
        archived = archived_in_log()
        assert not any(p.exists() for p in old)
        assert [e["path"] for e in archived] == [str(old[1]), str(old[0])]
        assert archived[0]["archived_to"].endswith(f"sh {old[1]}")
        assert (archive / "o10.jsonl").read_bytes() == content
    finally:
        proc.stop()
    failing = aged(root / "f.jsonl", 10)
    proc = daemon(base, "--max-age", "1d", "--archive-command", "false").start()
    try:
        wait_for(lambda: any(e.get("event") == "session_kept" for e in log_events(proc)))
        [kept, *_] = [e for e in log_events(proc) if e.get("event") == "session_kept"]
        assert kept["path"] == str(failing) and kept["reason"] == "max-age"
        assert kept["error"] == "the archive command exited with 1: kept"
        assert failing.exists() and check_file(failing).sound
    finally:
        proc.stop()


def shot(payload: bytes, i: int) -> events.ModelRequest:
    image = events.ImagePart(media_type="image/png", data=base64.b64encode(payload).decode())
    return events.ModelRequest(
        execution=events.Execution(id=f"m{i}", kind="model"),
        messages=[events.UserMessage(content=[image])],
    )


def record_shots(socket: str, path: str, payloads: list[bytes]) -> None:
    with connect(socket) as client:
        session = client.create(path)
        with session.begin_run() as run:
            for i, payload in enumerate(payloads):
                run.record(shot(payload, i))
        session.close()


@needs_root
def test_status_shows_each_uid_its_blobs_beside_its_files(base: Path) -> None:
    root = base / "root"
    mine = [b"\x89PNG" + os.urandom(6000)]
    theirs = [b"\x89PNG" + os.urandom(9000), b"\x89PNG" + os.urandom(7000)]
    proc = daemon(base, "--blobs").start()
    try:
        record_shots(proc.socket, "mine.jsonl", mine * 3)  # stored once
        as_uid(OTHER, lambda: record_shots(proc.socket, "theirs.jsonl", theirs))
        assert (root / "uid" / str(OTHER) / BLOB_DIR).is_dir()
        seen = {s.uid: s for s in swept(proc)}
        # Root reads every session: every uid's blobs, each beside its files.
        assert (seen[0].files, seen[0].blobs, seen[0].blob_bytes) == (1, 1, len(mine[0]))
        assert (seen[OTHER].files, seen[OTHER].blobs) == (1, 2)
        assert seen[OTHER].blob_bytes == sum(len(p) for p in theirs)
        # Another uid sees its own figures only.
        [its] = as_uid(OTHER, lambda: storage(proc.socket))
        assert (its.uid, its.files, its.blobs) == (OTHER, 1, 2)
        assert its.blob_bytes == seen[OTHER].blob_bytes
        with RawClient(proc.socket) as client:
            reply = client.request(Status(id=client.next_id()))
        assert isinstance(reply, StatusReply)
        shown = "\n".join(_status_lines(reply, proc.socket, Style(enabled=False)))
        assert f"uid {OTHER} files: 1 sessions, " in shown
        assert ", 2 blobs (" in shown and ", 1 blob (" in shown
    finally:
        proc.stop()


def test_a_symlink_loop_named_like_a_session_stops_neither_the_sweep_nor_a_reader(
    base: Path,
) -> None:
    # A link to itself named x.jsonl (anyone who may write the root can make one):
    # its is_file() raised ELOOP in the walk, so flightlogd --max-age failed to start
    # (exit 1), and find, sessions, vacuum and sql died with a traceback.
    root = base / "root"
    root.mkdir(parents=True)
    aged(root / "old.jsonl", 40)
    (root / "loop.jsonl").symlink_to("loop.jsonl")
    proc = daemon(base, "--max-age", "30d").start()
    try:
        wait_for(lambda: not (root / "old.jsonl").exists(), timeout=30)
        swept(proc)
        assert proc.alive(), proc.log
    finally:
        proc.stop()
    aged(root / "old.jsonl", 1)
    for argv in (
        ["sessions", "--json"],
        ["find", "--json"],
        ["vacuum", "--max-age", "9d", "--dry-run"],
        ["sql", "select count(*) as n from sessions"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "flightlog.cli", *argv, str(root)],
            env={**os.environ, "FLIGHTLOG_SOCKET": str(base / "no-daemon.sock")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "Traceback" not in result.stderr, (argv, result.stderr[-2000:])
        assert result.returncode in (0, 1, 2), (argv, result.stderr[-2000:])
        if argv[0] in ("sessions", "find"):
            assert str(root / "old.jsonl") in result.stdout, (argv, result.stdout)
            assert "symbolic links" in result.stdout + result.stderr, (argv, result)
