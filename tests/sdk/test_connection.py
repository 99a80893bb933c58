"""The client's sans-I/O state machine paired with the server's, and no transport at all.

Like h11's ``ConnectionPair``: a :class:`Link` carries the bytes of the real
:class:`ClientConnection` to a real :class:`flightlog.protocol.wire.ServerConnection` (inside a
:class:`MemoryDaemon`, which only stores) and back, one step at a time.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightlog.protocol import (
    ErrorCode,
    FlightlogError,
    LocalProtocolError,
    RecordingError,
    RemoteProtocolError,
    default_codec,
    now,
)
from flightlog.protocol._wire import SessionStatus
from flightlog.protocol.events import (
    AgentEnd,
    AgentStart,
    MessageUpdate,
)
from flightlog.protocol.wire import (
    Ack,
    BeginRun,
    ClientConnection,
    ErrorReply,
    Message,
    Pending,
    RecordEvent,
    RecordFailed,
    RunStarted,
    SessionOpened,
    SessionState,
    StatusReply,
    Subscribed,
    TailBatch,
    TailEnd,
    Unsubscribe,
    client_decoder,
    encode_frame,
    server_decoder,
)
from flightlog.sdk import ConnectionLost, DaemonError, MemoryDaemon


class Link:
    """A client connection wired to a daemon's: what one sends, the other gets."""

    def __init__(self, memory: MemoryDaemon) -> None:
        self.daemon = memory
        self.conn = ClientConnection(
            codec=default_codec, client_name="t", pid=os.getpid(), clock=time.monotonic
        )
        self.server = memory.connect()
        self._sent = server_decoder()
        self.inbox = bytearray()  # what the daemon sent and the client has not received

    def send(self, data: bytes | None) -> list[Any]:
        """The daemon receives ``data``; its answers wait in the inbox.  Returns the
        messages sent."""
        if data is None:
            return []
        self._sent.feed(data)
        messages = list(self._sent)
        self.server.receive_data(data)
        self.inbox += self.server.data_to_send()
        return messages

    def deliver(self) -> None:
        """The client receives what the daemon sent (b"" would be the end: not sent)."""
        self.inbox += self.server.data_to_send()
        if self.inbox:
            self.conn.receive_data(bytes(self.inbox))
            self.inbox.clear()

    def hang_up(self) -> None:
        """The client's end of the stream reaches the memory."""
        self.server.receive_data(b"")

    def call(self, pending: Pending[Any]) -> Any:
        self.send(pending.data)
        self.deliver()
        assert self.conn.answered(pending)
        return self.conn.result(pending)

    def push(self, message: Message) -> None:
        self.conn.receive_data(encode_frame(message))


def connected(memory: MemoryDaemon) -> Link:
    link = Link(memory)
    link.call(link.conn.hello())
    return link


@pytest.fixture
def link(memory: MemoryDaemon) -> Link:
    return connected(memory)


def open_run(link: Link) -> tuple[str, str]:
    opened = link.call(link.conn.create("s.jsonl", {}))
    started = link.call(link.conn.begin_run(opened.session_id))
    return opened.session_id, started.run_id


def test_the_welcome_sets_the_frame_limit() -> None:
    link = Link(MemoryDaemon(max_frame_size=1234))
    assert link.conn.welcome is None
    welcome = link.call(link.conn.hello())
    assert link.conn.welcome is welcome
    assert link.conn.max_frame_size == 1234


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
    assert str(caught.value).startswith("missing.jsonl does not exist")
    assert str(caught.value).endswith(" [session_not_found]")


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
            data=b'{"agent":"a","messages":[],"parent_id":null}',
        )
    ]
    assert link.inbox == b""


def test_never_written_events_build_nothing(link: Link) -> None:
    session_id, run_id = open_run(link)
    assert link.conn.record(session_id, run_id, MessageUpdate(delta="x")) is None


def test_a_record_larger_than_the_daemon_accepts() -> None:
    link = connected(MemoryDaemon(max_frame_size=300))
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


def line(seq: int, session_id: str = "s") -> bytes:
    record = {"session_id": session_id, "seq": seq, "type": "agent_start", "time": "t", "data": {}}
    return msgspec.json.encode(record)


def tailing(link: Link, route: int, path: str | None = "p", **options: Any) -> int:
    """A tail the daemon answered with subscription ``route``: the tail's number."""
    pending = link.conn.tails.subscribe(path, **options)
    link.push(Subscribed(id=pending.id, subscription=route, path=path))
    return link.conn.result(pending)


def status_reply(
    request_id: int,
    *sessions: SessionStatus,
    closed: tuple[SessionStatus, ...] = (),
    uptime: float = 0.0,
) -> StatusReply:
    """The daemon's answer to a tail's catch-up ``status``: the sessions it holds and
    those it closed; up for ``uptime`` seconds (0: started since the tail was on)."""
    return StatusReply(
        id=request_id,
        pid=1,
        version="1",
        uptime=uptime,
        connections=1,
        subscribers=1,
        records_written=sum(session.records for session in sessions),
        bytes_written=0,
        sessions=list(sessions),
        closed=list(closed),
    )


def sent(link: Link, data: bytes) -> list[Any]:
    decoder = server_decoder()
    decoder.feed(data)
    return list(decoder)


def test_tail_pushes_queue_per_tail(link: Link) -> None:
    link.push(Subscribed(id=99, subscription=1))  # a stray reply is dropped
    first, second = tailing(link, 5), tailing(link, 6)
    link.push(TailBatch(subscription=5, lines=[line(1), line(2)], path="p"))
    link.push(TailBatch(subscription=6, lines=[line(7)]))
    link.push(TailBatch(subscription=9, lines=[line(8)]))  # no tail's: dropped
    link.push(TailEnd(subscription=5, reason="end_of_file", last_seq=2))
    assert link.conn.tail_ready(first)
    assert [(p, r.seq) for p, r in link.conn.tails.next(first) or []] == [("p", 1), ("p", 2)]
    assert link.conn.tails.next(first) is None
    assert not link.conn.tails.is_subscribed(first)
    assert [r.seq for _, r in link.conn.tails.next(second) or []] == [7]
    assert not link.conn.tail_ready(second)
    assert link.conn.tails.next(second) == []


def test_a_tailed_line_that_is_no_record_fails_the_connection(link: Link) -> None:
    tail = tailing(link, 1)
    link.push(TailBatch(subscription=1, lines=[b"{}"]))
    assert isinstance(link.conn.failure, RemoteProtocolError)
    with pytest.raises(RemoteProtocolError):
        link.conn.tails.next(tail)


def test_a_tail_ended_by_an_error(link: Link) -> None:
    tail = tailing(link, 1)
    link.push(TailEnd(subscription=1, reason="error", code="session_corrupt", message="bad"))
    with pytest.raises(DaemonError) as caught:
        link.conn.tails.next(tail)
    assert caught.value.code == "session_corrupt"
    assert link.conn.tails.next(tail) is None


def test_a_failed_connection_ends_waiting_tails(link: Link) -> None:
    tail = tailing(link, 1)
    link.push(TailBatch(subscription=1, lines=[line(1)]))
    link.conn.receive_data(b"")
    assert link.conn.tails.next(tail)
    assert link.conn.tail_ready(tail)
    with pytest.raises(ConnectionLost):
        link.conn.tails.next(tail)


def test_an_abandoned_tail_is_unsubscribed_and_dropped(link: Link) -> None:
    sub = link.call(link.conn.tails.subscribe("s.jsonl", follow=True))
    link.call(link.conn.create("s.jsonl", {}))
    link.conn.tails.abandon_later(sub)
    link.conn.tails.abandon_later(sub)
    assert link.conn.tails.next(sub) is None
    outbox = link.conn.take_outbox()
    assert link.send(outbox) == [Unsubscribe(id=4, subscription=1)]
    assert link.conn.take_outbox() == b""
    # The TailEnd and the Ack of that unsubscribe have no caller and are dropped.
    assert link.inbox
    link.deliver()
    assert link.conn._replies == {}
    assert link.conn.tails.next(sub) is None


def test_a_subscription_nobody_waits_for_is_unsubscribed(link: Link) -> None:
    pending = link.conn.tails.subscribe("p", follow=True)
    link.conn.forget(pending)
    link.push(Subscribed(id=pending.id, subscription=3))
    link.push(TailBatch(subscription=3, lines=[line(1)]))
    assert link.conn.tails.to_resubscribe() == []
    assert sent(link, link.conn.take_outbox()) == [Unsubscribe(id=pending.id + 1, subscription=3)]


def test_a_tail_of_one_session_goes_on_after_its_last_seq(link: Link) -> None:
    link.conn.tails.resume = True
    tail = tailing(link, 1, follow=True, types=["agent_start"])
    link.push(TailBatch(subscription=1, lines=[line(1), line(4)], path="p"))
    link.conn.receive_data(b"")
    link.conn.reset()
    assert link.conn.tails.to_resubscribe() == [tail]
    again = link.conn.tails.resubscribe(tail)
    [subscribe] = sent(link, again.data)
    assert (subscribe.path, subscribe.after, subscribe.follow) == ("p", 4, True)
    assert subscribe.types == ["agent_start"]
    # The new daemon numbers its subscriptions anew: the tail is the same.
    link.push(Subscribed(id=again.id, subscription=1))
    assert link.conn.result(again) == tail
    link.push(TailBatch(subscription=1, lines=[line(5)], path="p"))
    batches = [link.conn.tails.next(tail), link.conn.tails.next(tail)]
    assert [[r.seq for _, r in batch or []] for batch in batches] == [[1, 4], [5]]


def test_a_request_to_subscribe_whose_reply_was_lost(link: Link) -> None:
    link.conn.tails.resume = True
    pending = link.conn.tails.subscribe("p", follow=True)
    link.conn.receive_data(b"")
    link.conn.reset()
    # Never answered: sent again as it was.
    again = link.conn.retry(pending)
    assert again.settled is None and again.id != pending.id
    link.push(Subscribed(id=again.id, subscription=2))
    tail = link.conn.result(again)
    # Answered, then the connection broke: the reconnect subscribed it again.
    link.conn.receive_data(b"")
    link.conn.reset()
    assert link.conn.tails.to_resubscribe() == [tail]
    assert link.conn.retry(again).settled == (tail,)


def test_a_daemon_shutting_down_ends_a_tail_only_without_reconnects(memory: MemoryDaemon) -> None:
    ending, riding = connected(memory), connected(memory)
    riding.conn.tails.resume = True
    for link in (ending, riding):
        tail = tailing(link, 1)
        link.push(TailEnd(subscription=1, reason="shutting_down"))
        if link is ending:
            assert link.conn.tails.next(tail) is None
            assert link.conn.tails.pop_end(tail) == TailEnd(subscription=1, reason="shutting_down")
        else:
            # Subscribed again once the daemon is back.
            assert link.conn.tails.next(tail) == []
            assert link.conn.tails.to_resubscribe() == [tail]


def test_a_refused_resubscribe_ends_the_tail(link: Link) -> None:
    link.conn.tails.resume = True
    tail = tailing(link, 1)
    link.conn.receive_data(b"")
    link.conn.reset()
    again = link.conn.tails.resubscribe(tail)
    link.push(ErrorReply(id=again.id, code="permission_denied", message="not yours"))
    with pytest.raises(DaemonError) as refused:
        link.conn.result(again)
    link.conn.tails.end(tail, refused.value)
    with pytest.raises(DaemonError) as caught:
        link.conn.tails.next(tail)
    assert (caught.value.code, caught.value.message) == ("permission_denied", "not yours")
    assert link.conn.tails.to_resubscribe() == []


def test_a_tail_of_every_session_reads_what_it_missed_from_the_files(link: Link) -> None:
    link.conn.tails.resume = True
    a, b, c = "a" * 32, "b" * 32, "c" * 32
    tail = tailing(link, 1, None, follow=True)
    link.push(TailBatch(subscription=1, lines=[line(1, a), line(2, a)], path="/p"))
    link.push(TailBatch(subscription=1, lines=[line(6, b)], path="/q"))
    link.push(TailBatch(subscription=1, lines=[line(3, c)], path="/r"))
    link.conn.receive_data(b"")
    link.conn.reset()
    again = link.conn.tails.resubscribe(tail)
    link.push(Subscribed(id=again.id, subscription=4))
    link.conn.result(again)
    status = link.conn.tails.catch_up(tail)
    assert status is not None and link.conn.tails.catch_up(999) is None
    # Live records before the status reply are held: /p's 3 and 4 were written in the
    # gap, its 5 arrives live first.
    link.push(TailBatch(subscription=4, lines=[line(5, a)], path="/p"))
    link.push(
        status_reply(
            status.id,
            SessionStatus(path="/p", session_id=a, last_seq=5, records=3),
            # Nothing new in /q; /s was created while the tail was away.
            SessionStatus(path="/q", session_id=b, last_seq=6, records=1),
            SessionStatus(path="/s", session_id="d" * 32, last_seq=2, records=2),
        )
    )
    link.conn.result(status)
    # /r is not open: read after its position; /q is skipped.
    reads = {m.path: m for m in sent(link, link.conn.take_outbox())}
    assert sorted((m.path, m.after, m.follow) for m in reads.values()) == [
        ("/p", 2, False),
        ("/r", 3, False),
        ("/s", 0, False),
    ]
    for route, path in enumerate(["/p", "/r", "/s"], start=10):
        link.push(Subscribed(id=reads[path].id, subscription=route, path=path))
    link.push(TailBatch(subscription=4, lines=[line(6, a)], path="/p"))  # held too
    link.push(TailBatch(subscription=10, lines=[line(3, a), line(4, a), line(5, a)], path="/p"))
    link.push(TailEnd(subscription=10, reason="end_of_file", last_seq=5))
    link.push(TailEnd(subscription=11, reason="end_of_file", last_seq=3))
    link.push(TailBatch(subscription=12, lines=[line(1, "d" * 32), line(2, "d" * 32)], path="/s"))
    link.push(TailEnd(subscription=12, reason="end_of_file", last_seq=2))
    link.push(TailBatch(subscription=4, lines=[line(7, a)], path="/p"))
    got: list[tuple[str | None, int]] = []
    while batch := link.conn.tails.next(tail):
        got += [(path, record.seq) for path, record in batch]
    # Every session's records once, in order; /p's held ones after its file's.
    assert [n for p, n in got if p == "/p"] == [1, 2, 3, 4, 5, 6, 7]
    assert [n for p, n in got if p == "/q"] == [6]
    assert [n for p, n in got if p == "/r"] == [3]
    assert [n for p, n in got if p == "/s"] == [1, 2]
    assert link.conn.tails.to_resubscribe() == [tail]


def reconnected(link: Link, tail: int, route: int) -> Pending[None]:
    """The tail subscribed again after a reconnect; its catch-up ``status`` sent."""
    link.conn.receive_data(b"")
    link.conn.reset()
    again = link.conn.tails.resubscribe(tail)
    link.push(Subscribed(id=again.id, subscription=route))
    link.conn.result(again)
    status = link.conn.tails.catch_up(tail)
    assert status is not None
    [request] = sent(link, status.data)
    assert request.closed
    return status


def test_sessions_a_new_daemon_closed_while_a_tail_was_away_are_read(link: Link) -> None:
    link.conn.tails.resume = True
    a, m, n = "a" * 32, "m" * 32, "n" * 32
    tail = tailing(link, 1, None, follow=True)
    link.push(TailBatch(subscription=1, lines=[line(1, a), line(2, a)], path="/a"))
    status = reconnected(link, tail, 2)
    link.push(
        status_reply(
            status.id,
            # /m: created, closed and opened again by the new daemon (3 + 1 lines).
            SessionStatus(path="/m", session_id=m, last_seq=4, records=1),
            closed=(
                SessionStatus(path="/a", session_id=a, last_seq=5, records=3),
                # /n: created and closed while the tail was away.
                SessionStatus(path="/n", session_id=n, last_seq=3, records=3),
                SessionStatus(path="/m", session_id=m, last_seq=3, records=3),
                # Another session was at /m before: not the one there now.
                SessionStatus(path="/m", session_id="x" * 32, last_seq=9, records=9),
            ),
        )
    )
    link.conn.result(status)
    reads = sorted((m.path, m.after) for m in sent(link, link.conn.take_outbox()))
    assert reads == [("/a", 2), ("/m", 0), ("/n", 0)]


def test_sessions_closed_by_the_daemon_the_tail_was_on_are_not_read(link: Link) -> None:
    link.conn.tails.resume = True
    a = "a" * 32
    tail = tailing(link, 1, None, follow=True)
    link.push(TailBatch(subscription=1, lines=[line(1, a)], path="/a"))
    status = reconnected(link, tail, 2)
    # Up since before the tail subscribed: it may have closed /old before the tail came.
    closed = SessionStatus(path="/old", session_id="o" * 32, last_seq=3, records=3)
    link.push(status_reply(status.id, closed=(closed,), uptime=3600.0))
    link.conn.result(status)
    assert [(m.path, m.after) for m in sent(link, link.conn.take_outbox())] == [("/a", 1)]


def test_a_tail_of_every_session_that_fell_behind_subscribes_again(link: Link) -> None:
    a = "a" * 32
    tail = tailing(link, 1, None, follow=True)
    link.push(TailBatch(subscription=1, lines=[line(1, a), line(2, a)], path="/p"))
    link.push(TailEnd(subscription=1, reason="error", code="too_many", message="behind"))
    assert link.conn.tail_ready(tail)
    subscribe, status = sent(link, link.conn.take_outbox())
    assert (subscribe.path, subscribe.follow, status.closed) == (None, True, True)
    link.push(Subscribed(id=subscribe.id, subscription=2))
    link.push(TailBatch(subscription=2, lines=[line(5, a)], path="/p"))  # held
    # The same daemon: what it closed may be older than the tail, and is not read.
    closed = SessionStatus(path="/old", session_id="o" * 32, last_seq=3, records=3)
    link.push(
        status_reply(
            status.id,
            SessionStatus(path="/p", session_id=a, last_seq=5, records=5),
            closed=(closed,),
            uptime=3600.0,
        )
    )
    [read] = sent(link, link.conn.take_outbox())
    assert (read.path, read.after, read.follow) == ("/p", 2, False)
    link.push(Subscribed(id=read.id, subscription=3, path="/p"))
    link.push(TailBatch(subscription=3, lines=[line(3, a), line(4, a), line(5, a)], path="/p"))
    link.push(TailEnd(subscription=3, reason="end_of_file", last_seq=5))
    got = []
    while batch := link.conn.tails.next(tail):
        got += [record.seq for _, record in batch]
    assert got == [1, 2, 3, 4, 5]
    assert link.conn.tails.is_subscribed(tail)


def test_a_tail_refused_when_it_subscribes_again_ends_with_the_refusal(link: Link) -> None:
    tail = tailing(link, 1, None, follow=True)
    link.push(TailEnd(subscription=1, reason="error", code="too_many", message="behind"))
    subscribe, _ = sent(link, link.conn.take_outbox())
    link.push(ErrorReply(id=subscribe.id, code="too_many", message="1,024 subscriptions"))
    with pytest.raises(DaemonError) as caught:
        link.conn.tails.next(tail)
    assert caught.value.code == ErrorCode.TOO_MANY


def test_a_read_of_a_file_cut_short_by_a_shutdown_is_made_again(link: Link) -> None:
    link.conn.tails.resume = True
    a = "a" * 32
    tail = tailing(link, 1, None, follow=True)
    link.push(TailBatch(subscription=1, lines=[line(1, a)], path="/p"))
    for attempt in range(2):
        link.conn.receive_data(b"")
        link.conn.reset()
        again = link.conn.tails.resubscribe(tail)
        link.push(Subscribed(id=again.id, subscription=10 * attempt + 2))
        link.conn.result(again)
        status = link.conn.tails.catch_up(tail)
        assert status is not None
        link.push(status_reply(status.id))
        link.conn.result(status)
        [read] = sent(link, link.conn.take_outbox())
        # After what was received: from the last read too.
        assert (read.path, read.after) == ("/p", 1 + attempt)
        link.push(Subscribed(id=read.id, subscription=10 * attempt + 3))
        link.push(TailBatch(subscription=10 * attempt + 2, lines=[line(5, a)], path="/p"))
        if attempt == 0:
            # The daemon stops before the read is done: what it holds waits.
            link.push(TailBatch(subscription=3, lines=[line(2, a)], path="/p"))
            link.push(TailEnd(subscription=3, reason="shutting_down"))
            link.push(TailEnd(subscription=2, reason="shutting_down"))
    link.push(TailBatch(subscription=13, lines=[line(3, a), line(4, a)], path="/p"))
    link.push(TailEnd(subscription=13, reason="end_of_file"))
    got = []
    while batch := link.conn.tails.next(tail):
        got += [record.seq for _, record in batch]
    assert got == [1, 2, 3, 4, 5]


# ------------------------------------------------- the client's rules and the server's


def test_a_record_refused_while_the_close_is_on_its_way(link: Link) -> None:
    session_id, run_id = open_run(link)
    # A record the daemon refuses (its data is no JSON), which the client has not yet
    # heard of when it closes the run.
    bad = RecordEvent(
        session_id=session_id, run_id=run_id, event_type="agent_start", time=now(), data=b"{x"
    )
    link.send(encode_frame(bad))
    pending = link.conn.close_run(session_id, run_id, None)
    assert pending is not None
    [close] = link.send(pending.data)
    assert close.error is None
    link.deliver()
    with pytest.raises(RecordingError) as caught:
        link.conn.result(pending)
    assert caught.value.code == ErrorCode.BAD_EVENT
    # The run was closed all the same.
    records = link.daemon.session("s.jsonl").records()
    assert [r.type for r in records] == ["session_start", "run_start", "run_close"]


def test_the_server_refuses_what_a_client_sends_against_the_rules(link: Link) -> None:
    session_id, run_id = open_run(link)
    # Frames the client would have refused itself, built by hand.
    link.send(encode_frame(BeginRun(id=50, session_id=session_id, time=now())))
    for _ in range(2):
        link.send(link.conn.record(session_id, run_id, AgentStart()))
        stale = RecordEvent(
            session_id=session_id, run_id="0" * 32, event_type="agent_end", time=now(), data=b"{}"
        )
        link.send(encode_frame(stale))
    decoder = client_decoder()
    decoder.feed(link.inbox)
    error, pushed = list(decoder)
    assert error == ErrorReply(
        id=50,
        code="run_open",
        message="begin_run refused: a run is already open in this session; close it "
        "before beginning another",
        session_id=session_id,
    )
    # One push for the stale run, however many of its records came.
    assert isinstance(pushed, RecordFailed)
    assert (pushed.run_id, pushed.code) == ("0" * 32, "run_not_open")
    link.deliver()
    assert link.conn.sticky_error(session_id, "0" * 32) is not None
    assert link.conn.sticky_error(session_id, run_id) is None
    assert [r.type for r in link.daemon.session("s.jsonl").records()] == [
        "session_start",
        "run_start",
        "agent_start",
        "agent_start",
    ]


def test_a_session_has_one_writer(memory: MemoryDaemon, link: Link) -> None:
    session_id, run_id = open_run(link)
    other = connected(memory)
    with pytest.raises(DaemonError) as busy:
        other.call(other.conn.open("s.jsonl"))
    assert busy.value.code == ErrorCode.SESSION_BUSY
    assert f"pid {os.getpid()}" in busy.value.message
    # A write by hand from the other connection is refused, and pushed to it.
    stale = RecordEvent(
        session_id=session_id, run_id=run_id, event_type="agent_end", time=now(), data=b"{}"
    )
    other.send(encode_frame(stale))
    decoder = client_decoder()
    decoder.feed(other.inbox)
    [pushed] = list(decoder)
    assert isinstance(pushed, RecordFailed) and pushed.code == ErrorCode.NOT_WRITER
    # Once the writer closes the session, the other may open it.
    closing = link.conn.close_session(session_id)
    assert closing is not None
    link.call(closing)
    reopened = other.call(other.conn.open("s.jsonl"))
    assert reopened.session_id == session_id
    assert reopened.interrupted_runs == [run_id]
    assert reopened.last_seq == 2


def test_a_writer_that_goes_away_leaves_its_run_open(memory: MemoryDaemon, link: Link) -> None:
    session_id, run_id = open_run(link)
    link.send(link.conn.record(session_id, run_id, AgentStart()))
    link.hang_up()
    other = connected(memory)
    reopened = other.call(other.conn.open("s.jsonl"))
    assert (reopened.last_seq, reopened.interrupted_runs) == (3, [run_id])
    # The new writer begins its own run.
    started = other.call(other.conn.begin_run(session_id))
    assert started.run_id != run_id and started.seq == 4


def test_a_failed_write_fails_the_session_on_both_sides(link: Link) -> None:
    session_id, run_id = open_run(link)
    assert link.call(link.conn.save_checkpoint(session_id, run_id, {"step": 1})) == 3
    link.daemon.break_disk("s.jsonl", "no space left on device")
    link.send(link.conn.record(session_id, run_id, AgentEnd()))
    link.deliver()
    failure = link.conn.sticky_error(session_id, run_id)
    assert failure is not None and failure.code == ErrorCode.WRITE_FAILED
    assert failure.message == "no space left on device"
    for refused in (
        lambda: link.conn.record(session_id, run_id, AgentEnd()),
        lambda: link.conn.sync(session_id),
        lambda: link.conn.begin_run(session_id),
    ):
        with pytest.raises(RecordingError) as caught:
            refused()
        assert caught.value is failure
    # Reading still works; closing reports the failure.
    assert link.call(link.conn.load_checkpoint(session_id)) == {"step": 1}
    closing = link.conn.close_session(session_id)
    assert closing is not None
    with pytest.raises(RecordingError) as on_close:
        link.call(closing)
    assert on_close.value.message == "no space left on device"
    assert link.daemon.session("s.jsonl").closed


def test_a_follow_through_the_server(memory: MemoryDaemon, link: Link) -> None:
    reader = connected(memory)
    sub = reader.call(reader.conn.tails.subscribe("s.jsonl", follow=True, types=["agent_start"]))
    # It waits for the session, which the writer creates now.
    session_id, run_id = open_run(link)
    link.send(link.conn.record(session_id, run_id, AgentStart(agent="a")))
    link.send(link.conn.record(session_id, run_id, AgentEnd()))
    reader.deliver()
    assert [(r.seq, r.type) for _, r in reader.conn.tails.next(sub) or []] == [(3, "agent_start")]
    assert reader.conn.tails.next(sub) == []
    reader.call(reader.conn.tails.unsubscribe(sub))
    assert not reader.conn.tails.is_subscribed(sub)
    # The server knows it is gone.
    reader.send(encode_frame(Unsubscribe(id=99, subscription=sub)))
    decoder = client_decoder()
    decoder.feed(reader.inbox)
    [refused] = list(decoder)
    assert isinstance(refused, ErrorReply) and refused.code == "subscription_not_found"


def test_a_follow_ended_by_the_writer_while_the_reader_unsubscribes(
    memory: MemoryDaemon, link: Link
) -> None:
    session_id, _ = open_run(link)
    reader = connected(memory)
    sub = reader.call(reader.conn.tails.subscribe("s.jsonl", follow=True))
    closing = link.conn.close_session(session_id)
    assert closing is not None
    link.call(closing)
    # The daemon's TailEnd and the reader's unsubscribe cross on the way.
    assert reader.call(reader.conn.tails.unsubscribe(sub)) is None
    assert not reader.conn.tails.is_subscribed(sub)
    # Any other refusal of an unsubscribe is still raised.
    rude = Link(memory)  # no hello
    unsubscribe = rude.conn.tails.unsubscribe(tailing(rude, sub))
    assert unsubscribe is not None
    with pytest.raises(DaemonError) as caught:
        rude.call(unsubscribe)
    assert caught.value.code == ErrorCode.HELLO_REQUIRED


OPS = ["begin", "record", "checkpoint", "close_run", "sync", "load", "close", "open", "break"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(OPS), max_size=25))
def test_the_client_and_the_server_apply_the_same_rules(ops: list[str]) -> None:
    """Whatever an agent does, the client refuses exactly what the server would: a
    request the client lets through is refused by the server only when the disk broke
    (or it opens a session it already writes), and both sides end each step in the same
    state."""
    memory = MemoryDaemon()
    link = connected(memory)
    sid = link.call(link.conn.create("s.jsonl", {})).session_id
    run_id = "0" * 32
    broken = False
    for op in ops:
        try:
            match op:
                case "begin":
                    run_id = link.call(link.conn.begin_run(sid)).run_id
                case "record":
                    link.send(link.conn.record(sid, run_id, AgentStart()))
                    link.deliver()
                case "checkpoint":
                    link.call(link.conn.save_checkpoint(sid, run_id, {"n": 1}))
                case "close_run":
                    if (pending := link.conn.close_run(sid, run_id, None)) is not None:
                        link.call(pending)
                case "sync":
                    link.call(link.conn.sync(sid))
                case "load":
                    link.call(link.conn.load_checkpoint(sid))
                case "close":
                    if (pending := link.conn.close_session(sid)) is not None:
                        link.call(pending)
                case "open":
                    link.call(link.conn.open("s.jsonl"))
                case "break":
                    memory.break_disk("s.jsonl")
                    broken = True
        except LocalProtocolError:
            pass  # refused before anything was sent
        except RecordingError as exc:
            assert broken and exc.code == ErrorCode.WRITE_FAILED, exc
        except DaemonError as exc:
            assert op == "open" and exc.code == ErrorCode.SESSION_BUSY, exc
        client = link.conn.session_state(sid)
        server = link.server.server.sessions.get(sid)
        assert (client is None) == (server is None), op
        if client is not None and server is not None:
            assert client.state is server.state, op
            assert (client.failure is None) == (server.failure is None), op
            if client.state is not SessionState.FAILED:
                assert client.run_id == server.run_id, op


def test_errors_are_flightlog_errors() -> None:
    for error in (ConnectionLost("x"), DaemonError("x", code="session_busy")):
        assert isinstance(error, FlightlogError)


def test_a_create_sent_again_opens_the_file_its_lost_reply_created(memory: MemoryDaemon) -> None:
    link = connected(memory)
    first = link.conn.create("lost.jsonl", {"n": 1})
    link.send(first.data)  # created; the reply is lost with the connection
    link.hang_up()
    link.conn.connection_lost(ConnectionLost("the connection to the daemon broke: test"))
    link.conn.reset()
    again_link = Link(memory)
    again_link.conn = link.conn
    again_link.call(link.conn.hello())
    again = link.conn.retry(first)
    with pytest.raises(DaemonError) as exists:
        again_link.call(again)
    assert exists.value.code == ErrorCode.SESSION_EXISTS
    instead = link.conn.open_instead(again, exists.value)
    assert instead is not None
    opened = again_link.call(instead)
    assert opened.session_id == memory.session("lost.jsonl").session_id
    assert opened.meta == {"n": 1}
    # Refused for any other reason, or a create not sent again: nothing instead.
    assert link.conn.open_instead(first, exists.value) is None
    other = DaemonError("no", code=ErrorCode.PATH_REFUSED, session_id=None)
    assert link.conn.open_instead(again, other) is None
