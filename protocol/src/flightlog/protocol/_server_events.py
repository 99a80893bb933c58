"""What a :class:`~._server.ServerConnection` hands its owner, sans I/O: the events
that passed the connection's rules, and the rule of a ``begin_run`` that only the
session's file can apply (:func:`check_run_start`)."""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from ._errors import ErrorCode, LocalProtocolError
from ._wire import (
    BeginRun,
    CloseRun,
    CloseSession,
    Create,
    LoadBlob,
    LoadCheckpoint,
    Open,
    RecordEvent,
    SaveCheckpoint,
    Status,
    Subscribe,
    Sync,
    Unsubscribe,
)

__all__ = [
    "ConnectionClosed",
    "RecordLines",
    "ServerEvent",
    "StartRun",
    "check_run_start",
]


class StartRun(msgspec.Struct, frozen=True):
    """A ``begin_run`` that opened the run ``run_id``: write its ``run_start``."""

    request: BeginRun
    run_id: str


class RecordLines(msgspec.Struct, frozen=True):
    """Records of one session and run that passed every rule, taken in a row: their
    lines but the seq (``record_lines``; see :mod:`._server`).

    ``tails`` holds, for each of the ``count`` records in order, the part of its line
    after the seq (``,"type":...}`` and the newline) behind its length (a native
    4-byte unsigned int), as :meth:`~._records.LineEncoder.append_tails` takes them;
    ``size`` is the bytes of their data.
    """

    session_id: str
    run_id: str
    count: int
    size: int
    tails: bytearray


class ConnectionClosed(msgspec.Struct, frozen=True):
    """The last event: the client ended the stream, or the connection hung up.

    ``released`` holds the sessions this connection wrote, each with the run it left
    open (None when none was): their writer is gone, and those runs stay without
    ``run_close``.
    """

    released: dict[str, str | None]


ServerEvent = (
    Create
    | Open
    | StartRun
    | RecordEvent
    | RecordLines
    | SaveCheckpoint
    | CloseRun
    | CloseSession
    | Sync
    | LoadCheckpoint
    | Subscribe
    | Unsubscribe
    | Status
    | LoadBlob
    | ConnectionClosed
)


def check_run_start(
    start: StartRun,
    last_run: str | None,
    runs: Collection[str],
    interrupted: Collection[str] = (),
) -> None:
    """The rule of a ``begin_run`` that only the session's file can apply: ``last_run``
    is the file's last run when it has no ``run_close``, ``runs`` every run it holds
    (closed or not), ``interrupted`` its runs without ``run_close`` that no writer has
    open.  A resume continues ``last_run``; a repair (``resume`` with ``repair``) any
    of ``interrupted``.  Raises :class:`LocalProtocolError`: ``run_not_open`` for a
    resume of any other run, ``bad_message`` for a new run whose id is one of ``runs``.
    The owner refuses it with :meth:`ServerConnection.refuse` (or answers it itself and
    calls :meth:`ServerConnection.run_not_opened`)."""
    run_id, request = start.run_id, start.request
    if request.resume is not None:
        if request.repair and run_id not in interrupted:
            raise LocalProtocolError(
                f"run {run_id[:32]} is not a run of the session left without run_close",
                code=ErrorCode.RUN_NOT_OPEN,
            )
        if not request.repair and run_id != last_run:
            raise LocalProtocolError(
                f"run {run_id[:32]} is not the session's last run left without run_close",
                code=ErrorCode.RUN_NOT_OPEN,
            )
    elif run_id in runs:
        raise LocalProtocolError(
            f"run id {run_id} is not fresh: the file has a run with it",
            code=ErrorCode.BAD_MESSAGE,
        )
