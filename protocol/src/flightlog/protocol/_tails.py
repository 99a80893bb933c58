"""The client's tails across daemon subscriptions and restarts: :class:`TailRouter`, sans I/O.

Theory of operation
-------------------

A tail is known to the subscriber by a number of the client's own (a :class:`TailState`),
which outlives the daemon's subscriptions: each daemon subscription that feeds it is a
*route* (the daemon numbers them anew on every connection).  A tail remembers how far it
got: the seq of the last record received, for a tail of one session; the last
``(session_id, seq)`` of each path, for a tail of every session.  Pushes
(:class:`TailBatch`, :class:`TailEnd`) queue up per tail until the subscriber takes them
(:meth:`TailRouter.next`).

After a reconnect, the tail is subscribed again with the same filters
(:meth:`~TailRouter.resubscribe`).  A tail of one session goes on with ``after`` its last
seq: the daemon reads the file from there, then follows, so nothing is lost and nothing
repeated.  A tail of every session only gets what is written from its new subscription
on, so the client asks ``status`` and :meth:`~TailRouter.plan` reads the rest from the
files, one ``subscribe`` without ``follow`` per path: each path it delivered from, after
its position, and each session the new daemon holds that it never delivered from, after
the lines the old daemon wrote (``last_seq - records``: what the new daemon wrote was
written while the tail was away, a session created since included).  ``status`` also
lists the sessions the daemon closed lately: a daemon up for less time than since the
tail last caught up closed them all while the tail was away, so those it never delivered
from are read the same way (one created and closed meanwhile included); on the daemon it
was on, some were closed before it subscribed, so none.  While a path is read so, its
live records are held, then released past what the read delivered: each session's
records come once and in order.  A daemon that ends the subscription with
``shutting_down`` (SIGTERM) is going away: the tail waits for the reconnect too.  A tail
of every session the daemon ends for falling behind its buffer (``too_many``) catches up
the same way, without a reconnect.

The router builds no request a caller waits for: it gets request ids, a way to queue a
message to send (``queue``), whether a caller waits for a reply (``waiting``), the
connection's failure and how a refusal becomes an error from the connection that owns
it, and the caller's monotonic clock (seconds), and knows nothing else of it.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Protocol, TypeVar

import msgspec

from ._errors import ConnectionLost, DaemonError, ErrorCode, FlightlogError, RemoteProtocolError
from ._pending import Pending, ack_none
from ._records import Record
from ._wire import (
    Ack,
    ErrorReply,
    Message,
    Status,
    StatusReply,
    Subscribe,
    Subscribed,
    TailBatch,
    TailEnd,
    Unsubscribe,
)

__all__ = ["TailRouter", "TailState"]

#: Paths a tail of every session reads from the files at once after a reconnect.
_CATCH_UPS = 16

_record_decoder = msgspec.json.Decoder(Record)

#: What a tail gives its subscriber: records with their session's path.
Batch = list[tuple[str | None, Record]]

T = TypeVar("T")
R = TypeVar("R", bound=Message)


class Request(Protocol):
    """How the owning connection makes a request a caller waits for (a fresh id, the
    frame of ``build(id)``, the reply of ``reply_type`` turned into the result by
    ``finish``, a refusal by ``refused``)."""

    def __call__(
        self,
        build: Callable[[int], Message],
        finish: Callable[[R], T],
        reply_type: type[R],
        session_id: str | None = None,
        refused: Callable[[ErrorReply], T] | None = None,
    ) -> Pending[T]: ...


class TailState:
    """One tail as its subscriber sees it, across the daemon subscriptions that feed it
    (see the module docstring)."""

    __slots__ = (
        "after",
        "ended",
        "follow",
        "held",
        "holding",
        "items",
        "number",
        "path",
        "positions",
        "queued",
        "route",
        "run_id",
        "since",
        "types",
    )

    def __init__(
        self,
        number: int,
        path: str | None,
        after: int,
        follow: bool,
        types: list[str] | None,
        run_id: str | None,
    ) -> None:
        self.number = number
        self.path = path
        #: A tail of one session: the seq of the last record received.
        self.after = after
        self.follow = follow
        self.types = types
        self.run_id = run_id
        self.items: deque[Batch | TailEnd] = deque()
        self.ended = False
        #: The daemon's subscription that follows, while there is one.
        self.route: int | None = None
        #: A tail of every session: the last (session_id, seq) received, per path.
        self.positions: dict[str, tuple[str, int]] = {}
        #: Paths read from the file after a reconnect: their live records, held.
        self.held: dict[str, list[Record]] = {}
        #: Subscribed again, not yet told what to read from the files: every live
        #: record is held.
        self.holding = False
        #: Paths still to read from the file, and after which seq.
        self.queued: deque[tuple[str, int]] = deque()
        #: A tail of every session: when (monotonic) it was last subscribed and caught
        #: up; a daemon up for less time than since then is not the one it was on.
        self.since: float | None = None

    def subscribe(self, request_id: int) -> Subscribe:
        """The ``subscribe`` that feeds this tail from where it is."""
        return Subscribe(
            id=request_id,
            path=self.path,
            after=self.after,
            follow=self.follow,
            types=self.types,
            run_id=self.run_id,
        )

    def advance(self, path: str, record: Record) -> bool:
        """Whether ``record`` is new to a tail of every session (it moves the path's
        position), or was received already."""
        position = self.positions.get(path)
        if position is not None and position[0] == record.session_id and record.seq <= position[1]:
            return False
        self.positions[path] = (record.session_id, record.seq)
        return True


class TailRouter:
    """The client's tails, by number, and the daemon subscriptions that feed them."""

    def __init__(
        self,
        *,
        request: Request,
        next_id: Callable[[], int],
        queue: Callable[[Message], None],
        waiting: Callable[[int], bool],
        failure: Callable[[], FlightlogError | None],
        refusal: Callable[[ErrorReply], FlightlogError],
        clock: Callable[[], float],
    ) -> None:
        self._request = request
        self._next_id = next_id
        self._queue = queue
        self._waiting = waiting
        self._failure = failure
        self._refusal = refusal
        #: Seconds, monotonic: how long ago a tail was last caught up.
        self._clock = clock
        #: Whether tails are subscribed again after a reconnect (the client reconnects);
        #: else a break ends them with ``connection_lost``.
        self.resume = False
        self._tails: dict[int, TailState] = {}
        self._numbers = itertools.count(1)
        #: The daemon's subscription -> the tail it feeds, and the path it reads from
        #: the file after a reconnect (None: the tail's own subscription).
        self._routes: dict[int, tuple[TailState, str | None]] = {}
        #: Subscribe requests on their way, the same way.
        self._subscribing: dict[int, tuple[TailState, str | None]] = {}
        #: Status requests a tail of every session that fell behind asked, by id.
        self._planning: dict[int, TailState] = {}
        self._ends: dict[int, TailEnd] = {}

    # ------------------------------------------------------------ subscribing

    def subscribe(
        self,
        path: str | None,
        *,
        after: int = 0,
        follow: bool = False,
        types: list[str] | None = None,
        run_id: str | None = None,
    ) -> Pending[int]:
        """Tail ``path`` (every session when None); the result is the tail's number."""
        tail = TailState(next(self._numbers), path, after, follow, types, run_id)
        return self._subscribe(tail)

    def _subscribe(self, tail: TailState) -> Pending[int]:
        pending = self._request(tail.subscribe, partial(_number, tail), Subscribed)
        self._subscribing[pending.id] = (tail, None)
        pending.kind, pending.item = "subscribe", tail.number
        pending.rebuild = partial(self._subscribe, tail)
        return pending

    def unsubscribe(self, number: int) -> Pending[None] | None:
        """End the tail ``number``; pushes still in flight for it are dropped.  None
        when no subscription of the daemon feeds it now.

        One the daemon ended meanwhile (its TailEnd crossed the unsubscribe on the way,
        say when the writer closed the session) is over all the same: no error.
        """
        route = self.abandon(number)
        if route is None:
            return None

        def over(reply: ErrorReply) -> None:
            if reply.code != ErrorCode.SUBSCRIPTION_NOT_FOUND:
                raise self._refusal(reply)

        pending = self._request(
            lambda id: Unsubscribe(id=id, subscription=route), ack_none, Ack, None, over
        )
        pending.kind = "unsubscribe"
        return pending

    def answers(self, request_id: int) -> bool:
        """Whether the reply to ``request_id`` is one :meth:`subscribed` takes."""
        return request_id in self._subscribing

    def plans(self, request_id: int) -> bool:
        """Whether the reply to ``request_id`` is one :meth:`planned` takes."""
        return request_id in self._planning

    def subscribed(self, reply: Subscribed | ErrorReply) -> None:
        tail, path = self._subscribing.pop(reply.id)
        if isinstance(reply, ErrorReply):
            if path is not None and reply.code != ErrorCode.SHUTTING_DOWN:
                # A session no longer there to read (or no longer to this client): its
                # live records, if any come, are what there is of it.
                self._caught_up(tail, path)
            elif path is None and not self._waiting(reply.id):
                # Subscribing again after falling behind was refused: that ends it.
                self.end(tail.number, self._refusal(reply))
            return
        if path is None and self._waiting(reply.id):
            # Its pushes follow right behind the reply: they must find the tail.
            self._tails[tail.number] = tail
        if self._tails.get(tail.number) is not tail:
            self._unsubscribe_later(reply.subscription)  # nobody waits for it any more
            return
        self._routes[reply.subscription] = (tail, path)
        if path is None:
            tail.route = reply.subscription
            if not tail.holding:
                tail.since = self._clock()

    def is_subscribed(self, number: int) -> bool:
        """Whether the tail ``number`` is fed (subscribed again after a reconnect)."""
        return number in self._tails

    # ------------------------------------------------------------ pushes

    def pushed(self, message: TailBatch | TailEnd) -> None:
        """A push of the daemon: queued for the tail its subscription feeds."""
        route = self._routes.get(message.subscription)
        if route is None:
            return
        tail, path = route
        if isinstance(message, TailEnd):
            del self._routes[message.subscription]
        if self._tails.get(tail.number) is not tail:
            return  # abandoned
        if isinstance(message, TailEnd):
            if path is not None:
                # Cut short by the daemon going away: read again after the reconnect
                # (releasing what is held now would leave out the rest of the file).
                if message.reason != "shutting_down":
                    self._caught_up(tail, path)
                return
            tail.route = None
            if message.code == ErrorCode.TOO_MANY and tail.path is None:
                self._fell_behind(tail)
                return
            if not (message.reason == "shutting_down" and self.resume):
                tail.ended = True
                tail.items.append(message)
            # else the daemon is going away: the tail is subscribed again once it is back.
            return
        records = [_decode_line(line) for line in message.lines]
        if tail.path is not None:
            if records:
                tail.after = records[-1].seq
                tail.items.append([(message.path, record) for record in records])
            return
        where = path or message.path or ""
        if path is None and (tail.holding or where in tail.held):
            tail.held.setdefault(where, []).extend(records)
            return
        batch = [(message.path, record) for record in records if tail.advance(where, record)]
        if batch:
            tail.items.append(batch)

    # ------------------------------------------------------------ the subscriber

    def ready(self, number: int) -> bool:
        """Whether :meth:`next` has something without waiting (or the tail is gone)."""
        tail = self._tails.get(number)
        return tail is None or bool(tail.items)

    def next(self, number: int) -> Batch | None:
        """The records of the next batch with their session path, ``[]`` when none
        has come, or None at the end.

        Raises :class:`DaemonError` when the daemon ended the subscription with an
        error, and the connection's failure when it broke and nothing is left.
        """
        tail = self._tails.get(number)
        if tail is None:
            return None
        if not tail.items:
            if (failure := self._failure()) is not None:
                raise failure
            return []
        item = tail.items.popleft()
        if not isinstance(item, TailEnd):
            return item
        del self._tails[number]
        self._ends[number] = item
        if item.reason == "error":
            raise DaemonError(
                item.message or "the subscription failed",
                code=item.code or ErrorCode.INTERNAL,
            )
        return None

    def pop_end(self, number: int) -> TailEnd | None:
        """The daemon's TailEnd of an ended tail (once), or None."""
        return self._ends.pop(number, None)

    def abandon(self, number: int) -> int | None:
        """The subscriber is gone: its pushes are dropped.  The daemon subscription
        that fed it, to unsubscribe, or None."""
        tail = self._tails.pop(number, None)
        return None if tail is None else tail.route

    def abandon_later(self, number: int) -> None:
        """:meth:`abandon`, its unsubscribe queued (unless the connection failed)."""
        route = self.abandon(number)
        if route is not None and self._failure() is None:
            self._unsubscribe_later(route)

    def end(self, number: int, error: FlightlogError) -> None:
        """End the tail with ``error`` (a subscribe again refused, the connection gone),
        after the records it has."""
        tail = self._tails.get(number)
        if tail is None or tail.ended:
            return
        tail.ended = True
        tail.items.append(
            TailEnd(subscription=number, reason="error", code=error.code, message=error.message)
        )

    def _unsubscribe_later(self, route: int) -> None:
        self._queue(Unsubscribe(id=self._next_id(), subscription=route))

    # ------------------------------------------------------------ a new connection

    def reset(self) -> None:
        """A new connection: no daemon subscription feeds any tail any more.  Unless
        :attr:`resume`, every tail ends with a ``connection_lost`` error."""
        self._routes.clear()
        self._subscribing.clear()
        self._planning.clear()
        for tail in self._tails.values():
            tail.route = None
            # Held records are read again from the file, after the tail's positions.
            tail.held.clear()
            tail.queued.clear()
            if not self.resume and not tail.ended:
                self.end(
                    tail.number,
                    ConnectionLost("the connection to the daemon broke; the subscription ended"),
                )

    def to_resubscribe(self) -> list[int]:
        """The tails to subscribe again after a reconnect."""
        if not self.resume:
            return []
        return [number for number, tail in self._tails.items() if not tail.ended]

    def resubscribe(self, number: int) -> Pending[int]:
        """Subscribe the tail again, on a new connection, with its filters: a tail of one
        session after the last seq it received; a tail of every session for what is
        written from now on, holding it until :meth:`catch_up` has been answered."""
        tail = self._tails[number]
        tail.holding = tail.path is None
        return self._subscribe(tail)

    def catch_up(self, number: int) -> Pending[None] | None:
        """For a tail of every session subscribed again: ``status``, whose answer tells
        which paths to read from the files (their subscriptions, without ``follow``, are
        queued, a few at a time).  None for a tail of one session."""
        tail = self._tails.get(number)
        if tail is None or tail.path is not None:
            return None
        return self._request(
            lambda id: Status(id=id, closed=True), partial(self.plan, tail), StatusReply
        )

    def _fell_behind(self, tail: TailState) -> None:
        """The daemon ended a tail of every session that fell more than its buffer
        behind: subscribe again and read what it dropped from the files, as after a
        reconnect (the requests are queued, the status answer plans the reads)."""
        tail.holding = True
        request_id = self._next_id()
        self._subscribing[request_id] = (tail, None)
        self._queue(
            Subscribe(
                id=request_id,
                path=None,
                follow=tail.follow,
                types=tail.types,
                run_id=tail.run_id,
            )
        )
        status_id = self._next_id()
        self._planning[status_id] = tail
        self._queue(Status(id=status_id, closed=True))

    def planned(self, reply: StatusReply) -> None:
        """The answer to the ``status`` of a tail that fell behind."""
        self.plan(self._planning.pop(reply.id), reply)

    def plan(self, tail: TailState, reply: StatusReply) -> None:
        """Read from the files what ``tail`` missed, by what ``status`` answered (see
        the module docstring): the subscriptions go to the queue, a few at a time."""
        after = {path: seq for path, (_, seq) in tail.positions.items()}
        # Sessions never received from, and the seq after which the new daemon wrote.
        fresh: dict[str, tuple[str, int]] = {}
        opened = {session.path: session.session_id for session in reply.sessions}
        for session in reply.sessions:
            position = tail.positions.get(session.path)
            if position is not None and position[0] == session.session_id:
                if session.last_seq <= position[1] and session.path not in tail.held:
                    del after[session.path]  # nothing new: the rest comes live
            elif session.records or session.path in tail.held:
                # Never received from: what the new daemon wrote is new to the tail.
                fresh[session.path] = (session.session_id, session.last_seq - session.records)
        # A daemon started since the tail was last caught up closed its sessions while
        # the tail was away, one created in that time included: each never received
        # from is read after the lines that daemon wrote to it (over all its openings).
        # The daemon the tail was on closed some before: nothing tells which, so none.
        restarted = tail.since is None or reply.uptime <= self._clock() - tail.since
        for session in reply.closed if restarted else ():
            path, session_id = session.path, session.session_id
            position = tail.positions.get(path)
            if (position is not None and position[0] == session_id) or opened.get(
                path, session_id
            ) != session_id:
                continue  # read after its position, or another session is there now
            start = session.last_seq - session.records
            known = fresh.get(path)
            fresh[path] = (session_id, start if known is None else min(known[1], start))
        for path, (_, start) in fresh.items():
            after[path] = max(start, 0)
        for path, records in tail.held.items():
            if path not in after:
                after[path] = records[0].seq - 1
        tail.holding = False
        tail.since = self._clock()
        for path, seq in after.items():
            tail.held.setdefault(path, [])
            tail.queued.append((path, seq))
        for _ in range(_CATCH_UPS):
            self._next_catch_up(tail)

    def _next_catch_up(self, tail: TailState) -> None:
        if not tail.queued or self._failure() is not None:
            return
        path, after = tail.queued.popleft()
        request_id = self._next_id()
        self._subscribing[request_id] = (tail, path)
        self._queue(
            Subscribe(
                id=request_id,
                path=path,
                after=after,
                follow=False,
                types=tail.types,
                run_id=tail.run_id,
            )
        )

    def _caught_up(self, tail: TailState, path: str) -> None:
        held = tail.held.pop(path, [])
        batch: Batch = [(path, record) for record in held if tail.advance(path, record)]
        if batch:
            tail.items.append(batch)
        self._next_catch_up(tail)


def _number(tail: TailState, reply: Subscribed) -> int:
    return tail.number


def _decode_line(line: bytes) -> Record:
    try:
        return _record_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RemoteProtocolError(
            f"the daemon sent a tailed line that is not a record: {exc}",
            code=ErrorCode.BAD_MESSAGE,
        ) from None
