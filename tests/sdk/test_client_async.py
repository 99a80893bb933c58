"""The async client against a daemon in memory (mock transport): every public operation.

The mock transport's :class:`MemoryDaemon` answers through the protocol's real server
connection, so these tests run the real client and server rules against each other.

``test_client_sync.py`` is generated from this file by ``tests/sdk/unasync.py``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from flightlog.protocol import (
    Codec,
    EncodedEvent,
    ErrorCode,
    Event,
    Execution,
    default_codec,
)
from flightlog.protocol.events import (
    AgentEnd,
    AgentStart,
    MessageEnd,
    MessageUpdate,
    ModelExecEnd,
    ModelExecStart,
    ModelRequest,
    ModelResponse,
    ModelStream,
    TextPart,
    ToolExecEnd,
    UserMessage,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    CloseRun,
    Create,
    Hello,
    RecordFailed,
    SaveCheckpoint,
    Subscribe,
    TailBatch,
    Unsubscribe,
)
from flightlog.sdk import (
    CallRef,
    ConnectionLost,
    DaemonError,
    LocalProtocolError,
    MemoryDaemon,
    RecordingError,
)
from flightlog.sdk.aio import AsyncClient, AsyncMockTransport, AsyncRun, AsyncSession, aconnect

EXEC = Execution(id="m1", kind="model", turn_index=0)


def events() -> list[Any]:
    return [
        AgentStart(agent="demo", messages=[UserMessage(content="hi")]),
        ModelRequest(execution=EXEC, messages=[UserMessage(content="hi")]),
        ModelExecStart(execution=EXEC, model="m"),
        ModelExecEnd(execution=EXEC, message=None, error="overloaded"),
        MessageEnd(message=UserMessage(content=[TextPart(text="hello")])),
        AgentEnd(ok=True, reason="completed", turns=1),
    ]


def sent_types(transport: AsyncMockTransport) -> list[str]:
    return [type(message).__name__ for message in transport.sent]


@dataclasses.dataclass
class Unregistered:
    value: int


@pytest.fixture
def transport(memory: MemoryDaemon) -> AsyncMockTransport:
    return AsyncMockTransport(memory)


class RefusingCodec(Codec):
    """Refuses, as a codec of the application's may, the event that asks for it."""

    def encode_event(self, event: Event) -> EncodedEvent | None:
        if isinstance(event, AgentStart) and event.messages == ["refuse"]:
            raise RecordingError(
                "cannot record AgentStart: refused by the test's codec",
                code=ErrorCode.CODEC_ERROR,
            )
        return super().encode_event(event)


#: The event RefusingCodec refuses.
REFUSED = AgentStart(messages=["refuse"])


async def start(
    transport: AsyncMockTransport, codec: Codec | None = None
) -> tuple[AsyncClient, AsyncSession]:
    client = await aconnect(
        transport=transport, client_name="test-agent", codec=codec or default_codec
    )
    session = await client.create("demo/chat.jsonl", meta={"app": "demo"})
    return client, session


# ------------------------------------------------------------------------- connecting


@pytest.mark.anyio
async def test_connect_says_hello_first(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    async with aconnect(transport=transport, client_name="test-agent") as client:
        assert transport.sent == [
            Hello(id=1, version=PROTOCOL_VERSION, client="test-agent", pid=os.getpid())
        ]
        assert client.welcome.server == memory.name
        assert client.client_name == "test-agent"
    assert client.closed


@pytest.mark.anyio
async def test_client_name_defaults_to_the_program(transport: AsyncMockTransport) -> None:
    async with aconnect(transport=transport) as client:
        assert client.client_name == os.path.basename(sys.argv[0])


@pytest.mark.anyio
async def test_a_refused_hello_raises_and_closes() -> None:
    transport = AsyncMockTransport(MemoryDaemon(versions=(7,)))
    with pytest.raises(DaemonError) as caught:
        await aconnect(transport=transport)
    assert caught.value.code == ErrorCode.UNSUPPORTED_VERSION
    assert caught.value.message.endswith("speaks version 7")
    with pytest.raises(ConnectionLost):
        await transport.send(b"")


@pytest.mark.anyio
async def test_a_closed_client_refuses_requests(transport: AsyncMockTransport) -> None:
    client = await aconnect(transport=transport)
    await client.aclose()
    await client.aclose()
    with pytest.raises(ConnectionLost):
        await client.status()


# --------------------------------------------------------------------------- sessions


@pytest.mark.anyio
async def test_create_returns_the_session(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    created = memory.session("demo/chat.jsonl")
    assert session.session_id == created.session_id
    assert session.path == "demo/chat.jsonl"
    assert session.meta == {"app": "demo"}
    assert session.last_seq == 1
    assert transport.sent[1] == Create(id=2, path="demo/chat.jsonl", meta={"app": "demo"})
    await client.aclose()


@pytest.mark.anyio
async def test_daemon_refusals_are_daemon_errors(transport: AsyncMockTransport) -> None:
    client, session = await start(transport)
    with pytest.raises(DaemonError) as exists:
        await client.create("demo/chat.jsonl")
    assert exists.value.code == "session_exists"
    with pytest.raises(DaemonError) as missing:
        await client.open("nowhere.jsonl")
    assert missing.value.code == "session_not_found"
    # The connection goes on.
    assert await session.sync() == 1
    await client.aclose()


@pytest.mark.anyio
async def test_sessions_and_clients_are_context_managers(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    async with aconnect(transport=transport) as client:
        async with client.create("a.jsonl") as session, session.begin_run():
            pass
        assert memory.session("a.jsonl").closed
        async with client.open("a.jsonl") as reopened:
            assert reopened.last_seq == 3
    assert sent_types(transport)[-2:] == ["Open", "CloseSession"]


@pytest.mark.anyio
async def test_session_close_is_idempotent(transport: AsyncMockTransport) -> None:
    client, session = await start(transport)
    await session.aclose()
    await session.aclose()
    assert sent_types(transport).count("CloseSession") == 1
    with pytest.raises(LocalProtocolError) as caught:
        await session.begin_run()
    assert caught.value.code == ErrorCode.SESSION_CLOSED
    await client.aclose()


# ------------------------------------------------------------------------------- runs


@pytest.mark.anyio
async def test_a_run_records_what_was_sent(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    sent = events()
    async with session.begin_run() as run:
        for event in sent:
            await run.record(event)
    records = memory.session("demo/chat.jsonl").records()
    assert [r.type for r in records] == [
        "session_start",
        "run_start",
        "agent_start",
        "model_request",
        "model_exec_start",
        "model_exec_end",
        "message_end",
        "agent_end",
        "run_close",
    ]
    assert records[1].decode_data() == {
        "pid": os.getpid(),
        "client": "test-agent",
        # What the kernel says of the connection, beside what the agent said.
        "peer_pid": os.getpid(),
        "uid": os.getuid(),
        "gid": os.getgid(),
    }
    assert {r.run_id for r in records[1:]} == {run.run_id}
    assert [default_codec.decode_event(r) for r in records[2:-1]] == sent
    assert records[-1].decode_data() == {"error": None}
    await client.aclose()


@pytest.mark.anyio
async def test_record_returns_without_waiting(transport: AsyncMockTransport) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    # The daemon answers nothing to a record: a record that waited would find the end.
    await run.record(AgentStart())
    await run.record(AgentEnd())
    assert sent_types(transport)[-2:] == ["RecordEvent", "RecordEvent"]
    await run.aclose()
    await client.aclose()


@pytest.mark.anyio
async def test_record_time_comes_from_the_event_or_the_caller(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    await run.record(AgentStart(time="2026-01-02T03:04:05.000006Z"))
    await run.record(AgentStart(), time=datetime(2026, 1, 2, tzinfo=UTC))
    await run.record(AgentStart(), time="2026-01-03T00:00:00Z")
    with pytest.raises(LocalProtocolError):
        await run.record(AgentStart(), time="yesterday")
    times = [r.time for r in memory.session("demo/chat.jsonl").records()[2:]]
    assert times == [
        "2026-01-02T03:04:05.000006Z",
        "2026-01-02T00:00:00.000000Z",
        "2026-01-03T00:00:00Z",
    ]
    await client.aclose()


@pytest.mark.anyio
async def test_never_written_events_are_skipped(transport: AsyncMockTransport) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    before = len(transport.sent)
    await run.record(MessageUpdate(delta="to"))
    await run.record(ModelStream(execution=EXEC, chunk={"delta": "ken"}))
    await run.record(ModelResponse(execution=EXEC))
    assert len(transport.sent) == before
    await run.record(ModelResponse(execution=EXEC, length_recovery="continue"))
    assert sent_types(transport)[-1] == "RecordEvent"
    await client.aclose()


@pytest.mark.anyio
async def test_codec_errors_are_raised_by_record(transport: AsyncMockTransport) -> None:
    client, session = await start(transport, RefusingCodec())
    run = await session.begin_run()
    before = len(transport.sent)
    with pytest.raises(RecordingError) as not_an_event:
        await run.record({"type": "agent_start"})  # type: ignore[arg-type]
    assert not_an_event.value.code == ErrorCode.BAD_EVENT
    await run.record(AgentStart(messages=[Unregistered(1)]))
    assert len(transport.sent) == before + 1
    with pytest.raises(RecordingError) as caught:
        await run.record(REFUSED)
    assert caught.value.code == ErrorCode.CODEC_ERROR
    # The run's error is sticky: later records raise it and send nothing.
    with pytest.raises(RecordingError) as later:
        await run.record(AgentEnd())
    assert later.value is caught.value
    assert len(transport.sent) == before + 1
    assert run.error is caught.value
    # run_close is written with it, then it is raised: the run does not close quietly.
    with pytest.raises(RecordingError) as closing:
        await run.aclose()
    assert closing.value is caught.value
    close = transport.sent[-1]
    assert isinstance(close, CloseRun)
    assert close.error is not None
    assert close.error.startswith("cannot record AgentStart")
    await client.aclose()


@pytest.mark.anyio
async def test_record_many_sends_in_order_up_to_an_unencodable_event(
    transport: AsyncMockTransport,
) -> None:
    client, session = await start(transport, RefusingCodec())
    run = await session.begin_run()
    before = len(transport.sent)
    await run.record_many([AgentStart(agent="a"), MessageUpdate(delta="x"), AgentEnd()])
    assert [m.event_type for m in transport.sent[before:]] == ["agent_start", "agent_end"]
    with pytest.raises(RecordingError) as caught:
        await run.record_many([AgentStart(), REFUSED, AgentEnd()])
    assert caught.value.code == ErrorCode.CODEC_ERROR
    assert [m.event_type for m in transport.sent[before + 2 :]] == ["agent_start"]
    assert run.error is caught.value
    await client.aclose()


@pytest.mark.anyio
async def test_an_event_too_large_is_sent_as_its_stub_and_named_in_run_close() -> None:
    transport = AsyncMockTransport(MemoryDaemon(max_frame_size=2048))
    client, session = await start(transport)
    run = await session.begin_run()
    before = len(transport.sent)
    await run.record(AgentStart(agent="big", messages=["x" * 5000]))
    await run.record(AgentStart(messages=["x"]))
    stub, small = transport.sent[before:]
    assert stub.event_type == "agent_start"
    data = msgspec.json.decode(stub.data)
    assert data["$flightlog"] == "oversized"
    assert (data["omitted"], data["agent"]) == (["messages"], "big")
    assert msgspec.json.decode(small.data)["messages"] == ["x"]
    assert run.error is None  # nothing is refused: later records go on
    await run.aclose()
    close = transport.sent[-1]
    assert isinstance(close, CloseRun)
    assert close.error is not None
    assert close.error.startswith(
        "codec_error: 1 event written with $flightlog markers: agent_start: oversized: "
    )
    await client.aclose()


@pytest.mark.anyio
async def test_run_close_names_the_marked_events_after_the_runs_sticky_error(
    transport: AsyncMockTransport,
) -> None:
    client, session = await start(transport, RefusingCodec())
    run = await session.begin_run()
    await run.record(AgentStart(messages=[object()]))
    with pytest.raises(RecordingError) as caught:
        await run.record(REFUSED)
    with pytest.raises(RecordingError):
        await run.aclose()
    close = transport.sent[-1]
    assert isinstance(close, CloseRun)
    assert close.error == (
        f"{caught.value.message}; codec_error: 1 event written with $flightlog markers: "
        "agent_start: messages: builtins.object "
        "(TypeError: Encoding objects of type object is unsupported)"
    )
    await client.aclose()


@pytest.mark.anyio
async def test_values_the_codec_cannot_encode_are_marked_and_named_in_run_close(
    transport: AsyncMockTransport,
) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    before = len(transport.sent)
    tool = Execution(id="t7", kind="tool")
    await run.record(AgentStart(messages=[object()]))
    await run.record_many([ToolExecEnd(execution=tool, tool_call_id="c", name="n", details=len)])
    await run.record(AgentEnd())
    assert [m.event_type for m in transport.sent[before:]] == [
        "agent_start",
        "tool_exec_end",
        "agent_end",
    ]
    assert msgspec.json.decode(transport.sent[before].data)["messages"][0]["class"] == (
        "builtins.object"
    )
    assert run.error is None
    await run.aclose()
    close = transport.sent[-1]
    assert isinstance(close, CloseRun)
    assert close.error == (
        "codec_error: 2 events written with $flightlog markers: "
        "agent_start: messages: builtins.object "
        "(TypeError: Encoding objects of type object is unsupported); "
        "tool_exec_end t7: details: builtins.builtin_function_or_method "
        "(TypeError: Encoding objects of type builtin_function_or_method is unsupported)"
    )
    # The next run of the session starts with a clean account.
    second = await session.begin_run()
    await second.aclose()
    assert transport.sent[-1].error is None
    await client.aclose()


@pytest.mark.anyio
async def test_local_rules_refuse_without_a_round_trip(transport: AsyncMockTransport) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    with pytest.raises(LocalProtocolError) as open_run:
        await session.begin_run()
    assert open_run.value.code == ErrorCode.RUN_OPEN
    await run.aclose()
    await run.aclose()
    assert sent_types(transport).count("CloseRun") == 1
    before = len(transport.sent)
    with pytest.raises(LocalProtocolError) as closed_run:
        await run.record(AgentStart())
    assert closed_run.value.code == ErrorCode.RUN_NOT_OPEN
    with pytest.raises(LocalProtocolError):
        await run.save_checkpoint({})
    assert len(transport.sent) == before
    # A new run has a fresh id; the old run object stays closed.
    second = await session.begin_run()
    assert second.run_id != run.run_id
    with pytest.raises(LocalProtocolError):
        await run.record(AgentStart())
    await client.aclose()


@pytest.mark.anyio
async def test_run_ref_names_the_call(transport: AsyncMockTransport) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    retry = EXEC.next_attempt()
    assert run.ref(retry) == CallRef(session.session_id, run.run_id, "m1", 2)
    await client.aclose()


# ----------------------------------------------------------------------- sticky errors


async def record_until_refused(run: AsyncRun) -> RecordingError:
    """Record until a pushed error surfaces: record() looks for pushes once a millisecond."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            await run.record(AgentEnd())
        except RecordingError as exc:
            return exc
    pytest.fail("no record() raised the pushed error within 10 s")


@pytest.mark.anyio
async def test_a_pushed_error_surfaces_from_a_later_record(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    await run.record(AgentStart())
    transport.push(
        RecordFailed(
            session_id=run.session_id, run_id=run.run_id, code="bad_event", message="refused"
        )
    )
    first = await record_until_refused(run)
    assert (first.code, first.message) == ("bad_event", "refused")
    sent = sent_types(transport).count("RecordEvent")
    # Once taken in, it is raised by every record, before anything is sent.
    with pytest.raises(RecordingError) as second:
        await run.record(AgentEnd())
    assert second.value is first
    assert run.error is first
    assert sent_types(transport).count("RecordEvent") == sent
    # close() writes run_close with the error's text, then raises it.
    with pytest.raises(RecordingError) as on_close:
        await run.aclose()
    assert on_close.value is first
    assert memory.session("demo/chat.jsonl").records()[-1].decode_data() == {"error": "refused"}
    # Another run of the session is not touched by it.
    other = await session.begin_run()
    await other.record(AgentStart())
    await other.aclose()
    await client.aclose()


@pytest.mark.anyio
async def test_requests_take_in_a_push_that_record_has_not_looked_for(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    await run.record(AgentStart())  # looks for pushes: the next look is a while away
    transport.push(
        RecordFailed(
            session_id=run.session_id, run_id=run.run_id, code="bad_event", message="refused"
        )
    )
    with pytest.raises(RecordingError) as on_checkpoint:
        await run.save_checkpoint({"step": 1})
    assert on_checkpoint.value.message == "refused"
    assert sent_types(transport).count("SaveCheckpoint") == 0
    with pytest.raises(RecordingError) as on_close:
        await run.aclose()
    assert on_close.value is on_checkpoint.value
    await client.aclose()


@pytest.mark.anyio
async def test_a_push_is_raised_by_close_right_after_a_record(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    await run.record(AgentStart())
    transport.push(
        RecordFailed(
            session_id=run.session_id, run_id=run.run_id, code="bad_event", message="refused"
        )
    )
    with pytest.raises(RecordingError) as on_close:
        await run.aclose()
    assert on_close.value.message == "refused"
    assert memory.session("demo/chat.jsonl").records()[-1].decode_data() == {"error": "refused"}
    await client.aclose()


@pytest.mark.anyio
async def test_an_error_pushed_during_close_is_raised_by_close(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    # The daemon fails to write the run_close: it pushes the failure, then refuses.
    memory.break_disk("demo/chat.jsonl", "late")
    with pytest.raises(RecordingError) as caught:
        await run.aclose()
    assert caught.value.message == "late"
    await client.aclose()


@pytest.mark.anyio
async def test_a_session_write_failure_stops_every_run(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    memory.break_disk("demo/chat.jsonl", "disk full")
    caught = await record_until_refused(run)
    assert caught.code == ErrorCode.WRITE_FAILED
    assert caught.message == "disk full"
    # The daemon takes no more writes: run_close cannot be written, close says why.
    with pytest.raises(RecordingError) as on_close:
        await run.aclose()
    assert on_close.value is caught
    assert "CloseRun" not in sent_types(transport)
    with pytest.raises(RecordingError):
        await session.begin_run()
    # Closing the session releases it, and reports the failure once more.
    with pytest.raises(RecordingError) as on_session_close:
        await session.aclose()
    assert on_session_close.value.message == "disk full"
    assert memory.session("demo/chat.jsonl").closed
    await client.aclose()


@pytest.mark.anyio
async def test_write_failed_replies_are_recording_errors(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    memory.break_disk("demo/chat.jsonl", "fsync failed")
    with pytest.raises(RecordingError) as caught:
        await run.save_checkpoint({"step": 1})
    assert caught.value.message == "fsync failed"
    with pytest.raises(RecordingError) as sticky:
        await run.record(AgentStart())
    assert sticky.value is caught.value
    await client.aclose()


@pytest.mark.anyio
async def test_an_exception_in_the_block_closes_the_run_with_its_text(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    with pytest.raises(ValueError, match="boom"):
        async with session.begin_run() as run:
            await run.record(AgentStart())
            raise ValueError("boom")
    closed = memory.session("demo/chat.jsonl").records()[-1]
    assert (closed.type, closed.decode_data()) == ("run_close", {"error": "ValueError: boom"})
    await client.aclose()


@pytest.mark.anyio
async def test_the_exception_in_the_block_wins_over_a_sticky_error(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    with pytest.raises(KeyError):
        async with session.begin_run() as run:
            transport.push(
                RecordFailed(
                    session_id=run.session_id, run_id=run.run_id, code="bad_event", message="no"
                )
            )
            raise KeyError("agent bug")
    closed = memory.session("demo/chat.jsonl").records()[-1]
    assert closed.decode_data() == {"error": "no"}
    await client.aclose()


# ------------------------------------------------------------------------ checkpoints


@pytest.mark.anyio
async def test_checkpoints_round_trip_through_the_codec(transport: AsyncMockTransport) -> None:
    client, session = await start(transport)
    assert await session.load_checkpoint() is None
    run = await session.begin_run()
    snapshot = {"messages": [UserMessage(content="hi")], "step": 3}
    seq = await run.save_checkpoint(snapshot)
    assert seq == 3
    assert await session.load_checkpoint() == snapshot
    assert await session.sync() == 3
    with pytest.raises(RecordingError) as caught:
        await run.save_checkpoint({"handle": object()})
    assert caught.value.code == ErrorCode.CODEC_ERROR
    assert run.error is caught.value
    await client.aclose()


# ------------------------------------------------------------------------------ tails


@pytest.mark.anyio
async def test_tail_yields_the_records(memory: MemoryDaemon, transport: AsyncMockTransport) -> None:
    client, session = await start(transport)
    async with session.begin_run() as run:
        await run.record(AgentStart())
    tailed = [record async for record in client.tail("demo/chat.jsonl")]
    assert tailed == memory.session("demo/chat.jsonl").records()
    later = [record.seq async for record in client.tail("demo/chat.jsonl", after=2)]
    assert later == [3, 4]
    subscribe = [m for m in transport.sent if isinstance(m, Subscribe)]
    assert subscribe[1].after == 2
    assert subscribe[1].path == "demo/chat.jsonl"
    await client.aclose()


@pytest.mark.anyio
async def test_tail_passes_its_filters(transport: AsyncMockTransport) -> None:
    client, _ = await start(transport)
    tail = client.tail("demo/chat.jsonl", follow=True, types=["agent_end"], run_id="r")
    async with tail:
        pass
    subscribe = [m for m in transport.sent if isinstance(m, Subscribe)]
    assert subscribe == [
        Subscribe(
            id=3, path="demo/chat.jsonl", after=0, follow=True, types=["agent_end"], run_id="r"
        )
    ]
    await client.aclose()


@pytest.mark.anyio
async def test_tail_all_without_follow_replays_the_files_not_the_daemon(
    transport: AsyncMockTransport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It ends at the present: the files of the data root (here none: the daemon's
    sessions are in its memory), without a subscription (tests/sdk/test_tail_cursor.py
    has it with files and a real daemon)."""
    monkeypatch.setenv("FLIGHTLOG_ROOT", str(tmp_path))
    client, _ = await start(transport)
    await client.create("other.jsonl")
    tailed = [(path, record.type) async for path, record in client.tail_all()]
    assert tailed == []
    assert not any(isinstance(m, Subscribe) for m in transport.sent)
    await client.aclose()


@pytest.mark.anyio
async def test_a_tail_ended_by_an_error_raises_it(transport: AsyncMockTransport) -> None:
    client, _ = await start(transport)
    tail = client.tail("nowhere.jsonl")
    with pytest.raises(DaemonError) as caught:
        await tail.__anext__()
    assert caught.value.code == "session_not_found"
    assert "nowhere.jsonl" in caught.value.message
    assert [record async for record in tail] == []
    await client.aclose()


@pytest.mark.anyio
async def test_a_follow_gets_records_as_they_are_written(transport: AsyncMockTransport) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    async with client.tail("demo/chat.jsonl", follow=True) as tail:
        assert [(await tail.__anext__()).seq for _ in range(2)] == [1, 2]
        await run.record(AgentStart())
        await run.aclose()
        assert [(await tail.__anext__()).type for _ in range(2)] == ["agent_start", "run_close"]
        await session.aclose()
        # The writer closed the session: the follow ends.
        assert [record async for record in tail] == []
    assert tail.end is not None and tail.end.reason == "session_closed"
    await client.aclose()


@pytest.mark.anyio
async def test_closing_a_follow_unsubscribes(transport: AsyncMockTransport) -> None:
    client, session = await start(transport)
    async with client.tail("demo/chat.jsonl", follow=True) as tail:
        async for record in tail:
            assert record.type == "session_start"
            break
    assert transport.sent[-1] == Unsubscribe(id=4, subscription=1)
    # The TailEnd the daemon sends before its Ack is taken in stride.
    assert await session.sync() == 1
    await client.aclose()


@pytest.mark.anyio
async def test_an_abandoned_follow_is_unsubscribed_by_the_next_request(
    transport: AsyncMockTransport,
) -> None:
    client, session = await start(transport)
    tail = client.tail("demo/chat.jsonl", follow=True)
    assert (await tail.__anext__()).seq == 1
    del tail
    # Batches still in flight for it are dropped.
    transport.push(TailBatch(subscription=1, lines=[b"not even json"]))
    assert await session.sync() == 1
    assert sent_types(transport)[-2:] == ["Unsubscribe", "Sync"]
    await client.aclose()


# ------------------------------------------------------------------ the connection


@pytest.mark.anyio
async def test_bytes_arriving_one_at_a_time(memory: MemoryDaemon) -> None:
    transport = AsyncMockTransport(memory, chunk_size=1)
    client, session = await start(transport)
    async with session.begin_run() as run:
        await run.record(AgentStart())
        await run.save_checkpoint([1, 2, 3])
    assert await session.load_checkpoint() == [1, 2, 3]
    assert len([record async for record in client.tail("demo/chat.jsonl")]) == 5
    await client.aclose()


@pytest.mark.anyio
async def test_a_daemon_that_hangs_up_loses_the_connection(
    transport: AsyncMockTransport,
) -> None:
    client, session = await start(transport)
    run = await session.begin_run()
    transport.hang_up()
    deadline = time.monotonic() + 10
    with pytest.raises(ConnectionLost):  # found by the next look for pushes
        while time.monotonic() < deadline:
            await run.record(AgentStart())
    with pytest.raises(ConnectionLost):
        await run.record(AgentStart())
    with pytest.raises(ConnectionLost):
        await session.sync()
    with pytest.raises(ConnectionLost):
        await run.aclose()
    await client.aclose()


@pytest.mark.anyio
async def test_a_reply_lost_midway_fails_the_request(
    memory: MemoryDaemon, transport: AsyncMockTransport
) -> None:
    client, session = await start(transport)
    memory.hold(SaveCheckpoint)
    run = await session.begin_run()
    with pytest.raises(ConnectionLost):
        await run.save_checkpoint({})
    await client.aclose()


@pytest.mark.anyio
async def test_status(transport: AsyncMockTransport) -> None:
    client, _ = await start(transport)
    status = await client.status()
    assert status.pid == os.getpid()
    assert status.records_written == 1
    await client.aclose()
