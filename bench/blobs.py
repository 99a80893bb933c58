"""What storing blobs once saves on a session that sends the same images again and again.

``uv run --frozen --all-groups python -m bench.blobs [--quick]`` records through a real
flightlogd a computer-use style run: each of 50 model requests carries the whole
history so far, in which every step added a screenshot (a 150 KB PNG-like payload as
base64; 20 distinct screenshots, then they repeat), and the tool result of each step
carries the latest screenshot again.  It prints what the lines would hold inline (the
records as ``flightlog.sdk.read`` gives them back), the session file and the blob store
as written, and the time to read every record back with the payloads put back.

``python -m bench.blobs --write-cost [--rounds N]`` measures what taking payloads out
costs on the write path: rounds of a daemon without ``--blobs`` and one with, run
alternately in one sitting, each recording (``record()`` through the SDK, then
``close()``, which syncs) 200 tool results carrying a 150 KB screenshot as base64 (20
distinct, repeating) and, in another session, 20,000 small events.  It prints, per
event, the client's time and the daemon's CPU time, the median of the rounds of each
kind, and the ratio with blobs to without.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

from flightlog.protocol import events
from flightlog.protocol._blobs import BLOB_DIR
from flightlog.sdk import connect, read

from ._daemon import Daemon
from ._procs import cpu_seconds

_LARGE = 200
_SMALL = 20_000


def _screenshot(i: int) -> str:
    seed = hashlib.sha256(str(i).encode()).digest()
    # Not compressible, like a real PNG's deflated data.
    body = b"".join(hashlib.sha256(seed + n.to_bytes(4, "big")).digest() for n in range(4688))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + body).decode()


def _record(d: Daemon, path: str, recorded: list[events.Event]) -> tuple[float, float]:
    """Record ``recorded`` into a new session and close it: the client's seconds and
    the daemon's CPU seconds."""
    cpu = cpu_seconds(d.pid)
    begin = time.perf_counter()
    with connect(d.socket) as client:
        session = client.create(path)
        with session.begin_run() as run:
            for event in recorded:
                run.record(event)
        session.close()
    return time.perf_counter() - begin, cpu_seconds(d.pid) - cpu


def write_cost(rounds: int) -> None:
    shots = [_screenshot(i) for i in range(20)]
    large: list[events.Event] = [
        events.ToolExecEnd(
            execution=events.Execution(id=f"t{i}", kind="tool"),
            tool_call_id=f"c{i}",
            name="screenshot",
            content=[{"type": "image", "media_type": "image/png", "data": shots[i % 20]}],
        )
        for i in range(_LARGE)
    ]
    small: list[events.Event] = [
        events.ToolExecEnd(
            execution=events.Execution(id=f"t{i}", kind="tool"),
            tool_call_id=f"c{i}",
            name="read_file",
            content=[f"line {i}: the quick brown fox jumps over the lazy dog"],
        )
        for i in range(_SMALL)
    ]
    # (kind, blobs) -> [(client µs per event, daemon CPU µs per event)] of each round
    found: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for round_ in range(rounds):
        for blobs in (False, True):
            with (
                tempfile.TemporaryDirectory(prefix="flb-", dir="/tmp") as base,
                Daemon(Path(base), *(["--blobs"] if blobs else [])) as d,
            ):
                for kind, recorded in (("large", large), ("small", small)):
                    wall, cpu = _record(d, f"{kind}-{round_}.jsonl", recorded)
                    found.setdefault((kind, blobs), []).append(
                        (wall / len(recorded) * 1e6, cpu / len(recorded) * 1e6)
                    )
    print(f"{rounds} rounds, daemons without and with --blobs alternately")
    print(
        "µs per event (median of rounds)   client off   on    ratio | daemon CPU off   on   ratio"
    )
    for kind, label in (("large", "150 KB base64 tool result"), ("small", "small event (~200 B)")):
        off = found[(kind, False)]
        on = found[(kind, True)]
        wall_off, wall_on = (statistics.median(w for w, _ in r) for r in (off, on))
        cpu_off, cpu_on = (statistics.median(c for _, c in r) for r in (off, on))
        print(
            f"{label:33} {wall_off:9.1f} {wall_on:7.1f} {wall_on / wall_off:6.2f}x |"
            f" {cpu_off:13.1f} {cpu_on:6.1f} {cpu_on / cpu_off:5.2f}x"
        )
        for w_off, w_on in zip(off, on, strict=True):
            print(
                f"    round: client {w_off[0]:.1f} / {w_on[0]:.1f},"
                f" daemon {w_off[1]:.1f} / {w_on[1]:.1f}"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.blobs")
    parser.add_argument("--quick", action="store_true", help="10 requests")
    parser.add_argument(
        "--write-cost", action="store_true", help="the write path's cost, blobs off and on"
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --write-cost (default 3)")
    args = parser.parse_args(argv)
    if args.write_cost:
        write_cost(args.rounds)
        return
    steps = 10 if args.quick else 50
    shots = [_screenshot(i) for i in range(20)]
    with (
        tempfile.TemporaryDirectory(prefix="flb-", dir="/tmp") as base,
        Daemon(Path(base), "--blobs") as d,
    ):
        history: list[events.ChatMessage] = []
        begin = time.perf_counter()
        with connect(d.socket) as client:
            session = client.create("computer-use.jsonl")
            with session.begin_run() as run:
                for step in range(steps):
                    shot = shots[step % len(shots)]
                    history.append(
                        events.UserMessage(
                            content=[
                                events.TextPart(text=f"step {step}"),
                                events.ImagePart(media_type="image/png", data=shot),
                            ]
                        )
                    )
                    execution = events.Execution(id=f"m{step}", kind="model")
                    request = events.ModelRequest(execution=execution, messages=list(history))
                    run.record(request)
                    tool = events.Execution(id=f"t{step}", kind="tool")
                    run.record(
                        events.ToolExecEnd(
                            execution=tool,
                            tool_call_id=f"c{step}",
                            name="screenshot",
                            content=[{"type": "image", "media_type": "image/png", "data": shot}],
                        )
                    )
            session.close()
        record_time = time.perf_counter() - begin
        path = d.root / "computer-use.jsonl"
        begin = time.perf_counter()
        inline = sum(len(r.data) for r in read(path))
        read_time = time.perf_counter() - begin
        store = sum(p.stat().st_size for p in (d.root / BLOB_DIR).rglob("*") if p.is_file())
        written = path.stat().st_size + store
        print(f"{steps} requests, each with the history's screenshots (20 distinct, 150 KB each)")
        print(f"  inline (what the records hold):  {inline / 1e6:10.1f} MB")
        print(f"  session file:                    {path.stat().st_size / 1e6:10.3f} MB")
        print(f"  blob store:                      {store / 1e6:10.1f} MB")
        ratio = inline / written
        print(f"  written in all:                  {written / 1e6:10.1f} MB ({ratio:.0f}x less)")
        print(f"  recording: {record_time:.2f} s; reading every record back: {read_time:.2f} s")


if __name__ == "__main__":
    main()
