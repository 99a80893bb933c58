"""The exceptions of flightlog, split by who is wrong.

* :class:`LocalProtocolError`: the caller built something invalid (an event the codec
  cannot encode, a message sent in the wrong state).
* :class:`RemoteProtocolError`: the peer sent bytes that break the protocol.
* :class:`FileFormatError`: a session file breaks the reading rules.
* :class:`RecordingError`: recording failed; raised by the SDK and carried by the daemon.
* :class:`ConnectionLost`: the connection to the daemon broke while in use.
* :class:`DaemonError`: the daemon refused a request; ``code`` says why.

Every error has a stable machine-readable ``code`` (see :class:`ErrorCode`) and a
sentence a person can act on.  msgspec's own exceptions never leave this package.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ConnectionLost",
    "DaemonError",
    "ErrorCode",
    "FileFormatError",
    "FlightlogError",
    "LocalProtocolError",
    "RecordingError",
    "RemoteProtocolError",
]


class ErrorCode(StrEnum):
    """Stable machine-readable error codes, shared by the wire protocol and the SDK."""

    BAD_MESSAGE = "bad_message"
    FRAME_TOO_LARGE = "frame_too_large"
    UNSUPPORTED_VERSION = "unsupported_version"
    HELLO_REQUIRED = "hello_required"
    PATH_REFUSED = "path_refused"
    SESSION_EXISTS = "session_exists"
    SESSION_NOT_FOUND = "session_not_found"
    SESSION_BUSY = "session_busy"
    SESSION_CORRUPT = "session_corrupt"
    SESSION_CLOSED = "session_closed"
    NOT_WRITER = "not_writer"
    RUN_OPEN = "run_open"
    RUN_NOT_OPEN = "run_not_open"
    BAD_EVENT = "bad_event"
    CODEC_ERROR = "codec_error"
    WRITE_FAILED = "write_failed"
    SUBSCRIPTION_NOT_FOUND = "subscription_not_found"
    SHUTTING_DOWN = "shutting_down"
    TOO_MANY = "too_many"
    PERMISSION_DENIED = "permission_denied"
    BLOB_NOT_FOUND = "blob_not_found"
    BLOB_TOO_LARGE = "blob_too_large"
    CONNECTION_LOST = "connection_lost"
    DAEMON_UNREACHABLE = "daemon_unreachable"
    INTERNAL = "internal"


class FlightlogError(Exception):
    """Base class of every error flightlog raises.

    ``code`` is an :class:`ErrorCode` value; ``message`` is the sentence for a person.
    """

    def __init__(self, message: str, *, code: str = ErrorCode.INTERNAL) -> None:
        super().__init__(message)
        self.message = message
        self.code = str(code)

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"


class LocalProtocolError(FlightlogError):
    """The caller asked for something the protocol or the format does not allow."""


class RemoteProtocolError(FlightlogError):
    """The peer sent something that breaks the protocol (bad frame, bad message)."""


class RecordingError(FlightlogError):
    """Recording failed: an event could not be encoded or the daemon refused or lost it.

    Raised by the SDK.  A daemon-side failure is sticky on its run: once raised it is
    raised again from every later ``record()`` and from ``close()``.
    """


class FileFormatError(FlightlogError):
    """A session file breaks the reading rules of file format version 1.

    ``line`` is the 1-based line number of the offending line (0 for the file as a
    whole); ``reason`` says what is wrong with it.
    """

    def __init__(self, line: int, reason: str) -> None:
        where = f"line {line}" if line else "file"
        super().__init__(f"{where}: {reason}", code=ErrorCode.SESSION_CORRUPT)
        self.line = line
        self.reason = reason


class ConnectionLost(FlightlogError):
    """The connection to the daemon broke: it closed the socket or the socket failed.

    What was sent but not acknowledged may or may not have been written.
    """

    def __init__(self, message: str, *, code: str = ErrorCode.CONNECTION_LOST) -> None:
        super().__init__(message, code=code)


class DaemonError(FlightlogError):
    """The daemon refused a request with an error reply.

    ``code`` is the daemon's stable error code (``session_busy``, ``path_refused``,
    ``session_exists``, …; see :class:`ErrorCode`), ``message`` its sentence, and
    ``session_id`` the session it is about, when it names one.
    """

    def __init__(self, message: str, *, code: str, session_id: str | None = None) -> None:
        super().__init__(message, code=code)
        self.session_id = session_id
