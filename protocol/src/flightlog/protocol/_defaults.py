"""Default paths (docs/operations.md, "Where things go"), as pure functions of the environment.

The caller passes the environment and uid in, so this module reads nothing itself.
"""

from __future__ import annotations

import stat
from collections.abc import Collection, Mapping

__all__ = ["SOCKET_NAME", "default_root", "default_socket_path", "socket_directory_problem"]

SOCKET_NAME = "flightlog.sock"


def default_socket_path(environ: Mapping[str, str], uid: int) -> str:
    """``$FLIGHTLOG_SOCKET``, else ``$XDG_RUNTIME_DIR/flightlog/flightlog.sock``, else
    ``/tmp/flightlog-$UID/flightlog.sock``."""
    if path := environ.get("FLIGHTLOG_SOCKET"):
        return path
    if runtime := environ.get("XDG_RUNTIME_DIR"):
        return f"{runtime.rstrip('/')}/flightlog/{SOCKET_NAME}"
    return f"/tmp/flightlog-{uid}/{SOCKET_NAME}"


def default_root(environ: Mapping[str, str], home: str) -> str:
    """``$FLIGHTLOG_ROOT``, else ``$XDG_STATE_HOME/flightlog``, else
    ``~/.local/state/flightlog``."""
    if root := environ.get("FLIGHTLOG_ROOT"):
        return root
    if state := environ.get("XDG_STATE_HOME"):
        return f"{state.rstrip('/')}/flightlog"
    return f"{home.rstrip('/')}/.local/state/flightlog"


def socket_directory_problem(
    path: str, mode: int, owner: int, trusted: Collection[int]
) -> str | None:
    """Why the directory ``path`` (its ``lstat``: ``mode`` and ``owner``) must not hold
    the daemon's socket, or None when it may.

    It may when it is a directory (not a symlink to one), owned by a uid of ``trusted``,
    and writable by no one else: only its owner, or anyone when the sticky bit is set
    and root owns it (as ``/tmp``), since then no one may rename or remove what another
    made there.  Anyone else who could write in it could put a socket of their own in
    the daemon's place.  The SDK asks it of the directory it connects in, the daemon of
    the one it binds in (docs/operations.md, "Who answers").
    """
    what = f"{path} (owner uid {owner}, mode {stat.S_IMODE(mode):04o})"
    if stat.S_ISLNK(mode):
        return f"{what} is a symlink"
    if not stat.S_ISDIR(mode):
        return f"{what} is not a directory"
    if owner not in trusted:
        uids = ", ".join(str(uid) for uid in sorted(trusted))
        return f"{what} is owned by a uid not trusted (trusted: {uids})"
    if mode & 0o022 and not (mode & stat.S_ISVTX and owner == 0):
        return f"{what} is writable by others than its owner"
    return None
