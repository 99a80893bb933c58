"""Refused connections are logged within a bound, and counted (issue 27, 7).

A uid refused thousands of connections a second (here ``--max-connections`` is full)
used to get one ``refused`` line each: about 4,500 lines a second, enough for
journald's rate limit to drop the daemon's other lines.  Now each uid has at most
:data:`BURST` lines per window (``--refusal-window``, 10 s by
default), and the rest are counted (``dropped``) in its next ``refused`` line or in a
``refusals_not_logged`` line once the window is over.  The daemons here have windows of
:data:`WINDOW` seconds: the counts of a flood's last window are said once it is
over, which the tests wait for.
"""

from __future__ import annotations

import socket
import struct
import tempfile
import time
from pathlib import Path

from flightlog.daemon._refusals import BURST
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    Hello,
    Welcome,
)
from support import DaemonProcess, RawClient, wait_for
from support.daemon import as_uid, log_events, needs_root, shared_daemon

REFUSED = 600
#: The daemons' window: shorter than the default, still far longer than 20 of the
#: flood's connections take on a loaded machine.
WINDOW = 2.0
WINDOW_ARGS = ("--refusal-window", str(WINDOW))


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
    daemon = DaemonProcess(
        base, "--log-format", "json", "--max-connections", "1", *WINDOW_ARGS
    ).start()
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
            wait_for(lambda: _accounted(daemon)[1] >= before + REFUSED, timeout=60)
        lines, accounted = _accounted(daemon)
        assert accounted == before + REFUSED
        # Each window of the flood (and the one it ended in) logs at most BURST lines.
        assert lines <= BURST * (int(elapsed // WINDOW) + 2), (lines, elapsed)
        assert lines < REFUSED
        assert any(e.get("event") == "refusals_not_logged" for e in log_events(daemon))
    finally:
        daemon.stop()


OTHER = 47011


def _accounted_of(daemon: DaemonProcess, uid: int) -> tuple[int, int]:
    """(``refused`` lines of ``uid``, refusals they and the counts account for)."""
    lines = dropped = 0
    for event in log_events(daemon):
        if event.get("uid") != uid:
            continue
        if event.get("event") == "refused":
            lines += 1
            dropped += event.get("dropped", 0)
        elif event.get("event") == "refusals_not_logged":
            dropped += event["dropped"]
    return lines, lines + dropped


@needs_root
def test_a_uid_refused_once_on_each_of_many_connections_is_logged_within_a_bound() -> None:
    """Another uid opens connection after connection, each refused once (a first frame
    that is no message) and closed: its refusals share one window over all its
    connections.  Before, each connection had a window of its own, so every
    connection's refusal was logged: one line each (5,559 in 3 s from one uid)."""
    with shared_daemon(*WINDOW_ARGS) as daemon:

        def churn() -> float:
            started = time.monotonic()
            for _ in range(REFUSED):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.connect(daemon.socket)
                    sock.sendall(struct.pack(">I", 8) + b"\xff" * 8)
                    while sock.recv(4096):  # the error, then the daemon hangs up
                        pass
            return time.monotonic() - started

        elapsed = as_uid(OTHER, churn)
        wait_for(lambda: _accounted_of(daemon, OTHER)[1] >= REFUSED, timeout=60)
        lines, accounted = _accounted_of(daemon, OTHER)
        assert accounted == REFUSED
        assert lines <= BURST * (int(elapsed // WINDOW) + 2), (lines, elapsed)
        assert any(
            e.get("event") == "refusals_not_logged" and e.get("uid") == OTHER
            for e in log_events(daemon)
        )
