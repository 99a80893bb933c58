"""``run.record_many(events, event_ids=...)``: each event with an id is written once per
session, as with ``record(event, event_id=...)``: across a retry of the whole batch, an
agent killed with SIGKILL and started again, and a daemon killed and started again on
the same files, while the client rides through it; repeats are counted in
``run_close``.  Bad ids are refused before anything is sent."""

from __future__ import annotations

import signal
from pathlib import Path

import msgspec
import pytest

from flightlog.protocol import LocalProtocolError, events
from flightlog.sdk import connect, read
from support import DaemonProcess, run_python

#: Records turns ``first`` to ``last`` in one record_many, ids ``turn-N``; then kills
#: itself after a sync, or closes.
AGENT = """
import os, signal, sys
from flightlog.protocol import events
from flightlog.sdk import connect

socket, path, first, last, end = sys.argv[1:6]
turns = range(int(first), int(last) + 1)
with connect(socket) as client:
    session = client.session(path)
    run = session.begin_run()
    run.record_many(
        [events.TurnStart(turn_index=t) for t in turns], event_ids=[f"turn-{t}" for t in turns]
    )
    if end == "kill":
        session.sync()
        os.kill(os.getpid(), signal.SIGKILL)
    run.close()
    session.close()
"""


def turns(first: int, last: int) -> list[events.TurnStart]:
    return [events.TurnStart(turn_index=t) for t in range(first, last + 1)]


def ids(first: int, last: int) -> list[str | None]:
    return [f"turn-{t}" for t in range(first, last + 1)]


def ids_in(path: Path) -> list[object]:
    return [
        None if r.event_id is msgspec.UNSET else r.event_id
        for r in read(path)
        if r.type == "turn_start"
    ]


def run_closes(path: Path) -> list[dict[str, object]]:
    return [r.decode_data() for r in read(path) if r.type == "run_close"]


def test_a_batch_retried_across_a_daemon_restart_is_written_once(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    try:
        with connect(daemon.socket, reconnect_grace=60) as client:
            session = client.create("ids/many.jsonl")
            run = session.begin_run()
            run.record_many(turns(0, 4), event_ids=ids(0, 4))
            session.sync()
            daemon.kill()  # no shutdown: the next daemon knows the ids from the file
            daemon.proc.wait(timeout=30)
            daemon = DaemonProcess(short_tmp).start()
            # The caller, not knowing what was written, sends the batch again with more,
            # and once more; the client reconnects and resumes the run.
            run.record_many(turns(0, 7), event_ids=ids(0, 7))
            run.record_many(turns(0, 7), event_ids=ids(0, 7))
            run.close()
            session.close()
    finally:
        daemon.stop()
    path = daemon.root / "ids" / "many.jsonl"
    assert ids_in(path) == ids(0, 7)
    # Counted since the run was resumed: 5 of the first retry, 8 of the second.
    assert run_closes(path) == [{"error": None, "duplicates": 13}]
    assert [r.type for r in read(path)].count("run_resume") == 1


def test_a_killed_agent_and_a_restarted_daemon_write_each_batch_event_once(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp).start()
    try:
        killed = run_python(AGENT, daemon.socket, "ids/agent.jsonl", "0", "3", "kill")
        killed.communicate(timeout=60)
        assert killed.returncode == -signal.SIGKILL
        daemon.kill()
        daemon.proc.wait(timeout=30)
        daemon = DaemonProcess(short_tmp).start()
        again = run_python(AGENT, daemon.socket, "ids/agent.jsonl", "0", "5", "close")
        _, err = again.communicate(timeout=60)
        assert again.returncode == 0, err.decode()
    finally:
        daemon.stop()
    path = daemon.root / "ids" / "agent.jsonl"
    assert ids_in(path) == ids(0, 5)
    assert run_closes(path) == [{"error": None, "duplicates": 4}]


def test_events_without_an_id_in_a_batch_are_written_each_time(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("ids/mixed.jsonl")
        with session.begin_run() as run:
            for _ in range(2):
                run.record_many(turns(0, 2), event_ids=["a", None, "c"])
        session.close()
    path = daemon.root / "ids" / "mixed.jsonl"
    assert ids_in(path) == ["a", None, "c", None]
    assert run_closes(path) == [{"error": None, "duplicates": 2}]


@pytest.mark.parametrize(
    ("event_ids", "match"),
    [
        (["a", "b"], "2 event ids for 3 events"),
        (["a", "", "c"], "event id"),
        (["x" * 257], "event id"),
    ],
)
def test_bad_ids_refuse_the_whole_batch_before_it_is_sent(
    daemon: DaemonProcess, event_ids: list[str | None], match: str
) -> None:
    name = f"ids/bad-{len(event_ids)}-{len(event_ids[-1] or '')}.jsonl"
    with connect(daemon.socket) as client:
        session = client.create(name)
        with session.begin_run() as run:
            with pytest.raises(LocalProtocolError, match=match):
                run.record_many(turns(0, 2), event_ids=event_ids)
            run.record_many(turns(5, 5), event_ids=["fine"])  # the run goes on
        session.close()
    path = daemon.root / name
    assert ids_in(path) == ["fine"]
    assert run_closes(path) == [{"error": None}]
