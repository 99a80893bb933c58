"""Blobs under retention: once sessions go (by flightlogd's sweep or ``flightlog
vacuum``), the blobs no remaining session refers to go too, counted in the log and in
``vacuum --dry-run``; a blob a session refers to never goes, nor one a writer has
stored for a line not yet written; archiving carries a session's blobs; a SIGKILL in
the middle of a vacuum leaves every remaining session whole, each reference resolved."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from flightlog.daemon._blobstore import BlobStore
from flightlog.daemon._paths import Roots
from flightlog.protocol import events, format_time
from flightlog.protocol._blobs import BLOB_DIR, extract
from flightlog.sdk import check, connect, read
from flightlog.sdk.storage import collect_blobs
from support import DaemonProcess, wait_for
from support.daemon import as_uid, log_events, needs_root

OTHER = 64011

SCREENSHOT = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(b"screen").digest() * 700
PDF = b"%PDF-1.7\n" + hashlib.sha256(b"doc").digest() * 400
SHOT_SHA = hashlib.sha256(SCREENSHOT).hexdigest()
PDF_SHA = hashlib.sha256(PDF).hexdigest()
_TIME = re.compile(rb'"time":"[^"]*"')


def image(data: bytes, i: int = 0) -> events.ModelRequest:
    return events.ModelRequest(
        execution=events.Execution(id=f"m{i}", kind="model"),
        messages=[
            events.UserMessage(
                content=[
                    events.TextPart(text=f"what is on screen {i}?"),
                    events.ImagePart(media_type="image/png", data=base64.b64encode(data).decode()),
                ]
            )
        ],
    )


@pytest.fixture
def base() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def record(base: Path, sessions: dict[str, list[events.Event]]) -> None:
    """Record each session through a real flightlogd with blobs on, then stop it."""
    proc = DaemonProcess(base, "--blobs").start()
    try:
        with connect(proc.socket) as client:
            for path, recorded in sessions.items():
                session = client.create(path)
                with session.begin_run() as run:
                    for event in recorded:
                        run.record(event)
                session.close()
    finally:
        proc.stop()


def age(path: Path, days: float) -> None:
    """Make the session at ``path`` ``days`` old: its records' times and its mtime."""
    moment = datetime.now(UTC) - timedelta(days=days)
    stamp = b'"time":"%s"' % format_time(moment).encode()
    path.write_bytes(_TIME.sub(stamp, path.read_bytes()))
    os.utime(path, (moment.timestamp(), moment.timestamp()))


def blob(root: Path, digest: str) -> Path:
    return root / BLOB_DIR / "sha256" / digest[:2] / digest


def whole(path: Path) -> bool:
    """The session is sound and every blob reference in it resolves."""
    report = check(path)
    return report.sound and not [w for w in report.warnings if "blob" in w]


def vacuum(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "vacuum", str(root), *args],
        env={**os.environ, "FLIGHTLOG_SOCKET": str(root / "no-daemon.sock")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def two_sessions(base: Path) -> Path:
    """``old.jsonl`` (10 days old: the screenshot and the PDF) and ``new.jsonl`` (the
    screenshot): when old goes, only the PDF is left unreferenced."""
    record(
        base, {"old.jsonl": [image(SCREENSHOT), image(PDF, 1)], "new.jsonl": [image(SCREENSHOT)]}
    )
    root = base / "root"
    age(root / "old.jsonl", 10)
    assert blob(root, SHOT_SHA).is_file() and blob(root, PDF_SHA).is_file()
    return root


def sweeping(base: Path) -> DaemonProcess:
    """A flightlogd sweeping ``base``'s root with ``--max-age 1d``, once it has removed a
    blob and logged its sweep (the sweep's line comes after its removals')."""
    proc = DaemonProcess(
        base, "--blobs", "--log-format", "json", "--max-age", "1d", "--vacuum-interval", "0.05"
    ).start()
    try:
        wait_for(
            lambda: any(
                e.get("event") == "retention_sweep" and e.get("blobs_removed")
                for e in log_events(proc)
            )
        )
    except BaseException:
        proc.stop()
        raise
    return proc


def test_a_sweep_removes_the_blobs_only_removed_sessions_referred_to(base: Path) -> None:
    root = two_sessions(base)
    proc = sweeping(base)
    try:
        [removed] = [e for e in log_events(proc) if e.get("event") == "blob_removed"]
        [sweep] = [e for e in log_events(proc) if e.get("event") == "retention_sweep"]
    finally:
        proc.stop()
    assert not (root / "old.jsonl").exists()
    assert removed["path"] == str(blob(root, PDF_SHA)) and removed["size"] == len(PDF)
    assert sweep["blobs_removed"] == 1 and sweep["blob_bytes_freed"] == len(PDF)
    assert not blob(root, PDF_SHA).exists()
    assert blob(root, SHOT_SHA).is_file()  # new.jsonl refers to it
    assert whole(root / "new.jsonl")
    [request] = [r for r in read(root / "new.jsonl") if r.type == "model_request"]
    assert base64.b64encode(SCREENSHOT) in bytes(request.data)


def test_fifos_named_like_sessions_neither_hang_a_sweep_nor_go(base: Path) -> None:
    root = two_sessions(base)
    fifos = [root / "x.jsonl", root / "x.jsonl.zst", root / "deeper" / "y.jsonl"]
    (root / "deeper").mkdir()
    for fifo in fifos:
        os.mkfifo(fifo)  # no writer, ever: a reader opening one would wait for ever
    proc = sweeping(base)
    try:
        [sweep] = [e for e in log_events(proc) if e.get("event") == "retention_sweep"]
        assert sweep["files"] == 2 and sweep["removed"] == 1  # old and new, no FIFO
        # Sweeps go on (status shows a later survey each time), counting no FIFO.
        [mine] = _swept_storage(proc)
    finally:
        proc.stop()
    assert not (root / "old.jsonl").exists() and not blob(root, PDF_SHA).exists()
    assert blob(root, SHOT_SHA).is_file() and whole(root / "new.jsonl")
    assert all(stat.S_ISFIFO(fifo.lstat().st_mode) for fifo in fifos)
    assert mine.files == 1 and mine.bytes == (root / "new.jsonl").stat().st_size


def test_vacuum_dry_run_counts_the_blobs_a_run_removes(base: Path) -> None:
    root = two_sessions(base)
    dry = vacuum(root, "--max-age", "1d", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = [json.loads(line) for line in dry.stdout.splitlines()]
    assert [p.get("path") for p in planned if "blob" not in p] == [str(root / "old.jsonl")]
    [gone] = [p for p in planned if "blob" in p]
    assert gone == {
        "blob": PDF_SHA,
        "path": str(blob(root, PDF_SHA)),
        "size": len(PDF),
        "reason": "unreferenced",
        "removed": False,
        "error": None,
    }
    assert blob(root, PDF_SHA).is_file() and (root / "old.jsonl").is_file()
    done = vacuum(root, "--max-age", "1d")
    assert done.returncode == 0, done.stderr
    assert f"removed  {blob(root, PDF_SHA)}" in done.stdout
    assert "1 files, freed" in done.stdout and "; 1 blobs, freed" in done.stdout
    assert not blob(root, PDF_SHA).exists() and blob(root, SHOT_SHA).is_file()
    assert whole(root / "new.jsonl")


def test_an_archived_session_keeps_its_blobs_in_the_archive(base: Path) -> None:
    root = two_sessions(base)
    archive = Path(tempfile.mkdtemp(dir="/dev/shm")) / "archive"  # another filesystem
    try:
        done = vacuum(root, "--max-age", "1d", "--archive", str(archive))
        assert done.returncode == 0, done.stderr
        assert not (root / "old.jsonl").exists() and not blob(root, PDF_SHA).exists()
        assert blob(archive, PDF_SHA).read_bytes() == PDF
        assert blob(archive, SHOT_SHA).read_bytes() == SCREENSHOT
        assert whole(archive / "old.jsonl") and whole(root / "new.jsonl")
        data = b"".join(bytes(r.data) for r in read(archive / "old.jsonl"))
        assert base64.b64encode(PDF) in data and base64.b64encode(SCREENSHOT) in data
    finally:
        shutil.rmtree(archive.parent, ignore_errors=True)


def test_an_archive_command_is_told_the_blobs_of_the_session(base: Path) -> None:
    root = two_sessions(base)
    told = base / "told"
    done = vacuum(
        root, "--max-age", "1d", "--archive-command", f"sh -c 'echo \"$FLIGHTLOG_BLOBS\" > {told}'"
    )
    assert done.returncode == 0, done.stderr
    assert sorted(told.read_text().split()) == sorted(
        [str(blob(root, SHOT_SHA)), str(blob(root, PDF_SHA))]
    )


def test_a_blob_whose_line_is_on_its_way_is_kept(base: Path) -> None:
    """A writer (the daemon's own blob store) stored a blob nobody refers to yet and
    holds the store's lock until its line is written: a collection running meanwhile
    waits, sees the line, and keeps the blob."""
    root = base / "root"
    root.mkdir()
    roots = Roots(str(root))
    resolved = roots.resolve("s.jsonl")
    line = b'{"image":"%s"}' % base64.b64encode(SCREENSHOT)
    changed, blobs = extract(line)
    (root / "s.jsonl").write_bytes(b"")
    lock = BlobStore(roots).save(resolved, blobs)
    removed: list[Any] = []
    collector = threading.Thread(
        target=lambda: removed.extend(collect_blobs(str(root / BLOB_DIR))), daemon=True
    )
    try:
        collector.start()
        # The collection has scanned (the blob unreferenced) and waits for the lock.
        waiting = f":{os.stat(root / BLOB_DIR / 'lock').st_ino} "
        wait_for(
            lambda: any(
                "->" in line and waiting in line
                for line in Path("/proc/locks").read_text().splitlines()
            )
        )
        with open(root / "s.jsonl", "ab") as session:
            session.write(changed + b"\n")
    finally:
        os.close(lock)
    collector.join(timeout=30)
    assert not collector.is_alive()
    assert removed == [] and blob(root, SHOT_SHA).read_bytes() == SCREENSHOT
    # Once no line refers to it, it goes.
    (root / "s.jsonl").write_bytes(b"")
    [gone] = collect_blobs(str(root / BLOB_DIR))
    assert gone.sha256 == SHOT_SHA and gone.size == len(SCREENSHOT) and gone.error is None
    assert not blob(root, SHOT_SHA).exists()


def test_sigkill_mid_vacuum_leaves_every_remaining_session_whole(base: Path) -> None:
    shots = [hashlib.sha256(b"%d" % i).digest() * 200 for i in range(240)]
    sessions = {
        f"s{i:02}.jsonl": [image(shots[j], j) for j in range(i * 8, i * 8 + 16)] for i in range(29)
    }
    record(base, sessions)
    root = base / "root"
    for i in range(0, 29, 2):
        age(root / f"s{i:02}.jsonl", 10)
    killed = 0
    for _ in range(8):
        # Killed as soon as it has removed a session: in the middle of its removals.
        before = len(list(root.glob("*.jsonl")))
        proc = subprocess.Popen(
            [sys.executable, "-m", "flightlog.cli", "vacuum", str(root), "--max-age", "1d"],
            env={**os.environ, "FLIGHTLOG_SOCKET": str(root / "no-daemon.sock")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while proc.poll() is None and len(list(root.glob("*.jsonl"))) == before:
            time.sleep(0.001)
        if proc.poll() is None:
            proc.kill()
            killed += 1
        proc.wait()
        for path in root.glob("*.jsonl"):
            assert whole(path), path
    done = vacuum(root, "--max-age", "1d")
    assert done.returncode == 0, done.stderr
    remaining = sorted(p.name for p in root.glob("*.jsonl"))
    assert remaining == [f"s{i:02}.jsonl" for i in range(1, 29, 2)]
    assert all(whole(root / name) for name in remaining)
    referred = {
        hashlib.sha256(shots[j]).hexdigest()
        for i in range(1, 29, 2)
        for j in range(i * 8, i * 8 + 16)
    }
    stored = {p.name for p in (root / BLOB_DIR / "sha256").rglob("*") if p.is_file()}
    assert stored == referred
    assert killed  # at least one vacuum was killed before it finished


@needs_root
def test_a_directory_the_collection_cannot_list_keeps_every_blob(base: Path) -> None:
    """A session in a directory the caller may not list may refer to any blob: the
    collection stops, and removes nothing."""
    base.chmod(0o755)
    root = base / "root"
    (root / "private").mkdir(parents=True)
    line = b'{"image":"%s"}' % base64.b64encode(SCREENSHOT)
    changed, blobs = extract(line)
    roots = Roots(str(root))
    os.close(BlobStore(roots).save(roots.resolve("private/s.jsonl"), blobs))
    (root / "private" / "s.jsonl").write_bytes(changed + b"\n")
    (root / "private").chmod(0o700)  # root's, not the caller's
    for p in [root, *(root / BLOB_DIR).rglob("*"), root / BLOB_DIR]:
        os.chown(p, OTHER, OTHER)

    def collect() -> str:
        try:
            collect_blobs(str(root / BLOB_DIR))
        except PermissionError as exc:
            return f"refused: {exc.filename}"
        return "collected"

    assert blob(root, SHOT_SHA).is_file()
    assert as_uid(OTHER, collect) == f"refused: {root / 'private'}"
    assert blob(root, SHOT_SHA).read_bytes() == SCREENSHOT


#: Three 300 KB images: the sessions are a few KB, their blobs most of their use.
BIG = {name: b"\x89PNG\r\n\x1a\n" + hashlib.sha256(name.encode()).digest() * 9375 for name in "ABC"}
BIG_SHA = {name: hashlib.sha256(data).hexdigest() for name, data in BIG.items()}


def blobbed_sessions(base: Path) -> Path:
    """``s1`` (10 days old: images A and B), ``s2`` (5 days: C), ``s3`` (2 days: A).
    Under ``--max-use 500000`` counting blobs (900 KB of them): s1 goes and frees B
    only (s3 still refers to A): 600 KB, still over; s2 goes and frees C: 300 KB."""
    record(
        base,
        {
            "s1.jsonl": [image(BIG["A"]), image(BIG["B"], 1)],
            "s2.jsonl": [image(BIG["C"])],
            "s3.jsonl": [image(BIG["A"])],
        },
    )
    root = base / "root"
    for name, days in (("s1", 10), ("s2", 5), ("s3", 2)):
        age(root / f"{name}.jsonl", days)
    assert sum(p.stat().st_size for p in root.glob("*.jsonl")) < 20_000
    return root


def test_vacuum_counts_blobs_toward_max_use_and_keeps_a_shared_one(base: Path) -> None:
    root = blobbed_sessions(base)
    dry = vacuum(root, "--max-use", "500000", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = [json.loads(line) for line in dry.stdout.splitlines()]
    assert [(p["path"], p["reason"]) for p in planned if "blob" not in p] == [
        (str(root / "s1.jsonl"), "max-use"),
        (str(root / "s2.jsonl"), "max-use"),
    ]
    assert sorted(p["blob"] for p in planned if "blob" in p) == sorted([BIG_SHA["B"], BIG_SHA["C"]])
    done = vacuum(root, "--max-use", "500000")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in root.glob("*.jsonl")) == ["s3.jsonl"]
    assert not blob(root, BIG_SHA["B"]).exists() and not blob(root, BIG_SHA["C"]).exists()
    assert blob(root, BIG_SHA["A"]).read_bytes() == BIG["A"]  # s3 refers to it
    assert whole(root / "s3.jsonl")
    # Under the limit now: another run removes nothing.
    again = vacuum(root, "--max-use", "500000", "--dry-run", "--json")
    assert again.returncode == 0 and again.stdout == ""


def test_the_daemon_counts_blobs_toward_max_use(base: Path) -> None:
    root = blobbed_sessions(base)
    proc = DaemonProcess(
        base, "--blobs", "--log-format", "json", "--max-use", "500000", "--vacuum-interval", "0.05"
    ).start()
    try:
        wait_for(
            lambda: len([e for e in log_events(proc) if e.get("event") == "blob_removed"]) == 2
        )
        removed = [e for e in log_events(proc) if e.get("event") == "session_removed"]
        [mine] = _swept_storage(proc)
    finally:
        proc.stop()
    assert [(e["path"], e["reason"]) for e in removed] == [
        (str(root / "s1.jsonl"), "max-use"),
        (str(root / "s2.jsonl"), "max-use"),
    ]
    assert blob(root, BIG_SHA["A"]).is_file() and whole(root / "s3.jsonl")
    assert (mine.files, mine.blobs, mine.blob_bytes) == (1, 1, len(BIG["A"]))
    assert mine.bytes + mine.blob_bytes <= 500_000


@needs_root
def test_one_uids_blobs_never_count_against_another(base: Path) -> None:
    """Each uid's blobs count toward its own ``--max-use``; ``--max-use-total`` counts
    every uid's together."""
    root = blobbed_sessions(base)
    for directory in (base, base / "run"):  # another uid reaches the socket
        directory.mkdir(exist_ok=True)
        directory.chmod(0o755)
    proc = DaemonProcess(
        base,
        "--blobs",
        "--log-format",
        "json",
        "--socket-mode",
        "0666",
        "--max-use",
        "800000",
        "--vacuum-interval",
        "0.05",
    ).start()
    try:
        # Another uid's 600 KB: over nothing alone, but root's 900 KB is over 800 KB.
        as_uid(
            OTHER,
            lambda: _record_through(proc.socket, "o.jsonl", [image(BIG["B"]), image(BIG["C"], 1)]),
        )
        wait_for(lambda: any(e.get("event") == "blob_removed" for e in log_events(proc)))
        removed = [e["path"] for e in log_events(proc) if e.get("event") == "session_removed"]
        seen = {s.uid: s for s in _swept_storage(proc)}
    finally:
        proc.stop()
    theirs = root / "uid" / str(OTHER)
    assert removed == [str(root / "s1.jsonl")]  # frees B: 600 KB left, under 800 KB
    assert (theirs / "o.jsonl").is_file() and whole(theirs / "o.jsonl")
    assert blob(theirs, BIG_SHA["B"]).is_file() and blob(theirs, BIG_SHA["C"]).is_file()
    assert (seen[OTHER].blobs, seen[OTHER].blob_bytes) == (2, len(BIG["B"]) + len(BIG["C"]))
    assert seen[0].blob_bytes == len(BIG["A"]) + len(BIG["C"])
    # Together they use 1.2 MB: a total of 1 MB takes the oldest removable, whoever's.
    age(theirs / "o.jsonl", 20)
    proc = DaemonProcess(
        base,
        "--blobs",
        "--log-format",
        "json",
        "--max-use-total",
        "1000000",
        "--vacuum-interval",
        "0.05",
    ).start()
    try:
        wait_for(lambda: any(e.get("event") == "blob_removed" for e in log_events(proc)))
        removed = [e["path"] for e in log_events(proc) if e.get("event") == "session_removed"]
    finally:
        proc.stop()
    assert removed == [str(theirs / "o.jsonl")]  # frees B and C of its store: 600 KB
    assert not blob(theirs, BIG_SHA["B"]).exists() and blob(root, BIG_SHA["C"]).is_file()


def _record_through(socket: str, path: str, recorded: list[events.Event]) -> None:
    with connect(socket) as client:
        session = client.create(path)
        with session.begin_run() as run:
            for event in recorded:
                run.record(event)
        session.close()


def _swept_storage(proc: DaemonProcess) -> list[Any]:
    """What ``status`` says of storage once another sweep has surveyed the root."""
    with connect(proc.socket) as client:
        first = client.status().storage[0].surveyed
        wait_for(lambda: client.status().storage[0].surveyed != first, timeout=60)
        return list(client.status().storage)
