"""The agent-side events an agent (or an adapter for an agent framework) records.

``from flightlog.protocol import events`` and build ``events.ToolExecStart(...)``;
of them, :class:`Event` and :class:`Execution` are also at the top level of
:mod:`flightlog.protocol`.
"""

from __future__ import annotations

from ._events import *  # noqa: F403
from ._events import __all__ as __all__
