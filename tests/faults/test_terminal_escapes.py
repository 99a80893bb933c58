"""Records cannot drive the reader's terminal (issue 16, 12): on a terminal the CLI
shows control characters from records as visible escapes, as journalctl and less do;
``--json`` stays exactly the file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from flightlog.protocol import now
from flightlog.protocol.wire import BeginRun, CloseRun, CloseSession
from support import DaemonProcess, RawClient, on_a_terminal
from support.daemon import create

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b6n"


def test_control_characters_from_records_never_reach_a_terminal(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    with RawClient(daemon.socket) as client:
        sid = create(client, "evil.jsonl").session_id
        run = client.request(
            BeginRun(id=client.next_id(), session_id=sid, time=now(), client="agent" + HOSTILE)
        )
        client.request(
            CloseRun(
                id=client.next_id(), session_id=sid, run_id=run.run_id, time=now(), error=HOSTILE
            )
        )
        client.request(CloseSession(id=client.next_id(), session_id=sid))
    env = {**os.environ, "FLIGHTLOG_SOCKET": daemon.socket, "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    cli = [sys.executable, "-m", "flightlog.cli"]

    for colour in ("auto", "never"):
        shown = on_a_terminal([*cli, "--color", colour, "tail", "evil.jsonl"], env).decode()
        assert "run closed with error" in shown, shown
        for raw in ("\x07", "\x1b]", "\x1b[2J", "\x9b"):
            assert raw not in shown, (colour, shown)
        assert "\\x1b]0;pwned\\x07\\x1b[2J\\x9b6n" in shown, shown
        if colour == "never":
            assert "\x1b" not in shown

    exact = on_a_terminal([*cli, "tail", "--json", "evil.jsonl"], env)
    assert exact.replace(b"\r\n", b"\n") == (daemon.root / "evil.jsonl").read_bytes()
    daemon.stop()
