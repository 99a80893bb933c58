"""Refused connections are logged within a bound, and counted (issue 27, 7).

A uid refused thousands of connections a second (here ``--max-connections`` is full)
used to get one ``refused`` line each: about 4,500 lines a second, enough for
journald's rate limit to drop the daemon's other lines.  Now each uid has at most
:data:`BURST` lines per :data:`WINDOW` seconds, and the rest are counted (``dropped``)
in its next ``refused`` line or in a ``refusals_not_logged`` line once the window is
over.
"""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path

from flightlog.daemon._refusals import BURST, WINDOW
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    Hello,
    Welcome,
)
from support import DaemonProcess, RawClient, wait_for
from support.daemon import log_events

REFUSED = 600


def _accounted(daemon: DaemonProcess) -> tuple[int, int]:
    """(``refused`` lines of code too_many, connections they and the counts account for)."""
    lines = dropped = 0
    for event in log_events(daemon):
        if event.get("event") == "refused" and event.get("code") == "too_many":
            lines += 1
            dropped += event.get("dropped", 0)
        elif event.get("event") == "refusals_not_logged":
            dropped += event["dropped"]
    return lines, lines + dropped


def test_refused_connections_are_logged_within_a_bound_and_counted() -> None:
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    daemon = DaemonProcess(base, "--log-format", "json", "--max-connections", "1").start()
    try:
        holder: list[RawClient] = []

        def hold() -> bool:  # the only place (once the probe of start() is gone)
            client = RawClient(daemon.socket, hello=False)
            try:
                client.send(Hello(id=1, version=PROTOCOL_VERSION))
                if isinstance(client.receive(), Welcome):
                    holder.append(client)
                    return True
            except (EOFError, OSError):
                pass
            client.close()
            return False

        wait_for(hold)
        before = _accounted(daemon)[1]  # hold()'s own attempts, refused while the probe was
        with holder[0]:
            started = time.monotonic()
            for _ in range(REFUSED):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.connect(daemon.socket)
                    while sock.recv(4096):  # the error, then the daemon hangs up
                        pass
            elapsed = time.monotonic() - started
            wait_for(lambda: _accounted(daemon)[1] >= before + REFUSED, timeout=3 * WINDOW)
        lines, accounted = _accounted(daemon)
        assert accounted == before + REFUSED
        # Each window of the flood (and the one it ended in) logs at most BURST lines.
        assert lines <= BURST * (int(elapsed // WINDOW) + 2), (lines, elapsed)
        assert lines < REFUSED
        assert any(e.get("event") == "refusals_not_logged" for e in log_events(daemon))
    finally:
        daemon.stop()
