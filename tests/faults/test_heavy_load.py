"""Many agent processes recording at once through one daemon, each with several
sessions, checkpoints, and a close and reopen halfway: every record is in its file
exactly once, in order, and every file passes ``check``.

The soak runs 50 processes x 4 sessions x 20,000 events (4 million records); CI runs
20 x 2 x 2,000.  (tests/sdk/test_load.py records one run per session, without
checkpoints or reopening.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flightlog.sdk import check, read
from support import DaemonProcess, reaped

from .load_agent import CHECKPOINT_EVERY

AGENT = Path(__file__).resolve().parent / "load_agent.py"


def _load(daemon: DaemonProcess, agents: int, sessions: int, events: int) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, str(AGENT), daemon.socket, str(a), str(sessions), str(events)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for a in range(agents)
    ]
    with reaped(*procs):
        for proc in procs:
            out, err = proc.communicate(timeout=1800)
            assert proc.returncode == 0 and out == b"ok\n", err.decode()
    half = events // 2
    for a in range(agents):
        for n in range(sessions):
            path = daemon.root / "load" / f"agent-{a}-{n}.jsonl"
            report = check(path)
            assert report.sound and not report.unfinished_tail, (path, report.error)
            assert report.runs == 2 and report.open_runs == [], report
            assert report.checkpoints == events // CHECKPOINT_EVERY
            seen = []
            kinds = []
            for record in read(path):
                kinds.append(record.type)
                if record.type == "tool_exec_start":
                    seen.append(record.decode_data()["arguments"]["i"])
                elif record.type == "checkpoint":
                    # A checkpoint follows exactly the events before it.
                    assert record.decode_data()["snapshot"] == {"i": seen[-1]}
                    assert seen[-1] % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1
            # Every event of this session exactly once, in the order it was recorded.
            assert seen == list(range(events)), (path, len(seen))
            assert report.last_seq == len(kinds) == events + events // CHECKPOINT_EVERY + 5
            first_close = kinds.index("run_close")
            assert kinds[first_close + 1] == "run_start"
            assert kinds[:first_close].count("tool_exec_start") == half


def test_twenty_agents_two_sessions_two_thousand_events(daemon: DaemonProcess) -> None:
    _load(daemon, 20, 2, 2_000)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_fifty_agents_four_sessions_twenty_thousand_events(daemon: DaemonProcess) -> None:
    _load(daemon, 50, 4, 20_000)
