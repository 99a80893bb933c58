"""Records cannot drive the reader's terminal (issue 16, 12): on a terminal the CLI
shows control characters from records as visible escapes, as journalctl and less do;
``--json`` stays exactly the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from flightlog.protocol import now
from flightlog.protocol.wire import BeginRun, CloseRun, CloseSession
from support import DaemonProcess, RawClient, on_a_terminal
from support.daemon import (
    as_uid,
    begin,
    create,
    fact,
    needs_root,
    shared_daemon,
    synced_seq,
)

OTHER = 42031
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


#: The bidirectional controls (a right-to-left override, an isolate and its end, a
#: mark), DEL and C1 controls, as one uid may put them in what another reads.
BIDI = "\u202egnp.exe\u2066x\u2069\u200f\x7f\x90q\x9c"


@needs_root
def test_bidi_controls_from_another_uid_never_reach_roots_terminal() -> None:
    with shared_daemon() as daemon:

        def record() -> None:
            with RawClient(daemon.socket, client="agent" + BIDI) as client:
                sid = create(client, f"bidi{BIDI}.jsonl", app="app" + BIDI).session_id
                run = begin(client, sid).run_id
                execution = {"id": "t1" + BIDI, "kind": "tool", "attempt": 1, "turn_index": 0}
                for event_type, data in [
                    ("agent_start", {"agent": "agent" + BIDI}),
                    ("tool_exec_start", {"execution": execution, "name": "read" + BIDI}),
                    ("tool_exec_end", {"execution": execution, "result": "ok" + BIDI}),
                ]:
                    client.send(
                        fact(sid, run, event_type=event_type, data=json.dumps(data).encode())
                    )
                assert synced_seq(client, sid) == 5
                client.request(CloseSession(id=client.next_id(), session_id=sid))

        as_uid(OTHER, record)
        (path,) = daemon.root.rglob("bidi*.jsonl")
        env = {**os.environ, "FLIGHTLOG_SOCKET": daemon.socket, "TERM": "xterm"}
        env.pop("NO_COLOR", None)
        cli = [sys.executable, "-m", "flightlog.cli"]
        for argv in (
            ["tail", str(path)],
            ["show", str(path)],
            ["inspect", str(path)],
            ["find", str(path.parent)],
            ["sessions", str(path.parent)],
            ["diff", str(path), str(path)],
            ["--color", "never", "show", str(path)],
        ):
            shown = on_a_terminal([*cli, *argv], env).decode()
            # Before, each reached the terminal raw: "exe.png" showed as "gnp.exe".
            for raw in ("\u202e", "\u2066", "\u2069", "\u200f", "\x7f", "\x90", "\x9c"):
                assert raw not in shown, (argv, raw, shown)
            assert "\\u202egnp.exe" in shown, (argv, shown)
        exact = on_a_terminal([*cli, "tail", "--json", str(path)], env)
        assert exact.replace(b"\r\n", b"\n") == path.read_bytes()
        assert BIDI in path.name and BIDI.encode() in path.read_bytes()


@needs_root
def test_a_path_with_a_line_break_forges_no_line_in_vacuum_compress_or_sql() -> None:
    forged = "FORGED \x1b]0;t\x07"
    with shared_daemon() as daemon:

        def record() -> None:
            with RawClient(daemon.socket) as client:
                sid = create(client, f"paths/a\n{forged}.jsonl").session_id
                client.request(CloseSession(id=client.next_id(), session_id=sid))

        as_uid(OTHER, record)
        (path,) = daemon.root.rglob("a*.jsonl")
        # A FIFO of that name too, as a member of a shared root could leave: the
        # commands that list a directory say they left it out.
        os.mkfifo(path.parent / f"b\n{forged}.jsonl")
        env = {**os.environ, "FLIGHTLOG_SOCKET": daemon.socket}
        cli = [sys.executable, "-m", "flightlog.cli"]
        for argv in (
            ["vacuum", str(path.parent), "--max-age", "0s", "--protect", "0s", "--dry-run"],
            ["sql", "SELECT count(*) FROM records", str(path.parent)],
            ["compress", str(path.parent)],
        ):
            result = subprocess.run(
                [*cli, *argv], env=env, capture_output=True, text=True, timeout=120
            )
            assert result.returncode == 0, (argv, result.stderr)
            said = result.stdout + result.stderr
            # Before, each printed the name as it is: a line that began "FORGED".
            assert "\\nFORGED" in said, (argv, said)
            for line in said.split("\n"):
                assert not line.startswith("FORGED"), (argv, said)
