"""Who may write and who may read a session: the whole access policy, in one place.

A session's owner is the uid whose directory holds it (``uid/UID/`` under a root,
see :mod:`._paths`); a session elsewhere in a root belongs to the daemon's own uid,
which is how the per-user daemon (one uid) sees every session it ever wrote.  Only
the owner opens a session for writing.  The owner, root, the daemon's uid and the
members of the readers' group (``--readers-group``, none by default) may read it
through the daemon: tail, follow, show.  The peer's uid, gid and groups come from the
kernel (``SO_PEERCRED``, ``SO_PEERGROUPS``), never from what the client says.  A
refusal is decided from the path alone, before the file is touched: it names the
session and tells nothing of it, not even whether it exists.
"""

from __future__ import annotations

import errno
import socket
import struct
from typing import Protocol

from flightlog.protocol import ErrorCode, FlightlogError

from ._paths import ResolvedPath, Roots

__all__ = ["Access", "PermissionDenied", "Who", "peer_groups"]

# Linux's SO_PEERGROUPS (socket(7)), which the socket module does not name.
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_MAX_GROUPS = 65536


class Who(Protocol):
    """What the policy needs of a peer: its credentials, as the kernel gave them."""

    uid: int
    gid: int
    groups: tuple[int, ...]


class PermissionDenied(FlightlogError):
    """The peer may not write (or read) the session at this path."""

    def __init__(self, path: str, uid: int, what: str) -> None:
        super().__init__(
            f"uid {uid} may not {what} {path}: only its owner may write a session; "
            "its owner, root and the daemon's readers' group may read it",
            code=ErrorCode.PERMISSION_DENIED,
        )


def peer_groups(sock: socket.socket) -> tuple[int, ...]:
    """The supplementary groups of the process at the other end, as they were when
    it connected (``SO_PEERGROUPS``); empty where the kernel does not say."""
    size = 64 * 4
    while True:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, size)
        except OSError as exc:
            # ERANGE: more groups than the buffer holds.
            if exc.errno == errno.ERANGE and size < _MAX_GROUPS * 4:
                size *= 4
                continue
            return ()
        return struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])


class Access:
    """The policy of one daemon: its own uid and its readers' group."""

    def __init__(self, roots: Roots, *, daemon_uid: int, readers_gid: int | None) -> None:
        self.roots = roots
        self.daemon_uid = daemon_uid
        self.readers_gid = readers_gid

    def home(self, who: Who) -> int | None:
        """The uid directory a peer's relative paths resolve in; None (the top of the
        data root) for the daemon's own uid."""
        return None if who.uid == self.daemon_uid else who.uid

    def resolve(self, who: Who, path: str) -> ResolvedPath:
        """``path`` as ``who`` names it.  Raises :class:`~._paths.PathRefused`."""
        return self.roots.resolve(path, uid=self.home(who))

    def check_write(self, who: Who, resolved: ResolvedPath) -> None:
        """Raises :class:`PermissionDenied` unless ``who`` owns the session."""
        if self._owner(Roots.owner(resolved)) != who.uid:
            raise PermissionDenied(resolved.path, who.uid, "write")

    def check_read(self, who: Who, resolved: ResolvedPath) -> None:
        """Raises :class:`PermissionDenied` unless ``who`` may read the session."""
        if not self._may_read(who, Roots.owner(resolved)):
            raise PermissionDenied(resolved.path, who.uid, "read")

    def owner_uid(self, path: str) -> int:
        """The uid that owns the session at the resolved ``path`` (-1: nobody)."""
        return self._owner(self.roots.owner_of(path))

    def may_read(self, who: Who, path: str) -> bool:
        """Whether ``who`` may read the session at the resolved ``path``."""
        return self._may_read(who, self.roots.owner_of(path))

    def reads_all(self, who: Who) -> bool:
        """Whether ``who`` may read every session (then nothing needs filtering)."""
        return who.uid in (0, self.daemon_uid) or (
            self.readers_gid is not None
            and (who.gid == self.readers_gid or self.readers_gid in who.groups)
        )

    def _owner(self, owner: int | None) -> int:
        return self.daemon_uid if owner is None else owner

    def _may_read(self, who: Who, owner: int | None) -> bool:
        return self._owner(owner) == who.uid or self.reads_all(who)
