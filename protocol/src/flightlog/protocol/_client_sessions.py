"""The sessions a client writes, sans I/O: their machines and sticky errors (see
:mod:`._client`).

:class:`ClientSessions` is the part of :class:`~._client.ClientConnection` that keeps
the rules: a :class:`~._state.SessionMachine` for each session the client writes (the
daemon's rules, so that a mistake is refused before it is sent), the errors the daemon
pushed or refused with, which stick to a run or to its session, and the connection's
failure, which every check raises first.  The connection adds the requests, the
pushes and the reconnects; its replay log and tail router never see these.
"""

from __future__ import annotations

from ._errors import DaemonError, ErrorCode, FlightlogError, RecordingError
from ._pending import sticky_of
from ._state import SessionMachine, SessionOp, SessionState
from ._wire import ErrorReply

__all__ = ["ClientSessions"]


class ClientSessions:
    """The session machines of the sessions a client writes, their sticky errors, and
    the connection's failure."""

    def __init__(self) -> None:
        self._sessions: dict[str, SessionMachine[RecordingError]] = {}
        self._failure: FlightlogError | None = None

    @property
    def failure(self) -> FlightlogError | None:
        """Why the connection cannot be used any more, or None while it can."""
        return self._failure

    def connection_lost(self, error: FlightlogError) -> None:
        """Fail the connection: every wait and every later request raises ``error``."""
        if self._failure is None:
            self._failure = error

    def refuse_run(self, session_id: str, run_id: str, error: RecordingError) -> None:
        """An event of the run was refused here (the codec could not encode it): the
        run's error is sticky, as one the daemon pushed: every later write of the run
        raises it, and ``run_close`` carries it."""
        self._stick(session_id, run_id, error)

    def sticky_error(self, session_id: str, run_id: str | None) -> RecordingError | None:
        """The error pushed for this run, else the session's failure, else None."""
        return sticky_of(self._sessions.get(session_id), run_id)

    def session_state(self, session_id: str) -> SessionMachine[RecordingError] | None:
        """The rules and sticky errors of a session this client writes (None when it
        does not), which outlive its closing: a run keeps its own."""
        return self._sessions.get(session_id)

    def _refusal(self, reply: ErrorReply, session_id: str | None) -> FlightlogError:
        """The error a refusal raises; ``write_failed`` also fails its session."""
        session_id = reply.session_id or session_id
        if reply.code == ErrorCode.WRITE_FAILED:
            error = RecordingError(reply.message, code=reply.code)
            if session_id is not None:
                self._stick(session_id, None, error)
                # The first failure explains the rest (the daemon pushed it before this).
                return self.sticky_error(session_id, None) or error
            return error
        return DaemonError(reply.message, code=reply.code, session_id=session_id)

    def _stick(self, session_id: str, run_id: str | None, error: RecordingError) -> None:
        session = self._sessions.get(session_id)
        if session is None:
            return  # not a session this client writes (any more)
        # The first error is the one that explains the rest: later ones do not replace it.
        if run_id is None or error.code == ErrorCode.WRITE_FAILED:
            session.fail(error)
        else:
            session.run_failed(run_id, error)

    def _check(self, session_id: str, run_id: str | None, op: SessionOp) -> None:
        """Raise the connection's failure, the run's sticky error or the local refusal
        of ``op``."""
        if self._failure is not None:
            raise self._failure
        session = self._sessions.get(session_id)
        if session is None:
            session = SessionMachine()
            session.state = SessionState.CLOSED
        if run_id is not None and (sticky := session.run_failure(run_id)) is not None:
            raise sticky
        session.check(op, run_id)
