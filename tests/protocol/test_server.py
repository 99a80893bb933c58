"""The server's side of a connection, sans I/O: frames in, events and replies out."""

from __future__ import annotations

from typing import Any

import pytest

from flightlog.protocol import (
    ErrorCode,
    FlightlogError,
    LocalProtocolError,
)
from flightlog.protocol.wire import (
    BAD_FRAMES_IN_A_ROW,
    MAX_SUBSCRIPTIONS,
    PROTOCOL_VERSION,
    Ack,
    BeginRun,
    CloseRun,
    CloseSession,
    ConnectionClosed,
    ConnectionState,
    Create,
    ErrorReply,
    Hello,
    LoadCheckpoint,
    Message,
    RecordEvent,
    RecordFailed,
    SaveCheckpoint,
    ServerConnection,
    SessionMachine,
    SessionOpened,
    SessionState,
    StartRun,
    Status,
    Subscribe,
    Subscribed,
    Sync,
    TailEnd,
    Unsubscribe,
    Welcome,
    client_decoder,
    encode_frame,
)

TIME = "2026-11-29T20:00:00.000000Z"
SID = "a" * 32


class Client:
    """Frames into a ServerConnection; its events and what it sends back, decoded."""

    def __init__(self, server: ServerConnection | None = None) -> None:
        self.server = server or ServerConnection(max_frame_size=4096, pid=7, server="test")
        self._decoder = client_decoder()

    def send(self, *messages: Message) -> list[Any]:
        """Feed ``messages``; the events they made."""
        self.server.receive_data(b"".join(encode_frame(m) for m in messages))
        return self.events()

    def events(self) -> list[Any]:
        events = []
        while (event := self.server.next_event()) is not None:
            events.append(event)
        return events

    def received(self) -> list[Any]:
        self._decoder.feed(self.server.data_to_send())
        return list(self._decoder)


def hello(client: Client) -> None:
    assert client.send(Hello(id=1, version=PROTOCOL_VERSION, client="agent", pid=42)) == []
    [welcome] = client.received()
    assert isinstance(welcome, Welcome) and welcome.id == 1


def writing(client: Client, session_id: str = SID) -> SessionMachine[FlightlogError]:
    """Hello, then create a session and answer it: the client now writes it."""
    hello(client)
    [create] = client.send(Create(id=2, path="s.jsonl"))
    assert isinstance(create, Create)
    machine = client.server.opened(
        SessionOpened(id=2, session_id=session_id, path="/s.jsonl", last_seq=1)
    )
    [opened] = client.received()
    assert isinstance(opened, SessionOpened)
    return machine


def begin(client: Client, request_id: int = 3) -> str:
    [event] = client.send(BeginRun(id=request_id, session_id=SID, time=TIME))
    assert isinstance(event, StartRun) and event.request.id == request_id
    return event.run_id


def record(run_id: str, **changes: Any) -> RecordEvent:
    fields = {
        "session_id": SID,
        "run_id": run_id,
        "event_type": "agent_start",
        "time": TIME,
        "data": b"{}",
    }
    return RecordEvent(**{**fields, **changes})


# -------------------------------------------------------------------- the connection


def test_hello_first_is_answered_by_the_connection() -> None:
    client = Client()
    client.send(Hello(id=1, version=PROTOCOL_VERSION, client="agent", pid=42))
    assert client.received() == [
        Welcome(id=1, version=PROTOCOL_VERSION, max_frame_size=4096, daemon_pid=7, server="test")
    ]
    assert client.server.state is ConnectionState.READY
    assert (client.server.client, client.server.client_pid) == ("agent", 42)


@pytest.mark.parametrize(
    "first",
    [Status(id=1), record("r"), Create(id=1, path="x"), Hello(id=1, version=99)],
)
def test_anything_but_a_supported_hello_first_hangs_up(first: Message) -> None:
    client = Client()
    events = client.send(first, Status(id=2))
    assert events == [ConnectionClosed(released={})]
    [refused] = client.received()
    code = "unsupported_version" if isinstance(first, Hello) else "hello_required"
    assert isinstance(refused, ErrorReply) and refused.code == code
    assert refused.id == getattr(first, "id", 0)
    assert client.server.state is ConnectionState.CLOSED
    # Closed is final: nothing more comes out.
    assert client.send(Status(id=3)) == []
    assert client.received() == []


def test_the_versions_spoken_are_the_servers_own() -> None:
    client = Client(ServerConnection(versions=(7,)))
    client.send(Hello(id=1, version=PROTOCOL_VERSION))
    [refused] = client.received()
    assert refused.code == "unsupported_version"
    assert refused.message.endswith("this daemon speaks version 7")


def test_a_second_hello_is_refused_and_the_connection_goes_on() -> None:
    client = Client()
    hello(client)
    assert client.send(Hello(id=2, version=1), Status(id=3)) == [Status(id=3)]
    [refused] = client.received()
    assert (refused.id, refused.code) == (2, "bad_message")


def test_a_bad_frame_is_answered_and_skipped() -> None:
    client = Client()
    hello(client)
    client.server.receive_data(b"\x00\x00\x00\x03abc" + encode_frame(Status(id=2)))
    assert client.events() == [Status(id=2)]
    [refused] = client.received()
    assert (refused.id, refused.code) == (0, "bad_message")


def test_bad_frames_in_a_row_hang_up() -> None:
    client = Client()
    hello(client)
    client.server.receive_data(b"\x00\x00\x00\x01x" * (BAD_FRAMES_IN_A_ROW - 1))
    client.server.receive_data(encode_frame(Status(id=2)))
    assert client.events() == [Status(id=2)]  # a good frame starts the count again
    client.server.receive_data(b"\x00\x00\x00\x01x" * BAD_FRAMES_IN_A_ROW)
    assert client.events() == [ConnectionClosed(released={})]
    replies = client.received()
    assert len(replies) == 2 * BAD_FRAMES_IN_A_ROW - 1
    assert "in a row were no message: closing" in replies[-1].message


def test_a_bad_frame_before_the_hello_hangs_up() -> None:
    client = Client()
    client.server.receive_data(b"\x00\x00\x00\x01x")
    assert client.events() == [ConnectionClosed(released={})]


def test_an_oversized_frame_hangs_up() -> None:
    client = Client()
    hello(client)
    client.server.receive_data(b"\x00\x01\x00\x00")
    assert client.events() == [ConnectionClosed(released={})]
    [refused] = client.received()
    assert refused.code == "frame_too_large"


def test_frames_in_pieces_and_the_end_after_them() -> None:
    client = Client()
    hello(client)
    data = encode_frame(Status(id=2))
    for i in range(len(data) - 1):
        client.server.receive_data(data[i : i + 1])
        assert client.events() == []
    client.server.receive_data(data[-1:])
    client.server.receive_data(b"")
    assert client.events() == [Status(id=2), ConnectionClosed(released={})]


# ------------------------------------------------------------------------- sessions


def test_writes_to_a_session_this_connection_does_not_write() -> None:
    others = {SID}
    client = Client(ServerConnection(written_elsewhere=others.__contains__))
    hello(client)
    unknown = "b" * 32
    assert client.send(Sync(id=2, session_id=SID), Sync(id=3, session_id=unknown)) == []
    assert client.send(record("r"), record("r", session_id=unknown)) == []
    busy, missing, pushed_busy, pushed_missing = client.received()
    assert (busy.id, busy.code, busy.session_id) == (2, "not_writer", SID)
    assert (missing.id, missing.code) == (3, "session_not_found")
    assert isinstance(pushed_busy, RecordFailed) and pushed_busy.code == "not_writer"
    assert isinstance(pushed_missing, RecordFailed) and pushed_missing.code == "session_not_found"


def test_a_run_cycle_through_the_connection() -> None:
    client = Client()
    machine = writing(client)
    run_id = begin(client)
    assert (machine.state, machine.run_id) == (SessionState.RUN_OPEN, run_id)
    rec = record(run_id)
    checkpoint = SaveCheckpoint(id=4, session_id=SID, run_id=run_id, time=TIME, snapshot=b"1")
    close = CloseRun(id=5, session_id=SID, run_id=run_id, time=TIME)
    assert client.send(rec, checkpoint, close) == [rec, checkpoint, close]
    assert client.received() == []
    assert (machine.state, machine.run_id) == (SessionState.IDLE, None)
    # A new run gets a new id.
    assert begin(client, 6) != run_id


def test_session_rules_refuse_with_their_code() -> None:
    client = Client()
    writing(client)
    no_run = CloseRun(id=3, session_id=SID, run_id="r", time=TIME)
    assert client.send(no_run) == []
    run_id = begin(client, 4)
    again = BeginRun(id=5, session_id=SID, time=TIME)
    stale = SaveCheckpoint(id=6, session_id=SID, run_id="r", time=TIME, snapshot=b"1")
    assert client.send(again, stale) == []
    codes = [(reply.id, reply.code) for reply in client.received()]
    assert codes == [(3, "run_not_open"), (5, "run_open"), (6, "run_not_open")]
    assert client.server.sessions[SID].run_id == run_id


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"run_id": "stale"}, "not open"),
        ({"event_type": "run_start"}, "not an agent fact type"),
        ({"time": "yesterday"}, "not RFC 3339"),
        ({"time": "0000-01-01T00:00:00Z"}, "not RFC 3339"),
        ({"data": b"[1]"}, "one JSON object"),
        ({"data": b"{x"}, "not valid UTF-8 JSON"),
        ({"data": b'{"a":"\xff"}'}, "not valid UTF-8 JSON"),
        ({"data": b'{"a":\n1}'}, "on one line"),
        ({"data": b'{"a":' + b"[" * 256 + b"]" * 256 + b"}"}, "more than 256 levels"),
    ],
)
def test_a_refused_record_is_pushed_once_per_run(changes: dict[str, Any], reason: str) -> None:
    client = Client()
    writing(client)
    run_id = begin(client)
    bad = record(**{"run_id": run_id, **changes})
    assert client.send(bad, bad, record(run_id)) == [record(run_id)]
    [pushed] = client.received()
    assert isinstance(pushed, RecordFailed)
    assert pushed.run_id == bad.run_id and reason in pushed.message
    # It is the run's, not the session's: the session goes on.
    assert client.server.sessions[SID].state is SessionState.RUN_OPEN


@pytest.mark.parametrize(
    ("snapshot", "reason"),
    [
        (b"{x", "not valid UTF-8 JSON"),
        (b"[\r]", "on one line"),
        (b"[" * 257 + b"]" * 257, "more than 256 levels"),
    ],
)
def test_a_checkpoint_whose_snapshot_is_not_json_is_refused(snapshot: bytes, reason: str) -> None:
    client = Client()
    writing(client)
    run_id = begin(client)
    save = SaveCheckpoint(id=4, session_id=SID, run_id=run_id, time=TIME, snapshot=snapshot)
    assert client.send(save) == []
    [refused] = client.received()
    assert isinstance(refused, ErrorReply) and (refused.id, refused.code) == (4, "bad_event")
    assert reason in refused.message


def test_a_request_with_a_bad_time_is_refused() -> None:
    client = Client()
    writing(client)
    assert client.send(BeginRun(id=3, session_id=SID, time="soon")) == []
    [refused] = client.received()
    assert (refused.code, refused.session_id) == ("bad_event", SID)
    assert client.server.sessions[SID].state is SessionState.IDLE


def test_a_failure_is_pushed_once_and_refuses_every_later_write() -> None:
    client = Client()
    machine = writing(client)
    run_id = begin(client)
    error = FlightlogError("the disk is full", code=ErrorCode.WRITE_FAILED)
    client.server.fail(SID, error)
    client.server.fail(SID, FlightlogError("later", code=ErrorCode.WRITE_FAILED))
    assert machine.failure is error
    sync, load = Sync(id=4, session_id=SID), LoadCheckpoint(id=5, session_id=SID)
    assert client.send(record(run_id), sync, load) == [load]
    pushed, refused = client.received()
    assert pushed == RecordFailed(
        session_id=SID, run_id=run_id, code="write_failed", message="the disk is full"
    )
    assert (refused.id, refused.message) == (4, "the disk is full")
    # Closing still comes through: the owner answers it with the failure.
    close = CloseSession(id=6, session_id=SID)
    assert client.send(close) == [close]
    assert machine.state is SessionState.CLOSED and machine.failure is error


def test_closing_a_session_ends_this_connections_writes() -> None:
    client = Client()
    machine = writing(client)
    begin(client)
    close = CloseSession(id=4, session_id=SID)
    assert client.send(close) == [close]
    assert machine.state is SessionState.CLOSED and SID not in client.server.sessions
    assert client.send(close) == []
    [refused] = client.received()
    assert refused.code == "session_not_found"


def test_the_end_releases_the_sessions_and_names_their_open_runs() -> None:
    client = Client()
    machine = writing(client)
    run_id = begin(client)
    client.server.receive_data(b"")
    assert client.events() == [ConnectionClosed(released={SID: run_id})]
    assert (machine.state, machine.run_id) == (SessionState.IDLE, None)
    assert client.server.sessions == {}


def test_an_owner_keeps_a_sessions_machine_across_writers() -> None:
    machine: SessionMachine[FlightlogError] = SessionMachine()
    machine.fail(FlightlogError("gone", code=ErrorCode.WRITE_FAILED))
    client = Client()
    hello(client)
    opened = SessionOpened(id=2, session_id=SID, path="/s.jsonl", last_seq=1)
    assert client.server.opened(opened, machine) is machine
    client.received()
    assert client.send(BeginRun(id=3, session_id=SID, time=TIME)) == []
    [refused] = client.received()
    assert refused.message == "gone"


def test_refused_by_the_owner() -> None:
    client = Client()
    machine = writing(client)
    [start] = client.send(BeginRun(id=3, session_id=SID, time=TIME))
    client.server.refuse(start, FlightlogError("no", code=ErrorCode.INTERNAL))
    assert machine.state is SessionState.IDLE  # the run never started
    run_id = begin(client, 4)
    [event] = client.send(record(run_id))
    unwritten = LocalProtocolError("not written", code=ErrorCode.BAD_EVENT)
    client.server.refuse(event, unwritten)
    client.server.refuse(event, unwritten)
    create = Create(id=5, path="t.jsonl")
    client.server.refuse(create, FlightlogError("exists", code=ErrorCode.SESSION_EXISTS))
    refused_start, pushed, refused_create = client.received()
    assert (refused_start.id, refused_start.session_id) == (3, SID)
    assert isinstance(pushed, RecordFailed) and pushed.code == "bad_event"
    assert (refused_create.id, refused_create.code, refused_create.session_id) == (
        5,
        "session_exists",
        None,
    )


def test_a_session_is_opened_only_through_opened() -> None:
    client = Client()
    hello(client)
    with pytest.raises(LocalProtocolError):
        client.server.send(SessionOpened(id=2, session_id=SID, path="/s", last_seq=1))


# --------------------------------------------------------------------- subscriptions


def test_an_unsubscribe_names_a_subscription_of_this_connection() -> None:
    client = Client()
    hello(client)
    subscribe = Subscribe(id=2, path="s.jsonl", follow=True)
    assert client.send(subscribe, Unsubscribe(id=3, subscription=1)) == [subscribe]
    [refused] = client.received()
    assert (refused.id, refused.code) == (3, "subscription_not_found")
    client.server.send(Subscribed(id=2, subscription=1))
    unsubscribe = Unsubscribe(id=4, subscription=1)
    assert client.send(unsubscribe) == [unsubscribe]
    client.server.send(TailEnd(subscription=1, reason="unsubscribed"))
    client.server.send(Ack(id=4))
    assert client.send(Unsubscribe(id=5, subscription=1)) == []


def test_subscriptions_are_bounded() -> None:
    client = Client()
    hello(client)
    for number in range(MAX_SUBSCRIPTIONS):
        client.server.send(Subscribed(id=number + 2, subscription=number))
    assert client.send(Subscribe(id=9999)) == []
    assert client.received()[-1].code == "too_many"
    client.server.send(TailEnd(subscription=0, reason="end_of_file"))
    assert client.send(Subscribe(id=10000)) == [Subscribe(id=10000)]


def test_an_owner_may_iterate_over_the_events_until_more_bytes_are_needed() -> None:
    client = Client()
    writing(client)
    run_id = begin(client)
    server = client.server
    server.receive_data(encode_frame(record(run_id)) + encode_frame(Sync(id=4, session_id=SID)))
    taken = []
    for event in server.events:
        if event is None:
            break
        taken.append(event)
    assert taken == [record(run_id), Sync(id=4, session_id=SID)]
    assert server.next_event() is None  # the same events: nothing more yet
    server.receive_data(encode_frame(record(run_id)))
    assert server.next_event() == record(run_id)
    server.receive_data(b"")
    assert [next(server.events), next(server.events)] == [
        ConnectionClosed(released={SID: run_id}),
        None,
    ]


def test_frames_per_turn_bounds_the_frames_taken_between_two_nones() -> None:
    client = Client(ServerConnection(max_frame_size=4096, frames_per_turn=4))
    writing(client)
    # Records refused (not an agent fact type) make no event: ten of them, then two
    # status requests, are taken four frames at a time.
    refused = RecordEvent(
        session_id=SID, run_id="r" * 32, event_type="no_fact", time=TIME, data=b"{}"
    )
    statuses = [Status(id=n) for n in (50, 51)]
    client.server.receive_data(b"".join(encode_frame(m) for m in [refused] * 10 + statuses))
    turns = []
    while True:
        turns.append(client.events())
        if not client.server.more:
            break
    assert turns == [[], [], statuses]
    assert not client.server.more
    # Without the bound, one turn takes everything.
    unbounded = Client()
    hello(unbounded)
    unbounded.server.receive_data(b"".join(encode_frame(m) for m in statuses * 20))
    assert unbounded.events() == statuses * 20
    assert not unbounded.server.more
