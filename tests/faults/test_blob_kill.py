"""SIGKILL of flightlogd in the middle of storing a blob: no line refers to a blob that
is missing or partial, no blob holds bytes other than its digest's, and the session
opens again and goes on."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import signal
import threading
import time
from pathlib import Path

from flightlog.protocol import events
from flightlog.protocol._blobs import BLOB_DIR
from flightlog.sdk import FlightlogError, check, connect, read
from flightlog.sdk._blobs import referenced_blobs
from support import DaemonProcess


def image(i: int) -> str:
    return base64.b64encode(
        b"\x89PNG\r\n\x1a\n" + os.urandom(3_000_000) + bytes([i % 256])
    ).decode()


def shot(i: int) -> events.ModelRequest:
    return events.ModelRequest(
        execution=events.Execution(id=f"m{i}", kind="model"),
        messages=[
            events.UserMessage(content=[events.ImagePart(media_type="image/png", data=image(i))])
        ],
    )


def temporaries(root: Path) -> list[Path]:
    store = root / BLOB_DIR
    if not store.exists():
        return []
    return [p for p in store.rglob("*.blob-tmp")]


def stored(root: Path) -> list[Path]:
    store = root / BLOB_DIR
    if not store.exists():
        return []
    return [p for p in (store / "sha256").rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_the_daemon_killed_while_storing_a_blob_loses_nothing(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp, "--blobs").start()
    stop = threading.Event()

    def agent() -> None:
        # No reconnecting: the daemon is killed under it, and nothing follows.
        with (
            contextlib.suppress(FlightlogError, OSError),
            connect(daemon.socket, reconnect_grace=0) as client,
        ):
            session = client.create("shots.jsonl")
            run = session.begin_run()
            for i in range(200):
                if stop.is_set():
                    return
                run.record(shot(i))
                if i % 5 == 4:
                    session.sync()

    writer = threading.Thread(target=agent)
    writer.start()
    caught = False
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and writer.is_alive():
            # A blob being stored, after others were: some lines refer to blobs.
            if temporaries(daemon.root) and len(stored(daemon.root)) >= 2:
                caught = True
                break
            time.sleep(0.0005)
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait()
    finally:
        stop.set()
        writer.join(60)
        daemon.stop()
    assert caught, "no blob was caught being stored"

    path = daemon.root / "shots.jsonl"
    report = check(path)
    assert report.sound, report  # every reference's blob is there, whole
    for blob in (daemon.root / BLOB_DIR / "sha256").rglob("*"):
        if blob.is_file() and not blob.name.startswith("."):
            assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    referred = referenced_blobs([path])
    assert referred and all(
        (daemon.root / BLOB_DIR / "sha256" / d[:2] / d).exists() for d in referred
    )

    # A new daemon opens the session and goes on after what was written.
    daemon = DaemonProcess(short_tmp, "--blobs").start()
    try:
        with connect(daemon.socket) as client:
            session = client.open("shots.jsonl")
            with session.begin_run() as run:
                run.record(shot(999))
            session.close()
    finally:
        daemon.stop()
    after = check(path)
    assert after.sound and after.last_seq > report.last_seq
    last = [r for r in read(path) if r.type == "model_request"][-1]
    assert b'"$flightlog":"blob"' not in bytes(last.data)  # resolved, whole
