"""``uv run python -m bench.sql``: ``flightlog sql`` against ``flightlog find`` and ``grep``
on the corpus ``bench.find`` writes (bench/_find.py), the same questions each way.

* failing tool calls: ``sql`` on ``records`` and on the ``calls`` view, ``find --type
  tool_exec_end --error``, ``grep -c '"is_error":true'``;
* records mentioning a phrase: ``sql`` with ``contains(data::VARCHAR, ...)``, ``find
  --text``, ``grep -c``;
* input tokens by model: ``sql`` on ``calls`` with ``GROUP BY``, and ``find --type
  model_exec_end --json`` piped into a few lines of Python that sum them (``grep`` has no
  way to).

Each command runs once to warm the page cache and check its answer, then ``--runs``
times; the table gives each median wall time and its ratio to ``flightlog sql``'s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._find import MODELS, write_corpus

#: Sums ``find --json``'s model ends by model: what ``sql`` does with ``GROUP BY``.
_SUM_BY_MODEL = (
    "import json, sys\n"
    "sums = {}\n"
    "for line in sys.stdin:\n"
    "    data = json.loads(line)['data']\n"
    "    model = data['message']['model']\n"
    "    sums[model] = sums.get(model, 0) + data['usage']['input_tokens']\n"
    "print(len(sums))\n"
)


def _timed(command: list[str], runs: int) -> tuple[float, str]:
    """The median wall time of ``command`` over ``runs`` runs after one warm-up, and the
    warm-up's output."""
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times), output


def _sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sql", description=__doc__)
    parser.add_argument("--gigabytes", type=float, default=1.0, help="corpus size (default: 1)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="fl-sql-"))
    try:
        corpus = write_corpus(directory, int(args.gigabytes * 1e9))
        root = str(directory)
        cli = f"{sys.executable} -m flightlog.cli"

        def sql(query: str) -> list[str]:
            return [sys.executable, "-m", "flightlog.cli", "sql", "--csv", query, root]

        def grep(text: str) -> list[str]:
            return _sh(f"grep -rhcF '{text}' {root} | awk '{{s+=$1}} END {{print s}}'")

        failed, phrase = corpus.failed_tool_calls, "timed out"
        questions: list[tuple[str, int, list[tuple[str, list[str]]]]] = [
            (
                "failing tool calls",
                failed,
                [
                    (
                        "sql (records)",
                        sql(
                            "SELECT count(*) FROM records WHERE type = 'tool_exec_end' "
                            "AND data->>'is_error' = 'true'"
                        ),
                    ),
                    (
                        "sql (calls)",
                        sql("SELECT count(*) FROM calls WHERE kind = 'tool' AND status = 'error'"),
                    ),
                    (
                        "find",
                        _sh(f"{cli} find {root} --type tool_exec_end --error --json | wc -l"),
                    ),
                    ("grep", grep('"is_error":true')),
                ],
            ),
            (
                f"records mentioning {phrase!r}",
                failed,
                [
                    (
                        "sql (records)",
                        sql(
                            "SELECT count(*) FROM records "
                            f"WHERE contains(data::VARCHAR, '{phrase}')"
                        ),
                    ),
                    ("find", _sh(f"{cli} find {root} --text '{phrase}' --json | wc -l")),
                    ("grep", grep(phrase)),
                ],
            ),
            (
                "input tokens by model",
                len(MODELS),
                [
                    (
                        "sql (calls)",
                        sql(
                            "SELECT count(*) FROM (SELECT name, sum(input_tokens) FROM calls "
                            "WHERE kind = 'model' GROUP BY name)"
                        ),
                    ),
                    (
                        "find",
                        _sh(
                            f"{cli} find {root} --type model_exec_end --json | "
                            f'{sys.executable} -c "{_SUM_BY_MODEL}"'
                        ),
                    ),
                ],
            ),
        ]
        print(
            f"corpus: {corpus.bytes / 1e6:,.0f} MB, {corpus.records:,} records; "
            f"median of {args.runs} runs",
            file=sys.stderr,
        )
        rows = []
        for question, expected, tools in questions:
            base = None
            for tool, command in tools:
                seconds, output = _timed(command, args.runs)
                got = int(output.split()[-1])
                if got != expected:
                    raise SystemExit(f"{tool} answered {got} to {question!r}, not {expected}")
                base = base or seconds
                rows.append((question, tool, seconds, seconds / base))
                print(f"  {question}: {tool}: {seconds:.2f} s", file=sys.stderr)
        print("| question | tool | median | ratio to sql |")
        print("| --- | --- | --- | --- |")
        for question, tool, seconds, ratio in rows:
            print(f"| {question} | {tool} | {seconds:.2f} s | {ratio:.2f} |")
        print(
            f"\n{corpus.bytes / 1e6:,.0f} MB in {corpus.records:,} records; {os.cpu_count()} CPUs; "
            f"`uv run python -m bench.sql --gigabytes {args.gigabytes:g} --runs {args.runs}`"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
