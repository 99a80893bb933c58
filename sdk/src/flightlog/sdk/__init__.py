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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flightlog.protocol import (
        CheckReport,
        Record,
    )
    from flightlog.protocol.wire import (
        StatusReply,
    )

    from ._compression import session_files
    from ._cost import Price, Total, price, responded
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
    from ._mock_transport import MockTransport
    from ._models import CallRef
    from ._resume import OpenCall, Resumption
    from ._sql import SQL_VIEWS, SqlResult, sql, sql_connection
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
    from ._transport import SocketTransport, Transport

#: Where each public name lives: imported on first use (PEP 562), so that a program
#: that uses one part (``flightlog find`` uses the search) does not pay for the rest.
_WHERE: dict[str, str] = {
    "CheckReport": "flightlog.protocol",
    "Record": "flightlog.protocol",
    "StatusReply": "flightlog.protocol.wire",
    "Price": "._cost",
    "Total": "._cost",
    "price": "._cost",
    "responded": "._cost",
    "ConnectError": "._exceptions",
    "ConnectionLost": "._exceptions",
    "DaemonError": "._exceptions",
    "DaemonNotRunning": "._exceptions",
    "ErrorCode": "._exceptions",
    "FileFormatError": "._exceptions",
    "FlightlogError": "._exceptions",
    "LocalProtocolError": "._exceptions",
    "MissingExtra": "._exceptions",
    "RecordingError": "._exceptions",
    "RemoteProtocolError": "._exceptions",
    "UntrustedDaemon": "._exceptions",
    "check": "._files",
    "read": "._files",
    "Found": "._find",
    "find": "._find",
    "MemoryDaemon": "._memory",
    "CallRef": "._models",
    "OpenCall": "._resume",
    "Resumption": "._resume",
    "SQL_VIEWS": "._sql",
    "SqlResult": "._sql",
    "session_files": "._compression",
    "sql": "._sql",
    "sql_connection": "._sql",
    "DEFAULT_RECONNECT_GRACE": "._sync",
    "Client": "._sync",
    "Run": "._sync",
    "Session": "._sync",
    "Tail": "._sync",
    "connect": "._sync",
    "CallNotFound": "._transcript",
    "Conversation": "._transcript",
    "OriginNotFound": "._transcript",
    "Prompt": "._transcript",
    "Transcript": "._transcript",
    "conversation": "._transcript",
    "origin_of": "._transcript",
    "prompt": "._transcript",
    "MockTransport": "._mock_transport",
    "SocketTransport": "._transport",
    "Transport": "._transport",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
    "responded",
    "session_files",
    "sql",
    "sql_connection",
]
