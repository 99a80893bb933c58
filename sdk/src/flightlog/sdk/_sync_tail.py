# Generated from _async_tail.py by tests/sdk/unasync.py: edit that file, then run this.
"""The records of a subscription: :class:`Tail`.

The sync tail is generated from the async one by ``tests/sdk/unasync.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Generic, Self, TypeVar

from flightlog.protocol import (
    ErrorCode,
    FlightlogError,
    Record,
)
from flightlog.protocol.wire import (
    Pending,
    TailEnd,
)

from ._blobs import TailResolver
from ._exceptions import ConnectionLost
from ._sync_link import Link, Resource

__all__ = ["Tail"]

T = TypeVar("T")


class Tail(Resource, Generic[T]):
    """The records of a subscription: ``for record in client.tail(path)``.

    Use it in ``with`` (or call :meth:`close`) to unsubscribe from a follow
    before its end; an abandoned tail is unsubscribed with the client's next request.
    Blob references are put back as their payloads, as :func:`read` does: from the
    session's blob store where the caller can read it, else loaded through the daemon
    (``load_blob``).  A blob that cannot be had leaves its reference in the record and
    a sentence in :attr:`problems` (docs/format.md).
    """

    def __init__(
        self,
        link: Link,
        subscribe: Callable[[], Pending[int]],
        convert: Callable[[str | None, Record], T],
    ) -> None:
        self._link = link
        self._conn = link.conn
        self._subscribe = subscribe
        self._convert = convert
        self._resolve = TailResolver()
        self._subscription: int | None = None
        self._buffer: deque[T] = deque()
        self._done = False
        #: How the daemon ended the subscription, once it has: ``end.reason`` is
        #: ``end_of_file``, ``session_closed``, ``unsubscribed`` or ``shutting_down``.
        self.end: TailEnd | None = None
        #: What went wrong putting blobs back, one sentence each (the last 100).
        self.problems: deque[str] = deque(maxlen=100)

    @property
    def end_reason(self) -> str | None:
        """``end.reason``, or None while the subscription goes on."""
        return self.end.reason if self.end is not None else None

    def _start(self) -> int:
        if self._subscription is None:
            self._subscription = self._link.call(self._subscribe())
        return self._subscription

    def __iter__(self) -> Tail[T]:
        return self

    def __next__(self) -> T:
        link = self._link
        while not self._buffer:
            if self._done:
                raise StopIteration
            generation = link.generation
            try:
                subscription = self._start()
                link.flush()
                link.receive_until(partial(self._conn.tail_ready, subscription))
                try:
                    batch = self._conn.tails.next(subscription)
                finally:
                    self.end = self.end or self._conn.tails.pop_end(subscription)
            except ConnectionLost as exc:
                # The client reconnects and subscribes again where the tail was; past
                # the grace its error ends the tail.
                if exc.code != ErrorCode.CONNECTION_LOST or not link.reconnecting():
                    self._give_up()
                    raise
                try:
                    link.recover(generation)
                except BaseException:
                    self._give_up()
                    raise
                continue
            if batch is None:
                self._done = True
            else:
                resolve = self._resolve
                for path, record in batch:
                    for digest in resolve.wanted(path, record):
                        assert path is not None
                        self._load_blob(path, digest)
                self._buffer.extend(
                    self._convert(path, resolve(path, record)) for path, record in batch
                )
        return self._buffer.popleft()

    def _load_blob(self, path: str, digest: str) -> None:
        data: bytes | None = None
        try:
            data = self._link.call(self._conn.load_blob(path, digest))
        except FlightlogError as exc:
            # A connection lost here is found again by the next receive.
            self.problems.append(f"{path}: blob {digest}: {exc.message} ({exc.code})")
        problem = self._resolve.loaded(path, digest, data)
        if problem is not None:
            self.problems.append(problem)

    def _give_up(self) -> None:
        self._done = True
        if self._subscription is not None:
            self._conn.tails.abandon_later(self._subscription)

    def close(self) -> None:
        """Unsubscribe (when the daemon has not ended the subscription); safe to call again."""
        if self._done:
            return
        self._done = True
        subscription = self._subscription
        if subscription is None or not self._conn.tails.is_subscribed(subscription):
            return
        if self._conn.failure is not None:
            self._conn.tails.abandon_later(subscription)
            return
        pending = self._conn.tails.unsubscribe(subscription)
        if pending is not None:
            self._link.call(pending)

    def __enter__(self) -> Self:
        self._start()
        return self

    def __del__(self) -> None:
        if self._subscription is not None and not self._done:
            self._conn.tails.abandon_later(self._subscription)
