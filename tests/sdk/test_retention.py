"""The retention survey reads a session's last activity from the file's end: the same
answer as reading every record, on sound files and on damaged tails."""

from __future__ import annotations

import base64
import hashlib
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from flightlog.protocol import format_time, parse_time
from flightlog.protocol._blobs import extract
from flightlog.sdk import read
from flightlog.sdk._blobs import References
from flightlog.sdk._retention import (
    BlobUse,
    Limits,
    StoredFile,
    _link_or_copy,
    last_activity,
    parse_age,
    parse_size,
    plan,
)

_BASE = datetime(2026, 1, 1, tzinfo=UTC)


def line(seq: int, minutes: int, *, note: str = "", sid: str = "s1") -> bytes:
    record = {
        "session_id": sid,
        "seq": seq,
        "type": "session_start" if seq == 1 else "agent_start",
        "time": format_time(_BASE + timedelta(minutes=minutes)),
        "run_id": None,
        "data": {"format_version": 1, "meta": {}} if seq == 1 else {"agent": "a", "note": note},
    }
    return msgspec.json.encode(record) + b"\n"


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    os.utime(path, (1, 1))  # mtime 1970: the records decide
    return path


def full_scan(path: Path) -> datetime:
    times = [parse_time(r.time) for r in read(path)]
    return max([datetime.fromtimestamp(1, UTC), *times])


SOUND = {
    "one line": line(1, 0),
    "many lines": b"".join(line(n, n) for n in range(1, 300)),
    "a long last line": line(1, 0) + line(2, 5, note="y" * 300_000),
    "long lines throughout": b"".join(line(n, n, note="z" * 70_000) for n in range(1, 6)),
    "times out of order": line(1, 50) + line(2, 10),
}


@pytest.mark.parametrize("name", sorted(SOUND))
def test_the_end_gives_what_a_full_scan_gives(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / "s.jsonl", SOUND[name])
    session_id, latest = last_activity(str(path), 1)
    assert session_id == "s1"
    if name == "times out of order":  # the last record is what the file's end says
        assert latest == _BASE + timedelta(minutes=10)
    else:
        assert latest == full_scan(path)


@pytest.mark.parametrize(
    ("tail", "minutes"),
    [
        (line(3, 999)[:-1], 2),  # an unfinished tail that happens to be valid JSON
        (b'{"session_id":"s1","seq":3,"ti', 2),
        (b"\x00" * 100_000, 2),  # a power cut's NUL bytes
        (b"{not json\n", 2),  # a corrupt complete line: skipped backwards
        (b"{not json\n" + line(4, 7)[:-3], 2),
        (b"x" * 200_000 + b"\n" + b"y" * 10, 2),
    ],
)
def test_a_damaged_tail_is_skipped(tmp_path: Path, tail: bytes, minutes: int) -> None:
    path = write(tmp_path / "s.jsonl", line(1, 0) + line(2, minutes) + tail)
    assert last_activity(str(path), 1) == ("s1", _BASE + timedelta(minutes=minutes))


@pytest.mark.parametrize("data", [b"", line(1, 5)[:-1], b"\n\n"])
def test_no_complete_record_gives_the_mtime(tmp_path: Path, data: bytes) -> None:
    path = write(tmp_path / "s.jsonl", data)
    assert last_activity(str(path), 1)[1] == datetime.fromtimestamp(1, UTC)


def test_the_mtime_wins_when_later(tmp_path: Path) -> None:
    path = write(tmp_path / "s.jsonl", line(1, 0))
    later = (_BASE + timedelta(days=3)).timestamp()
    assert last_activity(str(path), later)[1] == datetime.fromtimestamp(later, UTC)


def test_sizes_and_ages() -> None:
    assert parse_size("10G") == 10 << 30 and parse_size("2048") == 2048
    assert parse_size("1.5KiB") == 1536 and parse_age("90d") == timedelta(days=90)
    for bad in ("ten", "-1G", "1 G"):
        with pytest.raises(ValueError, match="a size"):
            parse_size(bad)
    with pytest.raises(ValueError, match="an age"):
        parse_age("3 weeks")


def test_each_owner_is_planned_alone() -> None:
    now = _BASE + timedelta(days=100)

    def stored(owner: int, days: int) -> StoredFile:
        return StoredFile(
            f"/r/{owner}/{days}", "/r", 100, 100, 0, owner, last_activity=now - timedelta(days=days)
        )

    files = [stored(1, d) for d in (10, 11, 12)] + [stored(2, d) for d in (30, 31)]
    removals = plan(files, Limits(max_use=200), now=now, free=None)
    assert [r.path for r in removals] == ["/r/1/12"]  # owner 2 is at its limit, not over
    # The operator's total cap takes the oldest, whoever's: owner 2's first.
    capped = plan(files, Limits(max_use=300, max_use_total=300), now=now, free=None)
    assert [(r.path, r.reason) for r in capped] == [
        ("/r/2/31", "max-use-total"),
        ("/r/2/30", "max-use-total"),
    ]
    everyone = plan(files, Limits(keep_free=1000), now=now, free=500)
    assert [r.path for r in everyone] == ["/r/2/31", "/r/2/30", "/r/1/12", "/r/1/11", "/r/1/10"]
    held = plan(
        files,
        Limits(max_age=timedelta(days=1)),
        now=now,
        free=None,
        protected=lambda f: f.owner == 2,
    )
    assert {r.owner for r in held} == {1}


def test_blobs_count_toward_their_owners_use_and_free_only_when_no_file_is_left() -> None:
    now = _BASE + timedelta(days=100)
    files = [
        StoredFile(f"/r/{days}", "/r", 10, 10, 0, 1, last_activity=now - timedelta(days=days))
        for days in (9, 8, 7)
    ]
    # /r/9 refers to a (shared with /r/7) and b; /r/8 to c; 1,000 bytes each.
    blobs = BlobUse(
        blobs={("/s", d): (1000, 1024, 1) for d in "abc"},
        refers={"/r/9": [("/s", "a"), ("/s", "b")], "/r/8": [("/s", "c")], "/r/7": [("/s", "a")]},
    )
    assert plan(files, Limits(max_use=1000), now=now, free=None) == []  # files alone: 30
    removals = plan(files, Limits(max_use=1100), now=now, free=None, blobs=blobs)
    # /r/9 frees b only (3,030 -> 2,020), /r/8 frees c (-> 1,010): under 1,100.
    assert [r.path for r in removals] == ["/r/9", "/r/8"]
    # Another owner's blobs never count against owner 1.
    theirs = BlobUse(blobs={("/t", "d"): (5000, 5120, 2)}, refers={})
    assert plan(files, Limits(max_use=3100), now=now, free=None, blobs=theirs) == []
    # The total cap and the free space count them too.
    total = plan(files, Limits(max_use_total=2100), now=now, free=None, blobs=blobs)
    assert [(r.path, r.reason) for r in total] == [("/r/9", "max-use-total")]
    freed = plan(files, Limits(keep_free=2000), now=now, free=0, blobs=blobs)
    assert [r.path for r in freed] == ["/r/9", "/r/8"]  # 10+1024, then 10+1024: 2,068


def test_references_are_read_again_only_where_the_file_changed(tmp_path: Path) -> None:
    images = [b"\x89PNG\r\n\x1a\n" + hashlib.sha256(b"%d" % i).digest() * 700 for i in range(2)]
    lines = [extract(b'{"image":"%s"}' % base64.b64encode(image))[0] + b"\n" for image in images]
    a, b = (hashlib.sha256(image).hexdigest() for image in images)
    path = tmp_path / "s.jsonl"
    path.write_bytes(lines[0])
    references = References()
    assert references.of(str(path)) == {a}
    with path.open("ab") as grown:
        grown.write(lines[1])
    assert references.of(str(path)) == {a, b}  # what was read before still counts
    replacement = tmp_path / "new"
    replacement.write_bytes(lines[1])
    os.replace(replacement, path)
    assert references.of(str(path)) == {b}  # another file: read whole


def test_an_archived_copy_a_killed_vacuum_left_behind_is_removed_when_it_is_done_again(
    tmp_path: Path,
) -> None:
    # Killed after its copy was linked into place and before the copy was removed: the
    # next vacuum finds the target there (link() says EEXIST first) and cleans up.
    source = tmp_path / "root" / "s.jsonl"
    source.parent.mkdir()
    source.write_bytes(b"same\n")
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "s.jsonl").write_bytes(b"same\n")
    stale = archive / ".s.jsonl.1391.vacuum-partial"
    stale.write_bytes(b"same\n")
    _link_or_copy(str(source), str(archive / "s.jsonl"))
    assert sorted(p.name for p in archive.iterdir()) == ["s.jsonl"]
