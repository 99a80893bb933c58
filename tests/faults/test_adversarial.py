"""No single client may stall or bloat the daemon (issue 16): from several connections
at once, valid requests at every documented limit (the largest frame, the deepest
nesting, the widest object, the most escaping, thousands of requests in flight, the
slowest partial frames, connections that never say hello) while a bystander agent
records and syncs.

It prints the bystander's worst request latency (the goal is under 100 ms on 2 cores)
and the daemon's peak memory against its documented budget.  Timing is asserted only
against a bound that catches a stall of seconds: on a loaded machine latency varies.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from flightlog.daemon._config import Config
from flightlog.protocol.wire import (
    Status,
    StatusReply,
)
from support import DaemonProcess, RawClient, reaped
from support.daemon import begin, create, fact, proc_status_kb, synced_seq

from .harness import assert_every_file_sound

ADVERSARY = Path(__file__).resolve().parent / "adversary.py"
SECONDS = 10.0
#: A bystander's request slower than this is a stall, whatever the load.
STALL = 5.0


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99)]


def test_a_bystander_records_and_syncs_through_every_attack_at_once(short_tmp: Path) -> None:
    config = Config()
    daemon = DaemonProcess(short_tmp).start()
    before_kb = proc_status_kb(daemon.pid, "VmHWM")
    adversary = subprocess.Popen(
        [sys.executable, str(ADVERSARY), daemon.socket, str(SECONDS), str(config.max_frame_size)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with reaped(adversary):
        # A status request is answered on the event loop alone; a sync also waits for the
        # disk (an fsync of the bystander's file, which on ext4 may wait for the journal
        # to take the attackers' megabytes too).
        loop: list[float] = []
        synced: list[float] = []
        with RawClient(daemon.socket, client="bystander") as bystander:
            opened = create(bystander, "bystander.jsonl")
            run = begin(bystander, opened.session_id)
            sent = 0
            while adversary.poll() is None:
                started = time.perf_counter()
                assert isinstance(bystander.request(Status(id=bystander.next_id())), StatusReply)
                loop.append(time.perf_counter() - started)
                bystander.send(fact(opened.session_id, run.run_id, sent))
                sent += 1
                started = time.perf_counter()
                assert synced_seq(bystander, opened.session_id) == 2 + sent
                synced.append(time.perf_counter() - started)
        out, err = adversary.communicate(timeout=120)
    assert adversary.returncode == 0, err
    attacks = json.loads(out)
    peak_kb = proc_status_kb(daemon.pid, "VmHWM")
    print(
        f"\nbystander, {len(loop)} rounds: status worst {_ms(max(loop))}, "
        f"p99 {_ms(_p99(loop))}; record+sync worst {_ms(max(synced))}, "
        f"p99 {_ms(_p99(synced))}; daemon peak RSS {peak_kb >> 10} MiB "
        f"(at start {before_kb >> 10} MiB), --max-buffered {config.max_buffered >> 20} MiB; "
        f"attacks: {attacks}"
    )
    assert all(isinstance(count, int) and count > 0 for count in attacks.values()), attacks
    assert max(loop) < STALL and max(synced) < STALL, (max(loop), max(synced))
    assert daemon.alive()
    assert_every_file_sound(daemon.root)
    daemon.stop()
