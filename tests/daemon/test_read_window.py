"""The read window (``flightlogd --read-window``): a client streaming records is left
unread for a moment between reads, its frames waiting in the socket buffer (once it
has made no request for 40 windows).  Nothing it sends may be lost or reordered by
that: not when it streams with requests between its records, is tailed live, is
killed, or when the daemon stops during a hold."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol.wire import encode_frame
from flightlog.sdk import connect
from support import DaemonProcess, RawClient, read_lines
from support.daemon import (
    agent_report,
    begin,
    check_file,
    create,
    fact,
    open_when_released,
    spawn_agent,
    synced_seq,
)

#: Longer than the pauses of the streams below, so that they are held once 40 windows
#: (40 ms) have passed since their last request; short enough to keep tests fast.
WINDOW = "0.001"


@pytest.fixture
def windowed(short_tmp: Path) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(short_tmp, "--log-format", "json", "--read-window", WINDOW).start()
    try:
        yield proc
    finally:
        proc.stop()


def _turns(path: Path) -> list[int]:
    lines = read_lines(path)
    assert [line["seq"] for line in lines] == list(range(1, len(lines) + 1))
    return [line["data"]["turn_index"] for line in lines if line["type"] == "turn_start"]


def _stream(client: RawClient, session_id: str, run_id: str, first: int, count: int) -> None:
    """``count`` records, a few at a time, each burst well inside the window."""
    for n in range(first, first + count, 5):
        client.send_bytes(
            b"".join(encode_frame(fact(session_id, run_id, i)) for i in range(n, n + 5))
        )
        time.sleep(0.0003)


def test_requests_between_streamed_records_see_every_record_before_them(
    windowed: DaemonProcess,
) -> None:
    with RawClient(windowed.socket) as client:
        opened = create(client, "paced.jsonl")
        run = begin(client, opened.session_id)
        for burst in range(5):
            _stream(client, opened.session_id, run.run_id, burst * 1000, 1000)
            assert synced_seq(client, opened.session_id) == 2 + (burst + 1) * 1000
    assert _turns(windowed.root / "paced.jsonl") == list(range(5000))


def test_a_live_tail_gets_every_streamed_record(windowed: DaemonProcess) -> None:
    with RawClient(windowed.socket) as writer:
        opened = create(writer, "tailed.jsonl")
        run = begin(writer, opened.session_id)
        seen: list[int] = []
        with connect(windowed.socket) as reader:
            tail = reader.tail("tailed.jsonl", after=0, follow=True)

            def read() -> None:
                for record in tail:
                    if record.type == "turn_start":
                        seen.append(record.seq)
                        if len(seen) == 2000:
                            return

            thread = threading.Thread(target=read)
            thread.start()
            _stream(writer, opened.session_id, run.run_id, 0, 2000)
            thread.join(timeout=30)
            assert not thread.is_alive()
    assert seen == list(range(3, 2003))


def test_a_streaming_agent_killed_mid_hold_loses_nothing(windowed: DaemonProcess) -> None:
    agent = spawn_agent("hold", windowed.socket, "held.jsonl", "20000")
    try:
        sent = agent_report(agent)
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        for stream in (agent.stdin, agent.stdout, agent.stderr):
            if stream is not None:
                stream.close()
    with RawClient(windowed.socket) as client:
        reopened = open_when_released(client, "held.jsonl")
        assert reopened.last_seq == 20_000 + 2
        assert reopened.interrupted_runs == [sent["run_id"]]
    assert _turns(windowed.root / "held.jsonl") == list(range(20_000))


def test_sigterm_during_a_hold_lands_everything_and_exits_0(windowed: DaemonProcess) -> None:
    with RawClient(windowed.socket) as client:
        opened = create(client, "stopped.jsonl")
        run = begin(client, opened.session_id)
        _stream(client, opened.session_id, run.run_id, 0, 2000)
        # The last bursts are held, unread, when the signal comes.
        assert windowed.terminate() == 0, windowed.log
        assert client.closed_by_daemon()
    assert _turns(windowed.root / "stopped.jsonl") == list(range(2000))
    assert check_file(windowed.root / "stopped.jsonl").sound
