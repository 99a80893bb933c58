"""The daemon's memory budget for what clients make it hold.

Every byte a client can make the daemon hold is charged to its connection's
:class:`ConnectionBudget` and to the daemon's :class:`MemoryBudget`: bytes read and not
yet taken as messages (a partial frame too), and messages handed to session actors and
not yet written.  Per connection these are bounded already (the decoder holds at most
one frame and a read, a connection stops taking frames once ``connection_buffer`` bytes
wait in actors); the global budget bounds their sum over every connection: while it is
spent (``--max-buffered``), a connection that holds more than :data:`FLOOR` itself is
not read, so a client that sends small requests always goes on while large partial
frames wait for room.  (Per-user limits are another module's.)

The rings connections read from (docs/protocol.md, "The ring") are charged too, for
as long as their connection lives: a ring is made only while every ring together
takes at most a quarter of the budget, so past that many connections new ones use
their socket alone.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FLOOR", "ConnectionBudget", "MemoryBudget"]

#: Bytes a connection may always hold, whatever the global budget says: a client of
#: small requests is never held up by others' large frames.
FLOOR = 1024 * 1024


class MemoryBudget:
    """The bytes held for every connection, against ``cap``."""

    __slots__ = ("_waiting", "cap", "peak", "rings", "used")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0
        self.peak = 0
        #: Bytes of rings, within ``used``.
        self.rings = 0
        #: Connections not read until the budget has room again: how to resume each.
        self._waiting: dict[object, Callable[[], None]] = {}

    @property
    def spent(self) -> bool:
        return self.used >= self.cap

    def take_ring(self, size: int) -> bool:
        """Charge a ring of ``size`` bytes, if rings stay within a quarter of the cap."""
        if self.rings + size > self.cap // 4:
            return False
        self.rings += size
        self.used += size
        if self.used > self.peak:
            self.peak = self.used
        return True

    def give_ring(self, size: int) -> None:
        """A ring of ``size`` bytes was unmapped."""
        self.rings -= size
        self.used -= size
        if self._waiting:
            self._freed()

    def wait(self, who: object, resume: Callable[[], None]) -> None:
        self._waiting[who] = resume

    def forget(self, who: object) -> None:
        self._waiting.pop(who, None)

    def _freed(self) -> None:
        if self._waiting and self.used < self.cap:
            waiting, self._waiting = self._waiting, {}
            for resume in waiting.values():
                resume()


class ConnectionBudget:
    """What one connection holds, charged to the daemon's :class:`MemoryBudget`."""

    __slots__ = ("_global", "held")

    def __init__(self, budget: MemoryBudget) -> None:
        self._global = budget
        self.held = 0

    def charge(self, count: int) -> None:
        self.held += count
        budget = self._global
        budget.used += count
        if budget.used > budget.peak:
            budget.peak = budget.used

    def discharge(self, count: int) -> None:
        self.held -= count
        budget = self._global
        budget.used -= count
        if budget._waiting:
            budget._freed()

    def may_read(self) -> bool:
        """Whether the connection may read more now."""
        return self.held < FLOOR or not self._global.spent

    def wait(self, who: object, resume: Callable[[], None]) -> None:
        """Call ``resume`` once the global budget has room again."""
        self._global.wait(who, resume)

    def forget(self, who: object) -> None:
        """``who`` waits for the budget no more."""
        self._global.forget(who)
