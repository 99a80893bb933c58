"""Blobs stored once: flightlogd takes large base64 payloads out of the records it
writes, stores each once by SHA-256 beside the sessions, and every reader puts them
back; ``check`` verifies them; a reader without the store still reads every line."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol import Record, default_codec, events
from flightlog.protocol._blobs import BLOB_DIR
from flightlog.sdk import Transcript, check, connect, read
from flightlog.sdk._blobs import referenced_blobs, stored_blobs
from support import DaemonProcess
from support.daemon import as_uid, needs_root, shared_daemon

SCREENSHOT = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(b"screen").digest() * 700
SCREENSHOT64 = base64.b64encode(SCREENSHOT).decode()
PDF = b"%PDF-1.7\n" + hashlib.sha256(b"doc").digest() * 400
PDF_URL = "data:application/pdf;base64," + base64.b64encode(PDF).decode()


@pytest.fixture(scope="module", params=["speedups", "python"])
def daemon(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    """A real flightlogd; with its C accelerator (records come as line tails) and
    without (records come one by one): both ways take payloads out."""
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    env = {"FLIGHTLOG_NO_SPEEDUPS": "1"} if request.param == "python" else {}
    proc = DaemonProcess(base, "--blobs", env=env).start()
    try:
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(base, ignore_errors=True)


def request(i: int) -> events.ModelRequest:
    return events.ModelRequest(
        execution=events.Execution(id=f"m{i}", kind="model"),
        messages=[
            events.UserMessage(
                content=[
                    events.TextPart(text=f"what changed on screen {i}?"),
                    events.ImagePart(media_type="image/png", data=SCREENSHOT64),
                ]
            )
        ],
    )


def tool_result(i: int) -> events.ToolExecEnd:
    return events.ToolExecEnd(
        execution=events.Execution(id=f"t{i}", kind="tool"),
        tool_call_id=f"c{i}",
        name="fetch",
        content=[{"type": "document", "url": PDF_URL}, "small text"],
    )


def record(daemon: DaemonProcess, path: str, recorded: list[events.Event]) -> Path:
    with connect(daemon.socket) as client:
        session = client.create(path)
        with session.begin_run() as run:
            for event in recorded:
                run.record(event)
        session.close()
    return daemon.root / path


def blob_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / BLOB_DIR / "sha256").rglob("*") if p.is_file())


def data_of(records: list[Record]) -> list[bytes]:
    return [bytes(r.data) for r in records if r.type in ("model_request", "tool_exec_end")]


def test_payloads_are_stored_once_and_read_back_exactly(daemon: DaemonProcess) -> None:
    recorded: list[events.Event] = [request(0), tool_result(0), request(1), tool_result(1)]
    path = record(daemon, "blobs/screens.jsonl", recorded)
    other = record(daemon, "blobs/again.jsonl", [request(2)])

    # Two distinct payloads in five places of two sessions: two blobs.
    files = blob_files(daemon.root)
    assert sorted(p.name for p in files) == sorted(
        [hashlib.sha256(SCREENSHOT).hexdigest(), hashlib.sha256(PDF).hexdigest()]
    )
    assert {p.read_bytes() for p in files} == {SCREENSHOT, PDF}
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE((daemon.root / BLOB_DIR).stat().st_mode) == 0o700
    # The session file holds references, not payloads.
    raw = path.read_bytes()
    assert SCREENSHOT64.encode() not in raw and len(raw) < len(SCREENSHOT64)
    assert raw.count(b'"$flightlog":"blob"') == 4

    # read() gives back what was recorded, byte for byte.
    expected = [bytes(default_codec.encode_event(e).data) for e in recorded]
    assert data_of(list(read(path))) == expected
    decoded = default_codec.decode_event(next(r for r in read(path) if r.type == "model_request"))
    assert decoded == recorded[0]
    assert check(path).sound and check(other).sound
    assert referenced_blobs([path.parent]) == {p.name for p in files}
    # The prompt rebuild sees the image.
    prompts = list(Transcript.read(path).prompts())
    assert SCREENSHOT64 in json.dumps([str(p.messages) for p in prompts])
    # So does the command line, straight from the file.
    shown = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "tail", "--json", str(path)],
        capture_output=True,
        check=True,
    ).stdout
    assert shown.count(SCREENSHOT64.encode()) == 2 and PDF_URL.encode() in shown


def test_tails_through_the_daemon_give_the_payloads_back(daemon: DaemonProcess) -> None:
    """A subscriber of ``tail`` and ``tail_all`` over the socket reads what read()
    reads: the payloads, not the references the file holds."""
    recorded: list[events.Event] = [request(0), tool_result(0)]
    expected = [bytes(default_codec.encode_event(e).data) for e in recorded]
    with connect(daemon.socket) as client, client.tail_all(follow=True) as live:
        path = record(daemon, "blobs/tailed.jsonl", recorded)
        assert b'"$flightlog":"blob"' in path.read_bytes()
        assert data_of(list(client.tail(str(path)))) == expected
        seen: list[Record] = []
        for at, found in live:
            if at == str(path):
                seen.append(found)
                if found.type == "tool_exec_end":
                    break
        assert data_of(seen) == expected


def test_small_events_are_written_as_they_were(daemon: DaemonProcess) -> None:
    small = tool_result(0)
    small = events.ToolExecEnd(
        execution=small.execution, tool_call_id="c", name="n", content=["QUJD" * 500]
    )
    path = record(daemon, "blobs/small.jsonl", [small])
    assert b"QUJD" * 500 in path.read_bytes()
    assert not (daemon.root / BLOB_DIR).exists() or b"QUJD" * 500 not in b"".join(
        p.read_bytes() for p in blob_files(daemon.root)
    )


def test_check_names_a_damaged_or_missing_blob(daemon: DaemonProcess, tmp_path: Path) -> None:
    path = record(daemon, "blobs/damaged.jsonl", [tool_result(0), request(1)])
    copy_root = tmp_path / "copy"
    shutil.copytree(daemon.root / "blobs", copy_root / "blobs")
    shutil.copytree(daemon.root / BLOB_DIR, copy_root / BLOB_DIR)
    session = copy_root / "blobs" / "damaged.jsonl"
    assert check(session).sound

    pdf_blob = next(p for p in (copy_root / BLOB_DIR).rglob(hashlib.sha256(PDF).hexdigest()))
    pdf_blob.write_bytes(PDF[:-1] + b"!")
    report = check(session)
    assert not report.sound and report.error_line == 3
    assert "does not match its digest" in (report.error or "")
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "check", str(session)], capture_output=True
    )
    assert result.returncode != 0
    # A damaged blob is never put back: the reference stays.
    assert b'"$flightlog":"blob"' in data_of(list(read(session)))[0]

    pdf_blob.unlink()
    report = check(session)
    assert not report.sound and "is missing" in (report.error or "")
    assert path.exists()


def test_a_reader_without_the_store_reads_every_line(daemon: DaemonProcess) -> None:
    path = record(daemon, "blobs/alone.jsonl", [request(0), tool_result(0)])
    alone = Path(os.environ.get("TMPDIR", "/tmp")) / f"fl-alone-{os.getpid()}.jsonl"
    shutil.copyfile(path, alone)
    try:
        records = list(read(alone))
        assert [r.seq for r in records] == [1, 2, 3, 4, 5]
        assert all(b'"$flightlog":"blob"' in d for d in data_of(records))
        report = check(alone)
        assert report.sound and any("no blob store" in w for w in report.warnings)
    finally:
        alone.unlink()


@needs_root
def test_a_uids_blobs_live_in_its_own_directory() -> None:
    uid = 42017

    def agent(socket: str) -> None:
        with connect(socket) as client:
            session = client.create("mine.jsonl")
            with session.begin_run() as run:
                run.record(request(0))
            session.close()

    with shared_daemon("--blobs") as shared:
        as_uid(uid, lambda: agent(shared.socket))
        own = shared.root / "uid" / str(uid)
        files = blob_files(own)
        assert [p.name for p in files] == [hashlib.sha256(SCREENSHOT).hexdigest()]
        assert not (shared.root / BLOB_DIR).exists()
        for p in [*files, own / BLOB_DIR, *(own / BLOB_DIR).rglob("*")]:
            st = p.stat()
            assert st.st_uid == os.geteuid()
            assert stat.S_IMODE(st.st_mode) == (0o600 if p.is_file() else 0o700)
        assert check(own / "mine.jsonl").sound
        assert SCREENSHOT64.encode() in b"".join(data_of(list(read(own / "mine.jsonl"))))


def test_stored_and_referenced_blobs_tell_what_nobody_needs(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    record(daemon, "blobs/one.jsonl", [request(0)])
    record(daemon, "blobs/two.jsonl", [tool_result(0)])
    stored = {digest: size for digest, _, size in stored_blobs(daemon.root / BLOB_DIR)}
    assert stored[hashlib.sha256(SCREENSHOT).hexdigest()] == len(SCREENSHOT)
    assert stored[hashlib.sha256(PDF).hexdigest()] == len(PDF)
    (daemon.root / "blobs" / "two.jsonl").rename(tmp_path / "two.jsonl")
    try:
        assert hashlib.sha256(SCREENSHOT).hexdigest() in referenced_blobs([daemon.root])
        assert referenced_blobs([tmp_path]) == {hashlib.sha256(PDF).hexdigest()}
        assert set(stored) >= referenced_blobs([daemon.root, tmp_path])
    finally:
        (tmp_path / "two.jsonl").rename(daemon.root / "blobs" / "two.jsonl")
