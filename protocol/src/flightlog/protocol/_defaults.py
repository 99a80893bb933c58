"""Default paths (docs/operations.md, "Where things go"), as pure functions of the environment.

The caller passes the environment and uid in, so this module reads nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SOCKET_NAME", "default_root", "default_socket_path"]

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
