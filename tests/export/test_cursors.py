"""The follower's cursors on disk, and what it does while the backend refuses; the OTLP
side is a stand-in that says no, then yes (the real backend is in test_follow.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flightlog.cli._commands import CommandError
from flightlog.cli._export import _Cursors, _Follower, state_dir
from flightlog.cli._sessions import SessionFile
from flightlog.cli._spans import Span

from .test_spans import example_file


class Backend:
    """Refuses the first ``refusals`` exports, then keeps every span it is sent."""

    endpoint = "stand-in"

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.attempts = 0
        self.spans: list[Span] = []

    def send(self, spans: list[Span]) -> bool:
        self.attempts += 1
        if self.refusals:
            self.refusals -= 1
            return False
        self.spans.extend(spans)
        return True


def feed(follower: _Follower, path: Path) -> None:
    follower.take((str(path), record) for record in SessionFile(str(path), lambda _: 0).read())


def test_cursors_move_only_once_the_backend_took_the_spans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = example_file(tmp_path)
    state = tmp_path / "state"
    backend = Backend(refusals=1)
    follower = _Follower(backend, _Cursors(str(state)), content=False)  # type: ignore[arg-type]
    feed(follower, path)
    assert list(state.iterdir()) == []  # nothing sent yet, nothing moved
    follower.flush()
    assert backend.attempts == 2
    assert "did not take the spans; trying again in 1s" in capsys.readouterr().err
    assert [s.name for s in backend.spans] == [
        "chat claude-x",
        "execute_tool read_file",
        "turn 0",
        "invoke_agent demo",
    ]
    (cursor,) = state.glob("*.cursor")
    assert cursor.name == "5f0c2a9e8b7d4c1fa3e6b2d9c8a7f015.cursor"
    assert json.loads(cursor.read_text()) == {"seq": 18, "path": str(path)}
    assert not list(state.glob("*.tmp"))

    # A restart reads the file again from its start, and sends nothing already taken.
    again = Backend(refusals=0)
    restarted = _Follower(again, _Cursors(str(state)), content=False)  # type: ignore[arg-type]
    feed(restarted, path)
    restarted.flush()
    assert again.spans == [] and again.attempts == 0


def test_a_cursor_between_spans_sends_only_the_later_ones(tmp_path: Path) -> None:
    path = example_file(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    # Sent up to seq 10: the chat span (ended at seq 8) was taken, the others not.
    (state / "5f0c2a9e8b7d4c1fa3e6b2d9c8a7f015.cursor").write_text('{"seq": 10, "path": "x"}')
    backend = Backend(refusals=0)
    follower = _Follower(backend, _Cursors(str(state)), content=False)  # type: ignore[arg-type]
    feed(follower, path)
    follower.flush()
    assert [s.name for s in backend.spans] == [
        "execute_tool read_file",
        "turn 0",
        "invoke_agent demo",
    ]


def test_a_damaged_cursor_file_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / f"{'a' * 32}.cursor").write_text("{not json")
    with pytest.raises(CommandError) as raised:
        _Cursors(str(tmp_path))
    assert raised.value.code == 2
    assert "not a cursor file" in raised.value.message


def test_the_state_directory() -> None:
    env: dict[str, Any] = {
        "STATE_DIRECTORY": "/var/lib/flightlog-export:/x",
        "XDG_STATE_HOME": "/s",
    }
    assert state_dir(env, "/home/u") == "/var/lib/flightlog-export"
    assert state_dir({"XDG_STATE_HOME": "/s"}, "/home/u") == "/s/flightlog-export"
    assert state_dir({}, "/home/u") == "/home/u/.local/state/flightlog-export"
