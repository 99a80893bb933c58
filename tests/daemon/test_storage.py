"""The daemon's file layer in process: what a sync owes after the descriptor closed,
the record times it accepts, and the bounded size of each write."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from flightlog.daemon import _storage
from flightlog.daemon._paths import Roots
from flightlog.daemon._storage import SessionFile, StorageError
from flightlog.protocol import (
    Record,
    new_id,
    now,
)
from flightlog.protocol.format import (
    encode_line,
    is_time,
)


@pytest.fixture
def session(tmp_path: Path) -> SessionFile:
    roots = Roots(str(tmp_path))
    return SessionFile.create(
        roots, roots.resolve("s.jsonl"), session_id=new_id(), meta={}, time=now()
    )


def _line(session: SessionFile, seq: int) -> bytes:
    return encode_line(
        Record(
            session_id=session.session_id,
            seq=seq,
            type="turn_start",
            time=now(),
            data=msgspec.Raw(b"{}"),
        )
    )


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inodes fsynced from now on (the real fsync still runs)."""
    synced: list[int] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return synced


def test_sync_after_the_descriptor_was_closed_still_fsyncs(
    session: SessionFile, fsyncs: list[int]
) -> None:
    inode = session.ident[1]
    session.write(_line(session, 2), count=1)
    session.close()  # idle, or the least recently used: the write is not durable yet
    session.sync()
    assert fsyncs == [inode]
    session.sync()  # nothing new written: nothing to do
    assert fsyncs == [inode]
    session.close()


def test_sync_of_a_clean_file_with_a_closed_descriptor_does_not_reopen(
    session: SessionFile, fsyncs: list[int]
) -> None:
    session.close()
    session.sync()
    assert fsyncs == []
    assert session.fd is None


def test_sync_owed_to_a_replaced_file_fails(session: SessionFile, tmp_path: Path) -> None:
    session.write(_line(session, 2), count=1)
    session.close()
    (tmp_path / "other").write_bytes((tmp_path / "s.jsonl").read_bytes())
    (tmp_path / "other").rename(tmp_path / "s.jsonl")
    with pytest.raises(StorageError, match="replaced or changed"):
        session.sync()


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("2026-11-29T20:00:00Z", True),
        ("2026-11-29T20:00:00.123456789Z", True),
        ("2028-02-29T23:59:59.999999Z", True),
        ("2026-02-29T20:00:00Z", False),
        ("2026-11-29T24:00:00Z", False),
        ("2026-11-29T20:00:60Z", False),
        ("2026-11-29 20:00:00Z", False),
        ("2026-11-29T20:00:00+00:00", False),
        ("\u0662\u0660\u0662\u0666-11-29T20:00:00Z", False),
    ],
)
def test_record_times_the_daemon_accepts(text: str, valid: bool) -> None:
    assert is_time(text) is valid


def test_a_large_batch_lands_whole_in_writes_of_bounded_size(
    session: SessionFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write() gets at most _WRITE_BYTES (see _storage); the file gets every byte."""
    sizes: list[int] = []
    real = _storage._os_write

    def spy(fd: int, data: memoryview) -> int:
        sizes.append(len(data))
        return real(fd, data)

    monkeypatch.setattr(_storage, "_os_write", spy)
    lines = b"".join(_line(session, seq) for seq in range(2, 2000))
    before = os.path.getsize(session.path)
    session.write(lines, count=1998)
    assert os.path.getsize(session.path) == before + len(lines)
    with open(session.path, "rb") as written:
        assert written.read()[before:] == lines
    assert len(sizes) == -(-len(lines) // _storage._WRITE_BYTES) > 1
    assert max(sizes) == _storage._WRITE_BYTES
