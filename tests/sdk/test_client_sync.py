# Generated from test_client_async.py by tests/sdk/unasync.py: edit that file, then run this.
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
    Client,
    ConnectionLost,
    DaemonError,
    LocalProtocolError,
    MemoryDaemon,
    MockTransport,
    RecordingError,
    Run,
    Session,
    connect,
)

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


def sent_types(transport: MockTransport) -> list[str]:
    return [type(message).__name__ for message in transport.sent]


@dataclasses.dataclass
class Unregistered:
    value: int


@pytest.fixture
def transport(memory: MemoryDaemon) -> MockTransport:
    return MockTransport(memory)


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


def start(transport: MockTransport, codec: Codec | None = None) -> tuple[Client, Session]:
    client = connect(transport=transport, client_name="test-agent", codec=codec or default_codec)
    session = client.create("demo/chat.jsonl", meta={"app": "demo"})
    return client, session


# ------------------------------------------------------------------------- connecting


def test_connect_says_hello_first(memory: MemoryDaemon, transport: MockTransport) -> None:
    with connect(transport=transport, client_name="test-agent") as client:
        assert transport.sent == [
            Hello(id=1, version=PROTOCOL_VERSION, client="test-agent", pid=os.getpid())
        ]
        assert client.welcome.server == memory.name
        assert client.client_name == "test-agent"
    assert client.closed


def test_client_name_defaults_to_the_program(transport: MockTransport) -> None:
    with connect(transport=transport) as client:
        assert client.client_name == os.path.basename(sys.argv[0])


def test_a_refused_hello_raises_and_closes() -> None:
    transport = MockTransport(MemoryDaemon(versions=(7,)))
    with pytest.raises(DaemonError) as caught:
        connect(transport=transport)
    assert caught.value.code == ErrorCode.UNSUPPORTED_VERSION
    assert caught.value.message.endswith("speaks version 7")
    with pytest.raises(ConnectionLost):
        transport.send(b"")


def test_a_closed_client_refuses_requests(transport: MockTransport) -> None:
    client = connect(transport=transport)
    client.close()
    client.close()
    with pytest.raises(ConnectionLost):
        client.status()


# --------------------------------------------------------------------------- sessions


def test_create_returns_the_session(memory: MemoryDaemon, transport: MockTransport) -> None:
    client, session = start(transport)
    created = memory.session("demo/chat.jsonl")
    assert session.session_id == created.session_id
    assert session.path == "demo/chat.jsonl"
    assert session.meta == {"app": "demo"}
    assert session.last_seq == 1
    assert transport.sent[1] == Create(id=2, path="demo/chat.jsonl", meta={"app": "demo"})
    client.close()


def test_daemon_refusals_are_daemon_errors(transport: MockTransport) -> None:
    client, session = start(transport)
    with pytest.raises(DaemonError) as exists:
        client.create("demo/chat.jsonl")
    assert exists.value.code == "session_exists"
    with pytest.raises(DaemonError) as missing:
        client.open("nowhere.jsonl")
    assert missing.value.code == "session_not_found"
    # The connection goes on.
    assert session.sync() == 1
    client.close()


def test_sessions_and_clients_are_context_managers(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    with connect(transport=transport) as client:
        with client.create("a.jsonl") as session, session.begin_run():
            pass
        assert memory.session("a.jsonl").closed
        with client.open("a.jsonl") as reopened:
            assert reopened.last_seq == 3
    assert sent_types(transport)[-2:] == ["Open", "CloseSession"]


def test_session_close_is_idempotent(transport: MockTransport) -> None:
    client, session = start(transport)
    session.close()
    session.close()
    assert sent_types(transport).count("CloseSession") == 1
    with pytest.raises(LocalProtocolError) as caught:
        session.begin_run()
    assert caught.value.code == ErrorCode.SESSION_CLOSED
    client.close()


# ------------------------------------------------------------------------------- runs


def test_a_run_records_what_was_sent(memory: MemoryDaemon, transport: MockTransport) -> None:
    client, session = start(transport)
    sent = events()
    with session.begin_run() as run:
        for event in sent:
            run.record(event)
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
    client.close()


def test_record_returns_without_waiting(transport: MockTransport) -> None:
    client, session = start(transport)
    run = session.begin_run()
    # The daemon answers nothing to a record: a record that waited would find the end.
    run.record(AgentStart())
    run.record(AgentEnd())
    assert sent_types(transport)[-2:] == ["RecordEvent", "RecordEvent"]
    run.close()
    client.close()


def test_record_time_comes_from_the_event_or_the_caller(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    client, session = start(transport)
    run = session.begin_run()
    run.record(AgentStart(time="2026-01-02T03:04:05.000006Z"))
    run.record(AgentStart(), time=datetime(2026, 1, 2, tzinfo=UTC))
    run.record(AgentStart(), time="2026-01-03T00:00:00Z")
    with pytest.raises(LocalProtocolError):
        run.record(AgentStart(), time="yesterday")
    times = [r.time for r in memory.session("demo/chat.jsonl").records()[2:]]
    assert times == [
        "2026-01-02T03:04:05.000006Z",
        "2026-01-02T00:00:00.000000Z",
        "2026-01-03T00:00:00Z",
    ]
    client.close()


def test_never_written_events_are_skipped(transport: MockTransport) -> None:
    client, session = start(transport)
    run = session.begin_run()
    before = len(transport.sent)
    run.record(MessageUpdate(delta="to"))
    run.record(ModelStream(execution=EXEC, chunk={"delta": "ken"}))
    run.record(ModelResponse(execution=EXEC))
    assert len(transport.sent) == before
    run.record(ModelResponse(execution=EXEC, length_recovery="continue"))
    assert sent_types(transport)[-1] == "RecordEvent"
    client.close()


def test_codec_errors_are_raised_by_record(transport: MockTransport) -> None:
    client, session = start(transport, RefusingCodec())
    run = session.begin_run()
    before = len(transport.sent)
    with pytest.raises(RecordingError) as not_an_event:
        run.record({"type": "agent_start"})  # type: ignore[arg-type]
    assert not_an_event.value.code == ErrorCode.BAD_EVENT
    run.record(AgentStart(messages=[Unregistered(1)]))
    assert len(transport.sent) == before + 1
    with pytest.raises(RecordingError) as caught:
        run.record(REFUSED)
    assert caught.value.code == ErrorCode.CODEC_ERROR
    # The run's error is sticky: later records raise it and send nothing.
    with pytest.raises(RecordingError) as later:
        run.record(AgentEnd())
    assert later.value is caught.value
    assert len(transport.sent) == before + 1
    assert run.error is caught.value
    # run_close is written with it, then it is raised: the run does not close quietly.
    with pytest.raises(RecordingError) as closing:
        run.close()
    assert closing.value is caught.value
    close = transport.sent[-1]
    assert isinstance(close, CloseRun)
    assert close.error is not None
    assert close.error.startswith("cannot record AgentStart")
    client.close()


def test_record_many_sends_in_order_up_to_an_unencodable_event(
    transport: MockTransport,
) -> None:
    client, session = start(transport, RefusingCodec())
    run = session.begin_run()
    before = len(transport.sent)
    run.record_many([AgentStart(agent="a"), MessageUpdate(delta="x"), AgentEnd()])
    assert [m.event_type for m in transport.sent[before:]] == ["agent_start", "agent_end"]
    with pytest.raises(RecordingError) as caught:
        run.record_many([AgentStart(), REFUSED, AgentEnd()])
    assert caught.value.code == ErrorCode.CODEC_ERROR
    assert [m.event_type for m in transport.sent[before + 2 :]] == ["agent_start"]
    assert run.error is caught.value
    client.close()


def test_an_event_too_large_is_sent_as_its_stub_and_named_in_run_close() -> None:
    transport = MockTransport(MemoryDaemon(max_frame_size=2048))
    client, session = start(transport)
    run = session.begin_run()
    before = len(transport.sent)
    run.record(AgentStart(agent="big", messages=["x" * 5000]))
    run.record(AgentStart(messages=["x"]))
    stub, small = transport.sent[before:]
    assert stub.event_type == "agent_start"
    data = msgspec.json.decode(stub.data)
    assert data["$flightlog"] == "oversized"
    assert (data["omitted"], data["agent"]) == (["messages"], "big")
    assert msgspec.json.decode(small.data)["messages"] == ["x"]
    assert run.error is None  # nothing is refused: later records go on
    run.close()
    close = transport.sent[-1]
    assert isinstance(close, CloseRun)
    assert close.error is not None
    assert close.error.startswith(
        "codec_error: 1 event written with $flightlog markers: agent_start: oversized: "
    )
    client.close()


def test_run_close_names_the_marked_events_after_the_runs_sticky_error(
    transport: MockTransport,
) -> None:
    client, session = start(transport, RefusingCodec())
    run = session.begin_run()
    run.record(AgentStart(messages=[object()]))
    with pytest.raises(RecordingError) as caught:
        run.record(REFUSED)
    with pytest.raises(RecordingError):
        run.close()
    close = transport.sent[-1]
    assert isinstance(close, CloseRun)
    assert close.error == (
        f"{caught.value.message}; codec_error: 1 event written with $flightlog markers: "
        "agent_start: messages: builtins.object "
        "(TypeError: Encoding objects of type object is unsupported)"
    )
    client.close()


def test_values_the_codec_cannot_encode_are_marked_and_named_in_run_close(
    transport: MockTransport,
) -> None:
    client, session = start(transport)
    run = session.begin_run()
    before = len(transport.sent)
    tool = Execution(id="t7", kind="tool")
    run.record(AgentStart(messages=[object()]))
    run.record_many([ToolExecEnd(execution=tool, tool_call_id="c", name="n", details=len)])
    run.record(AgentEnd())
    assert [m.event_type for m in transport.sent[before:]] == [
        "agent_start",
        "tool_exec_end",
        "agent_end",
    ]
    assert msgspec.json.decode(transport.sent[before].data)["messages"][0]["class"] == (
        "builtins.object"
    )
    assert run.error is None
    run.close()
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
    second = session.begin_run()
    second.close()
    assert transport.sent[-1].error is None
    client.close()


def test_local_rules_refuse_without_a_round_trip(transport: MockTransport) -> None:
    client, session = start(transport)
    run = session.begin_run()
    with pytest.raises(LocalProtocolError) as open_run:
        session.begin_run()
    assert open_run.value.code == ErrorCode.RUN_OPEN
    run.close()
    run.close()
    assert sent_types(transport).count("CloseRun") == 1
    before = len(transport.sent)
    with pytest.raises(LocalProtocolError) as closed_run:
        run.record(AgentStart())
    assert closed_run.value.code == ErrorCode.RUN_NOT_OPEN
    with pytest.raises(LocalProtocolError):
        run.save_checkpoint({})
    assert len(transport.sent) == before
    # A new run has a fresh id; the old run object stays closed.
    second = session.begin_run()
    assert second.run_id != run.run_id
    with pytest.raises(LocalProtocolError):
        run.record(AgentStart())
    client.close()


def test_run_ref_names_the_call(transport: MockTransport) -> None:
    client, session = start(transport)
    run = session.begin_run()
    retry = EXEC.next_attempt()
    assert run.ref(retry) == CallRef(session.session_id, run.run_id, "m1", 2)
    client.close()


# ----------------------------------------------------------------------- sticky errors


def record_until_refused(run: Run) -> RecordingError:
    """Record until a pushed error surfaces: record() looks for pushes once a millisecond."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            run.record(AgentEnd())
        except RecordingError as exc:
            return exc
    pytest.fail("no record() raised the pushed error within 10 s")


def test_a_pushed_error_surfaces_from_a_later_record(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    client, session = start(transport)
    run = session.begin_run()
    run.record(AgentStart())
    transport.push(
        RecordFailed(
            session_id=run.session_id, run_id=run.run_id, code="bad_event", message="refused"
        )
    )
    first = record_until_refused(run)
    assert (first.code, first.message) == ("bad_event", "refused")
    sent = sent_types(transport).count("RecordEvent")
    # Once taken in, it is raised by every record, before anything is sent.
    with pytest.raises(RecordingError) as second:
        run.record(AgentEnd())
    assert second.value is first
    assert run.error is first
    assert sent_types(transport).count("RecordEvent") == sent
    # close() writes run_close with the error's text, then raises it.
    with pytest.raises(RecordingError) as on_close:
        run.close()
    assert on_close.value is first
    assert memory.session("demo/chat.jsonl").records()[-1].decode_data() == {"error": "refused"}
    # Another run of the session is not touched by it.
    other = session.begin_run()
    other.record(AgentStart())
    other.close()
    client.close()


def test_requests_take_in_a_push_that_record_has_not_looked_for(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    client, session = start(transport)
    run = session.begin_run()
    run.record(AgentStart())  # looks for pushes: the next look is a while away
    transport.push(
        RecordFailed(
            session_id=run.session_id, run_id=run.run_id, code="bad_event", message="refused"
        )
    )
    with pytest.raises(RecordingError) as on_checkpoint:
        run.save_checkpoint({"step": 1})
    assert on_checkpoint.value.message == "refused"
    assert sent_types(transport).count("SaveCheckpoint") == 0
    with pytest.raises(RecordingError) as on_close:
        run.close()
    assert on_close.value is on_checkpoint.value
    client.close()


def test_a_push_is_raised_by_close_right_after_a_record(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    client, session = start(transport)
    run = session.begin_run()
    run.record(AgentStart())
    transport.push(
        RecordFailed(
            session_id=run.session_id, run_id=run.run_id, code="bad_event", message="refused"
        )
    )
    with pytest.raises(RecordingError) as on_close:
        run.close()
    assert on_close.value.message == "refused"
    assert memory.session("demo/chat.jsonl").records()[-1].decode_data() == {"error": "refused"}
    client.close()


def test_an_error_pushed_during_close_is_raised_by_close(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    client, session = start(transport)
    run = session.begin_run()
    # The daemon fails to write the run_close: it pushes the failure, then refuses.
    memory.break_disk("demo/chat.jsonl", "late")
    with pytest.raises(RecordingError) as caught:
        run.close()
    assert caught.value.message == "late"
    client.close()


def test_a_session_write_failure_stops_every_run(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    client, session = start(transport)
    run = session.begin_run()
    memory.break_disk("demo/chat.jsonl", "disk full")
    caught = record_until_refused(run)
    assert caught.code == ErrorCode.WRITE_FAILED
    assert caught.message == "disk full"
    # The daemon takes no more writes: run_close cannot be written, close says why.
    with pytest.raises(RecordingError) as on_close:
        run.close()
    assert on_close.value is caught
    assert "CloseRun" not in sent_types(transport)
    with pytest.raises(RecordingError):
        session.begin_run()
    # Closing the session releases it, and reports the failure once more.
    with pytest.raises(RecordingError) as on_session_close:
        session.close()
    assert on_session_close.value.message == "disk full"
    assert memory.session("demo/chat.jsonl").closed
    client.close()


def test_write_failed_replies_are_recording_errors(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    client, session = start(transport)
    run = session.begin_run()
    memory.break_disk("demo/chat.jsonl", "fsync failed")
    with pytest.raises(RecordingError) as caught:
        run.save_checkpoint({"step": 1})
    assert caught.value.message == "fsync failed"
    with pytest.raises(RecordingError) as sticky:
        run.record(AgentStart())
    assert sticky.value is caught.value
    client.close()


def test_an_exception_in_the_block_closes_the_run_with_its_text(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    client, session = start(transport)
    with pytest.raises(ValueError, match="boom"), session.begin_run() as run:
        run.record(AgentStart())
        raise ValueError("boom")
    closed = memory.session("demo/chat.jsonl").records()[-1]
    assert (closed.type, closed.decode_data()) == ("run_close", {"error": "ValueError: boom"})
    client.close()


def test_the_exception_in_the_block_wins_over_a_sticky_error(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    client, session = start(transport)
    with pytest.raises(KeyError), session.begin_run() as run:
        transport.push(
            RecordFailed(
                session_id=run.session_id, run_id=run.run_id, code="bad_event", message="no"
            )
        )
        raise KeyError("agent bug")
    closed = memory.session("demo/chat.jsonl").records()[-1]
    assert closed.decode_data() == {"error": "no"}
    client.close()


# ------------------------------------------------------------------------ checkpoints


def test_checkpoints_round_trip_through_the_codec(transport: MockTransport) -> None:
    client, session = start(transport)
    assert session.load_checkpoint() is None
    run = session.begin_run()
    snapshot = {"messages": [UserMessage(content="hi")], "step": 3}
    seq = run.save_checkpoint(snapshot)
    assert seq == 3
    assert session.load_checkpoint() == snapshot
    assert session.sync() == 3
    with pytest.raises(RecordingError) as caught:
        run.save_checkpoint({"handle": object()})
    assert caught.value.code == ErrorCode.CODEC_ERROR
    assert run.error is caught.value
    client.close()


# ------------------------------------------------------------------------------ tails


def test_tail_yields_the_records(memory: MemoryDaemon, transport: MockTransport) -> None:
    client, session = start(transport)
    with session.begin_run() as run:
        run.record(AgentStart())
    tailed = [record for record in client.tail("demo/chat.jsonl")]
    assert tailed == memory.session("demo/chat.jsonl").records()
    later = [record.seq for record in client.tail("demo/chat.jsonl", after=2)]
    assert later == [3, 4]
    subscribe = [m for m in transport.sent if isinstance(m, Subscribe)]
    assert subscribe[1].after == 2
    assert subscribe[1].path == "demo/chat.jsonl"
    client.close()


def test_tail_passes_its_filters(transport: MockTransport) -> None:
    client, _ = start(transport)
    tail = client.tail("demo/chat.jsonl", follow=True, types=["agent_end"], run_id="r")
    with tail:
        pass
    subscribe = [m for m in transport.sent if isinstance(m, Subscribe)]
    assert subscribe == [
        Subscribe(
            id=3, path="demo/chat.jsonl", after=0, follow=True, types=["agent_end"], run_id="r"
        )
    ]
    client.close()


def test_tail_all_without_follow_replays_the_files_not_the_daemon(
    transport: MockTransport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It ends at the present: the files of the data root (here none: the daemon's
    sessions are in its memory), without a subscription (tests/sdk/test_tail_cursor.py
    has it with files and a real daemon)."""
    monkeypatch.setenv("FLIGHTLOG_ROOT", str(tmp_path))
    client, _ = start(transport)
    client.create("other.jsonl")
    tailed = [(path, record.type) for path, record in client.tail_all()]
    assert tailed == []
    assert not any(isinstance(m, Subscribe) for m in transport.sent)
    client.close()


def test_a_tail_ended_by_an_error_raises_it(transport: MockTransport) -> None:
    client, _ = start(transport)
    tail = client.tail("nowhere.jsonl")
    with pytest.raises(DaemonError) as caught:
        tail.__next__()
    assert caught.value.code == "session_not_found"
    assert "nowhere.jsonl" in caught.value.message
    assert [record for record in tail] == []
    client.close()


def test_a_follow_gets_records_as_they_are_written(transport: MockTransport) -> None:
    client, session = start(transport)
    run = session.begin_run()
    with client.tail("demo/chat.jsonl", follow=True) as tail:
        assert [(tail.__next__()).seq for _ in range(2)] == [1, 2]
        run.record(AgentStart())
        run.close()
        assert [(tail.__next__()).type for _ in range(2)] == ["agent_start", "run_close"]
        session.close()
        # The writer closed the session: the follow ends.
        assert [record for record in tail] == []
    assert tail.end is not None and tail.end.reason == "session_closed"
    client.close()


def test_closing_a_follow_unsubscribes(transport: MockTransport) -> None:
    client, session = start(transport)
    with client.tail("demo/chat.jsonl", follow=True) as tail:
        for record in tail:
            assert record.type == "session_start"
            break
    assert transport.sent[-1] == Unsubscribe(id=4, subscription=1)
    # The TailEnd the daemon sends before its Ack is taken in stride.
    assert session.sync() == 1
    client.close()


def test_an_abandoned_follow_is_unsubscribed_by_the_next_request(
    transport: MockTransport,
) -> None:
    client, session = start(transport)
    tail = client.tail("demo/chat.jsonl", follow=True)
    assert (tail.__next__()).seq == 1
    del tail
    # Batches still in flight for it are dropped.
    transport.push(TailBatch(subscription=1, lines=[b"not even json"]))
    assert session.sync() == 1
    assert sent_types(transport)[-2:] == ["Unsubscribe", "Sync"]
    client.close()


# ------------------------------------------------------------------ the connection


def test_bytes_arriving_one_at_a_time(memory: MemoryDaemon) -> None:
    transport = MockTransport(memory, chunk_size=1)
    client, session = start(transport)
    with session.begin_run() as run:
        run.record(AgentStart())
        run.save_checkpoint([1, 2, 3])
    assert session.load_checkpoint() == [1, 2, 3]
    assert len([record for record in client.tail("demo/chat.jsonl")]) == 5
    client.close()


def test_a_daemon_that_hangs_up_loses_the_connection(
    transport: MockTransport,
) -> None:
    client, session = start(transport)
    run = session.begin_run()
    transport.hang_up()
    deadline = time.monotonic() + 10
    with pytest.raises(ConnectionLost):  # found by the next look for pushes
        while time.monotonic() < deadline:
            run.record(AgentStart())
    with pytest.raises(ConnectionLost):
        run.record(AgentStart())
    with pytest.raises(ConnectionLost):
        session.sync()
    with pytest.raises(ConnectionLost):
        run.close()
    client.close()


def test_a_reply_lost_midway_fails_the_request(
    memory: MemoryDaemon, transport: MockTransport
) -> None:
    client, session = start(transport)
    memory.hold(SaveCheckpoint)
    run = session.begin_run()
    with pytest.raises(ConnectionLost):
        run.save_checkpoint({})
    client.close()


def test_status(transport: MockTransport) -> None:
    client, _ = start(transport)
    status = client.status()
    assert status.pid == os.getpid()
    assert status.records_written == 1
    client.close()
