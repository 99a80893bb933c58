"""Live tail through a real daemon: catch-up to live handover, stalled subscribers,
files at rest, filters, refused paths and ``tail_all``.

Writers and subscribers are real SDK clients (or a raw socket, where a test needs a
subscriber that does not read) in threads of this process; the daemon is a real
``flightlogd`` process, so its memory can be read from ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from flightlog.protocol import (
    Event,
)
from flightlog.protocol.events import (
    Error,
    TurnEnd,
    TurnStart,
)
from flightlog.protocol.wire import (
    ErrorReply,
    Subscribe,
    Subscribed,
    TailBatch,
    TailEnd,
)
from flightlog.sdk import DaemonError, FlightlogError, Record, connect
from flightlog.sdk.aio import aconnect
from support import DaemonProcess, RawClient, read_lines, wait_for


def _write(
    daemon: DaemonProcess,
    path: str,
    count: int,
    *,
    at: Callable[[int], None] | None = None,
    before_close: Callable[[], None] | None = None,
    close: bool = True,
    event: Event | None = None,
) -> int:
    """Record ``count`` turn_start events in one run and close it; returns the last seq
    (``count + 3``: session_start, run_start, the records, run_close).

    ``at(i)`` is called before the i-th record, to start subscribers mid-write;
    ``before_close()`` before the session is closed.
    """
    with connect(daemon.socket, client_name="writer") as client:
        session = client.create(path)
        with session.begin_run() as run:
            for i in range(count):
                if at is not None:
                    at(i)
                run.record(event or TurnStart(turn_index=i))
        last = session.sync()
        if before_close is not None:
            before_close()
        if close:
            session.close()
    return last


def _seqs(records: Iterator[Record]) -> list[int]:
    return [record.seq for record in records]


class _Follower(threading.Thread):
    """A subscriber in a thread: ``tail(path, after, follow=True)`` to the end."""

    def __init__(self, daemon: DaemonProcess, path: str, after: int) -> None:
        super().__init__(daemon=True)
        self.daemon_proc = daemon
        self.path = path
        self.after = after
        self.subscribed = threading.Event()
        self.seqs: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with (
                connect(self.daemon_proc.socket, client_name="follower") as client,
                client.tail(self.path, after=self.after, follow=True) as tail,
            ):
                self.subscribed.set()
                for record in tail:
                    self.seqs.append(record.seq)
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.subscribed.set()


@pytest.mark.timeout(120)
def test_catch_up_to_live_handover_under_concurrent_writing(daemon: DaemonProcess) -> None:
    # 20,000 records while three subscribers start at different points: before the
    # first record (after=0), mid-way (after=5,000, while 10,000 are written: the
    # catch-up from the file meets the live stream), and near the end (after=19,990,
    # past what is written when it subscribes).  Each sees exactly after+1..N.
    count = 20_000
    followers = {
        0: _Follower(daemon, "handover.jsonl", after=0),
        10_000: _Follower(daemon, "handover.jsonl", after=5_000),
        19_000: _Follower(daemon, "handover.jsonl", after=19_990),
    }

    def start_follower(i: int) -> None:
        # The writer goes on at once: each subscription lands wherever the writing is.
        follower = followers.get(i)
        if follower is not None:
            follower.start()

    def all_subscribed() -> None:
        # A follow ends when the writer closes the session: every follower must have
        # subscribed by then (one subscribing later would follow a file at rest).
        for follower in followers.values():
            assert follower.subscribed.wait(10)

    # The first follower subscribes once the session exists: record 0 starts it.
    final = _write(daemon, "handover.jsonl", count, at=start_follower, before_close=all_subscribed)
    assert final == count + 3
    for follower in followers.values():
        follower.join(30)
        assert not follower.is_alive(), "the follow did not end when the session closed"
        assert follower.error is None, follower.error
        assert follower.seqs == list(range(follower.after + 1, final + 1)), (
            f"after={follower.after}: {len(follower.seqs)} records, "
            f"first {follower.seqs[:3]}, last {follower.seqs[-3:]}"
        )


def _rss_mib(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"{key} not in /proc/{pid}/status")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("count", "size"),
    [
        pytest.param(100_000, 0, id="100k-small-records"),
        # The same stall with records of 10 kB (a 200 MB stream): the bound must hold in
        # bytes, not only in a number of buffered writes.
        pytest.param(20_000, 10_000, id="20k-10kB-records"),
    ],
)
def test_stalled_subscriber_gets_everything_and_daemon_memory_stays_bounded(
    daemon: DaemonProcess, count: int, size: int
) -> None:
    # A subscriber that stops reading while the records are written: the daemon
    # must neither buffer them for it nor lose any; once it reads again it gets every
    # record, once, in order.  The writer's time with and without the stalled
    # subscriber is printed (a benchmark, not a timed assertion).
    event = Error(message="x" * size) if size else TurnStart(turn_index=0)
    started = time.monotonic()
    _write(daemon, "baseline.jsonl", count, event=event)
    baseline_seconds = time.monotonic() - started
    baseline_rss = _rss_mib(daemon.pid)

    with (
        connect(daemon.socket, client_name="writer") as client,
        RawClient(daemon.socket, client="stalled") as stalled,
    ):
        session = client.create("stalled.jsonl")
        reply = stalled.request(
            Subscribe(id=stalled.next_id(), path="stalled.jsonl", after=0, follow=True)
        )
        assert isinstance(reply, Subscribed)
        peak = [baseline_rss]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                peak[0] = max(peak[0], _rss_mib(daemon.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        with session.begin_run() as run:
            for _ in range(count):
                run.record(event)
        last = session.sync()
        stalled_seconds = time.monotonic() - started
        session.close()
        done.set()
        sampler.join()
        peak[0] = max(peak[0], _rss_mib(daemon.pid))
        print(
            f"\nwriter: {count:,} records in {baseline_seconds:.2f}s alone, "
            f"{stalled_seconds:.2f}s with a stalled subscriber "
            f"(x{stalled_seconds / baseline_seconds:.2f}); daemon RSS {baseline_rss:.0f} MiB "
            f"before, peak {peak[0]:.0f} MiB"
        )
        # The daemon may hold a bounded buffer for the subscriber, never the stream.
        assert peak[0] - baseline_rss < 64, f"daemon RSS grew by {peak[0] - baseline_rss:.0f} MiB"

        # Read again: every record, in order, once; then the end.
        seqs: list[int] = []
        end: TailEnd | None = None
        while end is None:
            message = stalled.receive(timeout=30)
            if isinstance(message, TailBatch):
                seqs.extend(msgspec.json.decode(line)["seq"] for line in message.lines)
            elif isinstance(message, TailEnd):
                end = message
            else:
                raise AssertionError(f"unexpected {message!r}")
    final = last
    assert end.reason == "session_closed"
    assert end.last_seq == final
    assert len(seqs) == final
    assert seqs == list(range(1, final + 1))


def test_tail_follow_ends_cleanly_when_the_writer_closes_the_session(
    daemon: DaemonProcess,
) -> None:
    with connect(daemon.socket) as writer:
        session = writer.create("closing.jsonl")
        run = session.begin_run()
        run.record(TurnStart(turn_index=0))
        session.sync()
        seen: list[Record] = []
        with connect(daemon.socket) as reader:
            tail = reader.tail("closing.jsonl", follow=True)
            with tail:
                for record in tail:
                    seen.append(record)
                    if record.type == "turn_start":
                        # Live from here on: the rest arrives while we read.
                        run.record(TurnEnd(turn_index=0))
                        run.close()
                        session.close()
            # The iteration ended by itself: the session's writer closed it.
            assert [r.type for r in seen] == [
                "session_start",
                "run_start",
                "turn_start",
                "turn_end",
                "run_close",
            ]
            assert [r.seq for r in seen] == [1, 2, 3, 4, 5]
            # The connection is still good for another request.
            assert reader.status().pid == daemon.pid


def test_tail_of_a_file_at_rest(daemon: DaemonProcess) -> None:
    final = _write(daemon, "rest/a.jsonl", 50)
    # The daemon holds nothing for it (the actor finishes just after acknowledging the
    # close): the file is read where it lies.
    with connect(daemon.socket) as client:
        absolute = str(daemon.root / "rest/a.jsonl")
        wait_for(lambda: all(s.path != absolute for s in client.status().sessions))
        assert _seqs(client.tail("rest/a.jsonl")) == list(range(1, final + 1))
        assert _seqs(client.tail("rest/a.jsonl", after=40)) == list(range(41, final + 1))
        assert _seqs(client.tail("rest/a.jsonl", after=final)) == []
        # An absolute path under the root names the same file.
        lines = [msgspec.json.encode(r) for r in client.tail(absolute)]
    on_disk = (daemon.root / "rest/a.jsonl").read_bytes().split(b"\n")[:-1]
    assert lines == on_disk


def test_follow_of_a_file_at_rest_sees_a_later_writer_and_its_close(
    daemon: DaemonProcess,
) -> None:
    last = _write(daemon, "later.jsonl", 10)
    follower = _Follower(daemon, "later.jsonl", after=0)
    follower.start()
    assert follower.subscribed.wait(10)
    # Wait until it has caught up with the file at rest, then a writer comes.
    deadline = time.monotonic() + 10
    while len(follower.seqs) < last and time.monotonic() < deadline:
        time.sleep(0.01)
    assert follower.seqs == list(range(1, last + 1))
    with connect(daemon.socket) as client:
        session = client.open("later.jsonl")
        with session.begin_run() as run:
            run.record(TurnStart(turn_index=99))
        session.close()
    follower.join(10)
    assert not follower.is_alive()
    assert follower.error is None
    assert follower.seqs == list(range(1, last + 4))  # + run_start, turn_start, run_close


def test_follow_subscribed_just_after_a_close_keeps_following(daemon: DaemonProcess) -> None:
    # The close was acknowledged before the subscription: for the subscriber the file
    # is at rest, and a follow of a file at rest goes on until a writer closes it again.
    # It must not end at once with the earlier close ("session_closed" at seq 1).
    for attempt in range(10):
        path = f"reclosed-{attempt}.jsonl"
        with connect(daemon.socket) as client:
            client.create(path).close()
            with client.tail(path, follow=True) as tail:
                first = next(tail)
                assert first.seq == 1
                session = client.open(path)
                with session.begin_run() as run:
                    run.record(TurnStart(turn_index=0))
                session.close()
                rest = [record.seq for record in tail]
        assert rest == [2, 3, 4], f"attempt {attempt}: {rest}"


def test_tail_types_filter_applies_to_records_already_in_the_file(
    daemon: DaemonProcess,
) -> None:
    # The filter must not depend on whether a record came from the file or live.
    with connect(daemon.socket) as client:
        session = client.create("filtered.jsonl")
        with session.begin_run() as run:
            for i in range(3):
                run.record(TurnStart(turn_index=i))
                run.record(TurnEnd(turn_index=i))
        first_run = run.run_id
        with session.begin_run() as run:
            run.record(TurnStart(turn_index=7))
        session.close()
        types = [r.type for r in client.tail("filtered.jsonl", types=["turn_end"])]
        assert types == ["turn_end"] * 3
        runs = {r.run_id for r in client.tail("filtered.jsonl", run_id=first_run)}
        assert runs == {first_run}


def test_tail_outside_the_roots_is_refused(daemon: DaemonProcess, short_tmp: Path) -> None:
    outside = short_tmp / "elsewhere.jsonl"
    outside.write_bytes(b"")
    with connect(daemon.socket) as client:
        for path in (str(outside), "../escape.jsonl", "/etc/passwd"):
            with pytest.raises(DaemonError) as caught:
                list(client.tail(path))
            assert caught.value.code == "path_refused", path
        # Refused like any other request: the connection stays usable.
        assert client.status().pid == daemon.pid
    with RawClient(daemon.socket) as raw:
        reply = raw.request(Subscribe(id=raw.next_id(), path=str(outside), follow=True))
        assert isinstance(reply, ErrorReply)
        assert reply.code == "path_refused"


def test_tail_of_a_missing_session_says_so(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        with pytest.raises(DaemonError) as caught:
            list(client.tail("such.jsonl"))
        assert caught.value.code == "session_not_found"
        assert "does not exist" in caught.value.message


def test_following_a_session_that_does_not_exist_yet_waits_for_it(
    daemon: DaemonProcess,
) -> None:
    """Like ``tail -F``: the subscription waits, then reads the session from its start."""
    seen: list[str] = []
    with connect(daemon.socket) as reader, connect(daemon.socket) as writer:
        tail = reader.tail("later/chat.jsonl", follow=True)  # its directory is missing too
        thread = threading.Thread(target=lambda: seen.extend(r.type for r in tail))
        thread.start()
        wait_for(lambda: writer.status().subscribers == 1)
        session = writer.create("later/chat.jsonl")
        with session.begin_run() as run:
            run.record(TurnStart(turn_index=0))
        session.close()
        thread.join(timeout=10)
        assert not thread.is_alive()
    assert seen == ["session_start", "run_start", "turn_start", "run_close"]
    assert tail.end_reason == "session_closed"


def test_tail_of_a_session_in_a_missing_directory_says_so(daemon: DaemonProcess) -> None:
    # Not an internal error: the session simply does not exist.
    with connect(daemon.socket) as client, pytest.raises(DaemonError) as caught:
        list(client.tail("no/such/dir/session.jsonl"))
    assert caught.value.code == "session_not_found", caught.value


def test_tail_all_sees_records_of_two_sessions_with_their_paths(daemon: DaemonProcess) -> None:
    seen: list[tuple[str, int, str]] = []
    ready = threading.Event()

    def watch() -> None:
        # Ends with the daemon, at the fixture's teardown.
        with (
            contextlib.suppress(FlightlogError),
            connect(daemon.socket) as watcher,
            watcher.tail_all(follow=True) as tail,
        ):
            ready.set()
            for path, record in tail:
                seen.append((path, record.seq, record.type))

    # A daemon thread: if records are missing it blocks until the daemon stops.
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert ready.wait(10)
    with connect(daemon.socket) as writer:
        one = writer.create("all/one.jsonl")
        two = writer.create("all/two.jsonl")
        run_one, run_two = one.begin_run(), two.begin_run()
        run_one.record(TurnStart(turn_index=1))
        run_two.record(TurnStart(turn_index=2))
        run_one.close()
        run_two.close()
        one.close()
        two.close()
    one_path, two_path = str(daemon.root / "all/one.jsonl"), str(daemon.root / "all/two.jsonl")
    wait_for(lambda: {p for p, _, _ in seen} == {one_path, two_path} and len(seen) >= 6)
    time.sleep(0.2)  # anything still on its way
    expected = [(1, "session_start"), (2, "run_start"), (3, "turn_start"), (4, "run_close")]
    for path in (one_path, two_path):
        assert [(seq, type) for p, seq, type in seen if p == path] == expected, path
        assert [line["seq"] for line in read_lines(path)] == [1, 2, 3, 4]


@pytest.mark.anyio
async def test_async_tail_follows_until_the_session_closes(daemon: DaemonProcess) -> None:
    last = _write(daemon, "async.jsonl", 5, close=False)
    async with aconnect(daemon.socket) as client:
        seqs = [record.seq async for record in client.tail("async.jsonl", after=3)]
    # _write closed its client, which released the session: a file at rest now.
    assert seqs == list(range(4, last + 1))


def test_following_from_beyond_the_end_of_a_file_at_rest_reads_on_once_it_grows(
    daemon: DaemonProcess,
) -> None:
    """A follow after a seq the file does not hold yet, of a session no writer holds: the
    daemon reads the file to its end (nothing to send), then the file again from where
    it stopped once a writer opens it.  Where it stopped is a line before the seq asked
    for: reading on from there is not a ``session_corrupt`` naming that line."""
    last = _write(daemon, "beyond.jsonl", 3)
    with connect(daemon.socket) as reader:
        # No writer, no subscriber: the daemon lets go of the session.
        wait_for(lambda: all(s.path != "beyond.jsonl" for s in reader.status().sessions))
        with reader.tail("beyond.jsonl", after=last + 3, follow=True) as beyond:
            # The connection's catch-ups read one at a time, in order: once this one
            # is done, so is the first read of ``beyond``.
            with reader.tail("beyond.jsonl") as whole:
                assert _seqs(whole) == list(range(1, last + 1))
            with connect(daemon.socket, client_name="writer") as writer:
                session = writer.open("beyond.jsonl")
                with session.begin_run() as run:
                    for i in range(5):
                        run.record(TurnStart(turn_index=i))
                end = session.sync()
                session.close()
            # run_start, 5 records, run_close after the first ``last`` lines.
            assert end == last + 7
            assert _seqs(beyond) == list(range(last + 4, end + 1))


def test_a_timeout_error_of_the_callers_own_ends_a_follow(daemon: DaemonProcess) -> None:
    """A TimeoutError raised by the caller's signal handler while a follow waits is the
    caller's, not a broken connection: it ends the iteration, and the connection goes
    on (no reconnect)."""
    last = _write(daemon, "alarm.jsonl", 2, close=False)

    def deadline(signum: int, frame: object) -> None:
        raise TimeoutError("the caller's deadline")

    # SIGUSR1 from another thread, not SIGALRM: pytest-timeout keeps that one.
    previous = signal.signal(signal.SIGUSR1, deadline)
    alarm = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        with connect(daemon.socket) as client:
            with client.tail("alarm.jsonl", follow=True) as follow:
                seqs = []
                with pytest.raises(TimeoutError, match="the caller's deadline"):
                    for record in follow:
                        seqs.append(record.seq)
                        if record.seq == last:
                            # Nothing more comes: the follow waits in a receive.
                            alarm.start()
                assert seqs == list(range(1, last + 1))
            assert client.reconnects == 0
            assert client.status().uptime > 0  # the same connection answers
    finally:
        alarm.cancel()
        signal.signal(signal.SIGUSR1, previous)
