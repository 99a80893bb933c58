"""The wire protocol, sans I/O: messages, framing, both ends' connections and their rules.

``from flightlog.protocol import wire`` and use ``wire.Hello``, ``wire.ServerConnection``,
``wire.ClientConnection``; what agents and readers use is at :mod:`flightlog.protocol`'s
top level.
"""

from __future__ import annotations

from ._client import DEFAULT_MAX_UNACKED, ClientConnection, Pending, sticky_of
from ._defaults import *  # noqa: F403
from ._defaults import __all__ as _defaults_all
from ._framing import *  # noqa: F403
from ._framing import __all__ as _framing_all
from ._server import *  # noqa: F403
from ._server import __all__ as _server_all
from ._server_events import *  # noqa: F403
from ._server_events import __all__ as _server_events_all
from ._state import *  # noqa: F403
from ._state import __all__ as _state_all
from ._wire import *  # noqa: F403
from ._wire import __all__ as _wire_all

__all__ = [
    "DEFAULT_MAX_UNACKED",
    "ClientConnection",
    "Pending",
    "sticky_of",
    *_defaults_all,
    *_framing_all,
    *_server_all,
    *_server_events_all,
    *_state_all,
    *_wire_all,
]
