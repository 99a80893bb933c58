"""The daemon's memory budget for what clients make it hold.

Every byte a client can make the daemon hold is charged to its connection's
:class:`ConnectionBudget` and to the daemon's :class:`MemoryBudget`: bytes read and not
yet taken as messages (a partial frame too), messages handed to session actors and
not yet written, replies queued and not yet sent, the checkpoints sessions load for
it until their replies are sent (:meth:`ConnectionBudget.reserve`: a load waits for
room), and what its tail subscriptions hold (:mod:`._tail`, within half the budget).
Per connection these are bounded already (the decoder holds at most
one frame and a read, a connection stops taking frames once ``connection_buffer`` bytes
wait in actors); the global budget bounds their sum over every connection: while it is
spent (``--max-buffered``), a connection that holds more than :data:`FLOOR` itself is
not read, so a client that sends small requests always goes on while large partial
frames wait for room.

Each uid other than the daemon's has its own account too (:class:`UidMemory`): its
connections together may hold at most a share of the budget (``1 / UID_SHARE``) before
those holding more than the floor stop being read, so one uid cannot take the whole
budget from the others.  Its connections' floors are its too: once they hold its share
and :data:`UID_FLOOR_ROOM` more, none of them is read (nor loads a checkpoint or
buffers for a subscription) until the uid holds less, however little each holds.  So
one uid's many connections cannot each hold a floor beyond its share: before, 250
connections of one uid, each with all but the last byte of a frame, held 250 MiB more
than a budget of 64 MiB.  And what the floors of every such uid together hold beyond
the budget stops at :data:`FLOOR_POOL`: past it, a uid's connections are read only
while the uid holds (rings aside) at most one floor, so a uid that holds little is
never stopped by others' floors, and uids holding at once no longer take the daemon
past the budget by their number (before, each of three uids held half the budget
and 4 MiB: one and a half budgets).

The rings connections read from (docs/protocol.md, "The ring") are charged too, for
as long as their connection lives: a ring is made only while every ring together
takes at most a quarter of the budget, and one uid's rings at most ``1 / UID_SHARE``
of that, so past that many connections new ones use their socket alone; a uid
other than the daemon's gets one only while the daemon holds less than the budget
and :data:`FLOOR_POOL`, so that rings made during an attack add nothing beyond it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
from collections.abc import Callable

__all__ = [
    "FLOOR",
    "FLOOR_POOL",
    "UID_SHARE",
    "ConnectionBudget",
    "MemoryBudget",
    "UidMemory",
    "malloc_trim",
]

#: Bytes a connection may always hold, whatever the global budget says: a client of
#: small requests is never held up by others' large frames.
FLOOR = 1024 * 1024
#: One uid other than the daemon's holds at most ``1 / UID_SHARE`` of the budget, and
#: of the rings' part of it.
UID_SHARE = 2
#: What the floors of one uid's connections may hold beyond its share, together.
UID_FLOOR_ROOM = 4 * FLOOR
#: What the floors of every uid other than the daemon's may hold beyond the budget,
#: together: what one uid's may beyond its share, so the daemon's worst case is the
#: budget and this, not a share and this for each uid; past it, a uid holding at most
#: one floor is still read (:meth:`MemoryBudget.uid_floors_fit`).
FLOOR_POOL = UID_FLOOR_ROOM


class UidMemory:
    """What one uid's connections hold together; ``limited`` False: the daemon's own
    uid, bounded by the global budget alone."""

    __slots__ = ("held", "limited", "rings", "waiting")

    def __init__(self, *, limited: bool) -> None:
        self.limited = limited
        #: Bytes held, rings included.
        self.held = 0
        #: Bytes of rings, within ``held``.
        self.rings = 0
        #: Its connections waiting for room (in :attr:`MemoryBudget._waiting` too).
        self.waiting: dict[object, Callable[[], None]] = {}


class MemoryBudget:
    """The bytes held for every connection, against ``cap``."""

    __slots__ = (
        "_pool_waiting",
        "_trim",
        "_trim_below",
        "_trim_due",
        "_uids",
        "_waiting",
        "cap",
        "peak",
        "rings",
        "used",
    )

    def __init__(self, cap: int, *, trim: Callable[[], None] | None = None) -> None:
        self.cap = cap
        self.used = 0
        self.peak = 0
        #: Gives freed memory back to the system (:func:`malloc_trim`), once use fell
        #: from over a quarter of the cap to under an eighth of it, and again once it is
        #: zero: the last eighth's buffers go back too.
        self._trim = trim
        self._trim_due = False
        self._trim_below = 0
        #: Bytes of rings, within ``used``.
        self.rings = 0
        #: Connections not read until the budget has room again: how to resume each.
        self._waiting: dict[object, Callable[[], None]] = {}
        #: The uid of each waiter that has one (limited), which also lists it.
        self._uids: dict[object, UidMemory] = {}
        #: Whether a floor was refused for :data:`FLOOR_POOL` since waiters were last
        #: resumed for room in it.
        self._pool_waiting = False

    @property
    def spent(self) -> bool:
        return self.used >= self.cap

    def uid_spent(self, uid: UidMemory) -> bool:
        """Whether ``uid`` holds its whole share of the budget."""
        return uid.limited and uid.held >= self.cap // UID_SHARE

    def uid_floors_fit(self, uid: UidMemory, count: int = 1) -> bool:
        """Whether ``count`` more bytes held under its connections' floors keep
        ``uid`` within its share and :data:`UID_FLOOR_ROOM`, and the daemon within
        the budget and :data:`FLOOR_POOL`, unless ``uid`` holds (rings aside) at most
        one floor with them: a uid that holds little always goes on."""
        if not uid.limited:
            return True
        if uid.held + count > self.cap // UID_SHARE + UID_FLOOR_ROOM:
            return False
        if self.used + count <= self.cap + FLOOR_POOL or uid.held - uid.rings + count <= FLOOR:
            return True
        self._pool_waiting = True
        return False

    def take_ring(self, size: int, uid: UidMemory) -> bool:
        """Charge a ring of ``size`` bytes to the budget and to ``uid``, if rings stay
        within a quarter of the cap and ``uid``'s rings within its share of that, and
        for a uid other than the daemon's, the daemon within the budget and
        :data:`FLOOR_POOL` (past it, its new connections use their socket alone)."""
        part = self.cap // 4
        if self.rings + size > part or (
            uid.limited
            and (uid.rings + size > part // UID_SHARE or self.used + size > self.cap + FLOOR_POOL)
        ):
            return False
        self.rings += size
        self.used += size
        uid.rings += size
        uid.held += size
        if self.used > self.peak:
            self.peak = self.used
        return True

    def give_ring(self, size: int, uid: UidMemory) -> None:
        """A ring of ``size`` bytes is gone (unmapped, its pages given back)."""
        self.rings -= size
        self.used -= size
        uid.rings -= size
        uid.held -= size
        if self._waiting:
            self._freed(uid)

    def _trimmed(self) -> None:
        """Use fell back after a high: what malloc kept of the freed buffers (megabytes
        of partial frames, replies, checkpoints) goes back to the system now, on the
        loop's next turn, rather than staying in the daemon's RSS for good."""
        if self._trim_below > 1:
            self._trim_below = 1  # once more when nothing is held
        else:
            self._trim_due = False
        assert self._trim is not None
        try:
            asyncio.get_running_loop().call_soon(self._trim)
        except RuntimeError:  # no loop: at once
            self._trim()

    def wait(self, who: object, resume: Callable[[], None], uid: UidMemory | None = None) -> None:
        """Call ``resume`` once the budget has room again, or ``uid`` (whose
        connection ``who`` is) freed some of what it holds."""
        self._waiting[who] = resume
        if uid is not None and uid.limited:
            uid.waiting[who] = resume
            self._uids[who] = uid

    def forget(self, who: object) -> None:
        self._waiting.pop(who, None)
        uid = self._uids.pop(who, None)
        if uid is not None:
            uid.waiting.pop(who, None)

    def _freed(self, uid: UidMemory) -> None:
        """``uid`` held less: every waiter is resumed when the budget has room, or
        when :data:`FLOOR_POOL` has a floor's room again after a floor was refused
        for it, and ``uid``'s own when it is back within its floors' room (each
        looks again)."""
        if self.used < self.cap or (
            self._pool_waiting and self.used + FLOOR <= self.cap + FLOOR_POOL
        ):
            self._pool_waiting = False
            waiting = list(self._waiting)
        elif uid.waiting and self.uid_floors_fit(uid):
            waiting = list(uid.waiting)
        else:
            return
        for who in waiting:
            resume = self._waiting.get(who)
            if resume is not None:
                self.forget(who)
                resume()


class ConnectionBudget:
    """What one connection holds, charged to the daemon's :class:`MemoryBudget`."""

    __slots__ = ("_global", "_uid", "held")

    def __init__(self, budget: MemoryBudget, uid: UidMemory | None = None) -> None:
        self._global = budget
        #: The account of the connection's uid (None: an unlimited one of its own).
        self._uid = uid if uid is not None else UidMemory(limited=False)
        self.held = 0

    def charge(self, count: int) -> None:
        self.held += count
        self._uid.held += count
        budget = self._global
        budget.used += count
        if budget.used > budget.peak:
            budget.peak = budget.used
        if budget.used > budget.cap // 4 and budget._trim is not None:
            budget._trim_due = True
            budget._trim_below = budget.cap // 8

    def discharge(self, count: int) -> None:
        self.held -= count
        self._uid.held -= count
        budget = self._global
        budget.used -= count
        if budget._waiting:
            budget._freed(self._uid)
        if budget._trim_due and budget.used < budget._trim_below:
            budget._trimmed()

    def fits(self, count: int, *, part: int = 1) -> bool:
        """Whether ``count`` more bytes may be held now: within the floor, or within
        the budget and the uid's share of it; with ``part``, within that part of
        each (``1 / part``: what subscriptions may take, so that what they hold never
        stops the daemon reading its writers)."""
        budget, uid = self._global, self._uid
        if self.held + count <= FLOOR:
            return budget.uid_floors_fit(uid, count)
        if budget.used + count > budget.cap // part:
            return False
        return not uid.limited or uid.held + count <= budget.cap // UID_SHARE // part

    async def reserve(self, count: int, *, part: int = 1) -> None:
        """Charge ``count`` bytes once they fit (:meth:`fits`); a connection that holds
        nothing always may (a maximum frame is within every budget), unless its uid
        is past its floors' room."""
        while not self.fits(count, part=part) and (
            self.held or not self._global.uid_floors_fit(self._uid, count)
        ):
            room: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._global.wait(room, functools.partial(_set, room), self._uid)
            try:
                await room
            finally:
                self._global.forget(room)
        self.charge(count)

    def may_read(self) -> bool:
        """Whether the connection may read more now."""
        budget = self._global
        if self.held < FLOOR:
            return budget.uid_floors_fit(self._uid)
        return not budget.spent and not budget.uid_spent(self._uid)

    def wait(self, who: object, resume: Callable[[], None]) -> None:
        """Call ``resume`` once the global budget has room again, or the connection's
        uid is back within its floors' room."""
        self._global.wait(who, resume, self._uid)

    def forget(self, who: object) -> None:
        """``who`` waits for the budget no more."""
        self._global.forget(who)


def _set(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def malloc_trim() -> None:
    """Give the memory glibc's malloc keeps of freed buffers (in every arena) back to
    the system; nothing where the C library has no ``malloc_trim``.  flightlogd sets
    malloc's thresholds high for speed (``tune_malloc``): without this, the memory
    of an attack's buffers would stay in the daemon's RSS after it ended."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
