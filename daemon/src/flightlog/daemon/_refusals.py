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
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Final

__all__ = [
    "BURST",
    "WINDOW",
    "UidRefusals",
    "log_dropped",
    "log_dropped_after_window",
    "log_dropped_by_uid",
    "log_refusal",
    "set_window",
    "uid_refusals",
]

#: Refusals logged per client and window at most.
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
        self.dropped = 0


_counts: weakref.WeakKeyDictionary[object, _Count] = weakref.WeakKeyDictionary()


class UidRefusals:
    """What one uid's refusals are counted under, whichever connection made them."""

    __slots__ = ("__weakref__", "uid")

    def __init__(self, uid: int) -> None:
        self.uid = uid


#: The uids with refusals in their window (each forgotten once it is said).
_uids: dict[int, UidRefusals] = {}


def uid_refusals(uid: int) -> UidRefusals:
    """The key ``uid``'s refusals are counted under."""
    key = _uids.get(uid)
    if key is None:
        key = _uids[uid] = UidRefusals(uid)
    return key


def log_refusal(client: object, logger: Any, **fields: Any) -> None:
    """Log a ``refused`` warning for ``client``, or count it once its window's share
    is logged."""
    now = time.monotonic()
    count = _counts.get(client)
    if count is None or now - count.started >= _window:
        dropped = count.dropped if count is not None else 0
        count = _counts[client] = _Count(now)
        if dropped:
            fields["dropped"] = dropped
    if count.logged >= BURST:
        count.dropped += 1
        return
    count.logged += 1
    logger.warning("refused", **fields)


def log_dropped(client: object, logger: Any) -> None:
    """At the client's end: say how many refusals were not logged, if any."""
    count = _counts.pop(client, None)
    if count is not None and count.dropped:
        logger.warning("refusals_not_logged", dropped=count.dropped)


def log_dropped_by_uid(logger: Any) -> None:
    """Each uid whose window is over: say how many of its refusals were not logged, if
    any, and forget it (the daemon calls it once a window)."""
    for uid, key in list(_uids.items()):
        if log_dropped_after_window(key, logger.bind(uid=uid)):
            del _uids[uid]


def log_dropped_after_window(client: object, logger: Any) -> bool:
    """Once ``client``'s window is over: say how many refusals were not logged, if any,
    and forget it (True); False while its window lasts."""
    count = _counts.get(client)
    if count is not None and time.monotonic() - count.started < _window:
        return False
    log_dropped(client, logger)
    return True
