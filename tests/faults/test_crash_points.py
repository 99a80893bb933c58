"""kill -9 of the daemon at seeded random moments under a multi-client load, again and
again on the same root, each time with a fresh daemon.

Each chain of cycles keeps its writers' sessions across the crashes.  In a cycle the
writers (threads, one connection each) open their sessions and record runs of records
with checkpoints, syncs, run closes and session closes; another client creates new
sessions as fast as it can.  Once the cycle has sent a seeded number of records the
daemon is killed.  Before the restart, every file under the root must pass ``check``
(an unfinished tail is allowed) and hold every line the daemon acknowledged, and each
writer's records must be in the file exactly once, in order: of what a writer sent to
one daemon, a prefix, and nothing it did not send.  After the restart the reopen must
truncate exactly the unfinished tail, report the interrupted runs, and the seq goes on.

A SIGKILL keeps the page cache, so this shows that acknowledgements never run ahead
of the writes; that they never run ahead of fsync would take a power cut.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flightlog.daemon import _paths
from flightlog.daemon._paths import Roots
from flightlog.daemon._storage import SessionFile
from flightlog.protocol import (
    CheckReport,
    new_id,
    now,
)
from flightlog.protocol.wire import (
    Ack,
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    Open,
    RecordEvent,
    RunStarted,
    SaveCheckpoint,
    SessionOpened,
    Sync,
)
from support import DaemonProcess, RawClient, read_lines, wait_for
from support.daemon import check_file

from .harness import DiskFaults, InProcessDaemon, assert_every_file_sound, session_files

WRITERS = 4
#: (chains, cycles per chain): 50 kills in CI, 1,000 in the soak.
CI_CHAINS, CI_CYCLES = 5, 10
SOAK_CHAINS, SOAK_CYCLES = 20, 50


class _Progress:
    """Records sent in this cycle, for the kill to wait on (no sleeps)."""

    def __init__(self) -> None:
        self.count = 0
        self.cond = threading.Condition()

    def tick(self) -> None:
        with self.cond:
            self.count += 1
            self.cond.notify_all()

    def wait_for(self, target: int, alive: list[threading.Thread], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.count < target and any(t.is_alive() for t in alive):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"the load sent {self.count} of {target} records"
                self.cond.wait(min(remaining, 0.5))


@dataclass
class _Ledger:
    """What one writer sent and what the daemon acknowledged, over every lifetime."""

    number: int
    path: str
    session_id: str | None = None
    next_n: int = 0
    #: Per daemon lifetime: the range of record numbers sent to it.
    lifetimes: list[range] = field(default_factory=list)
    #: (line type, seq, detail): run_start/run_close with the run id, checkpoint and
    #: sync with the number of records sent before them.
    acks: list[tuple[str, int, Any]] = field(default_factory=list)
    expected: CheckReport | None = None


def _record(ledger: _Ledger, run_id: str, rng: random.Random) -> RecordEvent:
    assert ledger.session_id is not None
    # Now and then a record of megabytes: a kill in the middle of its write() can cut
    # it short (the kernel checks for a fatal signal between pages), leaving a torn tail.
    size = 2_000_000 if rng.random() < 0.01 else rng.choice((0, 10, 100, 1000, 5000))
    pad = "x" * size
    return RecordEvent(
        session_id=ledger.session_id,
        run_id=run_id,
        event_type="turn_start",
        time=now(),
        data=json.dumps({"w": ledger.number, "n": ledger.next_n, "pad": pad}).encode(),
    )


def _expect(reply: Any, kind: type) -> Any:
    if not isinstance(reply, kind):
        raise AssertionError(f"expected {kind.__name__}, got {reply!r}")
    return reply


def _attach(client: RawClient, ledger: _Ledger) -> None:
    """Create the writer's session, or open it and check what the open reports."""
    if ledger.session_id is None:
        opened = _expect(
            client.request(Create(id=client.next_id(), path=ledger.path)), SessionOpened
        )
        ledger.session_id = opened.session_id
        ledger.acks.append(("session_start", 1, None))
        return
    opened = _expect(client.request(Open(id=client.next_id(), path=ledger.path)), SessionOpened)
    expected = ledger.expected
    assert expected is not None
    assert opened.session_id == ledger.session_id
    assert opened.last_seq == expected.last_seq, (opened, expected)
    assert opened.truncated_bytes == expected.tail_bytes, (opened, expected)
    assert opened.interrupted_runs == expected.open_runs, (opened, expected)


def _drive(
    client: RawClient,
    ledger: _Ledger,
    rng: random.Random,
    progress: _Progress,
    failures: list[BaseException],
) -> None:
    """Record until the daemon is gone; every acknowledgement goes into the ledger."""
    session_id = ledger.session_id
    assert session_id is not None
    first = ledger.next_n
    last_seq = ledger.expected.last_seq if ledger.expected else 1
    try:
        while True:
            run = _expect(
                client.request(BeginRun(id=client.next_id(), session_id=session_id, time=now())),
                RunStarted,
            )
            assert run.seq == last_seq + 1, (run, last_seq)  # the seq goes on
            ledger.acks.append(("run_start", run.seq, run.run_id))
            last_seq = run.seq
            for _ in range(rng.randint(1, 4)):
                for _ in range(rng.randint(0, 30)):
                    client.send(_record(ledger, run.run_id, rng))
                    ledger.next_n += 1
                    ledger.lifetimes[-1] = range(first, ledger.next_n)
                    last_seq += 1
                    progress.tick()
                choice = rng.random()
                if choice < 0.5:
                    ack = _expect(
                        client.request(
                            SaveCheckpoint(
                                id=client.next_id(),
                                session_id=session_id,
                                run_id=run.run_id,
                                time=now(),
                                snapshot=b'{"n":%d}' % ledger.next_n,
                            )
                        ),
                        Ack,
                    )
                    last_seq += 1
                    assert ack.seq == last_seq, (ack, last_seq)
                    ledger.acks.append(("checkpoint", ack.seq, (first, ledger.next_n)))
                elif choice < 0.7:
                    ack = _expect(
                        client.request(Sync(id=client.next_id(), session_id=session_id)), Ack
                    )
                    assert ack.seq == last_seq, (ack, last_seq)
                    ledger.acks.append(("sync", ack.seq, (first, ledger.next_n)))
            ack = _expect(
                client.request(
                    CloseRun(
                        id=client.next_id(), session_id=session_id, run_id=run.run_id, time=now()
                    )
                ),
                Ack,
            )
            last_seq += 1
            assert ack.seq == last_seq
            ledger.acks.append(("run_close", ack.seq, run.run_id))
            if rng.random() < 0.2:
                # Close and reopen the session within the same lifetime too.
                _expect(
                    client.request(CloseSession(id=client.next_id(), session_id=session_id)), Ack
                )
                opened = _expect(
                    client.request(Open(id=client.next_id(), path=ledger.path)), SessionOpened
                )
                assert opened.last_seq == last_seq and opened.truncated_bytes == 0, opened
    except (OSError, EOFError):
        return  # the daemon was killed
    except BaseException as exc:
        failures.append(exc)


def _storm(
    client: RawClient,
    prefix: str,
    created: list[str],
    progress: _Progress,
    failures: list[BaseException],
) -> None:
    """Create new sessions one after another, each with a short run."""
    try:
        with client:
            for i in range(10_000):
                path = f"{prefix}-{i}.jsonl"
                opened = client.request(Create(id=client.next_id(), path=path))
                _expect(opened, SessionOpened)
                created.append(path)
                progress.tick()
                run = _expect(
                    client.request(
                        BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
                    ),
                    RunStarted,
                )
                client.send(
                    RecordEvent(
                        session_id=opened.session_id,
                        run_id=run.run_id,
                        event_type="turn_start",
                        time=now(),
                        data=b'{"storm":%d}' % i,
                    )
                )
                _expect(
                    client.request(CloseSession(id=client.next_id(), session_id=opened.session_id)),
                    Ack,
                )
    except (OSError, EOFError):
        return
    except BaseException as exc:
        failures.append(exc)


def _verify(root: Path, ledger: _Ledger) -> CheckReport:
    """The file holds the writer's records exactly once, in order, and every line that
    was acknowledged; returns its check report."""
    path = root / ledger.path
    report = check_file(path)
    assert report.sound, (path, report)
    assert report.session_id == ledger.session_id
    lines = read_lines(path)
    by_seq = {line["seq"]: line for line in lines}
    numbers = [line["data"]["n"] for line in lines if line["type"] == "turn_start"]
    assert numbers == sorted(set(numbers)), "records repeated or out of order"
    landed = set(numbers)
    for lifetime in ledger.lifetimes:
        of_this = [n for n in numbers if n in lifetime]
        # What one daemon wrote of what it was sent: a prefix, nothing skipped.
        assert of_this == list(lifetime[: len(of_this)]), (lifetime, of_this)
    assert all(any(n in lt for lt in ledger.lifetimes) for n in numbers), "a record never sent"
    for kind, seq, detail in ledger.acks:
        line = by_seq.get(seq)
        assert line is not None, f"acknowledged {kind} at seq {seq} is not in {path}"
        if kind in ("run_start", "run_close"):
            assert (line["type"], line["run_id"]) == (kind, detail), (line, kind, detail)
        elif kind in ("checkpoint", "sync"):
            first, sent = detail
            if kind == "checkpoint":
                assert line["type"] == kind and line["data"] == {"snapshot": {"n": sent}}, line
            # Everything this lifetime sent before the acknowledged request is there.
            assert landed.issuperset(range(first, sent)), (kind, seq, first, sent)
    return report


@dataclass
class _Cycle:
    """One daemon lifetime of a chain: what runs in it, up to the kill."""

    daemon: DaemonProcess
    progress: _Progress = field(default_factory=_Progress)
    failures: list[BaseException] = field(default_factory=list)
    clients: list[RawClient] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    #: The storm's creates that were acknowledged.
    created: list[str] = field(default_factory=list)

    def connect(self, name: str) -> RawClient:
        client = RawClient(self.daemon.socket, client=name)
        self.clients.append(client)
        return client

    def reopen(self, paths: list[str]) -> None:
        """Open (each must open: sound, and no file without its first line) and close."""
        with RawClient(self.daemon.socket, client="crash-check") as checker:
            for path in paths:
                reopened = checker.request(Open(id=checker.next_id(), path=path))
                assert isinstance(reopened, SessionOpened), (path, reopened)
                checker.request(CloseSession(id=checker.next_id(), session_id=reopened.session_id))

    def opening(self, ledgers: list[_Ledger]) -> None:
        """Send every writer's open, and wait for no reply: the kill comes while the
        sessions are opened (their torn tails truncated)."""
        for ledger in ledgers:
            self.connect(f"crash-w{ledger.number}").send(Open(id=1_000_000, path=ledger.path))
            ledger.lifetimes.append(range(ledger.next_n, ledger.next_n))

    def load(self, ledgers: list[_Ledger], rng: random.Random, storm_prefix: str) -> None:
        """Open the writers' sessions, start them and the storm, and return once the
        cycle's seeded number of records is sent: the moment of the kill."""
        for ledger in ledgers:
            _attach(self.connect(f"crash-w{ledger.number}"), ledger)
            ledger.lifetimes.append(range(ledger.next_n, ledger.next_n))
        for ledger, client in zip(ledgers, list(self.clients), strict=True):
            args = (client, ledger, random.Random(rng.random()), self.progress, self.failures)
            self.threads.append(threading.Thread(target=_drive, args=args))
        storm = self.connect("crash-storm")
        args = (storm, storm_prefix, self.created, self.progress, self.failures)
        self.threads.append(threading.Thread(target=_storm, args=args))
        for thread in self.threads:
            thread.start()
        self.progress.wait_for(rng.randint(0, 400), self.threads)

    def kill(self) -> None:
        self.daemon.kill()
        for thread in self.threads:
            thread.join(timeout=30)
        for client in self.clients:
            client.close()
        assert not self.failures, self.failures
        assert not any(t.is_alive() for t in self.threads)


def _chain(base: Path, chain: int, cycles: int) -> Counter[str]:
    """Run ``cycles`` crash cycles on one root; counts of what the kills hit."""
    rng = random.Random(f"crash-chain-{chain}")
    ledgers = [_Ledger(number=i, path=f"writers/w{i}.jsonl") for i in range(WRITERS)]
    storm_files: list[str] = []
    seen: Counter[str] = Counter()
    for number in range(cycles):
        cycle = _Cycle(DaemonProcess(base).start())
        root = cycle.daemon.root
        try:
            try:
                cycle.reopen(storm_files)  # the storm's files of the last cycle
                if number and rng.random() < 0.15:
                    cycle.opening(ledgers)
                    seen["kills while opening"] += 1
                else:
                    cycle.load(ledgers, rng, f"storm/c{chain}-{number}")
            finally:
                cycle.kill()
                seen["kills"] += 1
            for ledger in ledgers:
                ledger.expected = _verify(root, ledger)
            reports = assert_every_file_sound(root)
            seen["torn tails"] += sum(r.unfinished_tail for r in reports.values())
            seen["acknowledged lines checked"] += sum(len(ledger.acks) for ledger in ledgers)
            for path in cycle.created:
                # An acknowledged create is there, whatever came after it.
                assert (root / path).is_file(), path
        except AssertionError as exc:
            log = cycle.daemon.log[-3000:]
            raise AssertionError(f"chain {chain} cycle {number}: {exc}\n{log}") from exc
        storm_files = [
            str(file.relative_to(root))
            for file in session_files(root)
            if file.name.startswith(f"c{chain}-{number}-")
        ]
    seen["records"] = sum(ledger.next_n for ledger in ledgers)
    return seen


def test_a_new_session_file_has_no_name_until_its_first_line_is_synced(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a kill during create left an empty file, which could be neither
    opened (no session_start) nor created again (it exists).  Now the file appears
    under its name only once its session_start is synced."""
    faults = DiskFaults(monkeypatch)
    with InProcessDaemon(short_tmp) as daemon:
        directory = daemon.root / "new"
        directory.mkdir(parents=True)
        gate = threading.Event()
        faults.on(directory).fsync_gate = gate
        with RawClient(daemon.socket) as client:
            client.send(Create(id=client.next_id(), path="new/s.jsonl"))
            try:
                wait_for(lambda: faults.on(directory).fsyncs == 1)
                # The create waits in its fsync: a crash now would leave nothing behind.
                assert os.listdir(directory) == []
            finally:
                gate.set()
            opened = client.receive()
            assert isinstance(opened, SessionOpened), opened
        report = check_file(directory / "s.jsonl")
        assert report.sound and report.records == 1 and not report.unfinished_tail, report
        assert (directory / "s.jsonl").stat().st_mode & 0o777 == 0o600


@pytest.fixture
def crash_root() -> Any:
    base = Path(tempfile.mkdtemp(prefix="fl-crash-", dir="/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("chain", range(CI_CHAINS))
def test_kill_9_at_random_moments(crash_root: Path, chain: int) -> None:
    seen = _chain(crash_root, chain, CI_CYCLES)
    assert seen["kills"] == CI_CYCLES
    print(f"crash chain {chain}: {dict(seen)}")


@pytest.mark.soak
@pytest.mark.parametrize("chain", range(100, 100 + SOAK_CHAINS))
def test_kill_9_at_random_moments_soak(crash_root: Path, chain: int) -> None:
    seen = _chain(crash_root, chain, SOAK_CYCLES)
    assert seen["kills"] == SOAK_CYCLES
    print(f"crash chain {chain}: {dict(seen)}")


def test_without_o_tmpfile_the_file_is_linked_from_a_hidden_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the file system cannot make a file without a name, it is made under a
    hidden temporary name and linked into place; the temporary name goes."""
    monkeypatch.setattr(_paths, "_PROC_FD", False)
    roots = Roots(str(tmp_path))
    resolved = roots.resolve("d/s.jsonl")
    session = SessionFile.create(roots, resolved, session_id=new_id(), meta={}, time=now())
    session.close()
    assert os.listdir(tmp_path / "d") == ["s.jsonl"]
    assert check_file(tmp_path / "d" / "s.jsonl").records == 1
    with pytest.raises(FileExistsError):
        SessionFile.create(roots, resolved, session_id=new_id(), meta={}, time=now())
    assert os.listdir(tmp_path / "d") == ["s.jsonl"]
