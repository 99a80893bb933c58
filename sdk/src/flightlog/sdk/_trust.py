"""Whom a client talks to: the checks made before anything is sent on a socket.

Anyone may create ``/tmp/flightlog-$UID`` before its user does and listen there, so a
path alone does not say who answers.  Before it connects, a client looks at the
socket's directory and the socket node (``lstat``, no symlink followed): the directory
must pass :func:`~flightlog.protocol.socket_directory_problem`, the node must be a
socket owned by a trusted uid.  Once connected, and before it sends a byte, it asks the
kernel who listens (``SO_PEERCRED``): that uid must be trusted too.  Either failing is
:class:`UntrustedDaemon`, naming what was found.

Trusted are the caller's effective uid, root (uid 0: under socket activation systemd
listens, so the peer is root), and the users ``$FLIGHTLOG_DAEMON_USER`` names (names
or numbers, separated by commas): the dedicated user of a shared daemon that binds its
own socket, or owns its directory (docs/operations.md, "Who answers").
"""

from __future__ import annotations

import os
import pwd
import socket
import stat
import struct
from collections.abc import Iterable, Mapping

from flightlog.protocol.wire import (
    socket_directory_problem,
)

from ._exceptions import ConnectError, UntrustedDaemon

__all__ = ["check_directory", "check_peer", "trusted_uids"]

_PEERCRED = struct.Struct("3i")


def trusted_uids(
    environ: Mapping[str, str] | None = None, also: Iterable[int] = ()
) -> frozenset[int]:
    """The caller's effective uid, root, the users ``$FLIGHTLOG_DAEMON_USER`` names,
    and the uids ``also`` gives (``connect(trusted_uids=...)``).

    Raises :class:`ConnectError` (``daemon_user_unknown``) for a name no user has.
    """
    environ = os.environ if environ is None else environ
    uids = {os.geteuid(), 0, *also}
    for name in environ.get("FLIGHTLOG_DAEMON_USER", "").split(","):
        name = name.strip()
        if not name:
            continue
        if name.isdigit():
            uids.add(int(name))
            continue
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise ConnectError(
                f"$FLIGHTLOG_DAEMON_USER names {name!r}, and no user has that name",
                code="daemon_user_unknown",
            ) from None
    return frozenset(uids)


def check_directory(path: str, trusted: frozenset[int]) -> None:
    """Refuse ``path`` when its directory or its node is not the daemon's.

    A directory or node that is missing or out of reach passes: the connect then
    fails with what keeps it out (nothing listening, a permission).
    """
    directory = os.path.dirname(path) or "."
    try:
        st = os.lstat(directory)
    except OSError:  # missing or out of reach: the connect fails and says why
        return
    problem = socket_directory_problem(directory, st.st_mode, st.st_uid, trusted)
    if problem is not None:
        raise UntrustedDaemon(
            f"refusing the flightlog socket {path}: its directory {problem}; nothing was "
            "sent (name the daemon's user in $FLIGHTLOG_DAEMON_USER if it is trusted)",
            path=path,
            owner=st.st_uid,
            mode=stat.S_IMODE(st.st_mode),
        )
    try:
        node = os.lstat(path)
    except OSError:
        return
    if stat.S_ISSOCK(node.st_mode) and node.st_uid in trusted:
        return
    kind = "a symlink" if stat.S_ISLNK(node.st_mode) else "not a socket"
    if stat.S_ISSOCK(node.st_mode):
        kind = "owned by a uid not trusted"
    raise UntrustedDaemon(
        f"refusing the flightlog socket {path} (owner uid {node.st_uid}, mode "
        f"{stat.S_IMODE(node.st_mode):04o}): it is {kind}; nothing was sent",
        path=path,
        owner=node.st_uid,
        mode=stat.S_IMODE(node.st_mode),
    )


def check_peer(sock: socket.socket, path: str, trusted: frozenset[int]) -> None:
    """Refuse the connected ``sock`` unless the process listening runs as a trusted uid."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, _ = _PEERCRED.unpack(raw)
    if uid in trusted:
        return
    uids = ", ".join(str(u) for u in sorted(trusted))
    raise UntrustedDaemon(
        f"refusing the flightlog socket {path}: pid {pid} listens on it as uid {uid}, "
        f"which is not trusted (trusted: {uids}); nothing was sent (name the daemon's "
        "user in $FLIGHTLOG_DAEMON_USER if it is trusted)",
        path=path,
        peer_uid=uid,
        peer_pid=pid,
    )
