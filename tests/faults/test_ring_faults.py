"""Crashes around the ring (docs/protocol.md, "The ring").

An agent SIGKILLed right after ``record()`` returned loses nothing: what it published
is in the daemon's memfd, and the daemon takes the ring to its end before it treats
the stream as ended.  The daemon is stopped (SIGSTOP) while the agent records, so
nothing of it was read before the agent died; a frame the agent left half written is
dropped, as one cut short on a socket is.  The daemon's own restarts with rings on
are tests/faults/test_restarts.py's (the SDK asks for a ring by default).
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flightlog.protocol.ring import (
    ring_supported,
)
from support import DaemonProcess, read_lines, wait_for
from support.daemon import assert_serving, check_file

pytestmark = pytest.mark.skipif(
    not ring_supported(sys.platform, platform.machine(), sys.thread_info.lock),
    reason="rings need x86-64 Linux",
)

#: An agent that creates its session, says "ready", waits for a line on stdin, records
#: COUNT events (and, with "half", writes half a frame more), and SIGKILLs itself.
AGENT = """
import os, signal, sys
from flightlog.protocol import events
from flightlog.protocol.wire import encode_frame, RecordEvent
from flightlog.sdk import connect

client = connect(sys.argv[1])
assert client.welcome.ring > 0
session = client.create("killed.jsonl")
run = session.begin_run()
print("ready", flush=True)
sys.stdin.readline()
for n in range(int(sys.argv[2])):
    run.record(events.TurnStart(turn_index=n))
if sys.argv[3] == "half":
    frame = encode_frame(RecordEvent(
        session_id=session.session_id, run_id=run.run_id, event_type="turn_start",
        time="2026-01-01T00:00:00Z", data=b'{"turn_index":-1}'))
    client._link.transport._ring.write(frame[: len(frame) // 2])
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("tail", ["whole", "half"])
def test_an_agent_killed_after_record_loses_nothing(short_tmp: Path, tail: str) -> None:
    daemon = DaemonProcess(short_tmp, "--log-format", "json").start()
    try:
        count = 500  # ~60 KB of frames: all of it fits in the ring
        with subprocess.Popen(
            [sys.executable, "-c", AGENT, daemon.socket, str(count), tail],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as agent:
            assert agent.stdout is not None and agent.stdin is not None
            assert agent.stderr is not None
            assert agent.stdout.readline() == "ready\n", agent.stderr.read()
            os.kill(daemon.pid, signal.SIGSTOP)
            try:
                agent.stdin.write("go\n")
                agent.stdin.flush()
                assert agent.wait(timeout=60) == -signal.SIGKILL, agent.stderr.read()
            finally:
                os.kill(daemon.pid, signal.SIGCONT)
        path = daemon.root / "killed.jsonl"

        def turns() -> list[int]:
            return [line["data"]["turn_index"] for line in read_lines(path)[2:]]

        wait_for(lambda: len(turns()) >= count)
        # The connection's end released the session: its run is left open, the file sound.
        assert check_file(path).sound
        assert turns() == list(range(count))
        assert daemon.alive()
        assert_serving(daemon)
    finally:
        daemon.stop()
