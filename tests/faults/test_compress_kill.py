"""SIGKILL in the middle of compressing a session, by ``flightlog compress`` and by the
daemon: the session file stays whole and readable in one form or the other, nothing
is lost, and the next compression or open goes on as if nothing happened."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec

from flightlog.protocol import Record, events, new_id, now
from flightlog.protocol._records import encode_line
from flightlog.sdk import check, connect, read
from flightlog.sdk._compression import TEMP_SUFFIX, ZSTD_MAGIC, compress_path
from support import DaemonProcess, wait_for


def big_session(path: Path, megabytes: int) -> bytes:
    """A sound session file of about ``megabytes`` MB of varied tool output."""
    session_id, run_id = new_id(), new_id()
    lines = [
        encode_line(
            Record(
                session_id=session_id,
                seq=1,
                type="session_start",
                time=now(),
                run_id=None,
                data=msgspec.Raw(b'{"format_version":1,"meta":{}}'),
            )
        )
    ]
    seq, size = 1, 0
    while size < megabytes * 1_000_000:
        seq += 1
        text = "".join(f"line {seq}.{j}: value {seq * 7919 + j * 104729}\n" for j in range(200))
        data = msgspec.json.encode({"tool_call_id": f"c{seq}", "content": [text]})
        lines.append(
            encode_line(
                Record(
                    session_id=session_id,
                    seq=seq,
                    type="tool_exec_end",
                    time=now(),
                    run_id=run_id,
                    data=msgspec.Raw(data),
                )
            )
        )
        size += len(lines[-1])
    path.parent.mkdir(parents=True, exist_ok=True)
    content = b"".join(lines)
    path.write_bytes(content)
    return content


def temp_files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.endswith(TEMP_SUFFIX)]


def kill_when_writing(proc: subprocess.Popen[bytes], directory: Path) -> bool:
    """SIGKILL ``proc`` once its temporary copy has bytes; whether it was caught there."""
    deadline = time.monotonic() + 120
    caught = False
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.stat().st_size > 0 for p in temp_files(directory) if p.exists()):
            caught = True
            break
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return caught


def one_run(daemon: DaemonProcess, event: events.Event) -> None:
    """Open ``agent/big.jsonl`` through ``daemon``, write a run of ``event``, close it."""
    with connect(daemon.socket) as client:
        session = client.open("agent/big.jsonl")
        with session.begin_run() as run:
            run.record(event)
        session.close()


def same_records(path: Path, content: bytes) -> bool:
    plain = path.parent / "plain-copy.jsonl.orig"
    plain.write_bytes(content)
    try:
        return [(r.seq, r.data) for r in read(path)] == [(r.seq, r.data) for r in read(plain)]
    finally:
        plain.unlink()


def test_flightlog_compress_killed_midway_loses_nothing(short_tmp: Path) -> None:
    path = short_tmp / "sessions" / "big.jsonl"
    content = big_session(path, 40)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flightlog.cli", "compress", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert kill_when_writing(proc, path.parent), "compression ended before it was caught"

    # The file is the original, whole; the partial copy is a hidden temporary.
    assert path.read_bytes() == content
    assert check(path).sound
    assert temp_files(path.parent)
    # The next compression removes the leftover and does the work.
    subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "compress", str(path)], check=True, timeout=300
    )
    assert path.read_bytes()[:4] == ZSTD_MAGIC
    assert not temp_files(path.parent)
    assert same_records(path, content)
    assert check(path).sound


def test_the_daemon_killed_while_compressing_loses_nothing(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp, "--compress-after", "3600").start()
    try:
        with connect(daemon.socket) as client:
            session = client.create("agent/big.jsonl")
            session.close()
    finally:
        daemon.stop()
    # A long session the daemon closes: its last run is written through it.
    path = daemon.root / "agent" / "big.jsonl"
    header = path.read_bytes()
    content = big_session(path, 40)
    # Keep the session's id: the daemon's first line, then the big file's records.
    content = header + content[content.index(b"\n") + 1 :].replace(
        msgspec.json.decode(content.split(b"\n")[0])["session_id"].encode(),
        msgspec.json.decode(header)["session_id"].encode(),
    )
    path.write_bytes(content)
    assert check(path).sound

    daemon = DaemonProcess(short_tmp, "--compress-after", "0.2").start()
    try:
        one_run(daemon, events.AgentStart(agent="a"))
        assert daemon.proc is not None
        assert kill_when_writing(daemon.proc, path.parent), "compressed before it was caught"
    finally:
        daemon.stop()
    # Plain, whole, with the run the daemon wrote before it was killed.
    written = path.read_bytes()
    assert written.startswith(content)
    assert written.count(b"\n") == content.count(b"\n") + 3
    assert check(path).sound

    # A new daemon opens it and goes on after it; it compresses it once closed.
    daemon = DaemonProcess(short_tmp, "--compress-after", "0.2").start()
    try:
        one_run(daemon, events.AgentEnd(agent="a"))
        wait_for(lambda: path.read_bytes()[:4] == ZSTD_MAGIC, timeout=120)
    finally:
        daemon.stop()
    records = list(read(path))
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    assert len(records) == written.count(b"\n") + 3
    assert check(path).sound
    assert not temp_files(path.parent)


def test_the_daemon_killed_while_restoring_a_compressed_session_loses_nothing(
    short_tmp: Path,
) -> None:
    """A compressed session opens as it is; its first write gives it its plain form:
    SIGKILL in the middle of that leaves the compressed file whole, and the next daemon
    restores it and goes on after it."""
    path = short_tmp / "root" / "agent" / "big.jsonl"
    content = big_session(path, 40)
    assert compress_path(path) is not None
    daemon = DaemonProcess(short_tmp).start()
    try:

        def first_write() -> None:
            # The daemon is killed under it.
            with contextlib.suppress(Exception), connect(daemon.socket, reconnect_grace=0) as c:
                session = c.open("agent/big.jsonl")
                with session.begin_run() as run:
                    run.record(events.AgentStart(agent="a"))

        writer = threading.Thread(target=first_write, daemon=True)
        writer.start()
        assert daemon.proc is not None
        assert kill_when_writing(daemon.proc, path.parent), "restored before it was caught"
        writer.join(timeout=60)
    finally:
        daemon.stop()
    assert path.read_bytes()[:4] == ZSTD_MAGIC  # the compressed file, whole
    assert same_records(path, content) and check(path).sound
    assert temp_files(path.parent)

    daemon = DaemonProcess(short_tmp).start()
    try:
        one_run(daemon, events.AgentStart(agent="b"))
    finally:
        daemon.stop()
    written = path.read_bytes()
    assert written.startswith(content)  # plain, every line before, then the new run
    assert written.count(b"\n") == content.count(b"\n") + 3
    assert check(path).sound and not temp_files(path.parent)
