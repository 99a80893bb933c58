"""What every ``flightlog`` command shares and that costs nothing to import: the exit
statuses, :class:`CommandError`, where a PATH is, the record types an option names.

The commands' modules import the SDK and the protocol as they need them; this one only
the protocol's constants, so that ``flightlog find`` starts without the rest
(:func:`~._main.run` sets up only the command it runs).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final

from flightlog.protocol import RECORD_TYPES
from flightlog.protocol.wire import default_root

__all__ = [
    "EXIT_CODES",
    "EXIT_DIFFERENT",
    "EXIT_GAPS",
    "EXIT_INTERRUPTED",
    "EXIT_NO_DAEMON",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNSOUND",
    "EXIT_USAGE",
    "CommandError",
    "data_root",
    "installed_version",
    "local_path",
    "record_types",
]

EXIT_OK: Final = 0
EXIT_UNSOUND: Final = 1
EXIT_USAGE: Final = 2
EXIT_GAPS: Final = 3
EXIT_NO_DAEMON: Final = 4
EXIT_REFUSED: Final = 5
EXIT_DIFFERENT: Final = 6
EXIT_INTERRUPTED: Final = 130

#: Every exit status of ``flightlog`` and what it means (also in ``--help`` and docs/cli.md).
EXIT_CODES: Final = {
    EXIT_OK: "success (check: every file is sound; inspect: no run has gaps)",
    EXIT_UNSOUND: "a session file breaks the reading rules (corrupt line, gap in seq, ...)",
    EXIT_USAGE: "bad arguments, a file that cannot be read, or nothing matches --run/--call",
    EXIT_GAPS: "inspect found gaps: no run_close, no agent_end, a call without its end, "
    "an execution id used by two calls; resume: tool calls are left unpaired, no writer "
    "holding the session",
    EXIT_NO_DAEMON: "no daemon listens on the socket, the connection broke, or it shut down",
    EXIT_REFUSED: "the daemon refused the request or ended the tail with an error; "
    "vacuum: a file could not be removed",
    EXIT_DIFFERENT: "diff: the two runs differ",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


class CommandError(Exception):
    """A failure the command explains in one sentence and ends with ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def data_root() -> str:
    return default_root(os.environ, os.path.expanduser("~"))


def installed_version(missing: str) -> str:
    """flightlog-sdk's installed version, or ``missing`` when it is not installed.

    ``importlib.metadata`` is imported here, when a version is asked for: imported with
    the CLI, it cost every command's start ~30 ms.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flightlog-sdk")
    except PackageNotFoundError:
        return missing


def local_path(path: str) -> str:
    """Where PATH is on this machine: in the current directory when it exists there
    (made absolute), else under the data root for a relative path, else as given."""
    if os.path.isabs(path):
        return path
    if os.path.lexists(path):
        return os.path.abspath(path)
    under_root = os.path.join(data_root(), path)
    return under_root if os.path.lexists(under_root) else path


def record_types(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    types = [t.strip() for value in values for t in value.split(",") if t.strip()]
    unknown = [t for t in types if t not in RECORD_TYPES]
    if unknown:
        known = ", ".join(sorted(RECORD_TYPES))
        raise CommandError(
            f"unknown record type {', '.join(map(repr, unknown))}; the types are: {known}",
            EXIT_USAGE,
        )
    return types
