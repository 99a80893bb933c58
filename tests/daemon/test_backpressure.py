"""Backpressure, not buffering: a client that sends faster than the daemon writes is
slowed down, and the daemon's memory stays bounded while another session is served."""

from __future__ import annotations

import itertools
import select
from collections.abc import Iterator

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    CheckpointLoaded,
    LoadCheckpoint,
    SaveCheckpoint,
    Subscribe,
    encode_frame,
)
from support import DaemonProcess, RawClient
from support.daemon import (
    agent_report,
    assert_serving,
    begin,
    check_file,
    create,
    fact,
    proc_status_kb,
    spawn_agent,
    synced_seq,
)

FLOOD_MB = 200
#: What the daemon may grow by while 200 MB pass through it: a connection's 8 MiB of
#: records handed to the actor, its copy in the batch being written, 8 MiB of replies
#: in the outbox, read buffers, allocator slack.
GROWTH_LIMIT_KB = 80 * 1024


def test_rss_stays_bounded_while_one_client_floods_200_mb(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        opened = create(client, "normal.jsonl")
        run = begin(client, opened.session_id)
        client.send(fact(opened.session_id, run.run_id, 0))
        assert synced_seq(client, opened.session_id) == 3
        baseline = proc_status_kb(daemon.pid, "VmRSS")

        flooder = spawn_agent("flood", daemon.socket, "flood.jsonl", str(FLOOD_MB))
        try:
            started = agent_report(flooder)
            assert started["flooding"]
            peak = baseline
            rounds = 0
            seq = 3
            # The normal session goes on being written and synced while the flood runs.
            while rounds < 5 or flooder.poll() is None:
                for n in range(20):
                    client.send(fact(opened.session_id, run.run_id, n))
                seq += 20
                assert synced_seq(client, opened.session_id) == seq
                peak = max(peak, proc_status_kb(daemon.pid, "VmRSS"))
                rounds += 1
            done = agent_report(flooder)
            assert done == {"synced": started["records"] + 2}
            assert flooder.wait(timeout=60) == 0
        finally:
            if flooder.poll() is None:
                flooder.kill()
            flooder.communicate()
        high_water = proc_status_kb(daemon.pid, "VmHWM")

    assert peak - baseline < GROWTH_LIMIT_KB, (baseline, peak)
    assert high_water - baseline < GROWTH_LIMIT_KB, (baseline, high_water)
    report = check_file(daemon.root / "flood.jsonl")
    assert report.sound and report.records == FLOOD_MB * 16 + 2, report
    assert check_file(daemon.root / "normal.jsonl").sound


def _send_until_held_back(client: RawClient, frames: Iterator[bytes]) -> int:
    """Send frames until the daemon stops taking them; the number of bytes taken."""
    client.sock.setblocking(False)
    pending = b""
    taken = 0
    while True:
        if not pending:
            pending = next(frames)
        try:
            n = client.sock.send(pending)
        except BlockingIOError:
            # Full for now; when the daemon holds this connection back it stays full.
            _, writable, _ = select.select([], [client.sock], [], 0.5)
            if not writable:
                return taken
            continue
        taken += n
        pending = pending[n:]


def test_a_client_faster_than_its_session_is_held_back_not_buffered(
    daemon: DaemonProcess,
) -> None:
    """The session's actor is made slow for real (its writer does not read the big
    checkpoints it asked for); the writer keeps sending records and finds itself held
    back after a bounded amount, while the daemon serves everyone else."""
    with RawClient(daemon.socket) as client:
        opened = create(client, "held-back.jsonl")
        run = begin(client, opened.session_id)
        saved = client.request(
            SaveCheckpoint(
                id=client.next_id(),
                session_id=opened.session_id,
                run_id=run.run_id,
                time=now(),
                snapshot=b'{"big":"%s"}' % (b"c" * 256 * 1024),
            )
        )
        assert isinstance(saved, Ack), saved
        baseline = proc_status_kb(daemon.pid, "VmRSS")
        loads = [
            encode_frame(LoadCheckpoint(id=client.next_id(), session_id=opened.session_id))
            for _ in range(100)
        ]
        record = encode_frame(
            fact(opened.session_id, run.run_id, data=b'{"pad":"%s"}' % (b"r" * 64 * 1024))
        )
        taken = _send_until_held_back(client, itertools.chain(loads, itertools.repeat(record)))
        held = proc_status_kb(daemon.pid, "VmRSS")
        # Bounded: the connection's 8 MiB buffer, the outbox's 8 MiB, socket buffers.
        assert taken < 24 * 1024 * 1024, taken
        assert held - baseline < GROWTH_LIMIT_KB, (baseline, held)
        assert_serving(daemon)

        # Once the client reads, everything it sent is written.
        client.sock.setblocking(True)
        records = (taken - sum(map(len, loads))) // len(record)
        replies = 0
        while replies < 100:
            reply = client.receive(30)
            assert isinstance(reply, CheckpointLoaded), reply
            replies += 1
        rest = taken - sum(map(len, loads)) - records * len(record)
        if rest:
            client.send_bytes(record[rest:])  # complete the torn frame
        assert synced_seq(client, opened.session_id) == 3 + records + (1 if rest else 0)
    assert check_file(daemon.root / "held-back.jsonl").sound


#: What a stalled subscriber of one session may make the daemon hold: its live buffer
#: (4 MiB, then it reads the file instead), the connection's 8 MiB of unsent replies,
#: the writer's records in flight, allocator slack.
STALLED_TAIL_LIMIT_KB = 32 * 1024


def test_a_stalled_subscriber_of_one_session_falls_back_to_the_file(
    daemon: DaemonProcess,
) -> None:
    """Past its live buffer, a subscriber that reads nothing costs the daemon nothing
    more: the file holds what it missed."""
    block = b'{"blob":"' + b"x" * (64 * 1024) + b'"}'
    with RawClient(daemon.socket, client="writer") as writer:
        opened = create(writer, "watched.jsonl")
        run = begin(writer, opened.session_id)
        with RawClient(daemon.socket, client="stalled") as stalled:
            stalled.send(Subscribe(id=stalled.next_id(), path="watched.jsonl", follow=True))
            assert synced_seq(writer, opened.session_id) == 2
            baseline = proc_status_kb(daemon.pid, "VmRSS")
            seq = 2
            for _ in range(12):  # 48 MiB, synced every 4 MiB
                for n in range(64):
                    writer.send(fact(opened.session_id, run.run_id, n, data=block))
                seq += 64
                assert synced_seq(writer, opened.session_id) == seq
            growth = proc_status_kb(daemon.pid, "VmHWM") - baseline
    print(f"stalled subscriber: VmHWM - VmRSS before: {growth} kB")
    assert growth < STALLED_TAIL_LIMIT_KB, growth
    assert check_file(daemon.root / "watched.jsonl").records == seq
