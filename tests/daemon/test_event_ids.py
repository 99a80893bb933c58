"""Caller-supplied event ids: ``run.record(event, event_id=...)`` is written once per
session however often it is recorded, by agents that are real processes killed with
SIGKILL and replay their own events, across a daemon killed and started again on the
same files; a repeat is counted in ``run_close`` and in ``status``."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import msgspec
import pytest

from flightlog.protocol import LocalProtocolError, Record, events
from flightlog.protocol.format import encode_line, parse_line
from flightlog.sdk import MemoryDaemon, MockTransport, check, connect, read
from support import DaemonProcess, communicate, run_python

#: An agent that records turns ``first`` to ``last`` with ids ``turn-N`` (and one event
#: without an id per turn), then either closes or kills itself with SIGKILL after a sync.
AGENT = """
import os, signal, sys
from flightlog.protocol import events
from flightlog.sdk import connect

socket, path, end = sys.argv[1], sys.argv[2], sys.argv[5]
first, last = int(sys.argv[3]), int(sys.argv[4])
with connect(socket) as client:
    session = client.session(path, meta={"app": "ids"})
    run = session.begin_run()
    for turn in range(first, last + 1):
        run.record(events.TurnStart(turn_index=turn), event_id=f"turn-{turn}")
        run.record(events.TurnEnd(turn_index=turn), event_id=f"turn-{turn}-end")
    if end == "kill":
        session.sync()
        print("synced", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    run.close()
    session.close()
    print("closed", flush=True)
"""


def agent(daemon: DaemonProcess, path: str, first: int, last: int, end: str) -> int:
    proc = run_python(AGENT, daemon.socket, path, str(first), str(last), end)
    out, err = communicate(proc, timeout=60)
    assert out.decode().strip() == ("synced" if end == "kill" else "closed"), err.decode()
    return proc.returncode


def ids_in(path: Path) -> list[str]:
    return [str(r.event_id) for r in read(path) if r.type in ("turn_start", "turn_end")]


def run_closes(path: Path) -> list[dict[str, object]]:
    return [r.decode_data() for r in read(path) if r.type == "run_close"]


def test_an_agent_killed_and_started_again_writes_each_event_once(
    daemon: DaemonProcess,
) -> None:
    path = daemon.root / "ids" / "killed.jsonl"
    # The first process records turns 0..4 and dies; the second, not knowing how far
    # the first got, records everything again from 0 to 9; a third once more.
    assert agent(daemon, "ids/killed.jsonl", 0, 4, "kill") == -signal.SIGKILL
    assert agent(daemon, "ids/killed.jsonl", 0, 9, "close") == 0
    assert agent(daemon, "ids/killed.jsonl", 0, 9, "close") == 0
    expected = [f"turn-{turn}{end}" for turn in range(10) for end in ("", "-end")]
    assert ids_in(path) == expected
    # The killed run has no run_close; the second dropped the first's ten records, the
    # third all twenty.
    assert run_closes(path) == [
        {"error": None, "duplicates": 10},
        {"error": None, "duplicates": 20},
    ]
    assert check(path).sound


def test_the_ids_outlive_a_daemon_restart(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    try:
        assert agent(daemon, "ids/restart.jsonl", 0, 2, "kill") == -signal.SIGKILL
        daemon.kill()  # no shutdown: the next daemon knows the ids from the file alone
        daemon.proc.wait(timeout=30)
        daemon = DaemonProcess(short_tmp).start()
        assert agent(daemon, "ids/restart.jsonl", 0, 3, "close") == 0
    finally:
        daemon.stop()
    path = daemon.root / "ids" / "restart.jsonl"
    assert ids_in(path) == [f"turn-{turn}{end}" for turn in range(4) for end in ("", "-end")]
    assert run_closes(path) == [{"error": None, "duplicates": 6}]


def test_a_repeat_in_one_run_is_counted_in_status_and_run_close(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("ids/one.jsonl")
        with session.begin_run() as run:
            run.record(events.TurnStart(turn_index=0), event_id="a")
            run.record(events.TurnStart(turn_index=1))  # no id: written as always
            run.record(events.TurnStart(turn_index=0), event_id="a")
            run.record(events.TurnStart(turn_index=1))
            run.record(events.TurnStart(turn_index=2), event_id="ü" * 128)  # 256 bytes
            session.sync()
            (status,) = client.status().sessions
            assert status.duplicates == 1
        session.close()
    path = daemon.root / "ids" / "one.jsonl"
    lines = path.read_text().splitlines()
    facts = [json.loads(line) for line in lines if '"turn_start"' in line]
    assert [fact.get("event_id") for fact in facts] == ["a", None, None, "ü" * 128]
    # The member sits before data; a line without an id has none.
    assert '"run_id":"' in lines[2] and ',"event_id":"a","data":{' in lines[2]
    assert "event_id" not in lines[3]
    assert run_closes(path) == [{"error": None, "duplicates": 1}]


@pytest.mark.parametrize("bad", ["", "x" * 257, "é" * 129])
def test_an_invalid_id_is_refused_at_the_call(daemon: DaemonProcess, bad: str) -> None:
    with connect(daemon.socket) as client:
        session = client.create("ids/bad.jsonl")
        with session.begin_run() as run:
            with pytest.raises(LocalProtocolError, match="event id"):
                run.record(events.TurnStart(turn_index=0), event_id=bad)
            run.record(events.TurnStart(turn_index=1), event_id="fine")
        session.close()
    assert ids_in(daemon.root / "ids" / "bad.jsonl") == ["fine"]
    assert run_closes(daemon.root / "ids" / "bad.jsonl") == [{"error": None}]


@pytest.mark.parametrize("event_id", ["a", 'quote " and \\ and \n', "ü" * 128])
def test_a_line_with_an_id_is_what_msgspec_writes_and_reads(event_id: str) -> None:
    record = Record(
        session_id="s" * 32,
        seq=3,
        type="turn_start",
        time="2026-11-29T20:00:00.000000Z",
        run_id="r" * 32,
        event_id=event_id,
        data=msgspec.Raw(b'{"turn_index":0}'),
    )
    line = encode_line(record)
    assert line == msgspec.json.encode(record) + b"\n"
    assert parse_line(line[:-1], lineno=3, session_id="s" * 32, expected_seq=3) == record
    without = msgspec.structs.replace(record, event_id=msgspec.UNSET)
    assert b"event_id" not in encode_line(without)
    assert encode_line(without) == msgspec.json.encode(without) + b"\n"


def _repeats(client: object) -> None:
    """Two runs of one session that repeat ids, within a run and across runs."""
    session = client.create("ids/twice.jsonl")  # type: ignore[attr-defined]
    for _ in range(2):
        with session.begin_run() as run:
            for turn in (0, 1, 0, 2):
                run.record(events.TurnStart(turn_index=turn), event_id=f"t{turn}")
            run.record(events.TurnEnd(turn_index=0))
    session.close()


def test_the_memory_daemon_writes_what_flightlogd_writes(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        _repeats(client)
    memory = MemoryDaemon()
    with connect(transport=MockTransport(memory)) as client:
        _repeats(client)

    def shape(records: list[Record]) -> list[tuple[str, object, bytes]]:
        return [(r.type, r.event_id, bytes(r.data)) for r in records if r.type != "run_start"]

    real = list(read(daemon.root / "ids" / "twice.jsonl"))
    assert shape(memory.session("ids/twice.jsonl").records()) == shape(real)
    assert [r.decode_data() for r in real if r.type == "run_close"] == [
        {"error": None, "duplicates": 1},
        {"error": None, "duplicates": 4},
    ]
