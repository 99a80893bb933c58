"""``uv run python -m bench.find_text``: ``flightlog find --text`` against ``grep -c`` in
CPU time, on one corpus, in one sitting.

The goal (docs/benchmarks.md, "find scan rate") is half of grep's throughput: at most
twice its CPU time on the same bytes.  On a shared machine wall times swing with the
load; the CPU time (user + system, of the command and its children) swings much less,
so this measures that: ``--runs`` runs of each command, alternated, after one warm-up
run each (every byte from the page cache), and prints their medians and the ratio.

``flightlog find`` runs as an installed command does: from the modules' bytecode (the
warm-up run writes it, into a temporary ``PYTHONPYCACHEPREFIX``, whatever
``PYTHONDONTWRITEBYTECODE`` says).  A second row runs it compiling every module each
time (``PYTHONDONTWRITEBYTECODE=1``, nothing cached: a read-only install without
``.pyc`` files), which costs a quarter of a second more.  ``--before DIR`` adds the
same two rows for the source tree ``DIR`` (a checkout of another commit, its C
accelerators built; its ``protocol/src`` and ``sdk/src`` go first on ``PYTHONPATH``).

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
from collections.abc import Mapping, Sequence
from pathlib import Path

from ._find import write_corpus

__all__ = ["main"]


def _cpu(command: Sequence[str], env: Mapping[str, str]) -> tuple[float, str]:
    """The CPU time (user + system) ``command`` took, with its children, and its output."""
    before = os.times()
    output = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
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
    parser.add_argument("--before", type=Path, help="a source tree to time find from too")
    args = parser.parse_args(argv)
    directory = args.corpus or Path(tempfile.mkdtemp(prefix="fl-find-text-"))
    bytecode = tempfile.mkdtemp(prefix="fl-find-text-pyc-")
    try:
        if args.corpus is None:
            write_corpus(directory, int(args.gigabytes * 1e9))
        root = str(directory)
        size = sum(path.stat().st_size for path in directory.rglob("*.jsonl"))
        find = f"{sys.executable} -m flightlog.cli find {root} --text '{args.text}' --json | wc -l"
        grep = f"grep -rhcF '{args.text}' {root} | awk '{{s+=$1}} END {{print s+0}}'"
        cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cached["PYTHONPYCACHEPREFIX"] = bytecode
        compiling = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
        compiling["PYTHONDONTWRITEBYTECODE"] = "1"
        trees = {"": None} if args.before is None else {"": None, ", before": args.before}
        commands: dict[str, tuple[str, Mapping[str, str]]] = {}
        for label, tree in trees.items():
            for kind, env in (("", cached), (", compiling each run", compiling)):
                if tree is not None:
                    sources = [str(tree / "protocol" / "src"), str(tree / "sdk" / "src")]
                    env = {**env, "PYTHONPATH": os.pathsep.join(sources)}
                commands[f"flightlog find --text{label}{kind}"] = (find, env)
        commands["grep -c"] = (grep, os.environ)
        times: dict[str, list[float]] = {name: [] for name in commands}
        counts = {
            name: _cpu(["sh", "-c", command], env)[1].strip()
            for name, (command, env) in commands.items()
        }
        if len(set(counts.values())) != 1:
            raise SystemExit(f"the tools count differently: {counts}")
        for _ in range(args.runs):
            for name, (command, env) in commands.items():
                times[name].append(_cpu(["sh", "-c", command], env)[0])
        medians = {name: statistics.median(values) for name, values in times.items()}
        grep_time = medians["grep -c"]
        print("| tool | CPU time, median | range | matches | against grep |")
        print("| --- | --- | --- | --- | --- |")
        for name, values in times.items():
            print(
                f"| {name} | {medians[name]:.2f} s | {min(values):.2f}-{max(values):.2f} s "
                f"| {int(counts[name]):,} | {_ratio(medians[name], grep_time)} |"
            )
        print(
            f"\n{size / 1e6:,.0f} MB; {args.runs} runs each, alternated; load average "
            f"{os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs"
        )
    finally:
        shutil.rmtree(bytecode, ignore_errors=True)
        if args.corpus is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


def _ratio(time: float, grep_time: float) -> str:
    """``time`` against grep's; a tiny corpus can take grep less than the clock's tick."""
    return f"{time / grep_time:.2f}x" if grep_time > 0 else "n/a (grep took under a tick)"


if __name__ == "__main__":
    raise SystemExit(main())
