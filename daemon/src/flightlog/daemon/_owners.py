"""What the daemon knows of each uid's sessions, kept apart per uid for ``status``.

Each owner (the uid whose directory holds a session, see :mod:`._access`) has its
sessions open now, what they wrote since the daemon started (:class:`Figures`), and
the sessions it closed lately.  A uid's ``status`` is made from its own entry alone:
it costs that uid's sessions, not every uid's, and tells it nothing of the others.
The closed sessions are kept per uid, :data:`CLOSED_PER_UID` each and
:data:`CLOSED_KEPT` in all, so that a uid closing sessions in a loop pushes out only
its own: past the whole bound, the uid that keeps the most loses its oldest.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from flightlog.protocol.wire import SessionStatus

__all__ = ["CLOSED_KEPT", "CLOSED_PER_UID", "Figures", "Owner", "Owners"]

#: Closed sessions the daemon remembers for ``status`` (a tail of every session that
#: was away reads those it missed) per uid, and in all: about 300 bytes each.
CLOSED_PER_UID = 1024
CLOSED_KEPT = 8192

Actor = TypeVar("Actor")


class Figures:
    """What one uid's sessions (or every session) wrote since the daemon started."""

    __slots__ = ("_rate_mark", "bytes_written", "errors", "rate", "records_written")

    def __init__(self, started: float) -> None:
        self.records_written = 0
        self.bytes_written = 0
        self.errors = 0
        self._rate_mark = (started, 0)
        self.rate = 0.0

    def records_per_second(self) -> float:
        mark_time, mark_records = self._rate_mark
        moment = time.monotonic()
        if moment - mark_time >= 1.0:
            self.rate = (self.records_written - mark_records) / (moment - mark_time)
            self._rate_mark = (moment, self.records_written)
        return self.rate


class Owner(Generic[Actor]):
    """One uid's sessions: open now (by path), what they wrote, closed lately (by
    path, with the order of their close, the latest last)."""

    __slots__ = ("closed", "figures", "sessions", "uid")

    def __init__(self, uid: int, started: float) -> None:
        self.uid = uid
        self.sessions: dict[str, Actor] = {}
        self.figures = Figures(started)
        self.closed: OrderedDict[str, tuple[int, SessionStatus]] = OrderedDict()


class Owners(Generic[Actor]):
    """Every uid's :class:`Owner`, and which owns each session open now."""

    def __init__(
        self,
        owner_uid: Callable[[str], int],
        started: float,
        *,
        per_uid: int = CLOSED_PER_UID,
        kept: int = CLOSED_KEPT,
    ) -> None:
        self._owner_uid = owner_uid
        self._started = started
        self._per_uid = per_uid
        self._kept = kept
        self._by_uid: dict[int, Owner[Actor]] = {}
        #: The owner of each session open now, by path.
        self._of_path: dict[str, Owner[Actor]] = {}
        self._closes = 0  # the order of the closes
        self._closed = 0  # entries kept over every uid

    def of(self, path: str) -> Owner[Actor]:
        """The owner of the session at the resolved ``path`` (made on first use)."""
        owner = self._of_path.get(path)
        if owner is None:
            owner = self.uid(self._owner_uid(path))
        return owner

    def uid(self, uid: int) -> Owner[Actor]:
        owner = self._by_uid.get(uid)
        if owner is None:
            owner = self._by_uid[uid] = Owner(uid, self._started)
        return owner

    def get(self, uid: int) -> Owner[Actor] | None:
        return self._by_uid.get(uid)

    def opened(self, path: str, actor: Actor) -> None:
        owner = self.of(path)
        self._of_path[path] = owner
        owner.sessions[path] = actor

    def finished(self, path: str) -> Owner[Actor]:
        """The session at ``path`` is no longer open: its owner."""
        owner = self._of_path.pop(path, None) or self.of(path)
        owner.sessions.pop(path, None)
        return owner

    def remember_closed(self, owner: Owner[Actor], status: SessionStatus) -> None:
        """Keep ``status`` among ``owner``'s closed sessions, the latest."""
        if owner.closed.pop(status.path, None) is not None:
            self._closed -= 1
        self._closes += 1
        owner.closed[status.path] = (self._closes, status)
        self._closed += 1
        if len(owner.closed) > self._per_uid:
            owner.closed.popitem(last=False)
            self._closed -= 1
        if self._closed > self._kept:
            # Every uid's together: the one that keeps the most gives its oldest.
            most = max(self._by_uid.values(), key=lambda o: len(o.closed))
            most.closed.popitem(last=False)
            self._closed -= 1

    def closed(self, uids: Iterable[int] | None) -> list[SessionStatus]:
        """The sessions closed lately of ``uids`` (None: every uid's), the latest last."""
        owners = (
            self._by_uid.values()
            if uids is None
            else [o for uid in uids if (o := self._by_uid.get(uid)) is not None]
        )
        entries = [entry for owner in owners for entry in owner.closed.values()]
        entries.sort(key=lambda entry: entry[0])
        return [status for _, status in entries]
