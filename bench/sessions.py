"""``uv run python -m bench.sessions [--sessions 10000]``: how long ``flightlog sessions``
takes to list a root of many sessions.

It writes ``--sessions`` session files of one to three agent runs each (the runs of
bench.find's corpus: model calls with usage, tool calls, about 10 KB a session) into a
temporary root, then times ``flightlog sessions --json`` over it (best of three, after a
warm-up that fills the page cache), with and without pricing.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from flightlog.protocol import default_codec

from ._find import _run_events, _SessionWriter


def write_root(root: Path, count: int, seed: int = 11) -> int:
    """``count`` sessions under ``root``; returns their bytes."""
    rng = random.Random(seed)
    runs = []
    for _ in range(16):
        encoded = []
        for event in _run_events(rng, turns=rng.randrange(1, 4)):
            done = default_codec.encode_event(event)
            assert done is not None
            encoded.append((done.type, done.data))
        runs.append(encoded)
    total = 0
    for index in range(count):
        session = _SessionWriter(uuid.UUID(int=rng.getrandbits(128)).hex, index)
        session.add("session_start", None, b'{"format_version":1,"meta":{"name":"s%d"}}' % index)
        for _ in range(rng.randrange(1, 4)):
            run_id = uuid.UUID(int=rng.getrandbits(128)).hex
            session.add("run_start", run_id, b'{"pid":1,"client":"bench"}')
            for type, data in rng.choice(runs):
                session.add(type, run_id, data)
            session.add("run_close", run_id, b'{"error":null}')
        path = root / f"team-{index % 50}" / f"s-{index:05d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(session.buf)
        total += len(session.buf)
    return total


def _best(command: list[str], env: dict[str, str], runs: int = 3) -> float:
    subprocess.run(command, env=env, capture_output=True, check=True)
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, env=env, capture_output=True, check=True)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sessions", description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000, help="how many (default: 10000)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="fl-sessions-"))
    try:
        size = write_root(root, args.sessions)
        env = {**os.environ, "FLIGHTLOG_ROOT": str(root), "FLIGHTLOG_SOCKET": str(root / "none")}
        command = [sys.executable, "-m", "flightlog.cli", "sessions", "--json"]
        priced = _best(command, env)
        blocked = f"import sys; sys.modules['genai_prices'] = None; {_MAIN}"
        unpriced = _best([sys.executable, "-c", blocked, "sessions", "--json"], env)
        print("| sessions | bytes | flightlog sessions | without cost |")
        print("| --- | --- | --- | --- |")
        print(f"| {args.sessions:,} | {size / 1e6:,.0f} MB | {priced:.2f} s | {unpriced:.2f} s |")
        print(
            f"\n{os.cpu_count()} CPUs; `uv run python -m bench.sessions --sessions {args.sessions}`"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


_MAIN = "from flightlog.cli import main; sys.argv[0] = 'flightlog'; main(sys.argv[1:])"

if __name__ == "__main__":
    raise SystemExit(main())
