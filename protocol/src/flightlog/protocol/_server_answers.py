"""What a server connection sends, sans I/O: the owner's answers and the connection's
own refusals, framed and queued in order.

:class:`ServerAnswers` is the sending half of :class:`~._server.ServerConnection` (whose
module docstring says how an owner uses both): it holds the sessions the connection
writes, the subscriptions it holds and the frames queued for the client.  The
receiving half applies the rules and queues refusals through it; the owner answers
through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ._errors import ErrorCode, FlightlogError, LocalProtocolError
from ._framing import FrameEncoder
from ._server_events import ConnectionClosed, RecordLines, ServerEvent, StartRun
from ._state import SessionMachine
from ._wire import (
    ErrorReply,
    Message,
    RecordEvent,
    RecordFailed,
    SessionOpened,
    Subscribed,
    TailEnd,
)

__all__ = ["ServerAnswers"]


class ServerAnswers:
    """The sessions a connection writes, its subscriptions and what it queues for the
    client; ``refused`` hears of every refusal the connection makes itself."""

    def __init__(self, refused: Callable[[FlightlogError], None] | None) -> None:
        self._refused = refused
        self._encoder = FrameEncoder()
        self._outbox = bytearray()
        self._sessions: dict[str, SessionMachine[FlightlogError]] = {}
        self._subscriptions: set[int] = set()

    @property
    def sessions(self) -> Mapping[str, SessionMachine[FlightlogError]]:
        """The sessions this connection writes, by id."""
        return self._sessions

    # ------------------------------------------------------------------ answering

    def opened(
        self, reply: SessionOpened, session: SessionMachine[FlightlogError] | None = None
    ) -> SessionMachine[FlightlogError]:
        """Answer a Create or Open: this connection now writes the session.

        ``session`` is the session's machine when the owner keeps one across writers
        (a new one otherwise); returns the machine the connection uses.
        """
        machine = session if session is not None else SessionMachine[FlightlogError]()
        self._sessions[reply.session_id] = machine
        self._queue(reply)
        return machine

    def send(self, message: Message) -> None:
        """Queue a reply or a push (for Create and Open, use :meth:`opened`).

        Raises :class:`LocalProtocolError` for a SessionOpened.
        """
        self._outbox += self.encode(message)

    def encode(self, message: Message) -> bytes:
        """The frame of a reply or a push, for an owner that sends it itself rather
        than through the queue: the rules of :meth:`send`, nothing queued.

        Raises :class:`LocalProtocolError` for a SessionOpened.
        """
        match message:
            case SessionOpened():
                raise LocalProtocolError(
                    "a SessionOpened is sent with opened(), which makes this connection "
                    "the session's writer",
                    code=ErrorCode.BAD_MESSAGE,
                )
            case Subscribed(subscription=subscription):
                self._subscriptions.add(subscription)
            case TailEnd(subscription=subscription):
                self._subscriptions.discard(subscription)
        return self._encoder.encode(message)

    def refuse(self, event: ServerEvent, error: FlightlogError) -> None:
        """The owner cannot do what ``event`` asked: queue its refusal.

        A record's refusal is pushed (at most once per run); a refused StartRun leaves
        its run unopened.
        """
        match event:
            case (
                RecordEvent(session_id=session_id, run_id=run_id)
                | RecordLines(session_id=session_id, run_id=run_id)
            ):
                session = self._sessions.get(session_id)
                if session is None or session.run_failed(run_id, error):
                    self._push_refusal(session_id, run_id, error)
            case StartRun(request=request):
                self.run_not_opened(event)
                self._queue(_error_reply(request, error))
            case ConnectionClosed():
                pass
            case _:
                self._queue(_error_reply(event, error))

    def run_not_opened(self, start: StartRun) -> None:
        """The owner refused ``start`` and answers it itself: its run is not open, so
        the writer may begin another, and records naming it are refused."""
        session = self._sessions.get(start.request.session_id)
        if session is not None and session.run_id == start.run_id:
            session.release()

    def fail(self, session_id: str, error: FlightlogError) -> None:
        """A write or sync of the session failed: it takes no more writes.

        The failure is pushed to the client (once), for the open run if there is one.
        """
        session = self._sessions.get(session_id)
        if session is None or not session.fail(error):
            return
        if session.run_id is not None:
            session.run_failed(session.run_id, error)
        self._push_refusal(session_id, session.run_id, error)

    def data_to_send(self) -> bytes:
        """Everything queued for the client, in order; ``b""`` when nothing is."""
        if not self._outbox:
            return b""
        data = bytes(self._outbox)
        self._outbox.clear()
        return data

    def _push_refusal(self, session_id: str, run_id: str | None, error: FlightlogError) -> None:
        self._queue(
            RecordFailed(
                session_id=session_id, run_id=run_id, code=error.code, message=error.message
            )
        )

    def _note(self, refusal: FlightlogError) -> None:
        if self._refused is not None:
            self._refused(refusal)

    def _queue(self, message: Message) -> None:
        self._encoder.encode_into(message, self._outbox)


def _error_reply(message: Message, error: FlightlogError) -> ErrorReply:
    return ErrorReply(
        id=getattr(message, "id", 0),
        code=error.code,
        message=error.message,
        session_id=getattr(message, "session_id", None),
    )
