"""``tail_all(after=CURSOR, follow=...)``: every session from a cursor, then live, with a
real daemon; the cursor is the one ``flightlog tail --all --after`` takes and prints."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.cli._tail_all import after_value
from flightlog.protocol import Record, events
from flightlog.sdk import connect
from flightlog.sdk._cursor import format_cursor
from flightlog.sdk.aio import aconnect
from support import DaemonProcess


@pytest.fixture
def root(daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The daemon's data root as the clients' default one (the files they replay)."""
    monkeypatch.setenv("FLIGHTLOG_ROOT", str(daemon.root))
    yield daemon.root


def record_turns(socket: str, path: str, turns: range) -> str:
    """Record ``turns`` in a new run of the session at ``path``; its session id."""
    with connect(socket) as client:
        session = client.session(path)
        with session.begin_run() as run:
            for turn in turns:
                run.record(events.TurnStart(turn_index=turn))
        session.close()
        return session.session_id


def keys(items: list[tuple[str, Record]]) -> list[tuple[str, str, int]]:
    return [(os.path.basename(path), record.type, record.seq) for path, record in items]


def test_without_follow_it_replays_every_session_and_ends(
    daemon: DaemonProcess, root: Path
) -> None:
    a = record_turns(daemon.socket, "a.jsonl", range(2))
    b = record_turns(daemon.socket, "sub/b.jsonl", range(1))
    with connect(daemon.socket) as client:
        tail = client.tail_all(follow=False)
        first = list(tail)
        # Each file in path order, every record once, from its session_start.
        assert [(name, seq) for name, _, seq in keys(first)] == [
            *(("a.jsonl", seq) for seq in range(1, 6)),
            *(("b.jsonl", seq) for seq in range(1, 5)),
        ]
        assert tail.cursor == format_cursor({a: 5, b: 4})
        assert after_value(tail.cursor) == {a: 5, b: 4}  # the CLI reads it back
        cursor = tail.cursor
        # More is written; from the cursor only that comes.
        record_turns(daemon.socket, "a.jsonl", range(5, 6))
        c = record_turns(daemon.socket, "c.jsonl", range(1))
        again = client.tail_all(after=cursor)
        assert keys(list(again)) == [
            ("a.jsonl", "run_start", 6),
            ("a.jsonl", "turn_start", 7),
            ("a.jsonl", "run_close", 8),
            *(
                ("c.jsonl", kind, seq)
                for seq, kind in enumerate(
                    ["session_start", "run_start", "turn_start", "run_close"], 1
                )
            ),
        ]
        assert after_value(again.cursor) == {a: 8, b: 4, c: 4}
        # Filters apply to what is delivered; the cursor moves over everything read.
        only = client.tail_all(after={a: 5}, types=["turn_start"])
        assert keys(list(only)) == [
            ("a.jsonl", "turn_start", 7),
            ("c.jsonl", "turn_start", 3),  # a directory's files before its subdirectories'
            ("b.jsonl", "turn_start", 3),
        ]
        assert after_value(only.cursor) == {a: 8, b: 4, c: 4}
        with pytest.raises(ValueError, match="SESSION_ID:SEQ"):
            client.tail_all(after="not a cursor")
        with pytest.raises(ValueError, match="cursor"):
            client.tail_all(after=3)


def test_with_follow_it_replays_then_goes_on_live(daemon: DaemonProcess, root: Path) -> None:
    a = record_turns(daemon.socket, "a.jsonl", range(2))
    with (
        connect(daemon.socket) as client,
        connect(daemon.socket) as writer,
        client.tail_all(after={a: 3}, follow=True) as tail,
    ):
        assert keys([next(tail), next(tail)]) == [
            ("a.jsonl", "turn_start", 4),
            ("a.jsonl", "run_close", 5),
        ]
        # Written after the replay: delivered live, each once, a new session too.
        session = writer.create("live.jsonl")
        with session.begin_run() as run:
            run.record(events.TurnStart(turn_index=0))
        session.close()
        live = [next(tail) for _ in range(4)]
        assert keys(live) == [
            ("live.jsonl", "session_start", 1),
            ("live.jsonl", "run_start", 2),
            ("live.jsonl", "turn_start", 3),
            ("live.jsonl", "run_close", 4),
        ]
        assert after_value(tail.cursor) == {a: 5, session.session_id: 4}


@pytest.mark.anyio
async def test_the_async_client_replays_from_a_cursor(daemon: DaemonProcess, root: Path) -> None:
    a = record_turns(daemon.socket, "a.jsonl", range(3))
    async with aconnect(daemon.socket) as client:
        tail = client.tail_all(after=f"{a}:4")
        got = [(os.path.basename(path), record.seq) async for path, record in tail]
        assert got == [("a.jsonl", 5), ("a.jsonl", 6)]
        assert tail.cursor == f"{a}:6"
