"""``uv run python -m bench.resume``: how long a restarted agent waits for
``Session.open`` and ``resume()`` on a big session (issue 29, 4).

It writes a session of ``--mb`` megabytes (100 by default): runs of tool calls whose
results are a few KiB each, a checkpoint every 50 calls, and a last run cut in the
middle of a tool call; then, against a real ``flightlogd``, times opening it, its
``resume()`` (the latest checkpoint, the cut runs and the calls left open) and, for
comparison, the full scan ``resume()`` made before (the file's every record tailed
through the daemon and paired).  Wall seconds and the daemon's CPU seconds (the wall
time depends on what else the machine runs), best of ``--runs``.
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
from flightlog.sdk import connect
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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.resume", description=__doc__)
    parser.add_argument("--mb", type=float, default=100.0, help="session size (default 100)")
    parser.add_argument("--runs", type=int, default=3, help="runs, best kept (default 3)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fl-bench-resume-"))
    try:
        with Daemon(base) as daemon:
            daemon.root.mkdir(parents=True, exist_ok=True)
            path = daemon.root / "big.jsonl"
            records = write_session(path, args.mb)
            size = path.stat().st_size
            with connect(daemon.socket) as client:
                opened = resumed = scan = open_cpu = resume_cpu = float("inf")
                found = None
                for _ in range(args.runs):
                    cpu = cpu_seconds(daemon.pid)
                    began = time.perf_counter()
                    session = client.open("big.jsonl")
                    middle, cpu_middle = time.perf_counter(), cpu_seconds(daemon.pid)
                    found = session.resume()
                    ended, cpu_ended = time.perf_counter(), cpu_seconds(daemon.pid)
                    session.close()
                    opened, resumed = min(opened, middle - began), min(resumed, ended - middle)
                    open_cpu = min(open_cpu, cpu_middle - cpu)
                    resume_cpu = min(resume_cpu, cpu_ended - cpu_middle)
                    began = time.perf_counter()
                    cut, calls = open_calls(client.tail("big.jsonl"))
                    scan = min(scan, time.perf_counter() - began)
            assert found is not None and (found.cut_runs, found.open_calls) == (cut, calls)
        rows = [
            ["step", "wall seconds", "daemon CPU seconds"],
            ["open (the daemon checks every line)", f"{opened:.3f}", f"{open_cpu:.3f}"],
            ["resume() after open", f"{resumed:.3f}", f"{resume_cpu:.3f}"],
            ["open + resume()", f"{opened + resumed:.3f}", f"{open_cpu + resume_cpu:.3f}"],
            ["resume() as it was: tail every record, pair them", f"{scan:.3f}", "-"],
        ]
        print(f"session: {size / 1e6:.0f} MB, {records:,} records")
        print(markdown_table(rows))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
