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

Inside a session at most one run is open.  One :class:`SessionMachine` per session
holds what the rules need: the state, the open run's id and the sticky failure.  The
daemon's side keeps one per session it holds, the client one per session it writes;
both apply the same table, :data:`SESSION_RULES`: for each state and operation, either
the next state or the error code the operation is refused with.

``FAILED`` is the sticky state a write or sync failure leaves behind: every later write
is refused with the error that failed the session (the first one: later ones do not
replace it), loading a checkpoint still works, and closing the session reports it.
A refused record does not fail the session: its error is the run's (the daemon pushes
the first one per run, the client raises it from every later write of that run).
Closing a session with its run still open, or its writer going away (``RELEASE``),
leaves that run without ``run_close``: the gap stays visible.

State table (a state is the next one, ``-`` keeps the state, anything else is the
code of the refusal; ``failure`` is the session's own error.  ``RECORD``,
``SAVE_CHECKPOINT`` and ``CLOSE_RUN`` also name a run, which must be the open one):

=============== ============== ========== ========= ================
op              IDLE           RUN_OPEN   FAILED    CLOSED
=============== ============== ========== ========= ================
BEGIN_RUN       RUN_OPEN       run_open   failure   session_closed
RECORD          run_not_open   -          failure   session_closed
SAVE_CHECKPOINT run_not_open   -          failure   session_closed
CLOSE_RUN       run_not_open   IDLE       failure   session_closed
SYNC            -              -          failure   session_closed
LOAD_CHECKPOINT -              -          -         session_closed
CLOSE_SESSION   CLOSED         CLOSED     CLOSED    session_closed
RELEASE         -              IDLE       -         -
=============== ============== ========== ========= ================
"""

from __future__ import annotations

from enum import Enum
from typing import Final, Generic, TypeVar

from ._errors import ErrorCode, FlightlogError, LocalProtocolError, RemoteProtocolError
from ._wire import SUPPORTED_VERSIONS, ClientMessage, Hello, Message

__all__ = [
    "CONNECTION_RULES",
    "SESSION_RULES",
    "ConnectionState",
    "SessionMachine",
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
    RELEASE = "release"  # the writer went away without closing the session


_S = SessionState
_O = SessionOp
_E = ErrorCode

#: (state, operation) -> next state, or the code the operation is refused with.
#: ``write_failed`` in ``FAILED`` stands for the session's own failure, which is raised.
SESSION_RULES: Final[dict[tuple[SessionState, SessionOp], SessionState | ErrorCode]] = {
    (_S.IDLE, _O.BEGIN_RUN): _S.RUN_OPEN,
    (_S.IDLE, _O.RECORD): _E.RUN_NOT_OPEN,
    (_S.IDLE, _O.SAVE_CHECKPOINT): _E.RUN_NOT_OPEN,
    (_S.IDLE, _O.CLOSE_RUN): _E.RUN_NOT_OPEN,
    (_S.IDLE, _O.SYNC): _S.IDLE,
    (_S.IDLE, _O.LOAD_CHECKPOINT): _S.IDLE,
    (_S.IDLE, _O.CLOSE_SESSION): _S.CLOSED,
    (_S.IDLE, _O.RELEASE): _S.IDLE,
    (_S.RUN_OPEN, _O.BEGIN_RUN): _E.RUN_OPEN,
    (_S.RUN_OPEN, _O.RECORD): _S.RUN_OPEN,
    (_S.RUN_OPEN, _O.SAVE_CHECKPOINT): _S.RUN_OPEN,
    (_S.RUN_OPEN, _O.CLOSE_RUN): _S.IDLE,
    (_S.RUN_OPEN, _O.SYNC): _S.RUN_OPEN,
    (_S.RUN_OPEN, _O.LOAD_CHECKPOINT): _S.RUN_OPEN,
    (_S.RUN_OPEN, _O.CLOSE_SESSION): _S.CLOSED,
    (_S.RUN_OPEN, _O.RELEASE): _S.IDLE,
    (_S.FAILED, _O.BEGIN_RUN): _E.WRITE_FAILED,
    (_S.FAILED, _O.RECORD): _E.WRITE_FAILED,
    (_S.FAILED, _O.SAVE_CHECKPOINT): _E.WRITE_FAILED,
    (_S.FAILED, _O.CLOSE_RUN): _E.WRITE_FAILED,
    (_S.FAILED, _O.SYNC): _E.WRITE_FAILED,
    (_S.FAILED, _O.LOAD_CHECKPOINT): _S.FAILED,
    (_S.FAILED, _O.CLOSE_SESSION): _S.CLOSED,
    (_S.FAILED, _O.RELEASE): _S.FAILED,
    (_S.CLOSED, _O.RELEASE): _S.CLOSED,
}
for _state in _S:
    for _op in _O:
        SESSION_RULES.setdefault((_state, _op), _E.SESSION_CLOSED)

#: The operations that name a run, which must be the open one.
_RUN_OPS: Final = frozenset({_O.RECORD, _O.SAVE_CHECKPOINT, _O.CLOSE_RUN})
# Plain globals: reading a member through its Enum class costs a lookup in the metaclass.
_RECORD: Final = _O.RECORD
_RUN_OPEN: Final = _S.RUN_OPEN

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


E = TypeVar("E", bound=FlightlogError)


class SessionMachine(Generic[E]):
    """One session's rules: its state, its open run and its sticky failure.

    Each operation checks the table and changes the state, or raises the refusal and
    changes nothing: :class:`LocalProtocolError` with the table's code, or the
    session's own failure once it failed.  :meth:`check` only checks, for a side
    that applies the change later (the client, once the reply is in).  ``E`` is the
    kind of error a side keeps as failures (the SDK's are :class:`RecordingError`).
    """

    __slots__ = ("_run_error", "failed_run", "failure", "run_id", "state")

    def __init__(self) -> None:
        self.state = SessionState.IDLE
        #: The open run; kept by a failure (the run is then neither open nor closed).
        self.run_id: str | None = None
        #: The error that failed the session, once it failed.
        self.failure: E | None = None
        #: The last run a record of which was refused, and that refusal (the first).
        self.failed_run: str | None = None
        self._run_error: E | None = None

    def check(self, op: SessionOp, run_id: str | None = None) -> None:
        """Raise the refusal of ``op`` (naming ``run_id``, for a run's operation)."""
        if op is _RECORD and self.state is _RUN_OPEN and run_id == self.run_id:
            return  # every record takes this way: spare it the table's enum hashing
        outcome = SESSION_RULES[(self.state, op)]
        if not isinstance(outcome, SessionState):
            if self.failure is not None and self.state is SessionState.FAILED:
                raise self.failure
            session_transition(self.state, op)
        if run_id is not None and op in _RUN_OPS and run_id != self.run_id:
            raise LocalProtocolError(
                f"{op.value} refused: run {run_id[:40]} is not open in this session",
                code=ErrorCode.RUN_NOT_OPEN,
            )

    def begin_run(self, run_id: str) -> None:
        """Open the run ``run_id``."""
        self.check(SessionOp.BEGIN_RUN)
        self.state, self.run_id = SessionState.RUN_OPEN, run_id

    def close_run(self, run_id: str) -> None:
        """Close the open run, which must be ``run_id``."""
        self.check(SessionOp.CLOSE_RUN, run_id)
        self.state, self.run_id = SessionState.IDLE, None

    def close(self) -> str | None:
        """Close the session; returns the run left open (without ``run_close``)."""
        self.check(SessionOp.CLOSE_SESSION)
        run_id, self.state, self.run_id = self.run_id, SessionState.CLOSED, None
        return run_id

    def release(self) -> str | None:
        """The writer went away; returns the run it left open (without ``run_close``)."""
        self.state = session_transition(self.state, SessionOp.RELEASE)
        run_id, self.run_id = self.run_id, None
        return run_id

    def fail(self, error: E) -> bool:
        """A write or sync failed: the session refuses every later write with ``error``.

        Returns whether ``error`` is the session's failure now (False when an earlier
        one stays, or the session is closed).
        """
        if self.failure is not None or self.state is SessionState.CLOSED:
            return False
        self.failure, self.state = error, SessionState.FAILED
        return True

    def run_failed(self, run_id: str, error: E) -> bool:
        """A record of ``run_id`` was refused; returns whether it is that run's first."""
        if self.failed_run == run_id:
            return False
        self.failed_run, self._run_error = run_id, error
        return True

    def run_failure(self, run_id: str) -> E | None:
        """The first refusal of a record of ``run_id``, if it is the last run refused."""
        return self._run_error if self.failed_run == run_id else None

    def __repr__(self) -> str:
        return f"SessionMachine({self.state.value}, run_id={self.run_id!r})"


#: state -> the message types accepted in it (any other is refused with the code).
CONNECTION_RULES: Final[dict[ConnectionState, tuple[tuple[type[Message], ...], ErrorCode]]] = {
    ConnectionState.AWAIT_HELLO: ((Hello,), ErrorCode.HELLO_REQUIRED),
    ConnectionState.READY: (
        tuple(t for t in ClientMessage.__args__ if t is not Hello),
        ErrorCode.BAD_MESSAGE,
    ),
    ConnectionState.CLOSED: ((), ErrorCode.BAD_MESSAGE),
}


def check_hello(hello: Hello, versions: tuple[int, ...] = SUPPORTED_VERSIONS) -> None:
    """Raises :class:`RemoteProtocolError` (``unsupported_version``) for a version not
    in ``versions``."""
    if hello.version not in versions:
        spoken = ", ".join(str(v) for v in versions)
        raise RemoteProtocolError(
            f"protocol version {hello.version} is not supported; this daemon speaks "
            f"version {spoken}",
            code=ErrorCode.UNSUPPORTED_VERSION,
        )


def connection_transition(
    state: ConnectionState, message: Message, versions: tuple[int, ...] = SUPPORTED_VERSIONS
) -> ConnectionState:
    """The connection state after the daemon receives ``message``.

    Raises :class:`RemoteProtocolError` when ``message`` is not allowed in ``state``
    (``hello_required`` before the hello, ``bad_message`` for a second hello) or the
    hello names a version not in ``versions``.
    """
    allowed, code = CONNECTION_RULES[state]
    if not isinstance(message, allowed):
        if code is ErrorCode.HELLO_REQUIRED:
            text = f"the first message must be hello, not {type(message).__name__}"
        else:
            text = f"{type(message).__name__} is not allowed on a {state.value} connection"
        raise RemoteProtocolError(text, code=code)
    if isinstance(message, Hello):
        check_hello(message, versions)
        return ConnectionState.READY
    return state
