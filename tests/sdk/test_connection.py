"""The client's sans-I/O state machine, with a fake daemon and no transport at all."""

from __future__ import annotations

import os
from typing import Any

import msgspec
import pytest

from flightlog.protocol import (
    Ack,
    AgentStart,
    ErrorCode,
    ErrorReply,
    FlightlogError,
    LocalProtocolError,
    Message,
    MessageUpdate,
    RecordEvent,
    RecordFailed,
    RecordingError,
    RemoteProtocolError,
    RunStarted,
    SessionOpened,
    StatusReply,
    Subscribed,
    TailBatch,
    TailEnd,
    Unsubscribe,
    default_codec,
    encode_frame,
    server_decoder,
)
from flightlog.sdk import ConnectionLost, DaemonError
from flightlog.sdk._connection import ClientConnection, Pending

from .fakes import FakeDaemon


class Link:
    """A client connection wired to a fake daemon: what one sends, the other gets."""

    def __init__(self, fake: FakeDaemon) -> None:
        self.fake = fake
        self.conn = ClientConnection(codec=default_codec, client_name="t", pid=os.getpid())
        self.server = server_decoder()
        self.inbox = bytearray()  # what the daemon sent and the client has not received

    def send(self, data: bytes | None) -> list[Any]:
        """The daemon receives ``data``; its answers wait in the inbox."""
        if data is None:
            return []
        self.server.feed(data)
        messages = list(self.server)
        for message in messages:
            for reply in self.fake(message):
                self.inbox += encode_frame(reply)
        return messages

    def deliver(self) -> None:
        self.conn.receive_data(bytes(self.inbox))
        self.inbox.clear()

    def call(self, pending: Pending[Any]) -> Any:
        self.send(pending.data)
        self.deliver()
        assert self.conn.answered(pending)
        return self.conn.result(pending)

    def push(self, message: Message) -> None:
        self.conn.receive_data(encode_frame(message))


@pytest.fixture
def link(fake: FakeDaemon) -> Link:
    link = Link(fake)
    link.call(link.conn.hello())
    return link


def open_run(link: Link) -> tuple[str, str]:
    opened = link.call(link.conn.create("s.jsonl", {}))
    started = link.call(link.conn.begin_run(opened.session_id))
    return opened.session_id, started.run_id


def test_the_welcome_sets_the_frame_limit(fake: FakeDaemon) -> None:
    fake.max_frame_size = 1234
    link = Link(fake)
    assert link.conn.welcome is None
    welcome = link.call(link.conn.hello())
    assert link.conn.welcome is welcome
    assert link.conn._encoder.max_frame_size == 1234


def test_requests_get_fresh_ids(link: Link) -> None:
    ids = [link.conn.status().id for _ in range(3)]
    assert ids == [2, 3, 4]


def test_replies_are_matched_by_id_in_any_order(link: Link) -> None:
    first, second = link.conn.status(), link.conn.create("s.jsonl", {"a": 1})
    assert not link.conn.answered(first)
    link.send(second.data)
    link.send(first.data)
    link.deliver()
    assert link.conn.answered(first) and link.conn.answered(second)
    assert isinstance(link.conn.result(first), StatusReply)
    assert isinstance(link.conn.result(second), SessionOpened)


def test_a_result_is_taken_once(link: Link) -> None:
    pending = link.conn.status()
    link.call(pending)
    with pytest.raises(LocalProtocolError):
        link.conn.result(pending)


def test_replies_to_forgotten_requests_are_dropped(link: Link) -> None:
    forgotten = link.conn.status()
    link.conn.forget(forgotten)
    link.send(forgotten.data)
    link.deliver()
    assert not link.conn.answered(forgotten)
    assert link.conn._replies == {}


def test_replies_arriving_in_pieces(link: Link) -> None:
    pending = link.conn.status()
    link.send(pending.data)
    data = bytes(link.inbox)
    for i in range(len(data)):
        assert not link.conn.answered(pending)
        link.conn.receive_data(data[i : i + 1])
    assert isinstance(link.conn.result(pending), StatusReply)


def test_an_error_reply_becomes_a_daemon_error(link: Link) -> None:
    pending = link.conn.open("missing.jsonl")
    with pytest.raises(DaemonError) as caught:
        link.call(pending)
    assert caught.value.code == "session_not_found"
    assert str(caught.value) == "missing.jsonl does not exist [session_not_found]"


def test_a_reply_of_the_wrong_kind_is_a_protocol_error(link: Link) -> None:
    pending = link.conn.status()
    link.push(Ack(id=pending.id))
    with pytest.raises(RemoteProtocolError) as caught:
        link.conn.result(pending)
    assert caught.value.code == ErrorCode.BAD_MESSAGE


def test_the_end_of_the_stream_fails_everything(link: Link) -> None:
    pending = link.conn.status()
    link.conn.receive_data(b"")
    assert link.conn.answered(pending)
    with pytest.raises(ConnectionLost):
        link.conn.result(pending)
    with pytest.raises(ConnectionLost):
        link.conn.status()


def test_a_reply_received_before_the_end_is_kept(link: Link) -> None:
    pending = link.conn.status()
    link.send(pending.data)
    link.deliver()
    link.conn.receive_data(b"")
    assert isinstance(link.conn.result(pending), StatusReply)


def test_garbage_from_the_daemon_fails_the_connection(link: Link) -> None:
    pending = link.conn.status()
    link.conn.receive_data(b"\x00\x00\x00\x03abc")
    with pytest.raises(RemoteProtocolError) as caught:
        link.conn.result(pending)
    assert caught.value.code == ErrorCode.BAD_MESSAGE
    assert isinstance(link.conn.failure, RemoteProtocolError)


def test_an_error_about_no_request_fails_the_connection(link: Link) -> None:
    link.push(ErrorReply(id=0, code="frame_too_large", message="too big"))
    with pytest.raises(DaemonError) as caught:
        link.conn.status()
    assert caught.value.code == "frame_too_large"


def test_an_error_about_no_request_but_a_session_is_sticky(link: Link) -> None:
    session_id, run_id = open_run(link)
    link.push(ErrorReply(id=0, code="bad_message", message="bad record", session_id=session_id))
    with pytest.raises(RecordingError) as caught:
        link.conn.record(session_id, run_id, AgentStart())
    assert caught.value.code == "bad_message"


# ----------------------------------------------------------------------------- records


def test_record_builds_one_frame(link: Link) -> None:
    session_id, run_id = open_run(link)
    event = AgentStart(agent="a")
    sent = link.send(link.conn.record(session_id, run_id, event))
    assert sent == [
        RecordEvent(
            session_id=session_id,
            run_id=run_id,
            event_type="agent_start",
            time=event.time,
            data=b'{"agent":"a","messages":[]}',
        )
    ]
    assert link.inbox == b""


def test_never_written_events_build_nothing(link: Link) -> None:
    session_id, run_id = open_run(link)
    assert link.conn.record(session_id, run_id, MessageUpdate(delta="x")) is None


def test_a_record_larger_than_the_daemon_accepts(fake: FakeDaemon) -> None:
    fake.max_frame_size = 300
    link = Link(fake)
    link.call(link.conn.hello())
    session_id, run_id = open_run(link)
    with pytest.raises(LocalProtocolError) as caught:
        link.conn.record(session_id, run_id, AgentStart(agent="x" * 300))
    assert caught.value.code == ErrorCode.FRAME_TOO_LARGE
    assert link.conn.record(session_id, run_id, AgentStart(agent="x")) is not None


def test_sticky_errors_are_per_run_and_the_first_one_stays(link: Link) -> None:
    session_id, run_id = open_run(link)
    link.push(RecordFailed(session_id=session_id, run_id=run_id, code="bad_event", message="1"))
    link.push(RecordFailed(session_id=session_id, run_id=run_id, code="bad_event", message="2"))
    sticky = link.conn.sticky_error(session_id, run_id)
    assert sticky is not None and sticky.message == "1"
    assert link.conn.sticky_error(session_id, "another-run") is None
    for _ in range(2):
        with pytest.raises(RecordingError) as caught:
            link.conn.record(session_id, run_id, AgentStart())
        assert caught.value is sticky


def test_a_session_sticky_error_applies_to_every_run(link: Link) -> None:
    session_id, run_id = open_run(link)
    link.push(RecordFailed(session_id=session_id, run_id=None, code="write_failed", message="io"))
    assert link.conn.sticky_error(session_id, run_id) is link.conn.sticky_error(session_id, None)
    with pytest.raises(RecordingError):
        link.conn.save_checkpoint(session_id, run_id, {})
    with pytest.raises(RecordingError) as on_sync:
        link.conn.sync(session_id)
    assert on_sync.value is link.conn.sticky_error(session_id, None)
    # Reading still works.
    assert link.conn.load_checkpoint(session_id) is not None


def test_close_run_carries_the_sticky_text_then_raises(link: Link) -> None:
    session_id, run_id = open_run(link)
    link.push(RecordFailed(session_id=session_id, run_id=run_id, code="bad_event", message="no"))
    pending = link.conn.close_run(session_id, run_id, "agent error")
    assert pending is not None
    [close] = link.send(pending.data)
    assert close.error == "no"
    link.deliver()
    with pytest.raises(RecordingError):
        link.conn.result(pending)
    assert link.conn.close_run(session_id, run_id, None) is None


def test_close_run_without_sticky_error_carries_the_given_text(link: Link) -> None:
    session_id, run_id = open_run(link)
    pending = link.conn.close_run(session_id, run_id, "agent error")
    assert pending is not None
    [close] = link.send(pending.data)
    assert close.error == "agent error"


def test_closing_a_session_forgets_it(link: Link) -> None:
    session_id, run_id = open_run(link)
    link.push(RecordFailed(session_id=session_id, run_id=None, code="write_failed", message="x"))
    pending = link.conn.close_session(session_id)
    assert pending is not None
    link.call(pending)
    assert link.conn.close_session(session_id) is None
    assert link.conn.sticky_error(session_id, run_id) is None
    with pytest.raises(LocalProtocolError) as caught:
        link.conn.record(session_id, run_id, AgentStart())
    assert caught.value.code == ErrorCode.SESSION_CLOSED


def test_requests_for_unknown_sessions_are_refused_locally(link: Link) -> None:
    with pytest.raises(LocalProtocolError) as caught:
        link.conn.begin_run("0" * 32)
    assert caught.value.code == ErrorCode.SESSION_CLOSED


def test_a_run_started_reply_opens_the_run(link: Link) -> None:
    opened = link.call(link.conn.create("s.jsonl", {}))
    pending = link.conn.begin_run(opened.session_id)
    link.send(pending.data)
    with pytest.raises(LocalProtocolError):
        link.conn.record(opened.session_id, "not-yet", AgentStart())
    link.deliver()
    started = link.conn.result(pending)
    assert isinstance(started, RunStarted)
    assert link.conn.record(opened.session_id, started.run_id, AgentStart()) is not None


# ------------------------------------------------------------------------------- tails


def line(seq: int) -> bytes:
    record = {"session_id": "s", "seq": seq, "type": "agent_start", "time": "t", "data": {}}
    return msgspec.json.encode(record)


def test_tail_pushes_queue_per_subscription(link: Link) -> None:
    link.push(Subscribed(id=99, subscription=1))  # a stray reply is dropped
    link.push(TailBatch(subscription=1, lines=[line(1), line(2)], path="p"))
    link.push(TailBatch(subscription=2, lines=[line(7)]))
    link.push(TailEnd(subscription=1, reason="end_of_file", last_seq=2))
    assert link.conn.tail_ready(1)
    assert [(p, r.seq) for p, r in link.conn.next_tail(1) or []] == [("p", 1), ("p", 2)]
    assert link.conn.next_tail(1) is None
    assert link.conn.tail_ended(1)
    assert [r.seq for _, r in link.conn.next_tail(2) or []] == [7]
    assert not link.conn.tail_ready(2)
    assert link.conn.next_tail(2) == []


def test_a_tailed_line_that_is_no_record(link: Link) -> None:
    link.push(TailBatch(subscription=1, lines=[b"{}"]))
    with pytest.raises(RemoteProtocolError):
        link.conn.next_tail(1)


def test_a_tail_ended_by_an_error(link: Link) -> None:
    link.push(TailEnd(subscription=1, reason="error", code="shutting_down", message="bye"))
    with pytest.raises(DaemonError) as caught:
        link.conn.next_tail(1)
    assert caught.value.code == "shutting_down"
    assert link.conn.next_tail(1) is None


def test_a_failed_connection_ends_waiting_tails(link: Link) -> None:
    link.push(TailBatch(subscription=1, lines=[line(1)]))
    link.conn.receive_data(b"")
    assert link.conn.next_tail(1)
    assert link.conn.tail_ready(1)
    with pytest.raises(ConnectionLost):
        link.conn.next_tail(1)


def test_an_abandoned_tail_is_unsubscribed_and_dropped(link: Link) -> None:
    pending = link.conn.subscribe("s.jsonl", follow=True)
    link.push(Subscribed(id=pending.id, subscription=4))
    assert link.conn.result(pending) == 4
    link.push(TailBatch(subscription=4, lines=[line(1)]))
    link.conn.abandon_tail(4)
    link.conn.abandon_tail(4)
    link.push(TailBatch(subscription=4, lines=[line(2)]))
    assert link.conn.next_tail(4) is None
    outbox = link.conn.take_outbox()
    assert link.send(outbox) == [Unsubscribe(id=3, subscription=4)]
    assert link.conn.take_outbox() == b""
    # The Ack of that unsubscribe has no caller and is dropped.
    link.deliver()
    assert link.conn._replies == {}


def test_a_subscription_number_used_again_is_not_dropped(link: Link) -> None:
    link.push(TailBatch(subscription=4, lines=[line(1)]))
    link.conn.abandon_tail(4)
    pending = link.conn.subscribe("s.jsonl")
    link.push(Subscribed(id=pending.id, subscription=4))
    link.push(TailBatch(subscription=4, lines=[line(5)]))
    assert link.conn.result(pending) == 4
    assert [r.seq for _, r in link.conn.next_tail(4) or []] == [5]


def test_errors_are_flightlog_errors() -> None:
    for error in (ConnectionLost("x"), DaemonError("x", code="session_busy")):
        assert isinstance(error, FlightlogError)
