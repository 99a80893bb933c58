"""The wire protocol, sans I/O: messages, framing, both ends' connections and their rules.

``from flightlog.protocol import wire`` and use ``wire.Hello``, ``wire.ServerConnection``,
``wire.ClientConnection``; what agents and readers use is at :mod:`flightlog.protocol`'s
top level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy

__all__: list[str]
if TYPE_CHECKING:
    from ._client import DEFAULT_MAX_UNACKED as DEFAULT_MAX_UNACKED
    from ._client import ClientConnection as ClientConnection
    from ._client import Pending as Pending
    from ._client import sticky_of as sticky_of
    from ._defaults import SOCKET_NAME as SOCKET_NAME
    from ._defaults import default_root as default_root
    from ._defaults import default_socket_path as default_socket_path
    from ._defaults import socket_directory_problem as socket_directory_problem
    from ._framing import HEADER_SIZE as HEADER_SIZE
    from ._framing import FrameDecoder as FrameDecoder
    from ._framing import FrameEncoder as FrameEncoder
    from ._framing import client_decoder as client_decoder
    from ._framing import encode_frame as encode_frame
    from ._framing import server_decoder as server_decoder
    from ._server import BAD_FRAMES_IN_A_ROW as BAD_FRAMES_IN_A_ROW
    from ._server import LINE_ENVELOPE as LINE_ENVELOPE
    from ._server import MAX_SUBSCRIPTIONS as MAX_SUBSCRIPTIONS
    from ._server import ServerConnection as ServerConnection
    from ._server import line_bound as line_bound
    from ._server_events import ConnectionClosed as ConnectionClosed
    from ._server_events import RecordLines as RecordLines
    from ._server_events import ServerEvent as ServerEvent
    from ._server_events import StartRun as StartRun
    from ._server_events import check_run_start as check_run_start
    from ._state import CONNECTION_RULES as CONNECTION_RULES
    from ._state import SESSION_RULES as SESSION_RULES
    from ._state import ConnectionState as ConnectionState
    from ._state import SessionMachine as SessionMachine
    from ._state import SessionOp as SessionOp
    from ._state import SessionState as SessionState
    from ._state import check_hello as check_hello
    from ._state import connection_transition as connection_transition
    from ._state import session_transition as session_transition
    from ._wire import DEFAULT_MAX_FRAME_SIZE as DEFAULT_MAX_FRAME_SIZE
    from ._wire import PROTOCOL_VERSION as PROTOCOL_VERSION
    from ._wire import SUPPORTED_VERSIONS as SUPPORTED_VERSIONS
    from ._wire import Ack as Ack
    from ._wire import BeginRun as BeginRun
    from ._wire import BlobLoaded as BlobLoaded
    from ._wire import CheckpointLoaded as CheckpointLoaded
    from ._wire import ClientMessage as ClientMessage
    from ._wire import CloseRun as CloseRun
    from ._wire import CloseSession as CloseSession
    from ._wire import Create as Create
    from ._wire import ErrorReply as ErrorReply
    from ._wire import Hello as Hello
    from ._wire import LoadBlob as LoadBlob
    from ._wire import LoadCheckpoint as LoadCheckpoint
    from ._wire import Message as Message
    from ._wire import Open as Open
    from ._wire import OpenCallInfo as OpenCallInfo
    from ._wire import RecordEvent as RecordEvent
    from ._wire import RecordFailed as RecordFailed
    from ._wire import Request as Request
    from ._wire import RunStarted as RunStarted
    from ._wire import SaveCheckpoint as SaveCheckpoint
    from ._wire import ServerMessage as ServerMessage
    from ._wire import SessionOpened as SessionOpened
    from ._wire import SessionStatus as SessionStatus
    from ._wire import Status as Status
    from ._wire import StatusReply as StatusReply
    from ._wire import Subscribe as Subscribe
    from ._wire import Subscribed as Subscribed
    from ._wire import Sync as Sync
    from ._wire import TailBatch as TailBatch
    from ._wire import TailEnd as TailEnd
    from ._wire import UidLimits as UidLimits
    from ._wire import UidStorage as UidStorage
    from ._wire import Unsubscribe as Unsubscribe
    from ._wire import Welcome as Welcome
else:
    __all__, __getattr__, __dir__ = lazy(
        __name__,
        globals(),
        {
            "_client": (
                "DEFAULT_MAX_UNACKED",
                "ClientConnection",
                "Pending",
                "sticky_of",
            ),
            "_defaults": (
                "SOCKET_NAME",
                "default_root",
                "default_socket_path",
                "socket_directory_problem",
            ),
            "_framing": (
                "HEADER_SIZE",
                "FrameDecoder",
                "FrameEncoder",
                "client_decoder",
                "encode_frame",
                "server_decoder",
            ),
            "_server": (
                "BAD_FRAMES_IN_A_ROW",
                "LINE_ENVELOPE",
                "MAX_SUBSCRIPTIONS",
                "ServerConnection",
                "line_bound",
            ),
            "_server_events": (
                "ConnectionClosed",
                "RecordLines",
                "ServerEvent",
                "StartRun",
                "check_run_start",
            ),
            "_state": (
                "CONNECTION_RULES",
                "SESSION_RULES",
                "ConnectionState",
                "SessionMachine",
                "SessionOp",
                "SessionState",
                "check_hello",
                "connection_transition",
                "session_transition",
            ),
            "_wire": (
                "DEFAULT_MAX_FRAME_SIZE",
                "PROTOCOL_VERSION",
                "SUPPORTED_VERSIONS",
                "Ack",
                "BeginRun",
                "BlobLoaded",
                "CheckpointLoaded",
                "ClientMessage",
                "CloseRun",
                "CloseSession",
                "Create",
                "ErrorReply",
                "Hello",
                "LoadBlob",
                "LoadCheckpoint",
                "Message",
                "Open",
                "OpenCallInfo",
                "RecordEvent",
                "RecordFailed",
                "Request",
                "RunStarted",
                "SaveCheckpoint",
                "ServerMessage",
                "SessionOpened",
                "SessionStatus",
                "Status",
                "StatusReply",
                "Subscribe",
                "Subscribed",
                "Sync",
                "TailBatch",
                "TailEnd",
                "UidLimits",
                "UidStorage",
                "Unsubscribe",
                "Welcome",
            ),
        },
    )
