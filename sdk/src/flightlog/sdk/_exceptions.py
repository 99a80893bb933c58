"""Every error the SDK raises, in one flat module, catchable by kind.

``FlightlogError`` is the base of all of them.  The protocol's errors are re-exported so
that a caller imports everything from here:

* :class:`RecordingError`: recording failed (an event the codec cannot encode, or a
  failure the daemon pushed; the latter is sticky on its run).
* :class:`LocalProtocolError`: the caller asked for something the protocol does not
  allow (a frame larger than the daemon accepts, a record on a closed run).
* :class:`RemoteProtocolError`: the daemon sent bytes that break the protocol.
* :class:`FileFormatError`: a session file breaks the reading rules.
* :class:`ConnectError`, :class:`DaemonNotRunning`: no connection could be made.
* :class:`UntrustedDaemon`: the socket's directory, or whoever answers on it, is not
  the daemon's: nothing was sent.
* :class:`ConnectionLost`: the connection broke while in use.
* :class:`DaemonError`: the daemon refused a request; ``code`` says why.
* :class:`MissingExtra`: a feature needs an optional dependency that is not installed.
"""

from __future__ import annotations

from flightlog.protocol import (
    ConnectionLost,
    DaemonError,
    ErrorCode,
    FileFormatError,
    FlightlogError,
    LocalProtocolError,
    RecordingError,
    RemoteProtocolError,
)

__all__ = [
    "ConnectError",
    "ConnectionLost",
    "DaemonError",
    "DaemonNotRunning",
    "ErrorCode",
    "FileFormatError",
    "FlightlogError",
    "LocalProtocolError",
    "MissingExtra",
    "RecordingError",
    "RemoteProtocolError",
    "UntrustedDaemon",
]


class ConnectError(FlightlogError):
    """The daemon's socket could not be connected to (permissions, a bad path)."""

    def __init__(self, message: str, *, code: str = "connect_failed") -> None:
        super().__init__(message, code=code)


class DaemonNotRunning(ConnectError):
    """Nothing listens on the socket: the daemon is not running, or not on this path."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"no flightlog daemon is listening on {path}; start one with `flightlogd` "
            "or `systemctl --user start flightlogd.socket`, or point $FLIGHTLOG_SOCKET "
            "at the socket it listens on",
            code="daemon_not_running",
        )
        self.path = path


class UntrustedDaemon(ConnectError):
    """The socket is not the daemon's, so nothing was sent to it (code
    ``untrusted_daemon``).

    Its directory is a symlink, or owned by a uid not trusted, or writable by others
    (anyone who could write there could have put their socket in the daemon's place),
    or the process that answers (its ``SO_PEERCRED``) runs as a uid not trusted.
    Trusted are the caller's own uid, root, and the users named in
    ``$FLIGHTLOG_DAEMON_USER`` (docs/sdk.md, "Who answers").  ``path`` is the socket's
    path; ``owner`` and ``mode`` those of the directory, or None when it passed;
    ``peer_uid`` and ``peer_pid`` those of whoever answered, or None when the check
    failed before connecting.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str,
        owner: int | None = None,
        mode: int | None = None,
        peer_uid: int | None = None,
        peer_pid: int | None = None,
    ) -> None:
        super().__init__(message, code="untrusted_daemon")
        self.path = path
        self.owner = owner
        self.mode = mode
        self.peer_uid = peer_uid
        self.peer_pid = peer_pid


class MissingExtra(FlightlogError):
    """A feature needs an optional dependency that is not installed.

    ``extra`` names the extra of ``flightlog-sdk`` that brings it (``sql`` for DuckDB).
    """

    def __init__(self, extra: str, package: str) -> None:
        super().__init__(
            f"this needs {package}, which is not installed: pip install 'flightlog-sdk[{extra}]'",
            code="missing_extra",
        )
        self.extra = extra
        self.package = package
