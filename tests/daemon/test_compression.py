"""Closed sessions compressed by the daemon (``--compress-after``): every reader reads
them as before, a tail follows across the change, and opening one to continue it goes
on after what it held."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol import Execution, Record
from flightlog.protocol.events import ToolExecEnd
from flightlog.sdk import Client, check, connect, read
from flightlog.sdk._compression import ZSTD_MAGIC
from support import DaemonProcess, wait_for


@pytest.fixture
def compressing(short_tmp: Path) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(short_tmp, "--compress-after", "0.2", "--log-format", "json").start()
    try:
        yield daemon
    finally:
        daemon.stop()


def tool_result(i: int, lines: int = 40) -> ToolExecEnd:
    listing = "".join(f"src/module_{j}.py\n" for j in range(lines))
    return ToolExecEnd(
        execution=Execution(id=f"t{i}", kind="tool"),
        tool_call_id=f"call_{i}",
        name="ls",
        content=[{"type": "text", "text": listing}],
    )


def record_run(client: Client, path: str, count: int, *, create: bool) -> None:
    session = client.create(path) if create else client.open(path)
    with session.begin_run() as run:
        for i in range(count):
            run.record(tool_result(i))
    session.close()


def is_compressed(path: Path) -> bool:
    with path.open("rb") as fileobj:
        return fileobj.read(4) == ZSTD_MAGIC


def plain_lines(records: list[Record]) -> list[tuple[int, str]]:
    return [(r.seq, r.type) for r in records]


def test_a_closed_session_is_compressed_and_reads_the_same(compressing: DaemonProcess) -> None:
    path = compressing.root / "agents" / "long.jsonl"
    with connect(compressing.socket) as client:
        record_run(client, "agents/long.jsonl", 300, create=True)
    plain = path.read_bytes()
    before = list(read(path))
    wait_for(lambda: is_compressed(path))

    assert path.stat().st_size * 10 <= len(plain)
    assert [(r.seq, bytes(r.data)) for r in read(path)] == [(r.seq, bytes(r.data)) for r in before]
    report = check(path)
    assert report.sound and report.last_seq == len(before) == 303
    # The stock tools read it: zstdcat gives back the very bytes.
    if shutil.which("zstdcat"):
        assert subprocess.run(["zstdcat", str(path)], capture_output=True).stdout == plain
    # So does a tail through the daemon.
    with connect(compressing.socket) as client:
        tailed = list(client.tail("agents/long.jsonl", after=0, follow=False))
    assert plain_lines(tailed) == plain_lines(before)


def test_opening_a_compressed_session_continues_after_it(compressing: DaemonProcess) -> None:
    path = compressing.root / "chat.jsonl"
    with connect(compressing.socket) as client:
        record_run(client, "chat.jsonl", 50, create=True)
    before = list(read(path))
    wait_for(lambda: is_compressed(path))

    with connect(compressing.socket) as client:
        record_run(client, "chat.jsonl", 5, create=False)
    after = list(read(path))
    assert [(r.seq, bytes(r.data)) for r in after[: len(before)]] == [
        (r.seq, bytes(r.data)) for r in before
    ]
    assert [r.seq for r in after] == list(range(1, len(before) + 8))
    assert after[len(before)].type == "run_start"
    assert len({r.run_id for r in after if r.type == "run_start"}) == 2
    assert check(path).sound
    # Closed again with every run closed: compressed again, and whole.
    wait_for(lambda: is_compressed(path))
    assert [(r.seq, bytes(r.data)) for r in read(path)] == [(r.seq, bytes(r.data)) for r in after]


def test_a_tail_follows_a_compressed_session_into_its_next_run(
    compressing: DaemonProcess,
) -> None:
    path = compressing.root / "followed.jsonl"
    with connect(compressing.socket) as client:
        record_run(client, "followed.jsonl", 20, create=True)
    wait_for(lambda: is_compressed(path))

    seen: list[Record] = []
    caught_up = threading.Event()

    def follow() -> None:
        with (
            connect(compressing.socket) as client,
            client.tail("followed.jsonl", after=0, follow=True) as tail,
        ):
            for record in tail:
                seen.append(record)
                if record.seq == 23:
                    caught_up.set()
                if record.type == "run_close" and record.seq > 23:
                    return

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        assert caught_up.wait(30)
        with connect(compressing.socket) as client:
            record_run(client, "followed.jsonl", 3, create=False)
    finally:
        follower.join(30)
    assert not follower.is_alive()
    assert [r.seq for r in seen] == list(range(1, 29))
    assert [(r.seq, bytes(r.data)) for r in seen] == [(r.seq, bytes(r.data)) for r in read(path)]


def test_a_session_left_with_a_run_open_is_not_compressed(compressing: DaemonProcess) -> None:
    open_path = compressing.root / "interrupted.jsonl"
    closed_path = compressing.root / "closed.jsonl"
    with connect(compressing.socket) as client:
        session = client.create("interrupted.jsonl")
        run = session.begin_run()
        run.record(tool_result(0))
        session.sync()
    # The writer went away with its run open; a session closed after it is compressed,
    # and the daemon handles its due sessions in the order they closed.
    with connect(compressing.socket) as client:
        record_run(client, "closed.jsonl", 5, create=True)
    wait_for(lambda: is_compressed(closed_path))
    assert not is_compressed(open_path)
    assert check(open_path).open_runs == [run.run_id]
