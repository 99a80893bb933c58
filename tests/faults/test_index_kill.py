"""SIGKILL of flightlogd in the middle of writing a session's index: the session file is
as it was, the index is either the old one or none (never a part), and a new daemon
opens the session answering what reading the whole file answers, and clears what the
killed write left behind."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from flightlog.daemon._index import SessionIndex
from flightlog.protocol import FlightlogError, new_id
from flightlog.protocol.format import RunLedger
from flightlog.sdk import connect, read, storage
from flightlog.sdk._compression import TEMP_SUFFIX
from flightlog.sdk._resume import open_calls
from support import DaemonProcess

_TIME = "2026-12-01T10:00:00.000000Z"


def many_small_records(megabytes: int) -> bytes:
    """Short tool calls with event ids, runs left cut: a big index for its size."""
    sid = new_id()
    out = [
        msgspec.json.encode(
            {
                "session_id": sid,
                "seq": 1,
                "type": "session_start",
                "time": _TIME,
                "run_id": None,
                "data": {"format_version": 1, "meta": {}},
            }
        )
        + b"\n"
    ]
    seq, size, r = 1, 0, 0
    while size < megabytes * 1_000_000:
        run = f"r{r}"
        kinds: list[tuple[str, dict[str, Any]]] = [("run_start", {"pid": 1, "client": "t"})]
        for n in range(500):
            execution = {"id": f"t{n}", "kind": "tool", "attempt": 1}
            kinds.append(("tool_exec_start", {"execution": execution, "name": "x"}))
            if n % 7:
                kinds.append(("tool_exec_end", {"execution": execution, "content": []}))
        if r % 3:
            kinds.append(("run_close", {"error": None}))
        for type, data in kinds:
            seq += 1
            line = {"session_id": sid, "seq": seq, "type": type, "time": _TIME, "run_id": run}
            if type == "tool_exec_start":
                line["event_id"] = f"{run}-{seq}"
            out.append(msgspec.json.encode({**line, "data": data}) + b"\n")
            size += len(out[-1])
        r += 1
    return b"".join(out)


def answers(daemon: DaemonProcess, name: str) -> tuple[list[str], list[Any], list[str]]:
    with connect(daemon.socket) as client:
        session = client.open(name)
        found = session.resume()
        session.close()
    return found.cut_runs, found.open_calls, list(session.interrupted_runs)


def truth(path: Path) -> tuple[list[str], list[Any], list[str]]:
    records = list(read(path))
    ledger = RunLedger()
    for record in records:
        ledger.add(record.type, record.run_id)
    return (*open_calls(records), ledger.interrupted_runs)


def test_the_daemon_killed_while_writing_an_index_loses_nothing(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    path = daemon.root / "kill.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    original = many_small_records(12)
    path.write_bytes(original)
    index = path.parent / storage.index_name(path.name)
    prefix = f".{path.name}."

    def temporaries() -> list[Path]:
        return [
            p
            for p in path.parent.iterdir()
            if p.name.startswith(prefix) and p.name.endswith(TEMP_SUFFIX)
        ]

    stop = threading.Event()

    def reopen() -> None:
        # Every open of the file without its index reads it whole and writes one.
        # No reconnecting: the daemon is killed under it, and nothing follows.
        with (
            contextlib.suppress(FlightlogError, OSError),
            connect(daemon.socket, reconnect_grace=0) as client,
        ):
            while not stop.is_set():
                index.unlink(missing_ok=True)
                client.open(path.name).close()

    opener = threading.Thread(target=reopen)
    opener.start()
    caught = False
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and opener.is_alive():
            if temporaries():
                caught = True
                break
            time.sleep(0.0002)
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait()
    finally:
        stop.set()
        opener.join(60)
        daemon.stop()
    assert caught, "no index was caught being written"

    assert path.read_bytes() == original  # the session file is untouched
    if index.exists():  # the one written before, whole, never a part
        msgspec.msgpack.decode(index.read_bytes(), type=SessionIndex)
    expected = truth(path)
    assert expected[1] and expected[2]  # calls left open, runs cut

    daemon = DaemonProcess(short_tmp).start()
    try:
        assert answers(daemon, path.name) == expected
        assert answers(daemon, path.name) == expected  # from the index it wrote
    finally:
        daemon.stop()
    assert not temporaries()  # the killed write's leftover is gone
    written = msgspec.msgpack.decode(index.read_bytes(), type=SessionIndex)
    assert written.offset == len(original)
