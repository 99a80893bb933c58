"""The connection and session rules, as tables."""

from __future__ import annotations

import pytest

from flightlog.protocol import (
    CONNECTION_RULES,
    SESSION_RULES,
    Ack,
    ConnectionState,
    Create,
    ErrorCode,
    Hello,
    LocalProtocolError,
    RecordEvent,
    RemoteProtocolError,
    SessionOp,
    SessionState,
    Status,
    check_hello,
    connection_transition,
    session_transition,
)

RECORD = RecordEvent(session_id="s", run_id="r", event_type="turn_start", time="t", data=b"{}")


def test_the_session_table_is_complete() -> None:
    assert set(SESSION_RULES) == {(s, o) for s in SessionState for o in SessionOp}


def test_a_run_cycle() -> None:
    state = SessionState.IDLE
    state = session_transition(state, SessionOp.BEGIN_RUN)
    assert state is SessionState.RUN_OPEN
    for op in (SessionOp.RECORD, SessionOp.SAVE_CHECKPOINT, SessionOp.SYNC):
        assert session_transition(state, op) is SessionState.RUN_OPEN
    state = session_transition(state, SessionOp.CLOSE_RUN)
    assert state is SessionState.IDLE
    assert session_transition(state, SessionOp.BEGIN_RUN) is SessionState.RUN_OPEN


@pytest.mark.parametrize(
    ("state", "op", "code"),
    [
        (SessionState.IDLE, SessionOp.RECORD, ErrorCode.RUN_NOT_OPEN),
        (SessionState.IDLE, SessionOp.SAVE_CHECKPOINT, ErrorCode.RUN_NOT_OPEN),
        (SessionState.IDLE, SessionOp.CLOSE_RUN, ErrorCode.RUN_NOT_OPEN),
        (SessionState.RUN_OPEN, SessionOp.BEGIN_RUN, ErrorCode.RUN_OPEN),
        (SessionState.FAILED, SessionOp.RECORD, ErrorCode.WRITE_FAILED),
        (SessionState.FAILED, SessionOp.SYNC, ErrorCode.WRITE_FAILED),
        (SessionState.FAILED, SessionOp.BEGIN_RUN, ErrorCode.WRITE_FAILED),
        (SessionState.CLOSED, SessionOp.RECORD, ErrorCode.SESSION_CLOSED),
        (SessionState.CLOSED, SessionOp.CLOSE_SESSION, ErrorCode.SESSION_CLOSED),
    ],
)
def test_refusals_carry_their_code(state: SessionState, op: SessionOp, code: ErrorCode) -> None:
    with pytest.raises(LocalProtocolError) as caught:
        session_transition(state, op)
    assert caught.value.code == code
    assert op.value in caught.value.message


def test_closing_is_allowed_with_a_run_open_or_after_a_failure() -> None:
    # The open run stays without run_close; a failed session still closes (and says why).
    assert session_transition(SessionState.RUN_OPEN, SessionOp.CLOSE_SESSION) is (
        SessionState.CLOSED
    )
    assert session_transition(SessionState.FAILED, SessionOp.CLOSE_SESSION) is (SessionState.CLOSED)
    assert session_transition(SessionState.FAILED, SessionOp.LOAD_CHECKPOINT) is (
        SessionState.FAILED
    )


def test_hello_first() -> None:
    state = ConnectionState.AWAIT_HELLO
    with pytest.raises(RemoteProtocolError) as caught:
        connection_transition(state, Status(id=1))
    assert caught.value.code == "hello_required"
    state = connection_transition(state, Hello(id=1, version=1))
    assert state is ConnectionState.READY
    assert connection_transition(state, RECORD) is ConnectionState.READY
    assert connection_transition(state, Create(id=2, path="x")) is ConnectionState.READY


def test_a_second_hello_is_a_bad_message() -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        connection_transition(ConnectionState.READY, Hello(id=2, version=1))
    assert caught.value.code == "bad_message"


def test_replies_are_not_accepted_from_clients() -> None:
    with pytest.raises(RemoteProtocolError):
        connection_transition(ConnectionState.READY, Ack(id=1))


def test_an_unsupported_version_names_the_supported_ones() -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        check_hello(Hello(id=1, version=2))
    assert caught.value.code == "unsupported_version"
    assert "version 2" in caught.value.message and "speaks version 1" in caught.value.message


def test_nothing_is_accepted_once_closed() -> None:
    assert CONNECTION_RULES[ConnectionState.CLOSED][0] == ()
    with pytest.raises(RemoteProtocolError):
        connection_transition(ConnectionState.CLOSED, Status(id=1))
