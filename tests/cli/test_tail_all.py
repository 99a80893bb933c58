"""``flightlog tail --all --after CURSOR``: replay every session from a cursor, then follow
live, merged by (session, seq) with no gap and no duplicate; a real daemon, real files,
an agent writing while the tail starts and stops."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightlog.protocol.events import (
    TurnEnd,
    TurnStart,
)
from flightlog.protocol.wire import Sync
from flightlog.sdk import connect
from support import DaemonProcess, RawClient, read_lines
from support.daemon import begin, create, fact

AGENT = Path(__file__).resolve().parents[1] / "export" / "agent_runs.py"


class TailAll:
    """``flightlog tail --all --json ARGS`` with its output lines read in a thread."""

    #: Every one started: a test that fails before it stops one leaves none running
    #: (:func:`_no_tail_left_running`).
    started: list[TailAll] = []

    def __init__(self, daemon: DaemonProcess, *args: str) -> None:
        env = {
            **os.environ,
            "FLIGHTLOG_SOCKET": daemon.socket,
            "FLIGHTLOG_ROOT": str(daemon.root),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flightlog.cli", "tail", "--all", "--json", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        TailAll.started.append(self)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def take(self, count: int, timeout: float = 30) -> list[dict[str, Any]]:
        return [self.lines.get(timeout=timeout) for _ in range(count)]

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        status = self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        assert self.proc.stderr is not None and self.proc.stdout is not None
        stderr = self.proc.stderr.read()
        self.proc.stderr.close()
        self.proc.stdout.close()
        return status, stderr

    def kill(self) -> None:
        """SIGKILL if it still runs, then its reader ends and its pipes are closed."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def rest(self) -> list[dict[str, Any]]:
        found = []
        while not self.lines.empty():
            found.append(self.lines.get_nowait())
        return found


def resume_cursor(stderr: str) -> str:
    line = next(line for line in stderr.splitlines() if "resume with: --after " in line)
    return line.split("--after ", 1)[1].removesuffix(" --").strip()


def key(line: dict[str, Any]) -> tuple[str, int]:
    return line["session_id"], line["seq"]


@pytest.fixture(autouse=True)
def _no_tail_left_running() -> Iterator[None]:
    yield
    while TailAll.started:
        TailAll.started.pop().kill()


@pytest.fixture
def two_sessions(daemon: DaemonProcess) -> Iterator[list[Path]]:
    with connect(daemon.socket) as client:
        for name in ("a/one.jsonl", "b/two.jsonl"):
            session = client.create(name, meta={"name": name})
            with session.begin_run() as run:
                for turn in range(3):
                    run.record(TurnStart(turn_index=turn))
                    run.record(TurnEnd(turn_index=turn))
            session.close()
    yield [daemon.root / "a/one.jsonl", daemon.root / "b/two.jsonl"]


def test_replays_everything_then_follows_then_resumes(
    daemon: DaemonProcess, two_sessions: list[Path]
) -> None:
    on_disk = [line for path in two_sessions for line in read_lines(path)]
    tail = TailAll(daemon, "--after", "start")
    replayed = tail.take(len(on_disk))
    assert sorted(map(key, replayed)) == sorted(map(key, on_disk))
    assert {line["path"] for line in replayed} == {str(p) for p in two_sessions}
    # Exactly as in the files, plus the path.
    first = next(line for line in replayed if key(line) == key(on_disk[0]))
    assert {k: v for k, v in first.items() if k != "path"} == on_disk[0]

    with connect(daemon.socket) as client:
        session = client.open("a/one.jsonl")
        with session.begin_run() as run:
            run.record(TurnStart(turn_index=9))
        session.close()
    live = tail.take(3)
    assert [line["type"] for line in live] == ["run_start", "turn_start", "run_close"]
    status, stderr = tail.stop()
    assert status == 130
    seen = replayed + live + tail.rest()
    assert len(seen) == len(set(map(key, seen)))
    cursor = resume_cursor(stderr)
    last = {line["session_id"]: line["seq"] for path in two_sessions for line in read_lines(path)}
    assert dict(item.split(":") for item in cursor.split(",")) == {
        sid: str(seq) for sid, seq in last.items()
    }

    # Written while no tail ran: the resumed tail starts exactly there.
    with connect(daemon.socket) as client:
        session = client.open("b/two.jsonl")
        with session.begin_run() as run:
            run.record(TurnStart(turn_index=10))
        session.close()
    resumed = TailAll(daemon, "--after", cursor)
    missed = resumed.take(3)
    assert [line["type"] for line in missed] == ["run_start", "turn_start", "run_close"]
    assert {line["path"] for line in missed} == {str(two_sessions[1])}
    assert missed[0]["seq"] == last[read_lines(two_sessions[1])[0]["session_id"]] + 1
    status, _ = resumed.stop()
    assert status == 130
    assert resumed.rest() == []


def test_no_gap_and_no_duplicate_while_an_agent_writes(
    daemon: DaemonProcess, two_sessions: list[Path]
) -> None:
    agent = subprocess.Popen(
        [sys.executable, str(AGENT), daemon.socket, "c/live.jsonl", "40", "0.002"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # Started while the agent writes: part of the session is replayed, part live.
        tail = TailAll(daemon, "--after", "start", "--type", "tool_exec_end,run_close")
        assert agent.stdout is not None
        assert agent.stdout.readline().strip() == "done"
        assert agent.wait(timeout=60) == 0
        path = daemon.root / "c/live.jsonl"
        expected = [
            key(line)
            for p in [*two_sessions, path]
            for line in read_lines(p)
            if line["type"] in ("tool_exec_end", "run_close")
        ]
        got = tail.take(len(expected))
        status, stderr = tail.stop()
        got += tail.rest()
        assert status == 130
        assert sorted(map(key, got)) == sorted(expected)
        live = [line["seq"] for line in got if line["path"] == str(path)]
        assert live == sorted(live)
        assert f"{read_lines(path)[0]['session_id']}:{read_lines(path)[-1]['seq']}" in stderr
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.wait()
        assert agent.stdout is not None
        agent.stdout.close()


def test_cursor_usage_errors(daemon: DaemonProcess, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flightlog.cli", "tail", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "FLIGHTLOG_SOCKET": daemon.socket},
            timeout=60,
        )

    bad = run("--all", "--after", "nothex:3")
    assert bad.returncode == 2
    assert "SESSION_ID:SEQ" in bad.stderr
    without_all = run("--after", f"{'a' * 32}:3", "x.jsonl")
    assert without_all.returncode == 2
    assert "goes with --all" in without_all.stderr
    missing = run("--all", "--after", f"@{tmp_path / 'none'}")
    assert missing.returncode == 2
    assert "cannot read the cursor file" in missing.stderr


# ----------------------------------------------------------- the merge, in-process


def format_example() -> list[bytes]:
    """The lines of docs/format.md's example file, without their newlines."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text()
    block = text.split("## 10. An example file", 1)[1].split("```")[1]
    return [line.encode() for line in block.splitlines() if line.startswith("{")]


def test_a_session_file_is_read_as_it_grows(tmp_path: Path) -> None:
    from flightlog.cli._sessions import SessionFile

    lines = format_example()
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"\n".join(lines[:5]) + b"\n" + lines[5][:40])  # an unfinished line
    file = SessionFile(str(path), lambda _sid: 2)
    assert [r.seq for r in file.read()] == [3, 4, 5]  # 1 and 2 are before the cursor
    with path.open("ab") as out:
        out.write(lines[5][40:] + b"\n" + lines[6] + b"\n")
    assert [r.seq for r in file.read()] == [6, 7]
    assert list(file.read()) == []
    # A live record: the next seq is taken as it is, and not read again from the file.
    live = parse(lines[7])
    assert file.accept(live) and not file.accept(live)
    with path.open("ab") as out:
        out.write(lines[7] + b"\n" + lines[8] + b"\n")
    assert [r.seq for r in file.read()] == [9]


def test_a_cut_unfinished_line_and_a_replaced_file(tmp_path: Path) -> None:
    from flightlog.cli._sessions import SessionFile
    from flightlog.protocol import FileFormatError

    lines = format_example()
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"\n".join(lines[:3]) + b"\n" + b'{"session_id":"5f0c')
    file = SessionFile(str(path), lambda _sid: 0)
    assert [r.seq for r in file.read()] == [1, 2, 3]
    # The daemon reopens the file after a crash: it cuts the unfinished line, appends.
    path.write_bytes(b"\n".join(lines[:4]) + b"\n")
    assert [r.seq for r in file.read()] == [4]
    # Shorter than the lines already read: another file.
    path.write_bytes(lines[0] + b"\n")
    with pytest.raises(FileFormatError, match="replaced"):
        list(file.read())
    assert list(file.read()) == []  # stopped for good


def parse(line: bytes) -> Any:
    from flightlog.protocol.format import (
        parse_line,
    )

    return parse_line(line, lineno=0, session_id=None, expected_seq=None)


def test_cursor_text() -> None:
    from flightlog.cli._sessions import format_cursor, parse_cursor

    a, b = "a" * 32, "b" * 32
    assert parse_cursor(f" {b}:4,{a}:18 ") == {a: 18, b: 4}
    assert format_cursor({b: 4, a: 18, "c" * 32: 0}) == f"{a}:18,{b}:4"
    assert parse_cursor("") == parse_cursor("0") == {}
    for bad in ("x:1", f"{a}:", f"{a}-3", f"{a.upper()}:3"):
        with pytest.raises(ValueError, match="SESSION_ID:SEQ"):
            parse_cursor(bad)


def test_live_records_merge_with_the_files(tmp_path: Path) -> None:
    from flightlog.cli._sessions import AllSessions

    lines = format_example()
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    path = root / "d" / "s.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines[:4]))
    errors: list[tuple[str, Exception]] = []
    sessions = AllSessions([str(root)], {}, lambda p, e: errors.append((p, e)))
    assert [r.seq for _, r in sessions.scan()] == [1, 2, 3, 4]
    # Pushed live, in order: taken as they come, the file is not read.
    assert [r.seq for _, r in sessions.live(str(path), parse(lines[4]))] == [5]
    # An old one again: dropped.
    assert list(sessions.live(str(path), parse(lines[2]))) == []
    # A gap (6 and 7 were not pushed): read from the file, up to and with the pushed one.
    path.write_bytes(b"".join(line + b"\n" for line in lines[:8]))
    assert [r.seq for _, r in sessions.live(str(path), parse(lines[7]))] == [6, 7, 8]
    assert list(sessions.scan()) == []
    session_id = parse(lines[0]).session_id
    assert sessions.cursor() == {session_id: 8}
    # A session met first live (a path outside the root): read from its start.
    other = tmp_path / "elsewhere.jsonl"
    other.write_bytes(b"".join(line + b"\n" for line in lines[:2]))
    assert [r.seq for _, r in sessions.live(str(other), parse(lines[1]))] == [1, 2]
    assert errors == []


def test_the_doorbell_hands_over_records_then_says_it_ended() -> None:
    from flightlog.cli._sessions import Doorbell, Rescan

    pushed = [("p", parse(line)) for line in format_example()[:3]]
    calls: list[int] = []

    def subscribe() -> tuple[Any, Any]:
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionRefusedError("no daemon")
        return iter(pushed), lambda: None

    bell = Doorbell(subscribe, retry=0.01).start()
    assert bell.started(timeout=10)
    got = [bell.items.get(timeout=10) for _ in range(5)]
    bell.close()
    assert got[:3] == pushed
    assert isinstance(got[3], Rescan) and not got[3].final
    assert isinstance(got[4], Rescan) and "no daemon" in got[4].reason
    once = Doorbell(lambda: (iter(()), lambda: None), retry=None).start()
    end = once.items.get(timeout=10)
    assert isinstance(end, Rescan) and end.final


@pytest.mark.parametrize("cursor", [False, True], ids=["live", "from-a-cursor"])
def test_a_blob_it_cannot_put_back_is_said_as_tail_says_it(
    daemon: DaemonProcess, cursor: bool
) -> None:
    # A line that refers to a blob the store does not hold (written by hand: the
    # daemon stores every blob before the line that refers to it).
    digest = hashlib.sha256(b"never stored").hexdigest()
    reference = b'{"$flightlog":"blob","sha256":"%s","media_type":"image/png","size":16,' % (
        digest.encode()
    )
    reference += b'"form":"base64"}'
    data = b'{"execution":{"id":"t1","kind":"tool","attempt":1},"tool_call_id":"c1",'
    data += b'"name":"shot","content":[' + reference + b"]}"
    tail = TailAll(daemon, *(["--after", "start"] if cursor else []))
    with RawClient(daemon.socket) as client:
        opened = create(client, "dangling.jsonl")
        run = begin(client, opened.session_id)
        # Turns until the tail prints one: it is subscribed from then on.
        while True:
            client.send(fact(opened.session_id, run.run_id))
            with contextlib.suppress(queue.Empty):
                if tail.lines.get(timeout=0.2)["type"] == "turn_start":
                    break
        tail.rest()
        client.send(fact(opened.session_id, run.run_id, event_type="tool_exec_end", data=data))
        client.request(Sync(id=client.next_id(), session_id=opened.session_id))
        while (line := tail.lines.get(timeout=30))["type"] != "tool_exec_end":
            pass
    assert line["data"]["content"] == [json.loads(reference)]  # the reference, kept
    _, stderr = tail.stop()
    said = [text for text in stderr.splitlines() if digest in text]
    assert len(said) == 1, stderr
    assert "blob_not_found" in said[0] and said[0].endswith("; the reference is kept")
    assert said[0].startswith(f"flightlog: {daemon.root / 'dangling.jsonl'}: blob {digest}")
