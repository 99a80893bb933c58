"""read() and check() find a relative path where create() put it: under the data root."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightlog.protocol import events
from flightlog.sdk import check, connect, read
from support import DaemonProcess


def _record_one(daemon: DaemonProcess, path: str) -> None:
    with connect(daemon.socket) as client:
        session = client.create(path, meta={"app": "paths"})
        with session.begin_run() as run:
            run.record(events.AgentStart(agent="paths"))
        session.close()


def test_a_relative_path_reads_under_the_data_root(
    daemon: DaemonProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _record_one(daemon, "team/a.jsonl")
    monkeypatch.setenv("FLIGHTLOG_ROOT", str(daemon.root))
    # A file of the same name in the current directory is not the one meant.
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "a.jsonl").write_bytes(b"not a session\n")
    monkeypatch.chdir(tmp_path)
    assert [r.type for r in read("team/a.jsonl")] == [
        "session_start",
        "run_start",
        "agent_start",
        "run_close",
    ]
    assert check(Path("team/a.jsonl")).sound


def test_the_root_defaults_like_the_daemons(
    daemon: DaemonProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _record_one(daemon, "b.jsonl")
    monkeypatch.delenv("FLIGHTLOG_ROOT", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (tmp_path / "flightlog").symlink_to(daemon.root)
    assert len(list(read("b.jsonl"))) == 4


def test_root_overrides_and_an_absolute_path_is_used_as_it_is(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    _record_one(daemon, "c.jsonl")
    monkeypatch.setenv("FLIGHTLOG_ROOT", "/nonexistent")
    assert check("c.jsonl", root=daemon.root).sound
    assert len(list(read(daemon.root / "c.jsonl"))) == 4
    with pytest.raises(FileNotFoundError):
        list(read("c.jsonl"))
