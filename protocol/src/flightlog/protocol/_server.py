"""The daemon's side of one connection, sans I/O: bytes in, events out, replies as bytes.

Theory of operation
-------------------

:class:`ServerConnection` is the server role of the wire protocol, as h11's
``Connection`` is for HTTP: it owns no socket and no storage.  Its owner feeds it
what the client sent (:meth:`~ServerConnection.receive_data`, ``b""`` at the end of
the stream), takes events from :meth:`~ServerConnection.next_event` until it returns
None (more bytes are needed), and sends what :meth:`~ServerConnection.data_to_send`
returns.

The connection applies every rule that needs no storage:

* hello first, answered here with :class:`Welcome`; a frame that is no message is
  answered with ``error`` (id 0) and skipped, and the connection hangs up after an
  oversized frame, a bad frame before the hello, or :data:`BAD_FRAMES_IN_A_ROW` of them;
* a session is written only by the connection that created or opened it, until it
  closes it: a request for any other session is refused with ``not_writer`` when
  another connection writes it (the owner's ``written_elsewhere`` says so), else with
  ``session_not_found``;
* each session's :class:`~._state.SessionMachine`: one open run, the sticky failure;
* a record names an agent fact type, an RFC 3339 UTC time and data that is one JSON
  object, and a checkpoint's snapshot is JSON, both as :func:`~._json.check_json`
  wants them (on one line, UTF-8, nested at most :data:`~._json.MAX_NESTING` deep,
  with numbers a reader reads back); with a
  ``max_line`` (the longest line the owner writes), a record's data leaves
  :data:`LINE_ENVELOPE` of it for the rest of its line, and a run's error fits in its
  ``run_close`` line;
* at most :data:`MAX_SUBSCRIPTIONS` subscriptions, and an unsubscribe names one of them.

A message that breaks a rule never reaches the owner: its refusal is queued here (an
``error`` reply; for a record, a ``record_failed`` push, at most one per run).  What
passes comes out as an event with the rules already applied: the client message
itself, a :class:`StartRun` (a ``begin_run``, with the id of the run it opened) or, last,
:class:`ConnectionClosed`.  The owner does the storage and answers: :meth:`opened` for
``create`` and ``open`` (which makes this connection the session's writer),
:meth:`send` for any other reply or push, :meth:`refuse` when it cannot do what was
asked, :meth:`fail` when a write of a session failed (which fails the session).
Everything queued leaves through :meth:`data_to_send`, in order.

An owner that writes its socket as it goes (flightlogd) may read straight into
:attr:`~ServerConnection.decoder` instead of calling :meth:`receive_data`, iterate over
:attr:`~ServerConnection.events` (the events :meth:`next_event` returns, without a call
per record) until it gives None, send what :meth:`~ServerConnection.encode` returns
instead of queueing with :meth:`send`, and end the connection itself with
:meth:`~ServerConnection.close`.  Such an owner may also take the JSON checks of
payloads longer than ``check_inline`` bytes off its event loop: those come out
unchecked, and the owner applies :func:`~._json.check_json` to them (in a worker thread)
and refuses with :meth:`refuse` what fails it.

An owner that writes lines with :class:`~._records.LineEncoder` may ask for
``record_lines``: then, when the C accelerator is built (:mod:`._accel`), the records
it certainly lets through come out as :class:`RecordLines`, one per stretch of
records of one session in the bytes read, instead of one :class:`RecordEvent` each:
one C call walks the buffered frames, applies the rules above and makes each record's
line but its seq.  It takes nothing it is not sure of; the first frame it does not
take, and what follows, goes the Python way, which alone refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

import msgspec

from ._accel import take_records
from ._errors import ErrorCode, FlightlogError, LocalProtocolError, RemoteProtocolError
from ._framing import FrameDecoder, server_decoder
from ._json import MAX_NESTING, check_json
from ._lines import MAX_LINE_BYTES
from ._records import AGENT_FACT_TYPES, check_event_id, is_session_id, is_time, new_id
from ._server_answers import ServerAnswers, _error_reply
from ._server_events import ConnectionClosed, RecordLines, ServerEvent, StartRun
from ._state import (
    ConnectionState,
    SessionMachine,
    SessionOp,
    SessionState,
    connection_transition,
)
from ._wire import (
    DEFAULT_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    ErrorReply,
    Hello,
    LoadBlob,
    LoadCheckpoint,
    Message,
    Open,
    RecordEvent,
    SaveCheckpoint,
    Status,
    Subscribe,
    Sync,
    Unsubscribe,
    Welcome,
)

__all__ = [
    "BAD_FRAMES_IN_A_ROW",
    "LINE_ENVELOPE",
    "MAX_SUBSCRIPTIONS",
    "ServerConnection",
    "line_bound",
]

#: Subscriptions one connection may hold at once.
MAX_SUBSCRIPTIONS: Final = 1024
#: Frames in a row that are no message, after which the connection hangs up: a peer
#: that sends only garbage does not speak the protocol.
BAD_FRAMES_IN_A_ROW: Final = 8

#: What a line may add to a record's data: its envelope.
LINE_ENVELOPE: Final = 64 * 1024
#: A run_close line beside its error, session id, run id and time (its keys, type,
#: version and seq), with room to spare.
_RUN_CLOSE_LINE: Final = 256
_encode_json = msgspec.json.Encoder().encode

# Plain globals for the path of every record: reading a member through its Enum class
# costs a lookup in the metaclass.
_READY: Final = ConnectionState.READY
_CLOSED: Final = ConnectionState.CLOSED
_RECORD: Final = SessionOp.RECORD
_RUN_OPEN: Final = SessionState.RUN_OPEN


class ServerConnection(ServerAnswers):
    """One client connection as the daemon sees it; see the module docstring.

    ``max_frame_size``, ``pid`` and ``server`` are announced in the Welcome;
    ``versions`` are the protocol versions spoken; ``written_elsewhere`` tells whether
    another connection writes a session (by id), to refuse its writes as ``not_writer``;
    ``refused`` hears of every refusal the connection makes itself (a record's, once
    per run), for the owner's log; ``max_line`` bounds the lines written; payloads
    longer than ``check_inline`` are left for the owner to check (see the module
    docstring); ``hello_frame_size`` bounds the frames read before the hello;
    ``ring`` is called for a hello that asks for a ring and returns the size of the
    one the owner made to pass with the Welcome (0: none, the socket goes on);
    ``record_lines`` asks for :class:`RecordLines` (see the module docstring);
    ``frames_per_turn`` bounds the frames taken the Python way (each decoded and
    checked alone, refused ones included) between two Nones of :attr:`events`: past
    it the events give None early, with :attr:`more` true, so that an owner serving
    many connections on one loop may let the others run before it asks again.
    """

    def __init__(
        self,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        pid: int = 0,
        server: str = "",
        versions: tuple[int, ...] = SUPPORTED_VERSIONS,
        written_elsewhere: Callable[[str], bool] | None = None,
        refused: Callable[[FlightlogError], None] | None = None,
        max_line: int | None = None,
        check_inline: int | None = None,
        hello_frame_size: int | None = None,
        ring: Callable[[], int] | None = None,
        record_lines: bool = False,
        frames_per_turn: int | None = None,
    ) -> None:
        self.max_frame_size = max_frame_size
        self.max_line = max_line
        #: The longest record data: the payload of the largest frame when no line
        #: bound is given.
        self.max_data = max_frame_size if max_line is None else max_line - LINE_ENVELOPE
        self.check_inline = max_frame_size if check_inline is None else check_inline
        self.pid = pid
        self.server = server
        self.versions = versions
        self.state = ConnectionState.AWAIT_HELLO
        #: The client's name and pid, from its hello.
        self.client = ""
        self.client_pid = 0
        super().__init__(refused)
        self._written_elsewhere = written_elsewhere
        self._ring = ring
        # Until the hello, frames may be held smaller: a client that has not said who
        # it is cannot make the server hold a large one.
        self._decoder = server_decoder(min(max_frame_size, hello_frame_size or max_frame_size))
        self._bad_frames = 0
        self._ended = False
        self._closed_reported = False
        self._take = take_records if record_lines else None
        self._frames_per_turn = frames_per_turn
        #: The last None of :attr:`events` came early (``frames_per_turn``): frames
        #: read are still waiting, and come with the next events, without new bytes.
        self.more = False
        #: The events, as :meth:`next_event` returns them: an owner may iterate over it
        #: until it gives None (more bytes are needed), and again once they came.
        self.events: Iterator[ServerEvent | None] = self._events()

    @property
    def decoder(self) -> FrameDecoder[Message]:
        """The frame decoder :meth:`receive_data` feeds, for an owner that reads into it
        directly (then ``receive_data(b"")`` still says the stream ended)."""
        return self._decoder

    # ------------------------------------------------------------------ receiving

    def receive_data(self, data: bytes) -> None:
        """Bytes the client sent; ``b""`` when it ended the stream."""
        if not data:
            self._ended = True
        elif self.state is not ConnectionState.CLOSED:
            self._decoder.feed(data)

    def next_event(self) -> ServerEvent | None:
        """The next event for the owner, or None when more bytes are needed.

        Refusals are queued on the way, never returned.  :class:`ConnectionClosed` is
        returned once, after which there are no more events.
        """
        return next(self.events)

    def _events(self) -> Iterator[ServerEvent | None]:
        # One generator for the connection's life: the record path resumes it with its
        # names at hand instead of making a call that looks them up again.
        next_message, sessions, facts = self._decoder.next_message, self._sessions, AGENT_FACT_TYPES
        max_data, inline = self.max_data, self.check_inline
        decoder, take, taken = self._decoder, self._take, min(max_data, inline)
        turn = self._frames_per_turn
        frames = 0
        while True:
            if turn is not None:
                frames += 1
                if frames > turn:
                    frames = 0
                    self.more = True
                    yield None
                    self.more = False
            if self.state is _CLOSED:
                yield None if self._closed_reported else self._hang_up()
                continue
            if take is not None and sessions and self.state is _READY:
                # The C walk over the frames read: what it is sure of, in stretches.
                buf, pos = decoder.pending()
                pos, stretches = take(
                    buf,
                    pos,
                    decoder.max_frame_size,
                    sessions,
                    _RUN_OPEN,
                    facts,
                    taken,
                    MAX_NESTING,
                    RecordLines,
                )
                if stretches:
                    decoder.consumed(pos)
                    self._bad_frames = 0
                    for lines in stretches:
                        if self._closed_reported:
                            break  # the owner closed the connection meanwhile
                        yield lines
                    continue
            try:
                message = next_message()
            except RemoteProtocolError as bad:
                if self._bad_frame(bad):
                    yield self._hang_up()
                continue
            if message is None:
                frames = 0
                yield self._hang_up() if self._ended else None
                continue
            if self._bad_frames:
                self._bad_frames = 0
            if message.__class__ is RecordEvent:
                # Every record takes this way: the checks of _record, inline.  A
                # connection writes sessions only once it is ready.
                session = sessions.get(message.session_id)
                if (
                    session is not None
                    and session.state is _RUN_OPEN
                    and message.run_id == session.run_id
                    and message.event_type in facts
                    and is_time(message.time)
                    and message.data[:1] == b"{"
                    and len(message.data) <= max_data
                    and message.event_id is None
                ):
                    if len(message.data) <= inline:
                        try:
                            check_json(message.data, "record data")
                        except LocalProtocolError as exc:
                            self._refuse_record(session, message, exc)
                            continue
                    yield message
                    continue
                event: ServerEvent | None = self._record(message)
            else:
                event = self._request(message)
            if event is not None:
                yield event

    def _bad_frame(self, bad: RemoteProtocolError) -> bool:
        """Answer a frame that is no message; whether the connection must hang up."""
        self._bad_frames += 1
        self._note(bad)
        text = bad.message
        if self._bad_frames >= BAD_FRAMES_IN_A_ROW:
            text += f"; {self._bad_frames} frames in a row were no message: closing"
        self._queue(ErrorReply(id=0, code=bad.code, message=text))
        # Nothing can be read after an oversized frame; and bytes that are no message
        # before the hello, or frame after frame of them, mean the peer does not speak
        # this protocol.
        return (
            bad.code == ErrorCode.FRAME_TOO_LARGE
            or self.state is ConnectionState.AWAIT_HELLO
            or self._bad_frames >= BAD_FRAMES_IN_A_ROW
        )

    def _hang_up(self) -> ConnectionClosed:
        self.state = ConnectionState.CLOSED
        self._closed_reported = True
        released = {sid: session.release() for sid, session in self._sessions.items()}
        self._sessions.clear()
        return ConnectionClosed(released=released)

    def _record(self, message: RecordEvent) -> RecordEvent | None:
        if self.state is not _READY:
            self._request(message)  # refused by the connection rules
            return None
        try:
            session = self._written(message.session_id)
        except FlightlogError as exc:
            self._note(exc)
            self._push_refusal(message.session_id, message.run_id, exc)
            return None
        try:
            session.check(_RECORD, message.run_id)
            if message.event_type not in AGENT_FACT_TYPES:
                raise LocalProtocolError(
                    f"{message.event_type[:40]!r} is not an agent fact type that may be recorded",
                    code=ErrorCode.BAD_EVENT,
                )
            _check_time(message.time)
            data = message.data
            if data[:1] != b"{":
                raise LocalProtocolError(
                    "record data must be one JSON object on one line", code=ErrorCode.BAD_EVENT
                )
            if len(data) > self.max_data:
                raise LocalProtocolError(
                    f"record data of {len(data)} bytes is more than the {self.max_data} "
                    "that fit in a line readers of session files read",
                    code=ErrorCode.BAD_EVENT,
                )
            if len(data) <= self.check_inline:
                check_json(data, "record data")
            if message.event_id is not None:
                check_event_id(message.event_id)
        except FlightlogError as exc:
            self._refuse_record(session, message, exc)
            return None
        return message

    def _refuse_record(
        self, session: SessionMachine[FlightlogError], message: RecordEvent, exc: FlightlogError
    ) -> None:
        if session.run_failed(message.run_id, exc):
            self._note(exc)
            self._push_refusal(message.session_id, message.run_id, exc)

    def _request(self, message: Message) -> ServerEvent | None:
        try:
            self.state = connection_transition(self.state, message, self.versions)
        except RemoteProtocolError as exc:
            self._note(exc)
            self._queue(
                ErrorReply(id=getattr(message, "id", 0), code=exc.code, message=exc.message)
            )
            if self.state is ConnectionState.AWAIT_HELLO:
                self.state = ConnectionState.CLOSED
            return None
        try:
            return self._accept(message)
        except FlightlogError as exc:
            self._note(exc)
            self._queue(_error_reply(message, exc))
            return None

    def _accept(self, message: Message) -> ServerEvent | None:
        """Apply the rules to a request the connection state allows; raises its refusal."""
        match message:
            case Hello(id=request_id, client=client, pid=pid):
                self.client, self.client_pid = client[:200], pid
                self._decoder.max_frame_size = self.max_frame_size
                ring = self._ring() if message.ring and self._ring is not None else 0
                self._queue(
                    Welcome(
                        id=request_id,
                        version=PROTOCOL_VERSION,
                        max_frame_size=self.max_frame_size,
                        daemon_pid=self.pid,
                        server=self.server,
                        ring=ring,
                    )
                )
                return None
            case BeginRun(session_id=session_id, time=time):
                session = self._written(session_id)
                session.check(SessionOp.BEGIN_RUN)
                _check_time(time)
                # A resumed run keeps its id; whether it may be resumed, storage knows.
                run_id = message.resume or _chosen_run_id(message.run_id)
                session.begin_run(run_id)
                return StartRun(message, run_id)
            case SaveCheckpoint(session_id=session_id, run_id=run_id, time=time):
                self._written(session_id).check(SessionOp.SAVE_CHECKPOINT, run_id)
                _check_time(time)
                if len(message.snapshot) <= self.check_inline:
                    check_json(message.snapshot, "checkpoint snapshot")
                return message
            case CloseRun(session_id=session_id, run_id=run_id, time=time, error=error):
                session = self._written(session_id)
                session.check(SessionOp.CLOSE_RUN, run_id)
                _check_time(time)
                if error is not None and self.max_line is not None:
                    self._check_run_close(message, error, self.max_line)
                session.close_run(run_id)
                return message
            case Sync(session_id=session_id):
                self._written(session_id).check(SessionOp.SYNC)
                return message
            case LoadCheckpoint(session_id=session_id):
                self._written(session_id).check(SessionOp.LOAD_CHECKPOINT)
                return message
            case CloseSession(session_id=session_id):
                self._written(session_id).close()
                del self._sessions[session_id]
                return message
            case Subscribe():
                if len(self._subscriptions) >= MAX_SUBSCRIPTIONS:
                    raise LocalProtocolError(
                        f"this connection holds {MAX_SUBSCRIPTIONS} subscriptions, the most "
                        "it may; unsubscribe first",
                        code=ErrorCode.TOO_MANY,
                    )
                return message
            case Unsubscribe(subscription=subscription):
                if subscription not in self._subscriptions:
                    raise LocalProtocolError(
                        f"no subscription {subscription} on this connection",
                        code=ErrorCode.SUBSCRIPTION_NOT_FOUND,
                    )
                return message
            case Create() | Open() | Status() | LoadBlob():
                return message
        raise LocalProtocolError(  # pragma: no cover - the connection rules admit no other
            f"unexpected {type(message).__name__}", code=ErrorCode.BAD_MESSAGE
        )

    def _check_run_close(self, message: CloseRun, error: str, max_line: int) -> None:
        # A run's error is escaped into its run_close line, which must stay one that
        # readers read; refused with the run still open.  A character takes six bytes
        # at most (``\u0001``).
        envelope = _RUN_CLOSE_LINE + len(message.session_id) + len(message.run_id)
        envelope += len(message.time)
        if 6 * len(error) + envelope > max_line:
            size = len(_encode_json(error)) + envelope
            if size > max_line:
                raise LocalProtocolError(
                    f"the run's error would make a run_close line of {size} bytes, more "
                    f"than the {max_line} that readers of session files read",
                    code=ErrorCode.BAD_EVENT,
                )

    def _written(self, session_id: str) -> SessionMachine[FlightlogError]:
        session = self._sessions.get(session_id)
        if session is not None:
            return session
        if self._written_elsewhere is not None and self._written_elsewhere(session_id):
            raise LocalProtocolError(
                f"session {session_id[:32]} is written by another connection",
                code=ErrorCode.NOT_WRITER,
            )
        raise LocalProtocolError(
            f"session {session_id[:32]} is not open on this connection; create or open it",
            code=ErrorCode.SESSION_NOT_FOUND,
        )

    def close(self) -> ConnectionClosed | None:
        """End the connection now, whatever the client sent after what was taken: the
        :class:`ConnectionClosed` that :meth:`next_event` would have returned last, or
        None when it already did."""
        if self._closed_reported:
            return None
        return self._hang_up()


def line_bound(max_frame_size: int) -> int:
    """The longest line a server whose clients send frames of up to ``max_frame_size``
    bytes writes (its ``max_line``): a maximum frame's payload with its envelope, and
    never more than every reader of session files reads (``MAX_LINE_BYTES``)."""
    return min(max_frame_size + LINE_ENVELOPE, MAX_LINE_BYTES)


def _chosen_run_id(run_id: str | None) -> str:
    """The client's id for a new run, or a fresh one."""
    if run_id is None:
        return new_id()
    if not is_session_id(run_id):
        raise LocalProtocolError(
            f"run id {run_id[:40]!r} is not 32 lowercase hex digits", code=ErrorCode.BAD_MESSAGE
        )
    return run_id


def _check_time(time: str) -> None:
    if not is_time(time):
        raise LocalProtocolError(
            f"time {time[:40]!r} is not RFC 3339 UTC (2026-11-29T20:00:00.000000Z)",
            code=ErrorCode.BAD_EVENT,
        )
