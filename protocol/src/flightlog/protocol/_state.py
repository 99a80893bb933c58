"""The connection and session rules, in one place.

Theory of operation
-------------------

A connection starts in ``AWAIT_HELLO``.  Its first message must be :class:`Hello` with
a version the daemon speaks; the daemon answers :class:`Welcome` and the connection is
``READY``.  Anything else first, or a version the daemon does not speak, is answered
with an error and the connection is closed (``CLOSED``).  A second Hello is a bad
message.

A session has exactly one writer: the connection that created or opened it, until that
connection closes the session or disconnects.  Another connection that creates or opens
it is refused with ``session_busy``; one that sends it writes is refused with
``not_writer``.  Readers (subscribers) need no ownership.

Inside a session at most one run is open.  The session's states and what each
operation does in them are the table :data:`SESSION_RULES`: an entry is either the
next state or the error code the operation is refused with.  ``FAILED`` is the sticky
state a write or sync failure leaves behind: every later write is refused with the
same ``write_failed`` error, and closing the session reports it.  Closing a session
with its run still open leaves that run without ``run_close``, exactly as a
disconnect does: the gap stays visible.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from ._errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from ._wire import SUPPORTED_VERSIONS, ClientMessage, Hello, Message

__all__ = [
    "CONNECTION_RULES",
    "SESSION_RULES",
    "ConnectionState",
    "SessionOp",
    "SessionState",
    "check_hello",
    "connection_transition",
    "session_transition",
]


class ConnectionState(Enum):
    AWAIT_HELLO = "await_hello"
    READY = "ready"
    CLOSED = "closed"


class SessionState(Enum):
    IDLE = "idle"  # no run open
    RUN_OPEN = "run_open"
    FAILED = "failed"  # sticky write error
    CLOSED = "closed"


class SessionOp(Enum):
    BEGIN_RUN = "begin_run"
    RECORD = "record"
    SAVE_CHECKPOINT = "save_checkpoint"
    CLOSE_RUN = "close_run"
    SYNC = "sync"
    LOAD_CHECKPOINT = "load_checkpoint"
    CLOSE_SESSION = "close_session"


_S = SessionState
_O = SessionOp
_E = ErrorCode

#: (state, operation) -> next state, or the code the operation is refused with.
SESSION_RULES: Final[dict[tuple[SessionState, SessionOp], SessionState | ErrorCode]] = {
    (_S.IDLE, _O.BEGIN_RUN): _S.RUN_OPEN,
    (_S.IDLE, _O.RECORD): _E.RUN_NOT_OPEN,
    (_S.IDLE, _O.SAVE_CHECKPOINT): _E.RUN_NOT_OPEN,
    (_S.IDLE, _O.CLOSE_RUN): _E.RUN_NOT_OPEN,
    (_S.IDLE, _O.SYNC): _S.IDLE,
    (_S.IDLE, _O.LOAD_CHECKPOINT): _S.IDLE,
    (_S.IDLE, _O.CLOSE_SESSION): _S.CLOSED,
    (_S.RUN_OPEN, _O.BEGIN_RUN): _E.RUN_OPEN,
    (_S.RUN_OPEN, _O.RECORD): _S.RUN_OPEN,
    (_S.RUN_OPEN, _O.SAVE_CHECKPOINT): _S.RUN_OPEN,
    (_S.RUN_OPEN, _O.CLOSE_RUN): _S.IDLE,
    (_S.RUN_OPEN, _O.SYNC): _S.RUN_OPEN,
    (_S.RUN_OPEN, _O.LOAD_CHECKPOINT): _S.RUN_OPEN,
    (_S.RUN_OPEN, _O.CLOSE_SESSION): _S.CLOSED,
    (_S.FAILED, _O.BEGIN_RUN): _E.WRITE_FAILED,
    (_S.FAILED, _O.RECORD): _E.WRITE_FAILED,
    (_S.FAILED, _O.SAVE_CHECKPOINT): _E.WRITE_FAILED,
    (_S.FAILED, _O.CLOSE_RUN): _E.WRITE_FAILED,
    (_S.FAILED, _O.SYNC): _E.WRITE_FAILED,
    (_S.FAILED, _O.LOAD_CHECKPOINT): _S.FAILED,
    (_S.FAILED, _O.CLOSE_SESSION): _S.CLOSED,
}
for _state in _S:
    for _op in _O:
        SESSION_RULES.setdefault((_state, _op), _E.SESSION_CLOSED)

_REFUSALS: Final = {
    _E.RUN_NOT_OPEN: "no run is open in this session; call begin_run first",
    _E.RUN_OPEN: "a run is already open in this session; close it before beginning another",
    _E.WRITE_FAILED: "an earlier write to this session failed; the session takes no more",
    _E.SESSION_CLOSED: "the session is closed",
}


def session_transition(state: SessionState, op: SessionOp) -> SessionState:
    """The state after ``op``; raises :class:`LocalProtocolError` with the refusal code."""
    outcome = SESSION_RULES[(state, op)]
    if isinstance(outcome, SessionState):
        return outcome
    raise LocalProtocolError(f"{op.value} refused: {_REFUSALS[outcome]}", code=outcome)


#: state -> the message types accepted in it (any other is refused with the code).
CONNECTION_RULES: Final[dict[ConnectionState, tuple[tuple[type[Message], ...], ErrorCode]]] = {
    ConnectionState.AWAIT_HELLO: ((Hello,), ErrorCode.HELLO_REQUIRED),
    ConnectionState.READY: (
        tuple(t for t in ClientMessage.__args__ if t is not Hello),
        ErrorCode.BAD_MESSAGE,
    ),
    ConnectionState.CLOSED: ((), ErrorCode.BAD_MESSAGE),
}


def check_hello(hello: Hello) -> None:
    """Raises :class:`RemoteProtocolError` (``unsupported_version``) for a foreign version."""
    if hello.version not in SUPPORTED_VERSIONS:
        spoken = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise RemoteProtocolError(
            f"protocol version {hello.version} is not supported; this daemon speaks "
            f"version {spoken}",
            code=ErrorCode.UNSUPPORTED_VERSION,
        )


def connection_transition(state: ConnectionState, message: Message) -> ConnectionState:
    """The connection state after the daemon receives ``message``.

    Raises :class:`RemoteProtocolError` when ``message`` is not allowed in ``state``
    (``hello_required`` before the hello, ``bad_message`` for a second hello) or the
    hello names an unsupported version.
    """
    allowed, code = CONNECTION_RULES[state]
    if not isinstance(message, allowed):
        if code is ErrorCode.HELLO_REQUIRED:
            text = f"the first message must be hello, not {type(message).__name__}"
        else:
            text = f"{type(message).__name__} is not allowed on a {state.value} connection"
        raise RemoteProtocolError(text, code=code)
    if isinstance(message, Hello):
        check_hello(message)
        return ConnectionState.READY
    return state
