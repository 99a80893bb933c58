"""Writes that stop part-way: the line being written is torn, nothing before it is lost,
and the next open truncates exactly the torn tail.

Two ways to stop a write: a short write injected into the daemon's storage layer (in
process) at a seeded byte offset, after which the disk fails with EIO; and a file-size
limit on a real daemon process (RLIMIT_FSIZE, so the kernel cuts the write at the limit
and fails the next one with EFBIG), after which a daemon without the limit reopens.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    CloseSession,
    ErrorReply,
    Open,
    RecordEvent,
    RecordFailed,
    SessionOpened,
    Sync,
    encode_frame,
)
from support import DaemonProcess, RawClient, read_lines
from support.daemon import (
    assert_serving,
    begin,
    check_file,
    create,
    fact,
    synced_seq,
)

from .harness import DiskFaults, InProcessDaemon

CI_CUTS = 60
SOAK_CUTS = 500


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fl-torn-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _records(
    session_id: str, run_id: str, rng: random.Random, start: int, count: int
) -> list[RecordEvent]:
    return [
        RecordEvent(
            session_id=session_id,
            run_id=run_id,
            event_type="turn_start",
            time=now(),
            data=json.dumps({"n": n, "pad": "p" * rng.choice((0, 7, 300, 4000, 70_000))}).encode(),
        )
        for n in range(start, start + count)
    ]


def _cut_one(daemon: InProcessDaemon, faults: DiskFaults, seed: int) -> bool:
    """One session cut at a seeded byte of a batch; whether the cut fell inside it."""
    rng = random.Random(f"torn-{seed}")
    name = f"torn/{seed}.jsonl"
    path = daemon.root / name
    with RawClient(daemon.socket) as client, RawClient(daemon.socket) as neighbour_client:
        opened = create(client, name)
        run = begin(client, opened.session_id)
        neighbour = create(neighbour_client, f"torn/{seed}-neighbour.jsonl")
        neighbour_run = begin(neighbour_client, neighbour.session_id)
        durable = rng.randint(0, 20)
        for record in _records(opened.session_id, run.run_id, rng, 0, durable):
            client.send(record)
        assert synced_seq(client, opened.session_id) == durable + 2
        before = path.read_bytes()

        # The next batch stops at a seeded byte: anywhere from its first byte to its last.
        batch = _records(opened.session_id, run.run_id, rng, durable, rng.randint(1, 20))
        batch_bytes = sum(len(r.data) + 150 for r in batch)  # about what its lines take
        cut = len(before) + rng.randint(0, batch_bytes)
        faults.on(path).write_limit = cut
        client.send_bytes(b"".join(encode_frame(r) for r in batch))
        reply = client.request(Sync(id=client.next_id(), session_id=opened.session_id))
        size = path.stat().st_size
        if isinstance(reply, Ack):  # the batch ended before the cut: nothing failed
            assert size <= cut
        else:
            assert isinstance(reply, ErrorReply) and reply.code == "write_failed", reply
            assert "Input/output error" in reply.message
            failed = client.pending.pop(0)
            assert isinstance(failed, RecordFailed) and failed.message == reply.message
            assert size == cut  # the short write put its bytes down, then the disk failed
            # The session is failed for good; its neighbour is not.
            client.send(fact(opened.session_id, run.run_id, 999))
            again = client.request(Sync(id=client.next_id(), session_id=opened.session_id))
            assert isinstance(again, ErrorReply) and again.message == reply.message, again
            assert path.stat().st_size == cut
        neighbour_client.send(fact(neighbour.session_id, neighbour_run.run_id, 1))
        assert synced_seq(neighbour_client, neighbour.session_id) == 3
        client.request(CloseSession(id=client.next_id(), session_id=opened.session_id))
    faults.clear(path)

    report = check_file(path)
    assert report.sound, report
    assert report.valid_bytes + report.tail_bytes == path.stat().st_size
    content = path.read_bytes()
    assert content[: len(before)] == before  # nothing before the cut is touched
    lines = read_lines(path)
    numbers = [line["data"]["n"] for line in lines[2:]]
    assert numbers == list(range(len(numbers)))  # every record up to the cut, in order
    assert len(numbers) >= durable

    with RawClient(daemon.socket) as client:
        reopened = client.request(Open(id=client.next_id(), path=name))
        assert isinstance(reopened, SessionOpened), reopened
        assert reopened.last_seq == report.last_seq
        assert reopened.truncated_bytes == report.tail_bytes
        assert reopened.interrupted_runs == [run.run_id]
        assert path.read_bytes() == content[: report.valid_bytes]  # only the tail went
        run2 = begin(client, reopened.session_id)
        assert run2.seq == report.last_seq + 1
        client.send(fact(reopened.session_id, run2.run_id, 7))
        assert synced_seq(client, reopened.session_id) == report.last_seq + 2
    final = check_file(path)
    assert final.sound and not final.unfinished_tail and final.last_seq == report.last_seq + 2
    return not isinstance(reply, Ack)


@pytest.fixture
def inproc(base: Path) -> Iterator[InProcessDaemon]:
    with InProcessDaemon(base / "inproc") as daemon:
        yield daemon


def test_writes_cut_short_at_seeded_bytes_lose_nothing_before_the_cut(
    inproc: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = DiskFaults(monkeypatch)
    cut = sum(_cut_one(inproc, faults, seed) for seed in range(CI_CUTS))
    assert cut >= CI_CUTS // 2, cut  # most cuts fall inside their batch
    assert_serving(inproc)


@pytest.mark.soak
def test_writes_cut_short_at_seeded_bytes_lose_nothing_before_the_cut_soak(
    inproc: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = DiskFaults(monkeypatch)
    cut = sum(_cut_one(inproc, faults, seed) for seed in range(1000, 1000 + SOAK_CUTS))
    assert cut >= SOAK_CUTS // 2, cut
    assert_serving(inproc)


def test_a_write_that_takes_nothing_fails_the_session_instead_of_spinning(
    inproc: InProcessDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a write returning 0 (a broken file system) had the write loop spin
    on the event loop for ever, stalling every session."""
    faults = DiskFaults(monkeypatch)
    with RawClient(inproc.socket) as client, RawClient(inproc.socket) as other:
        opened = create(client, "zero.jsonl")
        run = begin(client, opened.session_id)
        faults.on(inproc.root / "zero.jsonl").zero_writes = True
        client.send(fact(opened.session_id, run.run_id, 1))
        reply = client.request(Sync(id=client.next_id(), session_id=opened.session_id))
        assert isinstance(reply, ErrorReply) and reply.code == "write_failed", reply
        assert "took 0 of" in reply.message
        healthy = create(other, "healthy.jsonl")
        assert synced_seq(other, healthy.session_id) == 1
    assert_serving(inproc)


# ------------------------------------------------------------- RLIMIT_FSIZE


def _limited(limit: int):  # type: ignore[no-untyped-def]
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


SESSIONS_PER_LIMIT = 6


@pytest.mark.parametrize("seed", range(3))
def test_file_size_limit_cuts_then_a_reopen_truncates_only_the_tail(
    short_tmp: Path, seed: int
) -> None:
    """Every session of a daemon under a file-size limit is cut at the limit, each at a
    different place in its lines (their sizes differ); a daemon without the limit then
    reopens each, truncating the torn tail and nothing else."""
    rng = random.Random(f"fsize-{seed}")
    limit = rng.randint(64 * 1024, 512 * 1024)
    daemon = DaemonProcess(short_tmp).start(preexec_fn=_limited(limit))
    runs = {}
    try:
        with RawClient(daemon.socket) as client:
            for i in range(SESSIONS_PER_LIMIT):
                opened = create(client, f"limited-{i}.jsonl")
                run = begin(client, opened.session_id)
                runs[i] = (opened.session_id, run.run_id)
                records = _records(opened.session_id, run.run_id, rng, 0, 400)
                client.send_bytes(b"".join(encode_frame(r) for r in records))
                reply = client.request(Sync(id=client.next_id(), session_id=opened.session_id))
                assert isinstance(reply, ErrorReply) and "File too large" in reply.message, reply
                assert (daemon.root / f"limited-{i}.jsonl").stat().st_size == limit
        assert_serving(daemon)
    finally:
        assert daemon.terminate() == 0, daemon.log

    before = {i: (daemon.root / f"limited-{i}.jsonl").read_bytes() for i in runs}
    reports = {i: check_file(daemon.root / f"limited-{i}.jsonl") for i in runs}
    unlimited = DaemonProcess(short_tmp).start()
    try:
        with RawClient(unlimited.socket) as client:
            for i, (session_id, run_id) in runs.items():
                report = reports[i]
                assert report.sound, report
                numbers = [
                    line["data"]["n"] for line in read_lines(daemon.root / f"limited-{i}.jsonl")[2:]
                ]
                assert numbers == list(range(len(numbers)))
                reopened = client.request(Open(id=client.next_id(), path=f"limited-{i}.jsonl"))
                assert isinstance(reopened, SessionOpened), reopened
                assert reopened.session_id == session_id
                assert reopened.truncated_bytes == report.tail_bytes == limit - report.valid_bytes
                assert reopened.interrupted_runs == [run_id]
                after = (daemon.root / f"limited-{i}.jsonl").read_bytes()
                assert after == before[i][: report.valid_bytes]
                assert begin(client, session_id).seq == report.last_seq + 1
    finally:
        unlimited.stop()
