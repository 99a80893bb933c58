"""The connection and session rules, as tables."""

from __future__ import annotations

import pytest

from flightlog.protocol import (
    ErrorCode,
    FlightlogError,
    LocalProtocolError,
    RecordingError,
    RemoteProtocolError,
    _state,
)
from flightlog.protocol.wire import (
    CONNECTION_RULES,
    SESSION_RULES,
    Ack,
    ConnectionState,
    Create,
    Hello,
    RecordEvent,
    SessionMachine,
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


def test_the_table_in_the_theory_of_operation_is_the_table() -> None:
    doc = _state.__doc__ or ""
    rows = doc[doc.index("op              IDLE") :].split("\n")[2:]
    documented = {}
    for row in rows[: len(SessionOp)]:
        op, *outcomes = row.split()
        for state, outcome in zip(SessionState, outcomes, strict=True):
            documented[(state, SessionOp[op])] = outcome
    for (state, op), rule in SESSION_RULES.items():
        if isinstance(rule, SessionState):
            expected = "-" if rule is state else rule.name
        else:
            expected = "failure" if rule is ErrorCode.WRITE_FAILED else rule.value
        assert documented[(state, op)] == expected, (state, op)


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


# --------------------------------------------------------------- the session machine


def test_a_machine_runs_the_table() -> None:
    machine: SessionMachine[FlightlogError] = SessionMachine()
    machine.begin_run("r1")
    assert (machine.state, machine.run_id) == (SessionState.RUN_OPEN, "r1")
    machine.check(SessionOp.RECORD, "r1")
    with pytest.raises(LocalProtocolError) as stale:
        machine.check(SessionOp.RECORD, "r0")
    assert stale.value.code == ErrorCode.RUN_NOT_OPEN
    assert "run r0 is not open" in stale.value.message
    with pytest.raises(LocalProtocolError) as twice:
        machine.begin_run("r2")
    assert twice.value.code == ErrorCode.RUN_OPEN
    assert machine.run_id == "r1"  # a refusal changes nothing
    machine.close_run("r1")
    assert (machine.state, machine.run_id) == (SessionState.IDLE, None)
    machine.begin_run("r2")
    assert machine.close() == "r2"  # left without run_close
    assert machine.state is SessionState.CLOSED
    with pytest.raises(LocalProtocolError) as closed:
        machine.check(SessionOp.SYNC)
    assert closed.value.code == ErrorCode.SESSION_CLOSED


def test_a_failure_sticks_and_the_first_one_stays() -> None:
    machine: SessionMachine[RecordingError] = SessionMachine()
    machine.begin_run("r1")
    first = RecordingError("disk full", code=ErrorCode.WRITE_FAILED)
    assert machine.fail(first)
    assert not machine.fail(RecordingError("later", code=ErrorCode.WRITE_FAILED))
    assert (machine.state, machine.failure, machine.run_id) == (SessionState.FAILED, first, "r1")
    for op in (SessionOp.BEGIN_RUN, SessionOp.RECORD, SessionOp.SYNC, SessionOp.CLOSE_RUN):
        with pytest.raises(RecordingError) as caught:
            machine.check(op, "r1")
        assert caught.value is first
    machine.check(SessionOp.LOAD_CHECKPOINT)
    assert machine.release() == "r1"
    assert (machine.state, machine.run_id) == (SessionState.FAILED, None)
    assert machine.close() is None
    assert machine.failure is first


def test_a_closed_session_takes_no_failure() -> None:
    machine: SessionMachine[FlightlogError] = SessionMachine()
    machine.close()
    assert not machine.fail(FlightlogError("late", code=ErrorCode.WRITE_FAILED))
    assert machine.state is SessionState.CLOSED and machine.failure is None


def test_a_release_leaves_the_open_run_behind() -> None:
    machine: SessionMachine[FlightlogError] = SessionMachine()
    assert machine.release() is None
    machine.begin_run("r1")
    assert machine.release() == "r1"
    assert (machine.state, machine.run_id) == (SessionState.IDLE, None)


def test_a_runs_first_refusal_is_kept_per_run() -> None:
    machine: SessionMachine[FlightlogError] = SessionMachine()
    first = FlightlogError("bad", code=ErrorCode.BAD_EVENT)
    assert machine.run_failed("r1", first)
    assert not machine.run_failed("r1", FlightlogError("worse", code=ErrorCode.BAD_EVENT))
    assert machine.run_failure("r1") is first
    assert machine.run_failure("r2") is None
    # A refusal is the run's: the session goes on.
    assert machine.state is SessionState.IDLE and machine.failure is None
    assert machine.run_failed("r2", first)
    assert machine.run_failure("r1") is None


@pytest.mark.parametrize("state", list(SessionState))
@pytest.mark.parametrize("op", list(SessionOp))
@pytest.mark.parametrize("run_id", [None, "r1", "r2"])
def test_check_agrees_with_the_table(
    state: SessionState, op: SessionOp, run_id: str | None
) -> None:
    """check() takes a short way for records; whatever it answers is the table's."""
    machine: SessionMachine[FlightlogError] = SessionMachine()
    machine.state, machine.run_id = state, "r1"
    careful: str | None = None
    try:
        session_transition(state, op)
    except LocalProtocolError as exc:
        careful = exc.code
    named = op in (SessionOp.RECORD, SessionOp.SAVE_CHECKPOINT, SessionOp.CLOSE_RUN)
    if careful is None and named and run_id is not None and run_id != "r1":
        careful = ErrorCode.RUN_NOT_OPEN
    try:
        machine.check(op, run_id)
        answered = None
    except LocalProtocolError as exc:
        answered = exc.code
    assert answered == careful
