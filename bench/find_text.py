"""``uv run python -m bench.find_text``: ``flightlog find --text`` against ``grep -c`` in
CPU time, on one corpus, in one sitting.

The goal (docs/benchmarks.md, "find scan rate") is half of grep's throughput: at most
twice its CPU time on the same bytes.  On a shared machine wall times swing with the
load; the CPU time (user + system, of the command and its children) swings much less,
so this measures that: ``--runs`` runs of each command, alternated, after one warm-up
run each (every byte from the page cache), and prints their medians and the ratio.

``--corpus DIR`` measures existing session files (as ``bench.find``'s ``write_corpus``
makes them); without it a corpus of ``--gigabytes`` is written to a temporary
directory first and removed after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ._find import write_corpus

__all__ = ["main"]


def _cpu(command: Sequence[str]) -> tuple[float, str]:
    """The CPU time (user + system) ``command`` took, with its children, and its output."""
    before = os.times()
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    after = os.times()
    used = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return used, output


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.find_text", description=__doc__)
    parser.add_argument("--corpus", type=Path, help="session files to search (default: write)")
    parser.add_argument("--gigabytes", type=float, default=1.0, help="corpus size (default: 1)")
    parser.add_argument("--text", default="timed out", help="the phrase (default: timed out)")
    parser.add_argument("--runs", type=int, default=7, help="runs of each (default: 7)")
    args = parser.parse_args(argv)
    directory = args.corpus or Path(tempfile.mkdtemp(prefix="fl-find-text-"))
    try:
        if args.corpus is None:
            write_corpus(directory, int(args.gigabytes * 1e9))
        root = str(directory)
        size = sum(path.stat().st_size for path in directory.rglob("*.jsonl"))
        find = f"{sys.executable} -m flightlog.cli find {root} --text '{args.text}' --json | wc -l"
        grep = f"grep -rhcF '{args.text}' {root} | awk '{{s+=$1}} END {{print s+0}}'"
        commands = {"flightlog find --text": find, "grep -c": grep}
        times: dict[str, list[float]] = {name: [] for name in commands}
        counts = {
            name: _cpu(["sh", "-c", command])[1].strip() for name, command in commands.items()
        }
        if len(set(counts.values())) != 1:
            raise SystemExit(f"the tools count differently: {counts}")
        for _ in range(args.runs):
            for name, command in commands.items():
                times[name].append(_cpu(["sh", "-c", command])[0])
        medians = {name: statistics.median(values) for name, values in times.items()}
        print("| tool | CPU time, median | range | matches |")
        print("| --- | --- | --- | --- |")
        for name, values in times.items():
            print(
                f"| {name} | {medians[name]:.2f} s | {min(values):.2f}-{max(values):.2f} s "
                f"| {int(counts[name]):,} |"
            )
        ratio = medians["flightlog find --text"] / medians["grep -c"]
        print(
            f"\n{size / 1e6:,.0f} MB; find --text takes {ratio:.2f}x grep's CPU time; "
            f"{args.runs} runs each, alternated; load average {os.getloadavg()[0]:.1f}; "
            f"{os.cpu_count()} CPUs"
        )
    finally:
        if args.corpus is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
