"""One request of the client on its way: :class:`Pending` (see :mod:`._client`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ._errors import RecordingError
from ._state import SessionMachine
from ._wire import Ack, ErrorReply, Message

__all__ = ["Pending", "ack_none", "ack_seq", "same", "settled", "sticky_of"]

T = TypeVar("T")


class Pending(Generic[T]):
    """One request on its way: its id, its frame, and how its reply becomes a result.

    The client sends ``data`` and waits until :meth:`ClientConnection.answered`; the
    rest is the connection's and its collaborators' to read and to set.
    """

    __slots__ = (
        "acks",
        "data",
        "finish",
        "id",
        "item",
        "kind",
        "path",
        "rebuild",
        "refused",
        "run_id",
        "session_id",
        "settled",
    )

    def __init__(
        self,
        id: int,
        data: bytes,
        finish: Callable[[Message], T],
        session_id: str | None = None,
        refused: Callable[[ErrorReply], T] | None = None,
        rebuild: Callable[[], Pending[T]] | None = None,
    ) -> None:
        self.id = id
        self.data = data
        self.session_id = session_id
        #: Turns the reply into the result (or raises).
        self.finish = finish
        #: Turns a refusal into a result, or raises it (None: always raised).
        self.refused = refused
        #: The same request with a fresh id, for a new connection.
        self.rebuild = rebuild
        #: Whether its reply acknowledges the session's items sent before it.
        self.acks = False
        #: What a reconnect must know of it: ``begin``, ``close`` (of ``run_id``),
        #: ``checkpoint`` (the run's ``item``, once sent), ``recreate`` (a ``create``
        #: sent again), ``subscribe`` (of the tail ``item``), ``unsubscribe``, or None.
        self.kind: str | None = None
        self.run_id: str | None = None
        #: The path of a ``create``: opened instead when sent again and the file exists.
        self.path: str | None = None
        self.item = 0
        #: Its result when a reconnect found it done already (a checkpoint in the file).
        self.settled: tuple[T] | None = None


def settled(request: Pending[T], result: Any) -> Pending[T]:
    """``request``, marked done with ``result``: not to be sent again."""
    request.settled = (result,)
    return request


def sticky_of(
    session: SessionMachine[RecordingError] | None, run_id: str | None
) -> RecordingError | None:
    """The error pushed for the run ``run_id`` of ``session``, else the session's
    failure, else None."""
    if session is None:
        return None
    if run_id is not None and (sticky := session.run_failure(run_id)) is not None:
        return sticky
    return session.failure


def ack_seq(reply: Ack) -> int:
    """The result of a request answered with the seq it made durable."""
    return reply.seq


def ack_none(reply: Ack) -> None:
    """The result of a request whose ``Ack`` says only that it was done."""
    return None


def same(reply: T) -> T:
    """The result of a request that is its reply."""
    return reply
