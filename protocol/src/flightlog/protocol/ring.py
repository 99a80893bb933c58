"""The ring of shared memory a client may write its records into, sans I/O (the
mapping is the caller's): ``from flightlog.protocol import ring``."""

from __future__ import annotations

from ._ring import *  # noqa: F403
from ._ring import __all__ as __all__
