"""A connection's turn on the event loop is bounded in requests as well as in frames
(issue 27, 3): a client with hundreds of requests read at once (statuses, each far
dearer than a record) yields the loop to the others after its bound, so another
client's request is not answered behind 64 of them.  And a uid takes one turn at a
time over all its connections: another uid's request is not answered behind a turn
of each of them."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightlog.daemon import _connection
from flightlog.daemon._connection import Connection
from flightlog.protocol.wire import Status, StatusReply, encode_frame
from support import RawClient, wait_for
from support.daemon import needs_root, shared_daemon

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


@contextlib.contextmanager
def _as_euid(uid: int) -> Iterator[None]:
    """The test process as ``uid`` for a while: a socket connected meanwhile is that
    uid's for good (``SO_PEERCRED`` keeps who connected)."""
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)


@needs_root
def test_a_uids_connections_take_one_turn_while_another_uid_waits() -> None:
    bound = _connection._REQUESTS_PER_TURN
    requests = 100
    with shared_daemon() as daemon:
        # The victim first: its connection is idle by the time the flooder's are
        # welcomed (the last welcomed may still be ending its turn when stopped).
        with _as_euid(41002):
            victim = RawClient(daemon.socket, client="victim")
        with _as_euid(41001):
            flooders = [RawClient(daemon.socket, client="flooder") for _ in range(4)]
        # Everything is in the sockets before the daemon reads any of it: stopped,
        # it reads them all at once when it goes on, in the order they came.
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            burst = b"".join(encode_frame(Status(id=n + 2)) for n in range(requests))
            for flooder in flooders:
                flooder.send_bytes(burst)
            victim.send(Status(id=victim.next_id()))
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
        mine = victim.receive()
        assert isinstance(mine, StatusReply), mine
        theirs = []
        for flooder in flooders:
            for _ in range(requests):
                reply = flooder.receive()
                assert isinstance(reply, StatusReply), reply
                theirs.append(reply.uptime)
        for client in (*flooders, victim):
            client.sock.close()
    # Each status says when it was made (the daemon's uptime then): the victim's came
    # after one turn of the flooder's, where it came after a turn of each of its four
    # connections (32 statuses) before.
    assert sum(uptime < mine.uptime for uptime in theirs) == bound
