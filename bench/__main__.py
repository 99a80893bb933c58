"""``python -m bench``: flightlogd against in-process JSONL and a SQLite event log
(and, in scenarios 1 and 2, rsyslog and syslog-ng when they can be found).

Runs every scenario (``--only`` picks some), prints progress on stderr and one table
on stdout, with the machine, the date and the exact command.  ``--quick`` shrinks
every workload so the whole run takes well under a minute (for CI: it keeps the
harness working; its figures are not the benchmark's).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ._calls import client_cost, durable_ack
from ._context import Context
from ._frameworks import agent_overhead
from ._langchain import handler_per_step
from ._machine import CpuMeter, describe
from ._report import DASH, Row, format_table
from ._scale import backpressure, scale
from ._syslog import ENV_SYSLOG_NG, find_peers, peer_table
from ._tail import tail_latency
from ._throughput import large_events, small_events

SCENARIOS: dict[str, Callable[[Context], list[Row]]] = {
    "1": small_events,
    "2": large_events,
    "3": client_cost,
    "4": tail_latency,
    "5": durable_ack,
    "6": scale,
    "7": backpressure,
    "8": agent_overhead,
    "9": handler_per_step,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark flightlogd (through the SDK) against an in-process JSONL "
        "recorder and a SQLite event log, on this machine, in one run.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small workloads: the whole run in under a minute"
    )
    parser.add_argument(
        "--runs", type=int, default=None, help="runs per scenario (default: 5; --quick: 3)"
    )
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        metavar="N,N",
        help="scenarios to run, by number (default: all)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write every run's figures as JSON")
    parser.add_argument(
        "--dir",
        default=None,
        help="scratch directory parent, on the disk to measure (default: the system's temp dir)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an option for every flightlogd the scenarios start, e.g. "
        "--daemon-arg=--ring-size=65536 (repeatable)",
    )
    parser.add_argument(
        "--syslog-ng",
        metavar="DIR",
        default=None,
        help="where syslog-ng's Debian packages were unpacked (dpkg -x), for scenarios 1 "
        f"and 2 (default: ${ENV_SYSLOG_NG}, else syslog-ng on the PATH)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario {', '.join(sorted(unknown))}; pick from 1-9")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    runs = args.runs or (3 if args.quick else 5)
    base = Path(tempfile.mkdtemp(prefix="flbench-", dir=args.dir))
    machine = describe(str(base))
    throughput = {"1", "2"} & set(args.only.split(","))
    peers = find_peers(args.syslog_ng) if throughput else []
    ctx = Context(
        base=base, quick=args.quick, runs=runs, peers=peers, daemon_args=tuple(args.daemon_arg)
    )
    print(f"command: {machine['command']}")
    print(f"date:    {machine['date']}")
    print(
        f"machine: {machine['cores']} cores ({machine['usable_cores']} usable), "
        f"{machine['cpu_model']}, {machine['memory_gb']} GB RAM, Linux {machine['kernel']}, "
        f"Python {machine['python']}, SQLite {machine['sqlite']}"
    )
    print(f"disk:    {machine['filesystem']}")
    print(f"code:    {machine['revision']}")
    print(f"load:    {' '.join(map(str, machine['load_average_at_start']))} (1, 5, 15 min)")
    if peers:
        print(f"peers:   {'; '.join(peer.describe() for peer in peers)}")
    print(f"runs:    {runs} per scenario{' (quick workloads)' if args.quick else ''}", flush=True)
    for peer in peers:
        if peer.skipped:
            ctx.say(f"{peer.name} skipped in scenarios 1 and 2: {peer.skipped}")
    rows: list[Row] = []
    noise: dict[str, dict[str, float]] = {}  # CPU other processes took, per scenario
    started = time.monotonic()
    try:
        for key in args.only.split(","):
            began, meter = time.monotonic(), CpuMeter()
            rows += SCENARIOS[key](ctx)
            seconds, share = meter.others()
            noise[key] = {"cpu_seconds": round(seconds, 1), "share": round(share, 3)}
            ctx.say(
                f"scenario {key} done in {time.monotonic() - began:.0f} s; other processes "
                f"used {seconds:.1f} CPU-s meanwhile ({share:.0%} of the machine)"
            )
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    elapsed = time.monotonic() - started
    print()
    print(format_table(rows))
    print()
    print(
        f"median (min{DASH}max) of {runs} runs; ratios are flightlogd / baseline on medians; "
        f"total {elapsed:.0f} s"
    )
    print(
        "other processes' share of the machine's CPU, by scenario (noise): "
        + ", ".join(f"{key}: {value['share']:.0%}" for key, value in noise.items())
    )
    if peers:
        print()
        print("syslog peers, scenarios 1 and 2 (CPU: medians, all processes = agents + daemon):")
        print()
        print(peer_table(rows, peers))
    if args.json:
        report = {
            "machine": machine,
            "runs": runs,
            "quick": args.quick,
            "seconds": round(elapsed, 1),
            "other_processes_cpu_by_scenario": noise,
            "rows": [row.to_json() for row in rows],
            "peers": {
                peer.name: {"version": peer.version, "binary": peer.binary, "skipped": peer.skipped}
                for peer in peers
            },
        }
        Path(args.json).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
