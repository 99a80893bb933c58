"""The fault suite shares the daemon tests' helpers (``daemon_support``, ``agent_writer``)."""

from __future__ import annotations

import sys
from pathlib import Path

_DAEMON_TESTS = str(Path(__file__).resolve().parent.parent / "daemon")
if _DAEMON_TESTS not in sys.path:
    sys.path.insert(0, _DAEMON_TESTS)
