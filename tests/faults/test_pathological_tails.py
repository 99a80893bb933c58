"""Tails of pathological files hold no disk thread for long, and never the writers'
(issue 16, 7): a session file whose first line is followed by a hole of 64 GiB with no
newline, tailed by 20 clients at once, while a writer on the same root checkpoints.
"""

from __future__ import annotations

import os
import select
from pathlib import Path

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    CloseSession,
    Message,
    SaveCheckpoint,
    Subscribe,
    Subscribed,
    TailBatch,
)
from support import DaemonProcess, RawClient
from support.daemon import assert_serving, begin, create

HOLE = 64 << 30
TAILS = 20


def _received(client: RawClient) -> list[Message]:
    """What ``client`` has been sent so far."""
    messages = []
    while select.select([client.sock], [], [], 0)[0]:
        try:
            messages.append(client.receive(timeout=1))
        except TimeoutError:
            break
    return messages


def test_tails_of_a_file_of_holes_keep_no_writer_waiting(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    try:
        _tail_holes_while_a_writer_checkpoints(daemon)
    finally:
        daemon.stop()


def _tail_holes_while_a_writer_checkpoints(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as writer:
        opened = create(writer, "holes.jsonl")
        done = writer.request(CloseSession(id=writer.next_id(), session_id=opened.session_id))
        assert isinstance(done, Ack), done
    path = daemon.root / "holes.jsonl"
    os.truncate(path, path.stat().st_size + HOLE)  # NUL bytes, no newline, no disk

    tails = [RawClient(daemon.socket, client=f"tail {n}") for n in range(TAILS)]
    try:
        for tail in tails:
            subscribed = tail.request(Subscribe(id=tail.next_id(), path="holes.jsonl"))
            assert isinstance(subscribed, Subscribed), subscribed
        with RawClient(daemon.socket, client="writer") as writer:
            opened = create(writer, "busy.jsonl")
            run = begin(writer, opened.session_id)
            for n in range(20):
                ack = writer.request(
                    SaveCheckpoint(
                        id=writer.next_id(),
                        session_id=opened.session_id,
                        run_id=run.run_id,
                        time=now(),
                        snapshot=b'{"step":%d}' % n,
                    )
                )
                assert isinstance(ack, Ack), ack
        # The tails are still reading their holes: each has the first line (its batch
        # may come after the writer is done, the steps being shared) and nothing more.
        for tail in tails:
            assert isinstance(tail.receive(timeout=60), TailBatch)
            assert _received(tail) == []
    finally:
        for tail in tails:
            tail.close()
    # Their reads stop with them, a step at a time, and everyone is served.
    assert_serving(daemon)
