"""``tail --all`` keeps every subscriber that keeps up (issue 16, 8): a record larger
than a subscriber's live buffer reaches them all, none is ended with ``too_many``.
"""

from __future__ import annotations

import json
from pathlib import Path

from flightlog.protocol.wire import Subscribe, Subscribed, TailBatch
from support import DaemonProcess, RawClient
from support.daemon import begin, create, fact, synced_seq

#: Larger than a subscriber's live buffer (4 MiB).
BIG = b'{"blob":"' + b"x" * (5 << 20) + b'"}'


def test_a_huge_record_reaches_every_subscriber_of_all_sessions(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    tails = [RawClient(daemon.socket, client=f"tail {n}") for n in range(3)]
    try:
        for tail in tails:
            assert isinstance(tail.request(Subscribe(id=tail.next_id())), Subscribed)
        with RawClient(daemon.socket, client="writer") as writer:
            opened = create(writer, "big.jsonl")
            run = begin(writer, opened.session_id)
            for n in range(2):
                writer.send(fact(opened.session_id, run.run_id, n, data=BIG))
            writer.send(fact(opened.session_id, run.run_id, 2))
            assert synced_seq(writer, opened.session_id) == 5
        for tail in tails:
            seqs: list[int] = []
            while len(seqs) < 5:
                batch = tail.receive()
                assert isinstance(batch, TailBatch), batch  # not a tail_end: too_many
                seqs.extend(json.loads(line)["seq"] for line in batch.lines)
            assert seqs == [1, 2, 3, 4, 5]
    finally:
        for tail in tails:
            tail.close()
    daemon.stop()
