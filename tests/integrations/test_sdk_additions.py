"""What every integration needs from the SDK, against a real daemon: create-or-open, times
with any offset, values the frameworks hand out, and no waiting on an event-loop thread."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket

import pytest

from flightlog.protocol import events
from flightlog.sdk import DaemonError, ErrorCode, check, connect, read
from flightlog.sdk.aio import aconnect
from support import DaemonProcess, read_lines, wait_for


def test_session_creates_then_opens(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        first = client.session("chats/c1.jsonl", meta={"app": "t"})
        with first.begin_run() as run:
            run.record(events.AgentStart(agent="a"))
        first.close()
        again = client.session("chats/c1.jsonl", meta={"app": "ignored"})
        assert again.session_id == first.session_id
        assert again.meta == {"app": "t"}
        with again.begin_run() as run:
            run.record(events.AgentEnd())
        again.close()
    lines = read_lines(daemon.root / "chats" / "c1.jsonl")
    assert [line["type"] for line in lines].count("session_start") == 1
    assert [line["type"] for line in lines].count("run_start") == 2


def test_session_is_busy_while_another_client_writes_it(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as holder, connect(daemon.socket) as other:
        holder.session("busy.jsonl")
        with pytest.raises(DaemonError) as info:
            other.session("busy.jsonl")
        assert info.value.code == ErrorCode.SESSION_BUSY


@pytest.mark.anyio
async def test_async_session_creates_then_opens(daemon: DaemonProcess) -> None:
    async with aconnect(daemon.socket) as client:
        session = await client.session("a.jsonl", meta={"k": 1})
        await session.aclose()
        again = await client.session("a.jsonl")
        assert again.session_id == session.session_id
        await again.aclose()


def test_times_with_an_offset_are_written_in_utc(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.session("t.jsonl")
        with session.begin_run() as run:
            run.record(events.AgentStart(time="2026-11-29T21:00:00.250+01:00"))
            run.record(events.AgentEnd(), time="2026-11-29T15:00:01-05:00")
        session.close()
    times = {r.type: r.time for r in read(daemon.root / "t.jsonl")}
    assert times["agent_start"] == "2026-11-29T20:00:00.250Z"
    assert times["agent_end"] == "2026-11-29T20:00:01Z"


@dataclasses.dataclass
class Reply:
    text: str


def test_a_value_that_cannot_be_encoded_is_marked_and_named_in_run_close(
    daemon: DaemonProcess,
) -> None:
    with connect(daemon.socket) as client:
        session = client.session("codec.jsonl")
        run = session.begin_run()
        with socket.socket() as handle:
            run.record(events.MessageEnd(message=Reply(text="kept")))
            run.record(events.MessageEnd(message={"handle": handle}))
        run.record(events.AgentEnd())
        assert run.error is None
        run.close()
        session.close()
    records = list(read(daemon.root / "codec.jsonl"))
    assert [r.type for r in records][2:] == ["message_end", "message_end", "agent_end", "run_close"]
    assert records[2].decode_data()["message"] == {
        "$class": f"{__name__}.Reply",
        "text": "kept",
    }
    marker = records[3].decode_data()["message"]["handle"]
    assert (marker["$flightlog"], marker["class"]) == ("unencodable", "socket.socket")
    error = records[-1].decode_data()["error"]
    assert error.startswith("codec_error: 1 event written with $flightlog markers: message_end: ")
    assert "socket" in error


def test_the_sync_client_does_not_wait_for_durability_on_a_loop_thread(
    daemon: DaemonProcess,
) -> None:
    # With the daemon stopped, a close that waited for its reply would never return.
    with connect(daemon.socket) as client:
        session = client.session("loop.jsonl")
        run = session.begin_run()
        run.record(events.AgentEnd())

        async def close_on_the_loop() -> None:
            run.close()
            session.close()

        daemon.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            asyncio.run(close_on_the_loop())
        finally:
            daemon.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    # The daemon still writes run_close and syncs.
    path = daemon.root / "loop.jsonl"
    wait_for(lambda: read_lines(path)[-1]["type"] == "run_close")
    report = check(path)
    assert report.sound
    assert report.runs == 1
    assert report.open_runs == []
    assert [r.type for r in read(daemon.root / "loop.jsonl")][-1] == "run_close"
