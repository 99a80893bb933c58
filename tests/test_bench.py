"""The benchmark harness keeps working: ``python -m bench --quick`` runs every scenario
and produces every row.  Speeds are never asserted (CI machines vary); fairness is:
the baselines write the very bytes the daemon writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flightlog.sdk import connect
from support import DaemonProcess

ROOT = Path(__file__).resolve().parent.parent
# The harness is a top-level package of the repository, not an installed one.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._events import LineEncoder, large_event, line_lengths, small_event  # noqa: E402

ROWS = {
    # row key: the systems it must have figures for
    "1": {"flightlog", "jsonl", "sqlite"},
    "1b": {"flightlog", "jsonl", "sqlite"},
    "1c": {"flightlog"},
    "2": {"flightlog", "jsonl", "sqlite"},
    "2b": {"flightlog", "jsonl", "sqlite"},
    "2c": {"flightlog"},
    "3": {"flightlog", "jsonl", "sqlite"},
    "3b": {"flightlog", "jsonl", "sqlite"},
    "3c": {"flightlog", "jsonl"},
    "4-1k": {"flightlog", "sqlite"},
    "4-1k-p99": {"flightlog", "sqlite"},
    "4-1k-rate": {"flightlog", "sqlite"},
    "4-20k": {"flightlog", "sqlite"},
    "4-20k-p99": {"flightlog", "sqlite"},
    "4-20k-rate": {"flightlog", "sqlite"},
    "5": {"flightlog", "jsonl", "sqlite"},
    "5b": {"flightlog", "jsonl", "sqlite"},
    "5c": {"flightlog", "jsonl"},
    "6": {"flightlog"},
    "6b": {"flightlog", "jsonl", "sqlite"},
    "6c": {"flightlog", "jsonl", "sqlite"},
    "7": {"flightlog"},
    "7b": {"flightlog"},
    "7c": {"flightlog"},
}


@pytest.mark.parametrize(
    ("probe", "lines"),
    [
        ("bench.wakeup", ["reader asleep in epoll_wait: send p50", "reader spinning on recv"]),
        (
            "bench.roundtrip",
            [
                "status()",
                "session.sync()",
                "load_checkpoint()",
                "save_checkpoint(",
                "write + fsync",
            ],
        ),
    ],
)
def test_probes_run_and_print_every_line(probe: str, lines: list[str]) -> None:
    """The probes docs/benchmarks.md quotes for the floors under scenarios 3 and 5."""
    done = subprocess.run(
        [sys.executable, "-m", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for line in lines:
        assert line in done.stdout, done.stdout


def test_quick_run_produces_every_row(tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    for heading in ("command: python -m bench --quick", "date:", "machine:", "cores"):
        assert heading in out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    keys = [line.split("|")[1].strip() for line in table[1:]]
    assert keys == list(ROWS)

    data = json.loads(report.read_text())
    assert data["quick"] is True
    assert data["machine"]["cores"] >= 1
    rows = {row["key"]: row for row in data["rows"]}
    assert list(rows) == list(ROWS)
    for key, systems in ROWS.items():
        values = rows[key]["values"]
        assert set(values) == systems, key
        for system in systems:
            assert len(values[system]["runs"]) == data["runs"], (key, system)
        if rows[key]["targets"]:
            assert rows[key]["met"] in (True, False), key


def test_baselines_write_the_daemons_bytes(daemon: DaemonProcess) -> None:
    events = [small_event(), large_event(), small_event(123)]
    with connect(daemon.socket) as client:
        session = client.create("fair.jsonl")
        run = session.begin_run()
        for event in events:
            run.record(event)
        run.close()
        session.close()
        path = Path(session.path)
    lines = path.read_bytes().splitlines(keepends=True)
    assert [line.startswith(b'{"session_id"') for line in lines] == [True] * len(lines)
    written = lines[2 : 2 + len(events)]  # after session_start and run_start
    ours = LineEncoder(session.session_id, run.run_id, first_seq=3)
    assert [ours.line(event) for event in events] == written


def test_line_lengths_counts_the_seq_digits() -> None:
    event = small_event()
    at_one = len(LineEncoder("a" * 32, "b" * 32).line(event))
    for first, count in [(1, 1), (3, 20), (95, 10), (999, 2), (9990, 30), (1, 12000)]:
        lines = LineEncoder("a" * 32, "b" * 32, first_seq=first)
        expected = sum(len(lines.line(event)) for _ in range(count))
        assert line_lengths(at_one, first, count) == expected
