"""One batch of a session actor: the lines it gathers, the replies that wait for
their write (and sync), and the payload bytes to hand back to each connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from flightlog.protocol import CheckpointData, ErrorCode, FlightlogError, LocalProtocolError, Record
from flightlog.protocol._calls import OpenCall
from flightlog.protocol.format import (
    append_line,
)
from flightlog.protocol.wire import (
    CheckpointLoaded,
    ErrorReply,
    Message,
    OpenCallInfo,
)

from ._peers import Peer

__all__ = [
    "Batch",
    "Reply",
    "checkpoint_reply",
    "error_reply",
    "ready",
]


#: A reply that waits for its batch's write (and sync): made once they are done.
Reply = Callable[[], Message]


class Batch:
    """What one batch gathers until it is written: its lines, the replies that wait
    for them, the payload bytes to hand back to each connection."""

    __slots__ = (
        "buf",
        "checkpoints",
        "count",
        "first_seq",
        "loaded",
        "max_line",
        "needs_sync",
        "released",
        "replies",
        "reply_bytes",
    )

    def __init__(self, first_seq: int, max_line: int) -> None:
        self.max_line = max_line
        self.buf = bytearray()
        self.count = 0
        self.first_seq = first_seq
        self.replies: list[tuple[Peer, Reply]] = []
        #: Bytes of the replies made already (checkpoints loaded), held until sent.
        self.reply_bytes = 0
        #: The bytes of those replies charged to each connection's budget, handed
        #: back once the replies are sent (queued replies are charged there).
        self.loaded: list[tuple[Peer, int]] = []
        self.needs_sync = False
        self.released: dict[int, tuple[Peer, int]] = {}
        # (seq, offset in buf, length) of the checkpoints, indexed once written.
        self.checkpoints: list[tuple[int, int, int]] = []

    def add(self, session_id: str, kind: str, time: str, data: bytes, run_id: str | None) -> int:
        """Append a line; its seq.  Raises :class:`LocalProtocolError` (``bad_event``)
        when the line would be longer than ``max_line``: no reader would read it."""
        seq = self.first_seq + self.count
        start = len(self.buf)
        append_line(
            self.buf,
            Record(
                session_id=session_id,
                seq=seq,
                type=kind,
                time=time,
                run_id=run_id,
                data=msgspec.Raw(data),
            ),
        )
        length = len(self.buf) - start
        if length > self.max_line:
            del self.buf[start:]
            raise LocalProtocolError(
                f"its {kind} line would be {length} bytes, more than the {self.max_line} "
                "that readers of session files read",
                code=ErrorCode.BAD_EVENT,
            )
        self.count += 1
        return seq

    def release(self, peer: Peer, size: int) -> None:
        if size:
            _, held = self.released.get(id(peer), (peer, 0))
            self.released[id(peer)] = (peer, held + size)

    def restart(self, first_seq: int) -> None:
        """Start over after what was gathered so far was written."""
        self.buf = bytearray()
        self.count = 0
        self.first_seq = first_seq
        self.checkpoints.clear()


def ready(message: Message) -> Reply:
    return lambda: message


def error_reply(request_id: int, error: FlightlogError, session_id: str) -> ErrorReply:
    return ErrorReply(id=request_id, code=error.code, message=error.message, session_id=session_id)


def checkpoint_reply(
    request_id: int,
    record: Record | None,
    calls: tuple[list[str], list[OpenCall]] | None = None,
) -> CheckpointLoaded:
    found: dict[str, Any] = {}
    if calls is not None:
        cut_runs, open_calls = calls
        found = {
            "calls_known": True,
            "cut_runs": cut_runs,
            "open_calls": [
                OpenCallInfo(
                    run_id=call.run_id,
                    execution=msgspec.to_builtins(call.execution),
                    seq=call.seq,
                    tool_call_id=call.tool_call_id,
                    name=call.name,
                    arguments=call.arguments,
                )
                for call in open_calls
            ],
        }
    if record is None:
        return CheckpointLoaded(id=request_id, **found)
    data = msgspec.json.decode(record.data, type=CheckpointData)
    return CheckpointLoaded(
        id=request_id,
        seq=record.seq,
        run_id=record.run_id,
        time=record.time,
        snapshot=bytes(data.snapshot),
        **found,
    )
