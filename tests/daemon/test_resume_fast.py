"""``resume()`` without reading the file again: the daemon gathers the cut runs and open
calls while its open checks the file, and catches up with what was written since.  On
every file here, sound or with a damaged tail, before and after more is written, it
answers exactly what pairing every record of the file answers (the full scan)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from flightlog.protocol import CHECKPOINT, Execution, default_codec, new_id
from flightlog.protocol.events import ToolExecStart
from flightlog.sdk import connect, read
from flightlog.sdk._resume import open_calls
from support import DaemonProcess

_TIME = "2026-12-01T10:00:00.000000Z"


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    daemon = DaemonProcess(base).start()
    try:
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def lines(records: list[tuple[str, str | None, dict[str, Any]]]) -> bytes:
    sid = new_id()
    head = ("session_start", None, {"format_version": 1, "meta": {}})
    return b"".join(
        msgspec.json.encode(
            {"session_id": sid, "seq": n, "type": t, "time": _TIME, "run_id": r, "data": d}
        )
        + b"\n"
        for n, (t, r, d) in enumerate([head, *records], 1)
    )


def call(kind: str, id: str, attempt: int = 1, **more: Any) -> dict[str, Any]:
    return {"execution": {"id": id, "kind": kind, "attempt": attempt}, **more}


def snapshot(value: Any) -> dict[str, Any]:
    return {"snapshot": msgspec.json.decode(default_codec.encode_value(value))}


def tangled() -> bytes:
    """Three runs: one closed with a call left open, one cut with retries, model calls
    and calls that end twice or start after their end, and a last one cut in a tool."""
    a, b, c = "run-a", "run-b", "run-c"
    return lines(
        [
            ("run_start", a, {"pid": 1, "client": "t"}),
            ("tool_exec_start", a, call("tool", "t1", tool_call_id="c1", name="ls")),
            ("tool_exec_start", a, call("tool", "t2", tool_call_id="c2", arguments={"x": [1]})),
            ("tool_exec_end", a, call("tool", "t1", content=["ok"])),
            ("checkpoint", a, snapshot({"step": 1})),
            ("run_close", a, {"error": None}),
            ("run_start", b, {"pid": 2, "client": "t"}),
            ("model_request", b, call("model", "m1", messages=[{"role": "user"}])),
            ("model_exec_start", b, call("model", "m1")),
            ("model_exec_end", b, call("model", "m1")),
            ("model_request", b, call("model", "m1", 2)),  # a retry, never ended
            ("tool_queued", b, call("tool", "t9", tool_call_id=7, name=["odd"])),
            ("tool_exec_end", b, call("tool", "t8")),
            ("tool_exec_start", b, call("tool", "t8")),  # starts after its end: not open
            ("tool_exec_start", b, {"execution": {"kind": "tool"}}),  # no id: skipped
            ("tool_exec_start", b, call("tool", "t7", 0)),  # attempt 0: skipped
            ("tool_exec_start", b, {"execution": "bad"}),
            ("checkpoint", b, snapshot({"step": 2, "note": "latest"})),
            ("run_start", c, {"pid": 3, "client": "t"}),
            ("tool_exec_start", c, call("tool", "t1", tool_call_id="c1", arguments={})),
        ]
    )


def big() -> bytes:
    records: list[tuple[str, str | None, dict[str, Any]]] = []
    for r in range(5):
        run = f"run-{r}"
        records.append(("run_start", run, {"pid": 1, "client": "t"}))
        for n in range(300):
            records.append(("tool_exec_start", run, call("tool", f"t{n}", arguments={"n": n})))
            if n % 97:
                records.append(("tool_exec_end", run, call("tool", f"t{n}", content=["y" * 300])))
        if r < 4:
            records.append(("run_close", run, {"error": None}))
    return lines(records)


TAILS = {
    "sound": b"",
    "an unfinished tail that would end a call": msgspec.json.encode(
        {"session_id": "x", "seq": 99, "type": "tool_exec_end", "data": call("tool", "t1")}
    ),
    "NUL bytes": b"\x00" * 5000,
    "half a line": b'{"session_id":"',
}


def full_scan(path: Path) -> tuple[Any, list[str], list[Any]]:
    records = list(read(path))
    checkpoints = [r for r in records if r.type == CHECKPOINT]
    latest = (
        default_codec.decode_value(msgspec.json.encode(checkpoints[-1].decode_data()["snapshot"]))
        if checkpoints
        else None
    )
    cut, calls = open_calls(records)
    return latest, cut, calls


@pytest.mark.parametrize("tail", sorted(TAILS))
@pytest.mark.parametrize("body", ["tangled", "big"])
def test_resume_answers_what_the_full_scan_answers(
    daemon: DaemonProcess, body: str, tail: str
) -> None:
    name = f"fast/{body}-{tail.replace(' ', '-')}.jsonl"
    path = daemon.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((tangled() if body == "tangled" else big()) + TAILS[tail])
    with connect(daemon.socket) as client:
        session = client.open(name)  # truncates the tail, as every writer's open does
        found = session.resume()
        assert (found.checkpoint, found.cut_runs, found.open_calls) == full_scan(path)
        assert found.open_calls, "the files leave calls open"
        # What is written after the open is caught up with, not read from the start.
        with session.begin_run() as run:
            execution = Execution(id="late", kind="tool")
            run.record(ToolExecStart(execution=execution, tool_call_id="l", name="late"))
            session.sync()
            now = session.resume()
            assert (now.checkpoint, now.cut_runs, now.open_calls) == full_scan(path)
            assert now.open_calls[-1].execution.id == "late" and run.run_id in now.cut_runs
            run.save_checkpoint({"step": 3})
        after = session.resume()
        assert (after.checkpoint, after.cut_runs, after.open_calls) == full_scan(path)
        assert after.checkpoint == {"step": 3}
        session.close()
        # A second open gathers them again from the file alone.
        again = client.open(name).resume()
        assert (again.checkpoint, again.cut_runs, again.open_calls) == full_scan(path)
