"""Logging refused requests without letting a client flood the log.

Every refusal is worth a line, until a client sends thousands: 6.7 MB of bad requests
once made 23 MB of log.  Each client (the connection, as a :class:`~._peers.Peer` or
itself) may have :data:`BURST` refusals logged per window (:data:`WINDOW` seconds
unless the daemon sets another, its ``--refusal-window``: :func:`set_window`); the rest
are counted, and the next line logged for it (or the one at its end, from
:func:`log_dropped`) says how many were left out (``dropped``).  A client that does
not end has its count said by :func:`log_dropped_after_window` once its window is
over.  On a shared daemon the client is the uid (:func:`uid_refusals`): its refused
connections, and every refusal of its connections and their sessions, share one
window, so a uid opening connection after connection, each refused once, logs no
more than one that stays (:func:`log_dropped_by_uid` says each uid's count).

A uid's ``connection_opened`` lines are counted the same way, per uid
(:func:`uid_connections`, :func:`log_within`): one opening connections in a loop gets
:data:`BURST` of them per window, each with its ``connection_closed``, and a
``connections_not_logged`` line with its ``uid`` once the window is over says how many
of each were left out.
"""

from __future__ import annotations

import collections
import time
import weakref
from typing import Any, Final

__all__ = [
    "BURST",
    "WINDOW",
    "UidConnections",
    "UidRefusals",
    "count_dropped",
    "log_dropped",
    "log_dropped_after_window",
    "log_dropped_by_uid",
    "log_refusal",
    "log_within",
    "set_window",
    "uid_connections",
    "uid_refusals",
]

#: Lines (refusals, connections opened) logged per client and window at most.
BURST: Final = 20
#: Seconds of a window by default.
WINDOW: Final = 10.0
_window = WINDOW


def set_window(seconds: float) -> None:
    """Make a window ``seconds`` long (the daemon's ``--refusal-window``, set at start)."""
    global _window
    _window = seconds


class _Count:
    __slots__ = ("dropped", "logged", "started")

    def __init__(self, now: float) -> None:
        self.started = now
        self.logged = 0
        #: Lines not logged, by event.
        self.dropped: collections.Counter[str] = collections.Counter()


_counts: weakref.WeakKeyDictionary[object, _Count] = weakref.WeakKeyDictionary()


class UidRefusals:
    """What one uid's refusals are counted under, whichever connection made them."""

    __slots__ = ("__weakref__", "uid")
    #: The line that says how many were not logged.
    summary = "refusals_not_logged"
    level = "warning"

    def __init__(self, uid: int) -> None:
        self.uid = uid


class UidConnections(UidRefusals):
    """What one uid's connection lines are counted under."""

    __slots__ = ()
    summary = "connections_not_logged"
    level = "info"


#: The uids with lines in their window, by kind (each forgotten once it is said).
_uids: dict[tuple[type[UidRefusals], int], UidRefusals] = {}


def _uid_key(kind: type[UidRefusals], uid: int) -> UidRefusals:
    key = _uids.get((kind, uid))
    if key is None:
        key = _uids[kind, uid] = kind(uid)
    return key


def uid_refusals(uid: int) -> UidRefusals:
    """The key ``uid``'s refusals are counted under."""
    return _uid_key(UidRefusals, uid)


def uid_connections(uid: int) -> UidRefusals:
    """The key ``uid``'s ``connection_opened`` lines are counted under."""
    return _uid_key(UidConnections, uid)


def log_refusal(client: object, logger: Any, **fields: Any) -> None:
    """Log a ``refused`` warning for ``client``, or count it once its window's share
    is logged."""
    log_within(client, logger, "refused", "warning", **fields)


def log_within(client: object, logger: Any, event: str, level: str, **fields: Any) -> bool:
    """Log ``event`` for ``client`` at ``level`` (whether it was), or count it once its
    window's share is logged.  The first line of a window says how many lines the last
    left out (``dropped``), and of which events (``not_logged``)."""
    now = time.monotonic()
    count = _counts.get(client)
    if count is None or now - count.started >= _window:
        if count is not None and count.dropped:
            fields.update(_said(count))
        count = _counts[client] = _Count(now)
    if count.logged >= BURST:
        count.dropped[event] += 1
        return False
    count.logged += 1
    getattr(logger, level)(event, **fields)
    return True


def count_dropped(client: object, event: str) -> None:
    """Count ``event`` for ``client`` as not logged (a line that goes with one that was
    not: a connection's close)."""
    count = _counts.get(client)
    if count is None:
        count = _counts[client] = _Count(time.monotonic())
    count.dropped[event] += 1


def log_dropped(
    client: object, logger: Any, summary: str = "refusals_not_logged", level: str = "warning"
) -> None:
    """At the client's end: say how many of its lines were not logged, if any
    (``dropped``), and of which events (``not_logged``)."""
    count = _counts.pop(client, None)
    if count is not None and count.dropped:
        getattr(logger, level)(summary, **_said(count))


def _said(count: _Count) -> dict[str, Any]:
    """How a window's lines not logged are said: how many, and how many of each event."""
    return {"dropped": count.dropped.total(), "not_logged": dict(count.dropped)}


def log_dropped_by_uid(logger: Any) -> None:
    """Each uid whose window is over: say how many of its lines were not logged, if
    any, and forget it (the daemon calls it once a window)."""
    for (kind, uid), key in list(_uids.items()):
        if log_dropped_after_window(key, logger.bind(uid=uid), kind.summary, kind.level):
            del _uids[kind, uid]


def log_dropped_after_window(
    client: object, logger: Any, summary: str = "refusals_not_logged", level: str = "warning"
) -> bool:
    """Once ``client``'s window is over: say how many of its lines were not logged, if
    any, and forget it (True); False while its window lasts."""
    count = _counts.get(client)
    if count is not None and time.monotonic() - count.started < _window:
        return False
    log_dropped(client, logger, summary, level)
    return True
