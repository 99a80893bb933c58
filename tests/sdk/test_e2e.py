"""The SDK against a real flightlogd in a subprocess, on a socket in a temporary directory.

The ``daemon`` fixture (tests/conftest.py) starts it and waits until its socket accepts.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from flightlog.protocol import (
    CheckpointData,
    Codec,
    EncodedEvent,
    Event,
    Execution,
    default_codec,
)
from flightlog.protocol.events import (
    AgentEnd,
    AgentStart,
    AssistantMessage,
    CallConfig,
    ContextCompacted,
    ContextPrepareEnd,
    ContextPrepareStart,
    ContextProjected,
    Error,
    MessageEnd,
    MessageUpdate,
    ModelExecEnd,
    ModelExecStart,
    ModelRequest,
    ModelResponse,
    Retry,
    RetryWaitEnd,
    RetryWaitStart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolDeclaration,
    ToolExecEnd,
    ToolExecStart,
    ToolInvokeEnd,
    ToolInvokeStart,
    ToolQueued,
    ToolResultMessage,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
)
from flightlog.sdk import (
    Client,
    DaemonError,
    DaemonNotRunning,
    RecordingError,
    check,
    connect,
    read,
)
from flightlog.sdk.aio import aconnect
from support import DaemonProcess

pytestmark = pytest.mark.timeout(60)

MODEL = Execution(id="x1", kind="model", turn_index=0)
TOOL = Execution(id="x2", kind="tool", parent_id="x1", turn_index=0)
COMPACT = Execution(id="x3", kind="compaction")


def conversation() -> list[Event]:
    """One of every kind of agent fact, and two the codec never writes."""
    user = UserMessage(content="What is the weather in Paris?")
    call = ToolCallPart(id="c1", name="weather", arguments={"city": "Paris"})
    reply = AssistantMessage(
        content=[ThinkingPart(thinking="use the tool"), call], model="m", stop_reason="tool_use"
    )
    result = ToolResultMessage(tool_call_id="c1", name="weather", content=[TextPart(text="18C")])
    return [
        AgentStart(agent="demo", messages=[user]),
        TurnStart(turn_index=0),
        ContextPrepareStart(execution=MODEL, turn_index=0, message_count=1),
        ContextProjected(execution=MODEL, source_count=1, message_count=1),
        ContextPrepareEnd(execution=MODEL, message_count=1, token_estimate=12),
        ModelRequest(
            execution=MODEL,
            messages=[user],
            tools=[ToolDeclaration(name="weather", parameters={"type": "object"})],
            config=CallConfig(model="m", temperature=0.2),
        ),
        ModelExecStart(execution=MODEL, model="m", provider="p"),
        MessageUpdate(delta="use", execution=MODEL),
        ModelExecEnd(execution=MODEL, message=None, error="overloaded"),
        Retry(execution=MODEL, error="overloaded", delay_seconds=0.5),
        RetryWaitStart(execution=MODEL.next_attempt(), delay_seconds=0.5),
        RetryWaitEnd(execution=MODEL.next_attempt()),
        ModelExecEnd(
            execution=MODEL.next_attempt(),
            message=reply,
            usage=Usage(input_tokens=10, output_tokens=5),
            provider_state={"response_id": "r1"},
        ),
        ModelResponse(execution=MODEL.next_attempt(), length_recovery="none"),
        MessageEnd(message=reply, execution=MODEL.next_attempt()),
        ToolQueued(execution=TOOL, tool_call_id="c1", name="weather", arguments={"city": "Paris"}),
        ToolExecStart(execution=TOOL, tool_call_id="c1", name="weather"),
        ToolInvokeStart(execution=TOOL, tool_call_id="c1", name="weather"),
        ToolInvokeEnd(execution=TOOL, tool_call_id="c1", name="weather", content=["18C"]),
        ToolExecEnd(execution=TOOL, tool_call_id="c1", name="weather", content=["18C"]),
        MessageEnd(message=result),
        ContextCompacted(execution=COMPACT, summary="asked for weather", compacted_count=2),
        Error(message="a warning", fatal=False),
        TurnEnd(turn_index=0, stop_reason="end_turn", message_count=3, tool_call_count=1),
        AgentEnd(ok=True, reason="completed", turns=1),
    ]


def written(events: list[Event]) -> list[Event]:
    return [event for event in events if default_codec.encode_event(event) is not None]


def assert_file_holds(path: str, events: list[Event], snapshot: Any) -> None:
    """The file reads back exactly what was recorded, in order, in one closed run."""
    records = list(read(path))
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    assert records[0].type == "session_start"
    assert records[0].decode_data() == {"format_version": 1, "meta": {"app": "e2e"}}
    assert records[1].type == "run_start"
    assert records[1].decode_data() == {
        "pid": os.getpid(),
        "client": "e2e-agent",
        # What the kernel says of the connection, beside what the agent said.
        "peer_pid": os.getpid(),
        "uid": os.getuid(),
        "gid": os.getgid(),
    }
    facts = records[2:-2]
    assert [default_codec.decode_event(r) for r in facts] == written(events)
    assert [r.time for r in facts] == [e.time for e in written(events)]
    assert records[-2].type == "checkpoint"
    checkpoint = records[-2].decode_data(CheckpointData)
    assert default_codec.decode_value(checkpoint.snapshot) == snapshot
    assert records[-1].type == "run_close"
    assert records[-1].decode_data() == {"error": None}
    assert {r.run_id for r in records[1:]} == {records[1].run_id}
    report = check(path)
    assert report.sound and report.open_runs == []


SNAPSHOT = {"messages": [UserMessage(content="hi")], "turn": 1}


def test_a_sync_run_reads_back_as_sent(daemon: DaemonProcess) -> None:
    events = conversation()
    with connect(daemon.socket, client_name="e2e-agent") as client:
        assert client.welcome.daemon_pid == daemon.pid
        session = client.create("demo/sync.jsonl", meta={"app": "e2e"})
        assert session.path == str(daemon.root / "demo" / "sync.jsonl")
        with session.begin_run() as run:
            for event in events:
                run.record(event)
            assert run.ref(MODEL.next_attempt()).attempt == 2
            run.save_checkpoint(SNAPSHOT)
        assert session.load_checkpoint() == SNAPSHOT
        session.close()
    assert_file_holds(session.path, events, SNAPSHOT)


@pytest.mark.anyio
async def test_an_async_run_reads_back_as_sent(daemon: DaemonProcess) -> None:
    events = conversation()
    async with (
        aconnect(daemon.socket, client_name="e2e-agent") as client,
        client.create("demo/async.jsonl", meta={"app": "e2e"}) as session,
    ):
        async with session.begin_run() as run:
            for event in events:
                await run.record(event)
            await run.save_checkpoint(SNAPSHOT)
        assert await session.load_checkpoint() == SNAPSHOT
        path = session.path
    assert_file_holds(path, events, SNAPSHOT)


class RefusingCodec(Codec):
    """Refuses, as a codec of the application's may, the event that asks for it."""

    def encode_event(self, event: Event) -> EncodedEvent | None:
        if isinstance(event, AgentStart) and event.messages == ["refuse"]:
            raise RecordingError(
                "cannot record AgentStart: refused by the test's codec",
                code="codec_error",
            )
        return super().encode_event(event)


#: The event RefusingCodec refuses.
REFUSED = AgentStart(messages=["refuse"])


class BogusCodec(Codec):
    """Writes agent_end events under a type the daemon refuses."""

    def encode_event(self, event: Event) -> EncodedEvent | None:
        encoded = super().encode_event(event)
        if encoded is not None and isinstance(event, AgentEnd):
            return EncodedEvent(type="bogus", data=encoded.data, time=encoded.time)
        return encoded


def test_a_refused_record_is_sticky_on_its_run(daemon: DaemonProcess) -> None:
    with connect(daemon.socket, codec=BogusCodec()) as client:
        session = client.create("sticky.jsonl")
        run = session.begin_run()
        run.record(AgentStart())
        run.record(AgentEnd())  # pipelined: returns before the daemon refuses it
        session.sync()  # the refusal is pushed before this answer
        with pytest.raises(RecordingError) as caught:
            run.record(AgentStart())
        assert caught.value.code == "bad_event"
        assert "bogus" in caught.value.message
        with pytest.raises(RecordingError) as on_close:
            run.close()
        assert on_close.value is caught.value
        # Another run of the session records again.
        with session.begin_run() as second:
            second.record(AgentStart())
        session.close()
    records = list(read(session.path))
    run_closes = [r for r in records if r.type == "run_close"]
    assert run_closes[0].decode_data() == {"error": caught.value.message}
    assert run_closes[1].decode_data() == {"error": None}
    assert [r.type for r in records].count("agent_start") == 2


def test_a_refusal_surfaces_from_a_later_record_without_a_request(
    daemon: DaemonProcess,
) -> None:
    # record() looks for pushed errors at most once a millisecond: with no request in
    # between, a later record() raises the refusal, and every one after it.
    with connect(daemon.socket, codec=BogusCodec()) as client:
        session = client.create("later.jsonl")
        run = session.begin_run()
        run.record(AgentEnd())  # refused by the daemon, pushed back
        deadline = time.monotonic() + 10
        with pytest.raises(RecordingError) as caught:
            while time.monotonic() < deadline:
                run.record(AgentStart())
        assert caught.value.code == "bad_event"
        with pytest.raises(RecordingError) as again:
            run.record(AgentStart())
        assert again.value is caught.value
        with pytest.raises(RecordingError) as on_close:
            run.close()
        assert on_close.value is caught.value
        session.close()
    run_close = [r for r in read(session.path) if r.type == "run_close"]
    assert run_close[0].decode_data() == {"error": caught.value.message}


def test_close_right_after_a_refused_record_raises_it(daemon: DaemonProcess) -> None:
    # No record() looked for the push: close() takes it in before its answer.
    with connect(daemon.socket, codec=BogusCodec()) as client:
        session = client.create("close-right-after.jsonl")
        run = session.begin_run()
        run.record(AgentStart())
        run.record(AgentEnd())  # refused
        with pytest.raises(RecordingError) as on_close:
            run.close()
        assert on_close.value.code == "bad_event"
        assert run.error is on_close.value
        session.close()
    # (run_close carries the error's text only when the push came before close() sent it.)
    assert [r.type for r in read(session.path)][-2:] == ["agent_start", "run_close"]


def test_an_event_the_codec_refuses_is_sticky_on_its_run(daemon: DaemonProcess) -> None:
    with connect(daemon.socket, codec=RefusingCodec()) as client:
        session = client.create("unencodable.jsonl")
        run = session.begin_run()
        run.record(AgentStart())
        with pytest.raises(RecordingError) as caught:
            run.record(REFUSED)
        assert caught.value.code == "codec_error"
        with pytest.raises(RecordingError) as later:
            run.record(AgentEnd())
        assert later.value is caught.value
        assert client.dropped == {}
        with pytest.raises(RecordingError) as on_close:
            run.close()
        assert on_close.value is caught.value
        # Another run of the session records again.
        with session.begin_run() as second:
            second.record(AgentStart())
        session.close()
    records = list(read(session.path))
    assert [r.type for r in records].count("agent_end") == 0
    run_closes = [r.decode_data() for r in records if r.type == "run_close"]
    assert run_closes == [{"error": caught.value.message}, {"error": None}]
    assert caught.value.message.startswith("cannot record AgentStart")


@pytest.mark.anyio
async def test_an_event_the_codec_refuses_is_sticky_on_its_async_run(
    daemon: DaemonProcess,
) -> None:
    async with await aconnect(daemon.socket, codec=RefusingCodec()) as client:
        session = await client.create("unencodable-async.jsonl")
        run = await session.begin_run()
        await run.record(AgentStart())
        with pytest.raises(RecordingError) as caught:
            await run.record_many([AgentEnd(), REFUSED])
        assert caught.value.code == "codec_error"
        with pytest.raises(RecordingError) as later:
            await run.record(AgentEnd())
        assert later.value is caught.value
        with pytest.raises(RecordingError) as on_close:
            await run.aclose()
        assert on_close.value is caught.value
        await session.aclose()
    records = list(read(session.path))
    assert [r.type for r in records][-3:] == ["agent_start", "agent_end", "run_close"]
    assert records[-1].decode_data() == {"error": caught.value.message}


def test_best_effort_drops_an_event_the_codec_refuses(
    daemon: DaemonProcess, caplog: pytest.LogCaptureFixture
) -> None:
    with connect(daemon.socket, best_effort=True, codec=RefusingCodec()) as client:
        session = client.create("unencodable-best-effort.jsonl")
        with session.begin_run() as run:
            run.record(AgentStart())
            run.record(REFUSED)
            run.record(REFUSED)
            run.record(AgentEnd())
        assert run.dropped == 2
        assert client.dropped == {"codec_error": 2}
        session.close()
    assert len([r for r in caplog.records if "dropped an event" in r.getMessage()]) == 1
    records = list(read(session.path))
    assert [r.type for r in records][-3:] == ["agent_start", "agent_end", "run_close"]
    error = records[-1].decode_data()["error"]
    assert error.startswith("2 events not recorded, the first for codec_error: cannot record")


@pytest.mark.anyio
async def test_best_effort_drops_an_event_the_codec_refuses_async(
    daemon: DaemonProcess,
) -> None:
    async with await aconnect(daemon.socket, best_effort=True, codec=RefusingCodec()) as client:
        session = await client.create("unencodable-best-effort-async.jsonl")
        async with await session.begin_run() as run:
            # The batch goes on past the event the codec refuses.
            await run.record_many([AgentStart(), REFUSED, AgentEnd(), AgentStart()])
            await run.record(AgentEnd())
        assert run.dropped == 1
        assert client.dropped == {"codec_error": 1}
        await session.aclose()
    records = list(read(session.path))
    assert [r.type for r in records][-5:] == [
        "agent_start",
        "agent_end",
        "agent_start",
        "agent_end",
        "run_close",
    ]
    error = records[-1].decode_data()["error"]
    assert error.startswith("1 events not recorded, the first for codec_error: cannot record")


def test_an_exception_in_the_run_block_is_written_in_run_close(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("crash.jsonl")
        with pytest.raises(RuntimeError), session.begin_run() as run:
            run.record(AgentStart())
            raise RuntimeError("model exploded")
        session.close()
    last = list(read(session.path))[-1]
    assert last.decode_data() == {"error": "RuntimeError: model exploded"}


def test_a_second_writer_is_refused(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as first, connect(daemon.socket) as second:
        first.create("busy.jsonl")
        with pytest.raises(DaemonError) as caught:
            second.open("busy.jsonl")
        assert caught.value.code == "session_busy"


def test_refusals_name_their_code(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        with pytest.raises(DaemonError) as escape:
            client.create("../escape.jsonl")
        assert escape.value.code == "path_refused"
        with pytest.raises(DaemonError) as missing:
            client.open("missing.jsonl")
        assert missing.value.code == "session_not_found"
        client.create("exists.jsonl").close()
        with pytest.raises(DaemonError) as exists:
            client.create("exists.jsonl")
        assert exists.value.code == "session_exists"


def test_a_run_left_open_shows_when_reopened(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("interrupted.jsonl")
        run = session.begin_run()
        run.record(AgentStart())
    # The client went away with its run open: the gap stays visible.
    with connect(daemon.socket) as client:
        reopened = client.open("interrupted.jsonl")
        assert reopened.session_id == session.session_id
        assert reopened.last_seq == 3
        assert reopened.interrupted_runs == [run.run_id]
        with reopened.begin_run() as again:
            assert again.run_id != run.run_id
            assert again.seq == 4
        reopened.close()
    assert check(session.path).open_runs == [run.run_id]


def test_tail_reads_what_was_written(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("tailed.jsonl")
        with session.begin_run() as run:
            for _ in range(500):
                run.record(TurnStart())
        assert session.sync() == 503
        tailed = list(client.tail("tailed.jsonl"))
        assert tailed == list(read(session.path))
        assert [r.seq for r in client.tail("tailed.jsonl", after=500)] == [501, 502, 503]
        status = client.status()
        assert status.pid == daemon.pid
        assert session.session_id in {s.session_id for s in status.sessions}
        session.close()


def test_tail_filters_by_type_and_run(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("filtered.jsonl")
        with session.begin_run() as first:
            first.record(TurnStart())
        with session.begin_run() as second:
            second.record(TurnStart())
        session.close()
        closes = client.tail("filtered.jsonl", types=["run_close"])
        assert [r.run_id for r in closes] == [first.run_id, second.run_id]
        of_second = client.tail("filtered.jsonl", run_id=second.run_id)
        assert [r.type for r in of_second] == ["run_start", "turn_start", "run_close"]


@pytest.mark.anyio
async def test_a_follow_sees_records_as_they_are_written(daemon: DaemonProcess) -> None:
    async with aconnect(daemon.socket) as writer, aconnect(daemon.socket) as reader:
        session = await writer.create("live.jsonl")
        seen: list[str] = []

        async def follow() -> None:
            async for record in reader.tail("live.jsonl", follow=True):
                seen.append(record.type)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                async with session.begin_run() as run:
                    for _ in range(3):
                        await run.record(TurnStart())
                # Closing the session ends the follow.
                await session.aclose()
    assert seen == [
        "session_start",
        "run_start",
        "turn_start",
        "turn_start",
        "turn_start",
        "run_close",
    ]


@pytest.mark.anyio
async def test_tasks_share_one_client(daemon: DaemonProcess) -> None:
    async with aconnect(daemon.socket) as client:

        async def agent(n: int) -> None:
            async with (
                client.create(f"many/{n}.jsonl") as session,
                session.begin_run() as run,
            ):
                for turn in range(50):
                    await run.record(TurnStart(turn_index=turn))
                    if turn % 10 == 0:
                        await session.sync()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for n in range(20):
                    tg.start_soon(agent, n)
    for n in range(20):
        records = list(read(daemon.root / "many" / f"{n}.jsonl"))
        turns = [r.decode_data()["turn_index"] for r in records if r.type == "turn_start"]
        assert turns == list(range(50))


def test_threads_share_one_sync_client(daemon: DaemonProcess) -> None:
    errors: list[BaseException] = []

    def agent(client: Client, n: int) -> None:
        try:
            with client.create(f"threads/{n}.jsonl") as session, session.begin_run() as run:
                for turn in range(50):
                    run.record(TurnStart(turn_index=turn))
                    if turn % 10 == 0:
                        session.sync()
        except BaseException as exc:
            errors.append(exc)

    with connect(daemon.socket) as client:
        threads = [threading.Thread(target=agent, args=(client, n)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert errors == []
    for n in range(8):
        records = list(read(daemon.root / "threads" / f"{n}.jsonl"))
        turns = [r.decode_data()["turn_index"] for r in records if r.type == "turn_start"]
        assert turns == list(range(50))
        assert records[-1].type == "run_close"


@pytest.fixture
def small_frames(short_tmp: Path) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(short_tmp, "--max-frame-size", "4096").start()
    try:
        yield proc
    finally:
        proc.stop()


def test_an_event_too_large_is_written_as_its_stub(small_frames: DaemonProcess) -> None:
    tool = Execution(id="t1", kind="tool")
    big = ToolExecEnd(execution=tool, tool_call_id="call_1", name="dump", details="x" * 5000)
    encoded = default_codec.encode_event(big)
    assert encoded is not None
    with connect(small_frames.socket) as client:
        assert client.welcome.max_frame_size == 4096
        session = client.create("big.jsonl")
        with session.begin_run() as run:
            run.record(ToolExecStart(execution=tool, tool_call_id="call_1", name="dump"))
            run.record(big)
            run.record(AgentEnd())
            assert run.error is None  # the run goes on
        session.close()
    records = list(read(session.path))
    assert [r.type for r in records][-4:] == [
        "tool_exec_start",
        "tool_exec_end",
        "agent_end",
        "run_close",
    ]
    stub = records[-3].decode_data()
    assert stub["$flightlog"] == "oversized"
    assert stub["size"] == len(encoded.data)
    assert stub["sha256"] == hashlib.sha256(encoded.data).hexdigest()
    assert (stub["omitted"], stub["execution"]["id"], stub["name"]) == (["details"], "t1", "dump")
    end = default_codec.decode_event(records[-3])
    assert isinstance(end, ToolExecEnd) and end.details is None
    error = records[-1].decode_data()["error"]
    assert error == (
        "codec_error: 1 event written with $flightlog markers: tool_exec_end t1: oversized: "
        f"{len(encoded.data)} bytes, more than the maximum frame size of 4096 bytes; "
        "written as a stub without details"
    )


def test_unencodable_values_are_marked_and_named_in_run_close(daemon: DaemonProcess) -> None:
    tool = Execution(id="t2", kind="tool")
    with connect(daemon.socket) as client, socket.socket() as handle:
        session = client.create("marked.jsonl")
        with session.begin_run() as run:
            run.record(AgentStart())
            run.record(ToolExecStart(execution=tool, tool_call_id="c", name="open"))
            run.record(
                ToolExecEnd(
                    execution=tool, tool_call_id="c", name="open", details={"fd": handle, "n": 1}
                )
            )
            run.record(AgentEnd(output=[handle]))
            assert run.error is None
        with session.begin_run() as second:
            second.record(AgentStart())
        session.close()
    records = list(read(session.path))
    types = [r.type for r in records]
    assert types.count("tool_exec_end") == 1 and types.count("agent_end") == 1
    end = next(r for r in records if r.type == "tool_exec_end").decode_data()
    assert end["details"]["n"] == 1
    assert end["details"]["fd"]["$flightlog"] == "unencodable"
    assert end["details"]["fd"]["class"] == "socket.socket"
    closes = [r.decode_data()["error"] for r in records if r.type == "run_close"]
    socket_error = "socket.socket (TypeError: Encoding objects of type socket is unsupported)"
    assert closes == [
        "codec_error: 2 events written with $flightlog markers: "
        f"tool_exec_end t2: details: {socket_error}; agent_end: output: {socket_error}",
        None,
    ]


def test_a_stopped_daemon(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        client.create("before-stop.jsonl")
    daemon.stop()
    with pytest.raises(DaemonNotRunning):
        connect(daemon.socket)


def test_tail_says_how_the_daemon_ended_it(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("ended.jsonl")
        with client.tail("ended.jsonl") as at_rest:
            assert [r.seq for r in at_rest] == [1]
        assert at_rest.end_reason == "end_of_file"
        assert at_rest.end is not None and at_rest.end.last_seq == 1
        with client.tail("ended.jsonl", after=1, follow=True) as follow:  # subscribes now
            with session.begin_run() as run:
                run.record(TurnStart())
            session.close()
            assert [r.type for r in follow] == ["run_start", "turn_start", "run_close"]
        assert follow.end_reason == "session_closed"


def test_a_run_keeps_its_sticky_error_once_its_session_is_closed(
    daemon: DaemonProcess,
) -> None:
    with connect(daemon.socket, codec=BogusCodec()) as client:
        session = client.create("closed-keeps.jsonl")
        run = session.begin_run()
        run.record(AgentEnd())  # refused
        session.sync()  # the refusal is pushed before this answer
        pushed = run.error
        assert pushed is not None and pushed.code == "bad_event"
        session.close()  # the run left open
        assert run.error is pushed
        closed = session.client.create("closed-keeps-2.jsonl").begin_run()
        with pytest.raises(RecordingError) as on_close:
            closed.record(AgentEnd())
            closed.session.sync()
            closed.close()
        assert closed.error is on_close.value
        closed.session.close()
        assert closed.error is on_close.value


@pytest.mark.anyio
async def test_an_async_run_keeps_its_sticky_error_once_its_session_is_closed(
    daemon: DaemonProcess,
) -> None:
    async with aconnect(daemon.socket, codec=BogusCodec()) as client:
        session = await client.create("closed-keeps.jsonl")
        run = await session.begin_run()
        await run.record(AgentEnd())  # refused
        await session.sync()
        pushed = run.error
        assert pushed is not None and pushed.code == "bad_event"
        await session.aclose()
        assert run.error is pushed
