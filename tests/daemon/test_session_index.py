"""The index beside a big session file: an open reads the file only from where the index
stops, and answers exactly what reading the whole file answers (the checkpoint, the cut
runs and open calls, the runs a writer may continue, the event ids it holds); an index
that does not hold (torn, stale, foreign, hostile) is ignored and the file read whole."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from flightlog.daemon._index import INDEX_FROM, SessionIndex
from flightlog.protocol import (
    CHECKPOINT,
    ErrorCode,
    Execution,
    FlightlogError,
    default_codec,
    new_id,
)
from flightlog.protocol.events import ToolExecEnd, ToolExecStart
from flightlog.protocol.format import RunLedger
from flightlog.sdk import check, connect, read, storage
from flightlog.sdk._resume import open_calls
from support import DaemonProcess
from support.daemon import wait_for_log

_TIME = "2026-12-01T10:00:00.000000Z"
_index_decoder = msgspec.msgpack.Decoder(SessionIndex)


def call(id: str, **more: Any) -> dict[str, Any]:
    return {"execution": {"id": id, "kind": "tool", "attempt": 1}, **more}


def big_session(extra: int = 0) -> bytes:
    """A session over :data:`INDEX_FROM` bytes: closed runs with calls left open, event
    ids, checkpoints, two runs cut (the last in a tool call)."""
    sid = new_id()
    records: list[tuple[str, str | None, dict[str, Any], str | None]] = [
        ("session_start", None, {"format_version": 1, "meta": {"app": "index"}}, None)
    ]
    body = "y" * 4000
    r = 0
    while sum(len(d.get("content", [""])[0]) for _, _, d, _ in records) < INDEX_FROM + extra:
        run = f"run-{r}"
        records.append(("run_start", run, {"pid": 1, "client": "t"}, None))
        for n in range(100):
            records.append(("tool_exec_start", run, call(f"t{n}", name="ls"), f"e-{r}-{n}"))
            if n % 37:
                records.append(("tool_exec_end", run, call(f"t{n}", content=[body]), None))
        records.append((CHECKPOINT, run, {"snapshot": {"run": r}}, None))
        if r != 3:  # run 3 is cut, in the middle of the file
            records.append(("run_close", run, {"error": None}, None))
        r += 1
    last = f"run-{r}"
    records.append(("run_start", last, {"pid": 1, "client": "t"}, None))
    records.append(("tool_exec_start", last, call("cut", name="read"), None))
    out = []
    for seq, (type, run_id, data, event_id) in enumerate(records, 1):
        line = {"session_id": sid, "seq": seq, "type": type, "time": _TIME, "run_id": run_id}
        if event_id is not None:
            line["event_id"] = event_id
        out.append(msgspec.json.encode({**line, "data": data}) + b"\n")
    return b"".join(out)


def truth(path: Path) -> tuple[Any, list[str], list[Any], list[str], str | None]:
    """What reading every record of the file says: the latest checkpoint, the cut runs
    and open calls, the runs a writer may continue and the last run."""
    records = list(read(path))
    checkpoints = [r for r in records if r.type == CHECKPOINT]
    latest = default_codec.decode_value(
        msgspec.json.encode(checkpoints[-1].decode_data()["snapshot"])
    )
    ledger = RunLedger()
    for record in records:
        ledger.add(record.type, record.run_id)
    return (latest, *open_calls(records), ledger.interrupted_runs, ledger.last_run)


def opened(
    daemon: DaemonProcess, name: str
) -> tuple[Any, list[str], list[Any], list[str], str | None]:
    """What the daemon answers on opening the session: the same five things."""
    with connect(daemon.socket) as client:
        session = client.open(name)
        found = session.resume()
        answer = (
            found.checkpoint,
            found.cut_runs,
            found.open_calls,
            list(session.interrupted_runs),
            session.last_run,
        )
        session.close()
    return answer


def index_of(path: Path) -> Path:
    return path.parent / storage.index_name(path.name)


def load(path: Path) -> SessionIndex:
    return _index_decoder.decode(index_of(path).read_bytes())


def test_a_big_session_opens_from_its_index_and_reads_none_of_what_it_covers(
    daemon: DaemonProcess,
) -> None:
    path = daemon.root / "big.jsonl"
    path.write_bytes(big_session())
    expected = truth(path)
    assert not index_of(path).exists()
    assert opened(daemon, "big.jsonl") == expected  # read whole: the index is written
    index = load(path)
    assert (index.offset, index.last_seq) == (path.stat().st_size, check(path).last_seq)
    assert stat.S_IMODE(index_of(path).stat().st_mode) == 0o600
    # A line in the middle spoilt in place: an open from the index never reads it ...
    spoil_the_middle(path)
    assert opened(daemon, "big.jsonl") == expected
    # ... where reading the whole file finds it.
    index_of(path).unlink()
    with connect(daemon.socket) as client, pytest.raises(FlightlogError) as caught:
        client.open("big.jsonl")
    assert caught.value.code == ErrorCode.SESSION_CORRUPT


def test_a_small_session_has_no_index(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("small.jsonl")
        with session.begin_run() as run:
            run.save_checkpoint({"n": 1})
        session.close()
        client.open("small.jsonl").close()
    assert not index_of(daemon.root / "small.jsonl").exists()


def test_lines_written_after_the_index_are_read_on_from_it(daemon: DaemonProcess) -> None:
    path = daemon.root / "stale.jsonl"
    path.write_bytes(big_session())
    opened(daemon, "stale.jsonl")
    covered = load(path).offset
    # Another writer (the daemon, killed before it wrote a new index) went on.
    last = list(read(path))[-1]
    more = [
        ("run_close", last.run_id, {"error": None}),
        ("run_start", "late", {"pid": 2, "client": "t"}),
        ("tool_exec_start", "late", call("l1", name="late")),
        (CHECKPOINT, "late", {"snapshot": {"late": True}}),
    ]
    with path.open("ab") as file:
        for seq, (type, run_id, data) in enumerate(more, last.seq + 1):
            line = {"session_id": last.session_id, "seq": seq, "type": type, "time": _TIME}
            file.write(msgspec.json.encode({**line, "run_id": run_id, "data": data}) + b"\n")
    expected = truth(path)
    assert expected[0] == {"late": True} and expected[4] == "late"
    assert opened(daemon, "stale.jsonl") == expected
    # Read on from the index, which stays as it was: the file grew less than
    # REINDEX_AFTER past it.
    assert load(path).offset == covered < path.stat().st_size


def _lying(index: SessionIndex) -> bytes:
    """``index`` with a state no read of the file gives: no cut runs, no open calls, no
    checkpoint; everything that ties it to the file left as it was."""
    runs = msgspec.structs.replace(index.runs, open=[], last=None)
    calls = msgspec.structs.replace(index.calls, runs=[], calls=[])
    lie = msgspec.structs.replace(index, runs=runs, calls=calls, checkpoint=None)
    return msgspec.msgpack.encode(lie)


def _torn(path: Path, index: SessionIndex) -> None:
    data = index_of(path).read_bytes()
    index_of(path).write_bytes(data[: len(data) // 2])


def _garbage(path: Path, index: SessionIndex) -> None:
    index_of(path).write_bytes(os.urandom(5000))


def _group_writable(path: Path, index: SessionIndex) -> None:
    index_of(path).write_bytes(_lying(index))
    index_of(path).chmod(0o620)


def _foreign_owner(path: Path, index: SessionIndex) -> None:
    index_of(path).write_bytes(_lying(index))
    os.chown(index_of(path), 54321, 54321)


def _symlink(path: Path, index: SessionIndex) -> None:
    elsewhere = path.parent / "elsewhere"
    elsewhere.write_bytes(_lying(index))
    index_of(path).unlink()
    index_of(path).symlink_to(elsewhere)


def _other_last_line(path: Path, index: SessionIndex) -> None:
    length = index.last_line[0]
    lie = msgspec.structs.replace(index, last_line=(length, bytes(16)))
    index_of(path).write_bytes(_lying(lie))


def _other_file(path: Path, index: SessionIndex) -> None:
    # The same name, written anew (the same inode, perhaps): the content checks pass.
    index_of(path).write_bytes(_lying(index))
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)


def _other_session(path: Path, index: SessionIndex) -> None:
    lie = msgspec.structs.replace(index, session_id=new_id())
    index_of(path).write_bytes(_lying(lie))


def _beyond_the_file(path: Path, index: SessionIndex) -> None:
    lie = msgspec.structs.replace(index, offset=index.offset + 10)
    index_of(path).write_bytes(_lying(lie))


def _impossible_runs(path: Path, index: SessionIndex) -> None:
    runs = msgspec.structs.replace(index.runs, open=[("nowhere", 1)], last="nowhere")
    index_of(path).write_bytes(msgspec.msgpack.encode(msgspec.structs.replace(index, runs=runs)))


def _not_a_checkpoint(path: Path, index: SessionIndex) -> None:
    # The last line (a tool call's start) where the checkpoint should be.
    length = index.last_line[0]
    where = (index.last_seq, index.offset - length, length)
    lie = msgspec.structs.replace(index, checkpoint=where)
    index_of(path).write_bytes(msgspec.msgpack.encode(lie))


DAMAGES = {
    "impossible runs": _impossible_runs,
    "not a checkpoint": _not_a_checkpoint,
    "torn": _torn,
    "garbage": _garbage,
    "group-writable": _group_writable,
    "another owner": _foreign_owner,
    "a symlink": _symlink,
    "another last line": _other_last_line,
    "another file": _other_file,
    "another session": _other_session,
    "beyond the file": _beyond_the_file,
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_an_index_that_does_not_hold_is_ignored(daemon: DaemonProcess, damage: str) -> None:
    name = f"damaged-{damage.replace(' ', '-')}.jsonl"
    path = daemon.root / name
    path.write_bytes(big_session())
    expected = truth(path)
    opened(daemon, name)
    index = load(path)
    DAMAGES[damage](path, index)
    assert opened(daemon, name) == expected  # the file was read whole
    assert load(path).offset == path.stat().st_size  # and a sound index written again


def test_the_lying_index_is_believed_when_nothing_gives_it_away(daemon: DaemonProcess) -> None:
    # The control for the test above: each damage is what makes the index ignored.
    path = daemon.root / "believed.jsonl"
    path.write_bytes(big_session())
    expected = truth(path)
    opened(daemon, "believed.jsonl")
    index_of(path).write_bytes(_lying(load(path)))
    assert opened(daemon, "believed.jsonl") != expected


def test_a_session_written_through_the_daemon_keeps_its_index_when_it_closes(
    daemon: DaemonProcess,
) -> None:
    path = daemon.root / "live.jsonl"
    result = ["z" * 60_000]
    with connect(daemon.socket) as client:
        session = client.create("live.jsonl")
        with session.begin_run() as run:
            for n in range(90):
                execution = Execution(id=f"t{n}", kind="tool")
                start = ToolExecStart(execution=execution, tool_call_id=f"c{n}", name="ls")
                run.record_many([start], event_ids=[f"id-{n}"])
                if n % 10:
                    run.record(
                        ToolExecEnd(
                            execution=execution, tool_call_id=f"c{n}", name="ls", content=result
                        )
                    )
            run.save_checkpoint({"at": 90})
        cut = session.begin_run()
        cut.record(
            ToolExecStart(execution=Execution(id="cut", kind="tool"), tool_call_id="x", name="x")
        )
        session.close()  # the run stays cut
    wait_for_log(daemon, event="session_closed", path=str(path))
    assert path.stat().st_size >= INDEX_FROM
    assert load(path).offset == path.stat().st_size  # written as the session closed
    expected = truth(path)
    assert opened(daemon, "live.jsonl") == expected
    # The event ids come from the index too: one the file holds is not written again.
    with connect(daemon.socket) as client:
        session = client.open("live.jsonl")
        records = len(list(read(path)))
        with session.begin_run() as run:
            execution = Execution(id="t5", kind="tool")
            again = ToolExecStart(execution=execution, tool_call_id="c5", name="ls")
            run.record_many([again], event_ids=["id-5"])
        # and the repair continues the cut run after the items the file holds.
        session.resume(repair=True)
        session.close()
    records_after = list(read(path))
    assert [r.event_id for r in records_after].count("id-5") == 1
    # run_start and run_close; the repair's run_resume, tool_exec_end and run_close.
    assert len(records_after) == records + 2 + 3
    assert check(path).sound
    assert opened(daemon, "live.jsonl") == truth(path)


def spoil_the_middle(path: Path) -> None:
    """Spoil a line in the middle of the file in place, keeping its inode, size and
    mtime: what only a read of the whole file finds."""
    data, st = path.read_bytes(), path.stat()
    middle = data.index(b'"content":["yyy', len(data) // 2)
    with path.open("r+b") as file:
        file.seek(middle + 20)
        file.write(b"\x00")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_compressed_session_opens_from_its_index(daemon: DaemonProcess) -> None:
    path = daemon.root / "packed.jsonl"
    path.write_bytes(big_session())
    expected = truth(path)
    opened(daemon, "packed.jsonl")
    spoil_the_middle(path)  # so that only an open from the index succeeds
    assert storage.compress_path(path) is not None
    packed, index = path.stat(), load(path)
    assert opened(daemon, "packed.jsonl") == expected  # read on from where it stops
    # Opened, resumed and closed without a write: left as it is, compressed.
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        packed.st_ino,
        packed.st_size,
        packed.st_mtime_ns,
    )
    assert storage.is_compressed(path.read_bytes()[:4]) and load(path) == index
    assert opened(daemon, "packed.jsonl") == expected  # and again


def test_the_first_write_gives_a_compressed_session_its_plain_form(
    daemon: DaemonProcess,
) -> None:
    path = daemon.root / "continued.jsonl"
    path.write_bytes(big_session())
    opened(daemon, "continued.jsonl")  # its index
    plain = path.read_bytes()
    assert storage.compress_path(path) is not None
    with connect(daemon.socket) as client:
        session = client.open("continued.jsonl")
        assert session.resume().cut_runs  # read through the compressed form
        assert storage.is_compressed(path.read_bytes()[:4])  # opened as it is
        with session.begin_run() as run:  # its run_start is the first write
            execution = Execution(id="after", kind="tool")
            run.record(ToolExecStart(execution=execution, tool_call_id="a", name="ls"))
        session.close()
    data = path.read_bytes()
    assert data.startswith(plain) and check(path).sound  # nothing lost, the new after it
    records = list(read(path))
    assert [r.type for r in records[-3:]] == ["run_start", "tool_exec_start", "run_close"]
    index = load(path)  # written again, for the plain file
    st = path.stat()
    assert (index.offset, index.ident) == (st.st_size, (st.st_dev, st.st_ino))
    assert opened(daemon, "continued.jsonl") == truth(path)


def test_a_compressed_session_with_an_unfinished_tail_opens_plain_without_it(
    daemon: DaemonProcess,
) -> None:
    path = daemon.root / "cut.jsonl"
    with connect(daemon.socket) as client:
        session = client.create("cut.jsonl")
        with session.begin_run() as run:
            run.record(
                ToolExecStart(execution=Execution(id="a", kind="tool"), tool_call_id="a", name="ls")
            )
        session.close()
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"session_id":"cut","seq":5,"ty')  # a crash's tail
    assert storage.compress_path(path) is not None
    with connect(daemon.socket) as client:
        assert client.open("cut.jsonl").last_seq == check(path).last_seq
    # The tail is cut from the plain form: the file was given it at the open.
    assert path.read_bytes() == whole and check(path).sound


def test_a_vacuum_removes_the_index_with_the_file(daemon: DaemonProcess) -> None:
    path = daemon.root / "gone.jsonl"
    path.write_bytes(big_session())
    opened(daemon, "gone.jsonl")
    assert index_of(path).exists()
    (found,) = [f for f in storage.survey([str(daemon.root)]) if f.path == str(path)]
    limits = storage.Limits(max_use=1, protect=timedelta(0))
    (removal,) = storage.plan([found], limits, now=datetime.now(UTC), free=None)
    storage.remove(removal, None)
    assert removal.error is None
    assert not path.exists() and not index_of(path).exists()
