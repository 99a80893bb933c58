"""A uid opening connections in a loop (issue 27, 7): its ``connection_opened`` and
``connection_closed`` lines are bounded per uid, the rest counted.

Before, a uid churning connections (each sending a first frame that is no message, a
hello, or nothing, and hanging up) logged two lines a connection (about 4,000 a
second).
"""

from __future__ import annotations

import socket
import time

from flightlog.daemon._refusals import BURST, WINDOW
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    Hello,
    encode_frame,
)
from support import DaemonProcess, RawClient, wait_for
from support.daemon import as_uid, log_events, needs_root, shared_daemon

pytestmark = needs_root

FLOODER = 41001

CHURNED = 600


def _lines_of(daemon: DaemonProcess, uid: int) -> tuple[int, int, int, int]:
    """``connection_opened`` and ``connection_closed`` lines of ``uid``, and the
    connections they and the counts of those not logged account for (opened, closed)."""
    opened = closed = opened_counted = closed_counted = 0
    for event in log_events(daemon):
        if event.get("uid") != uid:
            continue
        name = event.get("event")
        opened += name == "connection_opened"
        closed += name == "connection_closed"
        # A window's count is said by the next window's first line, or once it is over.
        counted = event.get("not_logged", {})
        opened_counted += counted.get("connection_opened", 0)
        closed_counted += counted.get("connection_closed", 0)
    return opened, closed, opened + opened_counted, closed + closed_counted


def test_a_uid_churning_connections_logs_a_bounded_number_of_lines() -> None:
    """Another uid opens connection after connection, each hung up after its hello is
    answered: its ``connection_opened`` lines share one window of :data:`BURST`, each
    with its ``connection_closed``, and every connection is accounted for.  Before,
    each logged both lines: 1,200 lines for 600 connections."""
    hello = encode_frame(Hello(id=0, version=PROTOCOL_VERSION, client="churn"))
    with shared_daemon() as daemon:

        def churn() -> float:
            started = time.monotonic()
            for _ in range(CHURNED):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.connect(daemon.socket)
                    sock.sendall(hello)
                    sock.recv(4096)  # the welcome: it was served
            return time.monotonic() - started

        elapsed = as_uid(FLOODER, churn)
        wait_for(lambda: _lines_of(daemon, FLOODER)[2:] == (CHURNED, CHURNED), timeout=3 * WINDOW)
        opened, closed, _, _ = _lines_of(daemon, FLOODER)
        assert opened == closed
        assert opened <= BURST * (int(elapsed // WINDOW) + 2), (opened, elapsed)
        # Another uid's lines are its own: its connection is logged.
        with RawClient(daemon.socket, client="other"):
            pass
        wait_for(
            lambda: any(
                e.get("event") == "connection_closed" and e.get("client") == "other"
                for e in log_events(daemon)
            )
        )
