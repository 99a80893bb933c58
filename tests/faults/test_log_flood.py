"""Refusals do not flood the log (issue 16, 10): a client sending thousands of bad
requests gets a bounded number of ``refused`` lines, and the log says how many it left
out, to the unit.
"""

from __future__ import annotations

import time
from pathlib import Path

from flightlog.daemon._refusals import BURST, WINDOW
from flightlog.protocol.wire import (
    Sync,
    encode_frame,
)
from support import DaemonProcess, RawClient
from support.daemon import log_events, wait_for_log

BAD = 2000


def test_repeated_refusals_are_logged_a_few_at_a_time_with_a_count(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    started = time.monotonic()
    with RawClient(daemon.socket, client="flood") as client:
        frames = b"".join(
            encode_frame(Sync(id=client.next_id(), session_id=f"nope{n}")) for n in range(BAD)
        )
        client.send_bytes(frames)
        for _ in range(BAD):
            assert getattr(client.receive(), "code", None) == "session_not_found"
    windows = (time.monotonic() - started) // WINDOW + 1
    wait_for_log(daemon, event="refusals_not_logged")
    events = [e for e in log_events(daemon) if e.get("client") == "flood"]
    refused = [e for e in events if e["event"] == "refused"]
    assert len(refused) <= BURST * windows, len(refused)
    dropped = sum(e.get("dropped", 0) for e in events)
    assert len(refused) + dropped == BAD
    daemon.stop()
