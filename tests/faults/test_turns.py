"""A connection's turn on the event loop is bounded in requests as well as in frames
(issue 27, 3): a client with hundreds of requests read at once (statuses, each far
dearer than a record) yields the loop to the others after its bound, so another
client's request is not answered behind 64 of them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from flightlog.daemon import _connection
from flightlog.daemon._connection import Connection
from flightlog.protocol.wire import Status, StatusReply, encode_frame
from support import RawClient, wait_for

from .harness import InProcessDaemon


def test_a_turn_of_requests_ends_at_its_bound(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound = _connection._REQUESTS_PER_TURN
    routed: list[str] = []
    route = Connection._route

    async def recorded(self: Connection, event: Any) -> None:
        routed.append(self.client)
        await route(self, event)

    monkeypatch.setattr(Connection, "_route", recorded)
    with InProcessDaemon(short_tmp) as daemon:
        assert daemon.daemon is not None
        loop = daemon.daemon.poller._loop
        with (
            RawClient(daemon.socket, client="flooder") as flooder,
            RawClient(daemon.socket, client="bystander") as bystander,
        ):
            # Both sockets hold their requests before the loop reads either: it is
            # held (a callback that waits) while they send.
            gate, held = threading.Event(), threading.Event()
            loop.call_soon_threadsafe(lambda: (held.set(), gate.wait(10)))
            assert held.wait(10)
            routed.clear()
            flooder.send_bytes(b"".join(encode_frame(Status(id=n + 2)) for n in range(200)))
            bystander.send(Status(id=bystander.next_id()))
            gate.set()
            assert isinstance(bystander.receive(), StatusReply)
            wait_for(lambda: len(routed) == 201)
    # The flooder's task ran first (its bytes came first) and yielded after its bound
    # of statuses: the bystander's came right after them, where it came after 64 (the
    # bound in frames) before.
    assert routed.index("bystander") == bound < 64, routed.index("bystander")
