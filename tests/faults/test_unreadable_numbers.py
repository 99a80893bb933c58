"""The daemon acknowledges no number that readers refuse (issue 16, 9): a float beyond
the double range or an integer of thousands of digits is refused, in a record and in a
checkpoint, and everything it wrote reads back.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from daemon_support import begin, create, expect_record_failed, fact, synced_seq

from flightlog.protocol import ErrorReply, SaveCheckpoint, now
from support import DaemonProcess, RawClient

HUGE_INT = b"9" * 5000


def test_numbers_readers_refuse_are_refused_and_the_rest_reads_back(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    with RawClient(daemon.socket) as client:
        opened = create(client, "numbers.jsonl")
        sid = opened.session_id
        run = begin(client, sid)
        fine = [
            b'{"a":1e308}',
            b'{"a":-1.5e-400}',
            b'{"a":"1e400 in a string"}',
            b'{"a":' + b"9" * 400 + b"}",
        ]
        for data in fine:
            client.send(fact(sid, run.run_id, data=data))
        assert synced_seq(client, sid) == 2 + len(fine)
        client.send(fact(sid, run.run_id, data=b'{"a":1e400}'))
        expect_record_failed(client, "bad_event", sid)
        refused = client.request(
            SaveCheckpoint(
                id=client.next_id(),
                session_id=sid,
                run_id=run.run_id,
                time=now(),
                snapshot=b'{"n":' + HUGE_INT + b"}",
            )
        )
        assert isinstance(refused, ErrorReply) and refused.code == "bad_event", refused
        # A refused record is its run's error, not the session's.
        assert synced_seq(client, sid) == 2 + len(fine)
    lines = (daemon.root / "numbers.jsonl").read_bytes().splitlines()
    assert len(lines) == 2 + len(fine)
    for line in lines:
        msgspec.json.decode(line)  # every line reads back, numbers and all
    daemon.stop()
