"""read() and check(): session files without the daemon."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from flightlog.protocol import (
    Record,
    new_id,
)
from flightlog.protocol.format import (
    encode_line,
)
from flightlog.sdk import FileFormatError, check, read

SESSION = new_id()
RUN = new_id()


def record(seq: int, type: str, data: bytes, run_id: str | None = RUN) -> bytes:
    return encode_line(
        Record(
            session_id=SESSION,
            seq=seq,
            type=type,
            time="2026-11-29T20:00:00.000000Z",
            run_id=run_id,
            data=msgspec.Raw(data),
        )
    )


def session_file(path: Path, *, extra: bytes = b"") -> Path:
    path.write_bytes(
        record(1, "session_start", b'{"format_version":1,"meta":{"app":"t"}}', None)
        + record(2, "run_start", b'{"pid":1,"client":"t"}')
        + record(3, "agent_start", b'{"agent":null,"messages":[]}')
        + extra
    )
    return path


def test_read_streams_every_record(tmp_path: Path) -> None:
    path = session_file(tmp_path / "s.jsonl")
    records = list(read(path))
    assert [r.seq for r in records] == [1, 2, 3]
    assert records[0].decode_data()["meta"] == {"app": "t"}
    assert [r.type for r in read(str(path))] == ["session_start", "run_start", "agent_start"]


def test_read_ignores_an_unfinished_tail(tmp_path: Path) -> None:
    unfinished = record(4, "agent_end", b'{"ok":true}')[:-1]
    path = session_file(tmp_path / "s.jsonl", extra=unfinished)
    assert [r.seq for r in read(path)] == [1, 2, 3]


def test_read_refuses_a_broken_line(tmp_path: Path) -> None:
    path = session_file(tmp_path / "s.jsonl", extra=b"{not json}\n")
    records = read(path)
    assert [next(records).seq for _ in range(3)] == [1, 2, 3]
    with pytest.raises(FileFormatError) as caught:
        next(records)
    assert caught.value.line == 4


def test_read_opens_the_file_when_iterated(tmp_path: Path) -> None:
    records = read(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError):
        next(records)


def test_check_reports_a_sound_file(tmp_path: Path) -> None:
    report = check(session_file(tmp_path / "s.jsonl"))
    assert report.sound
    assert report.session_id == SESSION
    assert (report.records, report.runs, report.open_runs) == (3, 1, [RUN])


def test_check_reports_a_gap_without_raising(tmp_path: Path) -> None:
    path = session_file(tmp_path / "s.jsonl", extra=record(5, "agent_end", b"{}"))
    report = check(path)
    assert not report.sound
    assert report.error_line == 4
    assert report.error is not None and "gap" in report.error


def test_check_of_a_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        check(tmp_path / "missing.jsonl")
