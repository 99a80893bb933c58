"""structlog set-up: JSON lines on stderr (journald picks them up), or console lines.

Under journald (stderr is the journal stream) each line starts with a syslog priority
prefix such as ``<4>`` so ``journalctl -p warning`` filters by level.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

from ._systemd import stderr_is_journal

__all__ = ["configure_logging"]

_PRIORITIES = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}


def _journal_prefix(_: Any, method: str, event: Any) -> Any:
    return f"<{_PRIORITIES.get(method, 6)}>{event}"


def configure_logging(
    *, format: str = "json", level: str = "info", stream: TextIO | None = None
) -> None:
    """Configure structlog for the daemon.  ``format`` is ``json`` or ``console``."""
    processors: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if format == "console":
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
    else:
        processors.append(structlog.processors.JSONRenderer())
        if stream is None and stderr_is_journal():
            processors.append(_journal_prefix)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
