"""flightlog's tiny client: record agent sessions through flightlogd, read them back.

::

    from flightlog.sdk import connect

    with connect() as client:
        session = client.create("demo/hello.jsonl", meta={"app": "demo"})
        with session.begin_run() as run:
            run.record(event)
        session.close()

The async client is :mod:`flightlog.sdk.aio`.  Every error is a :class:`FlightlogError`;
see :mod:`flightlog.sdk._exceptions` for the kinds.
"""

from __future__ import annotations

from flightlog.protocol import (
    CheckReport,
    Record,
)
from flightlog.protocol.wire import (
    StatusReply,
)

from ._cost import Price, Total, price
from ._exceptions import (
    ConnectError,
    ConnectionLost,
    DaemonError,
    DaemonNotRunning,
    ErrorCode,
    FileFormatError,
    FlightlogError,
    LocalProtocolError,
    MissingExtra,
    RecordingError,
    RemoteProtocolError,
    UntrustedDaemon,
)
from ._files import check, read
from ._find import Found, find
from ._memory import MemoryDaemon
from ._models import CallRef
from ._resume import OpenCall, Resumption
from ._sql import SQL_VIEWS, SqlResult, session_files, sql, sql_connection
from ._sync import DEFAULT_RECONNECT_GRACE, Client, Run, Session, Tail, connect
from ._transcript import (
    CallNotFound,
    Conversation,
    OriginNotFound,
    Prompt,
    Transcript,
    conversation,
    origin_of,
    prompt,
)
from ._transport import MockTransport, SocketTransport, Transport

__all__ = [
    "DEFAULT_RECONNECT_GRACE",
    "SQL_VIEWS",
    "CallNotFound",
    "CallRef",
    "CheckReport",
    "Client",
    "ConnectError",
    "ConnectionLost",
    "Conversation",
    "DaemonError",
    "DaemonNotRunning",
    "ErrorCode",
    "FileFormatError",
    "FlightlogError",
    "Found",
    "LocalProtocolError",
    "MemoryDaemon",
    "MissingExtra",
    "MockTransport",
    "OpenCall",
    "OriginNotFound",
    "Price",
    "Prompt",
    "Record",
    "RecordingError",
    "RemoteProtocolError",
    "Resumption",
    "Run",
    "Session",
    "SocketTransport",
    "SqlResult",
    "StatusReply",
    "Tail",
    "Total",
    "Transcript",
    "Transport",
    "UntrustedDaemon",
    "check",
    "connect",
    "conversation",
    "find",
    "origin_of",
    "price",
    "prompt",
    "read",
    "session_files",
    "sql",
    "sql_connection",
]
