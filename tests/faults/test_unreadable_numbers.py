"""The daemon acknowledges no number that readers refuse (issue 16, 9): a float beyond
the double range or an integer of thousands of digits is refused, in a record and in a
checkpoint, and everything it wrote reads back.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    ErrorReply,
    SaveCheckpoint,
)
from support import DaemonProcess, RawClient
from support.daemon import begin, create, expect_record_failed, fact, synced_seq

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


@pytest.mark.parametrize("padding", [0, 64 * 1024], ids=["checked-inline", "checked-in-a-thread"])
def test_a_float_past_the_range_with_a_two_digit_exponent_is_refused(
    short_tmp: Path, padding: int
) -> None:
    # 10**250 * 10**99: no exponent of three digits and no run of 309 digits, which is
    # all the number check once looked for.
    pad = b" " * padding
    daemon = DaemonProcess(short_tmp).start()
    try:
        with RawClient(daemon.socket) as client:
            sid = create(client, "exponent.jsonl").session_id
            run = begin(client, sid)
            client.send(fact(sid, run.run_id, data=b'{"a":-' + b"9" * 209 + b"e99}" + pad))
            assert synced_seq(client, sid) == 3
            client.send(fact(sid, run.run_id, data=b'{"a":1' + b"0" * 250 + b"e99}" + pad))
            failed = expect_record_failed(client, "bad_event", sid)
            assert "holds a number no reader can read back" in failed.message
            assert synced_seq(client, sid) == 3
    finally:
        daemon.stop()
    lines = (daemon.root / "exponent.jsonl").read_bytes().splitlines()
    assert len(lines) == 3
    for line in lines:
        msgspec.json.decode(line)  # every line reads back
