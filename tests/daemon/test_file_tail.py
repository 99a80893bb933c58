"""The tail's file reading (``FileTail``) on real files: the reading rules of every other
reader, lines named by number, resumed mid-file, and a last line awaited."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from flightlog.daemon._file_tail import FileTail
from flightlog.daemon._paths import Roots
from flightlog.protocol import FileFormatError, Record
from flightlog.protocol.format import encode_line
from support.damaged_files import FOREIGN, sound_lines

SID = "0123456789abcdef0123456789abcdef"


def tail(
    tmp_path: Path,
    content: bytes,
    *,
    offset: int = 0,
    next_seq: int = 1,
    offset_seq: int | None = None,
) -> FileTail:
    """A reader of ``content`` from ``offset``, where the line ``offset_seq`` starts
    (default: ``next_seq``, or 1 at the start of the file)."""
    (tmp_path / "s.jsonl").write_bytes(content)
    roots = Roots(str(tmp_path))
    if offset_seq is None:
        offset_seq = next_seq if offset else 1
    return FileTail(roots, roots.resolve("s.jsonl"), offset, offset_seq, next_seq, 64 * 1024)


def seqs(lines: list[bytes]) -> list[int]:
    return [msgspec.json.decode(line, type=Record).seq for line in lines]


def foreign(line: bytes) -> bytes:
    record = msgspec.json.decode(line, type=Record)
    return encode_line(msgspec.structs.replace(record, session_id=FOREIGN))


def test_reads_every_line_then_nothing(tmp_path: Path) -> None:
    lines = sound_lines(SID, 3)
    reader = tail(tmp_path, b"".join(lines))
    assert seqs(reader.read_batch()) == [1, 2, 3, 4, 5, 6]
    assert reader.read_batch() == []
    assert (reader.next_seq, reader.offset) == (7, len(b"".join(lines)))


def test_lines_before_a_broken_one_come_first_then_the_error_naming_it(tmp_path: Path) -> None:
    lines = sound_lines(SID, 3)
    del lines[3]  # seq 4: a gap at line 4
    reader = tail(tmp_path, b"".join(lines))
    assert seqs(reader.read_batch()) == [1, 2, 3]
    with pytest.raises(FileFormatError) as caught:
        reader.read_batch()
    assert caught.value.message == "line 4: seq 5 leaves a gap: expected 4, 1 record(s) missing"
    assert caught.value.code == "session_corrupt"


def test_lines_before_after_are_checked_though_not_sent(tmp_path: Path) -> None:
    lines = sound_lines(SID, 6)
    lines[2] = foreign(lines[2])
    reader = tail(tmp_path, b"".join(lines), next_seq=7)
    with pytest.raises(FileFormatError) as caught:
        reader.read_batch()
    assert caught.value.line == 3
    assert "is not the file's session_id" in caught.value.reason


def test_resumed_mid_file_it_keeps_the_session_and_the_line_numbers(tmp_path: Path) -> None:
    lines = sound_lines(SID, 4)
    lines[4] = foreign(lines[4])
    offset = len(b"".join(lines[:3]))
    reader = tail(tmp_path, b"".join(lines), offset=offset, next_seq=4)
    assert seqs(reader.read_batch()) == [4]
    with pytest.raises(FileFormatError) as caught:
        reader.read_batch()
    assert caught.value.line == 5


def test_read_on_past_the_end_after_a_seq_the_file_did_not_hold_yet(tmp_path: Path) -> None:
    """Asked for the lines after seq 8 of a file of 6: nothing yet, and where it stopped
    is the end of the file with the seq of the line to come there (7), not 9; read on
    from there once the file grew, the lines before 9 are checked and skipped."""
    lines = sound_lines(SID, 6)  # seqs 1 to 9
    reader = tail(tmp_path, b"".join(lines[:6]), next_seq=9)
    assert reader.read_batch() == []
    assert (reader.next_seq, reader.offset, reader.offset_seq) == (9, len(b"".join(lines[:6])), 7)
    again = tail(
        tmp_path,
        b"".join(lines),
        offset=reader.offset,
        offset_seq=reader.offset_seq,
        next_seq=reader.next_seq,
    )
    assert seqs(again.read_batch()) == [9]


def test_an_unfinished_last_line_is_awaited(tmp_path: Path) -> None:
    lines = sound_lines(SID, 1)
    reader = tail(tmp_path, b"".join(lines[:2]) + lines[2][:20])
    assert seqs(reader.read_batch()) == [1, 2]
    assert reader.read_batch() == []
    with (tmp_path / "s.jsonl").open("ab") as file:
        file.write(lines[2][20:] + lines[3])
    assert seqs(reader.read_batch()) == [3, 4]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file: empty file: no session_start"),
        (b'{"session_id":', "line 1: no complete line: the session_start line is unfinished"),
    ],
)
def test_a_file_without_a_first_line_is_refused(
    tmp_path: Path, content: bytes, message: str
) -> None:
    with pytest.raises(FileFormatError) as caught:
        tail(tmp_path, content).read_batch()
    assert caught.value.message == message


def test_a_line_longer_than_a_frame_carries_is_refused_naming_it(tmp_path: Path) -> None:
    lines = sound_lines(SID, 2)
    lines[3] = lines[3][:-2] + b" " * (70 * 1024) + b"}\n"
    reader = tail(tmp_path, b"".join(lines))
    assert seqs(reader.read_batch()) == [1, 2, 3]
    with pytest.raises(FileFormatError) as caught:
        reader.read_batch()
    assert caught.value.line == 4
    assert "bytes long, more than 65536" in caught.value.reason
