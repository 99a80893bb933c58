"""``uv run python -m bench.resume``: how long a restarted agent waits for
``Session.open`` and ``resume()`` on a big session (issue 29, 4).

It writes a session of ``--mb`` megabytes (100 by default): runs of tool calls whose
results are a few KiB each, a checkpoint every 50 calls, and a last run cut in the
middle of a tool call; then, against a real ``flightlogd``, times opening it, its
``resume()`` (the latest checkpoint, the cut runs and the calls left open) and, for
comparison, the full scan ``resume()`` made before (the file's every record tailed
through the daemon and paired).  It opens the file three ways in turn, each run: with
its index removed (the daemon reads it whole, as it did before it kept one, and writes
the index), with the index the last close left, and compressed (``flightlog
compress``), which the open reads as it is, from the index; then it times the first
write to the compressed file, which gives it its plain form again.  Wall seconds and
the daemon's CPU seconds (the wall time depends on what else the machine runs), best
of ``--runs``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from flightlog.protocol import format_time, new_id
from flightlog.sdk import connect, storage
from flightlog.sdk._resume import open_calls

from ._daemon import Daemon
from ._procs import cpu_seconds
from ._report import markdown_table

__all__ = ["main", "write_session"]

_encode = msgspec.json.Encoder().encode


def write_session(path: Path, megabytes: float, *, result_bytes: int = 4096) -> int:
    """A sound session of about ``megabytes`` MB at ``path``; returns its records."""
    sid = new_id()
    seq = 0
    stamp = format_time(datetime.now(UTC))
    out = bytearray()
    body = "r" * result_bytes

    def add(type: str, run_id: str | None, data: dict[str, Any]) -> None:
        nonlocal seq
        seq += 1
        out.extend(
            _encode(
                {
                    "session_id": sid,
                    "seq": seq,
                    "type": type,
                    "time": stamp,
                    "run_id": run_id,
                    "data": data,
                }
            )
        )
        out.extend(b"\n")

    add("session_start", None, {"format_version": 1, "meta": {"bench": "resume"}})
    target = int(megabytes * 1_000_000)
    with path.open("wb") as file:
        run = 0
        while file.tell() + len(out) < target:
            run += 1
            run_id = new_id()
            add("run_start", run_id, {"pid": 1, "client": "bench"})
            for call in range(200):
                execution = {"id": f"t{call}", "kind": "tool", "attempt": 1}
                args = {"path": f"/src/{call}.py"}
                start = {"execution": execution, "tool_call_id": f"c{call}", "name": "read"}
                add("tool_exec_start", run_id, {**start, "arguments": args})
                add("tool_exec_end", run_id, {**start, "content": [body], "is_error": False})
                if call % 50 == 49:
                    add("checkpoint", run_id, {"snapshot": {"run": run, "call": call}})
            add("run_close", run_id, {"error": None})
            file.write(out)
            out.clear()
        run_id = new_id()  # the last run: cut in the middle of a tool call
        add("run_start", run_id, {"pid": 1, "client": "bench"})
        execution = {"id": "cut", "kind": "tool", "attempt": 1}
        add(
            "tool_exec_start",
            run_id,
            {"execution": execution, "tool_call_id": "cut", "name": "read", "arguments": {}},
        )
        file.write(out)
    return seq


def _open_resume(client: Any, daemon: Daemon) -> tuple[float, float, float, float, Any]:
    """Open the session, ``resume()`` it, close it: wall and daemon CPU seconds of the
    open and of the resume, and what it found."""
    cpu = cpu_seconds(daemon.pid)
    began = time.perf_counter()
    session = client.open("big.jsonl")
    middle, cpu_middle = time.perf_counter(), cpu_seconds(daemon.pid)
    found = session.resume()
    ended, cpu_ended = time.perf_counter(), cpu_seconds(daemon.pid)
    session.close()
    return middle - began, cpu_middle - cpu, ended - middle, cpu_ended - cpu_middle, found


def _first_write(client: Any, daemon: Daemon) -> tuple[float, float]:
    """Open the session, then time its first write (a run begun): wall and daemon CPU
    seconds."""
    session = client.open("big.jsonl")
    cpu = cpu_seconds(daemon.pid)
    began = time.perf_counter()
    run = session.begin_run()
    ended, cpu_ended = time.perf_counter(), cpu_seconds(daemon.pid)
    run.close()
    session.close()
    return ended - began, cpu_ended - cpu


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.resume", description=__doc__)
    parser.add_argument("--mb", type=float, default=100.0, help="session size (default 100)")
    parser.add_argument("--runs", type=int, default=3, help="runs, best kept (default 3)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fl-bench-resume-"))
    # What each way of opening took, best of the runs: open wall, open CPU, resume
    # wall, resume CPU.
    ways = ("read whole (no index)", "from the index", "compressed, from the index")
    best = {way: [float("inf")] * 4 for way in ways}
    first_write = [float("inf")] * 2
    try:
        with Daemon(base) as daemon:
            daemon.root.mkdir(parents=True, exist_ok=True)
            path = daemon.root / "big.jsonl"
            index = daemon.root / storage.index_name("big.jsonl")
            records = write_session(path, args.mb)
            size = path.stat().st_size
            scan = float("inf")
            with connect(daemon.socket) as client:
                for _ in range(args.runs):
                    # The three ways in turn, so that the load of the machine falls on
                    # them alike.
                    for way in ways:
                        if way == ways[0]:
                            index.unlink(missing_ok=True)
                        elif way == ways[2]:
                            storage.compress_path(path)
                        *times, found = _open_resume(client, daemon)
                        best[way] = [min(a, b) for a, b in zip(best[way], times, strict=True)]
                        assert index.exists(), "the daemon keeps an index (of --mb 5 or more)"
                    with path.open("rb") as file:  # opened as it is
                        assert storage.is_compressed(file.read(4))
                    times = _first_write(client, daemon)  # its plain form, for the next run
                    first_write = [min(a, b) for a, b in zip(first_write, times, strict=True)]
                    began = time.perf_counter()
                    cut, calls = open_calls(client.tail("big.jsonl"))
                    scan = min(scan, time.perf_counter() - began)
                    assert (found.cut_runs, found.open_calls) == (cut, calls)
        rows = [["open, then resume()", "open s", "open CPU s", "resume() s", "resume() CPU s"]]
        for way in ways:
            rows.append([way, *(f"{value:.3f}" for value in best[way])])
        print(f"session: {size / 1e6:.0f} MB, {records:,} records")
        print(markdown_table(rows))
        print(f"resume() as it was (tail every record, pair them): {scan:.3f} s")
        print(
            f"the first write to the compressed file (its plain form given back): "
            f"{first_write[0]:.3f} s, daemon CPU {first_write[1]:.3f} s"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
