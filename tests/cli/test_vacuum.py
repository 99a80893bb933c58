"""``flightlog vacuum``: real session files under a real daemon's root, limits applied
oldest first, open and recent sessions kept, every removal reported, archives moved
whole even when the vacuum is killed with SIGKILL."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from flightlog.protocol import events, format_time
from flightlog.sdk import check, connect
from support import DaemonProcess, wait_for

_TIME = re.compile(rb'"time":"[^"]*"')


DAEMON_ARGS = ("--idle-timeout", "0.2")


@pytest.fixture(scope="module")
def daemon(module_daemon: DaemonProcess) -> DaemonProcess:
    """The module's flightlogd (each test writes files of its own)."""
    return module_daemon


@pytest.fixture(scope="module")
def template(daemon: DaemonProcess) -> bytes:
    """A closed session's bytes, with a tool output of 20 KB."""
    with connect(daemon.socket) as client:
        session = client.create("template/t.jsonl")
        with session.begin_run() as run:
            run.record(events.AgentStart(agent="a"))
            execution = events.Execution(id="t1", kind="tool")
            run.record(events.ToolExecStart(execution=execution, tool_call_id="t1", name="read"))
            run.record(
                events.ToolExecEnd(
                    execution=execution, tool_call_id="t1", name="read", content=["x" * 20_000]
                )
            )
        session.close()
    return (daemon.root / "template" / "t.jsonl").read_bytes()


def aged(template: bytes, path: Path, days: float) -> Path:
    """A copy of ``template`` at ``path`` whose records and mtime are ``days`` old."""
    moment = datetime.now(UTC) - timedelta(days=days)
    stamp = f'"time":"{format_time(moment)}"'.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_TIME.sub(stamp, template))
    os.utime(path, (moment.timestamp(), moment.timestamp()))
    return path


def vacuum(
    daemon: DaemonProcess, *args: str, check_status: bool = True, user: int | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "vacuum", *args],
        env={**os.environ, "FLIGHTLOG_SOCKET": daemon.socket},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        user=user,
    )
    if check_status:
        assert result.returncode == 0, result.stderr
    return result


def removals(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_dry_run_lists_exactly_what_a_run_removes(
    daemon: DaemonProcess, template: bytes, tmp_path: Path
) -> None:
    for days in (3, 9, 1.5, 7, 0.1, 12):
        aged(template, tmp_path / f"d{days}" / "s.jsonl", days)
    dry = removals(vacuum(daemon, str(tmp_path), "--max-age", "5d", "--dry-run", "--json"))
    assert [Path(r["path"]).parent.name for r in dry] == ["d12", "d9", "d7"]  # oldest first
    assert all(r["reason"] == "max-age" and not r["removed"] for r in dry)
    assert all(r["size"] == len(template) for r in dry)
    assert 7 * 86400 < dry[2]["age_seconds"] < 7 * 86400 + 3600
    assert len(list(tmp_path.rglob("*.jsonl"))) == 6  # the dry run changed nothing
    real = removals(vacuum(daemon, str(tmp_path), "--max-age", "5d", "--json"))
    assert [(r["path"], r["reason"]) for r in real] == [(r["path"], r["reason"]) for r in dry]
    assert all(r["removed"] and r["error"] is None for r in real)
    left = sorted(p.parent.name for p in tmp_path.rglob("*.jsonl"))
    assert left == ["d0.1", "d1.5", "d3"]
    # Under max-use, the oldest go first until the rest fit; the protected window
    # (default 1d) keeps d0.1 even when the limit is not met.
    text = vacuum(daemon, str(tmp_path), "--max-use", "0").stdout.splitlines()
    assert [line.split()[0] for line in text[:-1]] == ["removed", "removed"]
    assert [line.split()[-1] for line in text[:-1]] == ["max-use", "max-use"]
    assert "d3" in text[0] and "d1.5" in text[1] and text[-1].startswith("2 files, freed")
    assert [p.parent.name for p in tmp_path.rglob("*.jsonl")] == ["d0.1"]


def test_max_use_stops_once_under_the_limit(
    daemon: DaemonProcess, template: bytes, tmp_path: Path
) -> None:
    for days in range(2, 8):
        aged(template, tmp_path / f"{days}.jsonl", days)
    limit = str(len(template) * 4 + 10)
    result = removals(vacuum(daemon, str(tmp_path), "--max-use", limit, "--json"))
    assert [Path(r["path"]).name for r in result] == ["7.jsonl", "6.jsonl"]
    assert {r["reason"] for r in result} == {"max-use"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{d}.jsonl" for d in range(2, 6)]


def test_open_sessions_are_never_removed(
    daemon: DaemonProcess, template: bytes, tmp_path: Path
) -> None:
    root = daemon.root / "vac-open"
    old = aged(template, root / "old.jsonl", 30)
    with connect(daemon.socket) as client:
        live = client.create("vac-open/live.jsonl")
        run = live.begin_run()
        run.record(events.AgentStart(agent="live"))
        live.sync()
        idle = client.create("vac-open/idle.jsonl")  # held by a writer, no run open
        idle.sync()

        def idle_file_closed() -> bool:  # after --idle-timeout: only its writer holds it
            reply = client.status()
            return any(s.path.endswith("idle.jsonl") and not s.file_open for s in reply.sessions)

        wait_for(idle_file_closed)
        for path in (root / "live.jsonl", root / "idle.jsonl"):
            os.utime(path, (1, 1))
        result = removals(
            vacuum(
                daemon, str(root), "--max-use", "0", "--max-age", "0s", "--protect", "0s", "--json"
            )
        )
        assert [r["path"] for r in result] == [str(old)]
        assert sorted(p.name for p in root.iterdir()) == ["idle.jsonl", "live.jsonl"]
        run.close()
        live.close()
        idle.close()


def test_interrupted_session_is_removable_outside_the_window(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys\n"
            "from flightlog.protocol import events\n"
            "from flightlog.sdk import connect\n"
            "with connect(sys.argv[1]) as client:\n"
            "    s = client.create('vac-killed/k.jsonl')\n"
            "    s.begin_run().record(events.AgentStart(agent='k'))\n"
            "    s.sync()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n",
            daemon.socket,
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    path = daemon.root / "vac-killed" / "k.jsonl"
    kept = removals(vacuum(daemon, str(path.parent), "--max-age", "1h", "--json"))
    assert kept == []  # inside the protected window: kept
    # Once the daemon no longer holds it (the writer is gone), it is removable.
    wait_for(
        lambda: (
            vacuum(
                daemon, str(path.parent), "--max-use", "0", "--protect", "0s", "--dry-run", "--json"
            ).stdout
            != ""
        ),
        timeout=60,
    )
    result = removals(
        vacuum(daemon, str(path.parent), "--max-use", "0", "--protect", "0s", "--json")
    )
    assert [r["path"] for r in result] == [str(path)] and not path.exists()


@pytest.mark.parametrize("where", ["same", "other"])
def test_archive_keeps_the_relative_path_and_never_overwrites(
    daemon: DaemonProcess, template: bytes, tmp_path: Path, where: str
) -> None:
    root = tmp_path / "root"
    base = Path(tempfile.mkdtemp(dir="/dev/shm")) if where == "other" else tmp_path
    archive = base / "archive"
    try:
        one = aged(template, root / "a" / "one.jsonl", 10)
        two = aged(template, root / "b" / "two.jsonl", 9)
        content = one.read_bytes()
        taken = archive / "b" / "two.jsonl"
        taken.parent.mkdir(parents=True)
        taken.write_bytes(b"something else\n")
        result = vacuum(
            daemon,
            str(root),
            "--max-age",
            "2d",
            "--archive",
            str(archive),
            "--json",
            check_status=False,
        )
        assert result.returncode == 5
        [first, second] = removals(result)
        assert first["archived_to"] == str(archive / "a" / "one.jsonl") and first["removed"]
        assert not second["removed"] and "already in the archive" in second["error"]
        assert not one.exists() and check(archive / "a" / "one.jsonl").sound
        assert (archive / "a" / "one.jsonl").read_bytes() == content
        assert two.exists() and taken.read_bytes() == b"something else\n"
        assert not [p for p in archive.rglob("*") if "partial" in p.name]
    finally:
        if where == "other":
            shutil.rmtree(base, ignore_errors=True)


def test_a_file_that_cannot_be_removed_is_reported(
    daemon: DaemonProcess, template: bytes, tmp_path: Path
) -> None:
    path = aged(template, tmp_path / "locked" / "s.jsonl", 10)
    other = aged(template, tmp_path / "locked" / "t.jsonl", 11)
    if os.getuid() == 0:  # root may remove anything but an immutable file
        locked = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
        if locked.returncode != 0:
            pytest.skip("chattr +i is not available here")
        unlock = ["chattr", "-i", str(path)]
    else:
        path.parent.chmod(0o555)
        unlock = ["chmod", "755", str(path.parent)]
    try:
        result = vacuum(daemon, str(path.parent), "--max-age", "1d", check_status=False)
    finally:
        subprocess.run(unlock, check=True)
    assert result.returncode == 5, result.stderr
    assert "Traceback" not in result.stderr
    [error] = result.stderr.splitlines()
    assert error.startswith(f"flightlog: {path}: ") and error.endswith(": kept")
    assert path.exists() and check(path).sound
    if os.getuid() == 0:  # the other file, in a writable directory, went
        assert not other.exists() and result.stdout.startswith(f"removed  {other}")


@pytest.mark.parametrize(
    "args",
    [
        ["--max-use", "ten"],
        ["--max-age", "3 weeks"],
        ["--keep-free=-1G"],
        [],
        ["--max-use", "1G", "--protect", "x"],
    ],
)
def test_bad_arguments(daemon: DaemonProcess, tmp_path: Path, args: list[str]) -> None:
    result = vacuum(daemon, str(tmp_path), *args, check_status=False)
    assert result.returncode == 2 and result.stderr.startswith("flightlog: ")


def test_sigkill_mid_archive_leaves_every_file_whole(
    daemon: DaemonProcess, template: bytes, tmp_path: Path
) -> None:
    big = template.replace(b"x" * 20_000, b"x" * 400_000)
    root = tmp_path / "root"
    names = [f"s{i:03}/s.jsonl" for i in range(120)]
    for i, name in enumerate(names):
        aged(big, root / name, 10 + i / 100)
    archive = Path(tempfile.mkdtemp(dir="/dev/shm")) / "archive"  # another filesystem
    try:
        killed_midway = 0
        for _ in range(6):
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flightlog.cli",
                    "vacuum",
                    str(root),
                    "--max-age",
                    "1d",
                    "--archive",
                    str(archive),
                ],
                env={**os.environ, "FLIGHTLOG_SOCKET": daemon.socket},
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            assert process.stdout is not None
            process.stdout.readline()  # one file is archived: the next ones are moving
            process.send_signal(signal.SIGKILL)
            process.wait()
            process.stdout.close()
            moved = {str(p.relative_to(archive)) for p in archive.rglob("*.jsonl")}
            here = {str(p.relative_to(root)) for p in root.rglob("*.jsonl")}
            assert moved | here == set(names)  # every file is somewhere, whole
            for path in [*(archive / n for n in moved), *(root / n for n in here)]:
                report = check(path)
                assert report.sound and path.stat().st_size == len(big), path
            if here and moved:
                killed_midway += 1
            if not here:
                break
        assert killed_midway
        # A last run finishes: every file is in the archive, once, and sound.
        vacuum(daemon, str(root), "--max-age", "1d", "--archive", str(archive))
        assert not list(root.rglob("*.jsonl"))
        assert sorted(str(p.relative_to(archive)) for p in archive.rglob("*.jsonl")) == names
        assert all(check(p).sound for p in archive.rglob("*.jsonl"))
        assert not [p for p in archive.rglob("*") if "partial" in p.name]
    finally:
        shutil.rmtree(archive.parent, ignore_errors=True)


def test_keep_free(daemon: DaemonProcess, template: bytes, tmp_path: Path) -> None:
    for days in (3, 4):
        aged(template, tmp_path / f"{days}.jsonl", days)
    assert removals(vacuum(daemon, str(tmp_path), "--keep-free", "1K", "--json")) == []
    # More than the disk holds: every removable file goes, oldest first, for keep-free.
    result = removals(vacuum(daemon, str(tmp_path), "--keep-free", "1000000T", "--json"))
    assert [(Path(r["path"]).name, r["reason"]) for r in result] == [
        ("4.jsonl", "keep-free"),
        ("3.jsonl", "keep-free"),
    ]
    refused = vacuum(
        daemon,
        str(tmp_path),
        "--keep-free",
        "1T",
        "--archive",
        str(tmp_path.parent / f"{tmp_path.name}-archive"),
        check_status=False,
    )
    assert refused.returncode == 2 and "same filesystem" in refused.stderr


def test_damaged_files_go_by_age_and_the_archive_stays_outside(
    daemon: DaemonProcess, template: bytes, tmp_path: Path
) -> None:
    lines = aged(template, tmp_path / "damaged.jsonl", 8).read_bytes().splitlines(keepends=True)
    (tmp_path / "damaged.jsonl").write_bytes(b"".join(lines[:2]) + b"{not json\n")
    os.utime(tmp_path / "damaged.jsonl", (1, 1))
    result = removals(vacuum(daemon, str(tmp_path), "--max-age", "2d", "--json"))
    assert [(Path(r["path"]).name, r["reason"]) for r in result] == [("damaged.jsonl", "max-age")]
    inside = vacuum(
        daemon,
        str(tmp_path),
        "--max-age",
        "1d",
        "--archive",
        str(tmp_path / "a"),
        check_status=False,
    )
    assert inside.returncode == 2 and "is inside" in inside.stderr


def test_a_file_written_after_the_plan_is_kept(
    daemon: DaemonProcess, template: bytes, tmp_path: Path
) -> None:
    from flightlog.cli._vacuum import Limits, plan
    from flightlog.sdk._retention import remove

    path = aged(template, tmp_path / "s.jsonl", 5)
    [removal] = plan(
        [str(tmp_path)],
        Limits(max_age=timedelta(days=1)),
        socket=daemon.socket,
        now=datetime.now(UTC),
        free=None,
    )
    with path.open("ab") as fileobj:  # a writer came back between the plan and the removal
        fileobj.write(template.splitlines(keepends=True)[-1])
    remove(removal, None)
    assert removal.error == "written since it was planned: kept" and path.exists()


def test_archive_command_gets_each_file_and_a_failure_keeps_it(
    daemon: DaemonProcess, template: bytes, tmp_path: Path
) -> None:
    root, archive = tmp_path / "root", tmp_path / "archive"
    archive.mkdir()
    files = [aged(template, root / f"d{days}" / "s.jsonl", days) for days in (10, 11)]
    content = files[0].read_bytes()
    failing = "sh -c 'echo no room left >&2; exit 3' sh"
    kept = vacuum(
        daemon,
        str(root),
        "--max-age",
        "1d",
        "--archive-command",
        failing,
        "--json",
        check_status=False,
    )
    assert kept.returncode == 5
    assert [r["error"] for r in removals(kept)] == [
        "the archive command exited with 3 (no room left): kept"
    ] * 2
    assert all(f.exists() for f in files)
    copy = f'sh -c \'cp "$1" "{archive}/$(basename "$(dirname "$1")").jsonl"\' sh'
    done = removals(
        vacuum(daemon, str(root), "--max-age", "1d", "--archive-command", copy, "--json")
    )
    assert [r["removed"] for r in done] == [True, True]
    assert done[0]["archived_to"].endswith(f"sh {files[1]}")  # the oldest first
    assert not any(f.exists() for f in files)
    assert sorted(p.name for p in archive.iterdir()) == ["d10.jsonl", "d11.jsonl"]
    assert (archive / "d10.jsonl").read_bytes() == content
    both = vacuum(
        daemon,
        str(root),
        "--max-age",
        "1d",
        "--archive",
        str(archive),
        "--archive-command",
        "true",
        check_status=False,
    )
    assert both.returncode == 2 and "choose one" in both.stderr
