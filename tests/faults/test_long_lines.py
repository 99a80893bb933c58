"""Nothing accepted makes a line that a reader refuses (issue 16, 5): strings the daemon
escapes into a line (a client's name, a run's error, a session's meta) are bounded by
the line the daemon writes, which is the line its tails read, and names are small.
"""

from __future__ import annotations

import json
from pathlib import Path

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    BeginRun,
    CloseRun,
    Create,
    ErrorReply,
    Subscribe,
    Subscribed,
    TailBatch,
    TailEnd,
)
from support import DaemonProcess, RawClient, read_lines
from support.daemon import begin, check_file, create, fact

FRAME = 1 << 20
#: Each control character becomes six bytes (``\u0001``) in a line.
ESCAPED = "\x01" * (FRAME // 2)


def test_escaped_strings_never_make_a_line_the_tails_refuse(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp, "--max-frame-size", str(FRAME)).start()
    with RawClient(daemon.socket) as client:
        refused = client.request(Create(id=client.next_id(), path="m.jsonl", meta={"k": ESCAPED}))
        assert isinstance(refused, ErrorReply) and refused.code == "bad_message", refused
        assert not (daemon.root / "m.jsonl").exists()

        opened = create(client, "long.jsonl")
        sid = opened.session_id
        run = client.request(
            BeginRun(id=client.next_id(), session_id=sid, time=now(), client=ESCAPED)
        )
        for n in range(3):
            client.send(fact(sid, run.run_id, n))
        closing = CloseRun(
            id=client.next_id(), session_id=sid, run_id=run.run_id, time=now(), error=ESCAPED
        )
        refused = client.request(closing)
        assert isinstance(refused, ErrorReply) and refused.code == "bad_event", refused
        # Refused, not failed: the session and its run go on.
        closed = client.request(
            CloseRun(id=client.next_id(), session_id=sid, run_id=run.run_id, time=now(), error="x")
        )
        assert closed == Ack(id=closed.id, seq=6), closed
        again = begin(client, sid)
        assert again.seq == 7

        # The daemon's own tail reads every line it wrote.
        subscribed = client.request(Subscribe(id=client.next_id(), path="long.jsonl"))
        assert isinstance(subscribed, Subscribed), subscribed
        lines: list[bytes] = []
        while not isinstance(message := client.receive(), TailEnd):
            assert isinstance(message, TailBatch), message
            lines.extend(message.lines)
        assert message.reason == "end_of_file", message
        assert [json.loads(line)["seq"] for line in lines] == list(range(1, 8))

    records = read_lines(daemon.root / "long.jsonl")
    assert records[1]["data"]["client"] == ESCAPED[:200]
    report = check_file(daemon.root / "long.jsonl")
    assert report.sound, report
    daemon.stop()
