"""Generate ``flightlog/sdk/_sync.py`` from ``_async.py``, as httpcore does.

``_async.py`` is the one source of truth of both clients.  Run this script after
editing it::

    uv run python tests/sdk/unasync.py          # rewrite _sync.py
    uv run python tests/sdk/unasync.py --check  # exit 1 when _sync.py is stale

``tests/sdk/test_unasync.py`` runs the check, so the two never drift apart.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SDK = Path(__file__).resolve().parents[2] / "sdk" / "src" / "flightlog" / "sdk"
SOURCE = SDK / "_async.py"
TARGET = SDK / "_sync.py"

# Whole lines that change meaning, not just names.
LINES = {
    "from ._synchronization import AsyncLock, AwaitableContext": (
        "from ._synchronization import Lock"
    ),
}

# (pattern, replacement), applied in order to every other line.
SUBS = [
    (r"AwaitableContext\[(\w+)\]", r"\1"),
    (r"AwaitableContext\((\w+)\)", r"\1"),
    (r"\bAsyncClient\b", "Client"),
    (r"\bAsyncSession\b", "Session"),
    (r"\bAsyncRun\b", "Run"),
    (r"\bAsyncTail\b", "Tail"),
    (r"\bAsyncTransport\b", "Transport"),
    (r"\bAsyncSocketTransport\b", "SocketTransport"),
    (r"\bAsyncLock\b", "Lock"),
    (r"\b_AsyncResource\b", "_Resource"),
    (r"\baconnect\b", "connect"),
    (r"\baclose\b", "close"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"``async with``", "``with``"),
    (r"\basync\b client", "sync client"),
]

HEADER = '''\
# Generated from _async.py by tests/sdk/unasync.py: edit _async.py, then run it.
"""The sync client: :class:`Client`, :class:`Session`, :class:`Run`, over a plain socket.

Generated from ``_async.py``, the one source of truth of both clients.  Every protocol
rule lives in :class:`ClientConnection`; the classes here only move bytes between it
and the transport.

One client may be shared by several threads: frames are sent whole under a lock, and
the thread that holds the receive lock feeds whatever arrives to the connection, so
each thread finds its own reply there.
"""
'''


def _body(source: str) -> str:
    """``source`` without its module docstring, which the header replaces."""
    if not source.startswith('"""'):
        raise ValueError(f"{SOURCE} must start with its module docstring")
    end = source.index('"""', 3) + 3
    return source[end:]


def unasync_line(line: str) -> str:
    if line.strip() in LINES:
        indent = line[: len(line) - len(line.lstrip())]
        return indent + LINES[line.strip()] + "\n"
    for pattern, replacement in SUBS:
        line = re.sub(pattern, replacement, line)
    return line


def generate() -> str:
    """The text _sync.py must have, formatted as ``ruff format`` leaves it."""
    body = _body(SOURCE.read_text())
    text = HEADER + "".join(unasync_line(line) for line in body.splitlines(keepends=True))
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(TARGET), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=SDK.parents[3],
    )
    return formatted.stdout


def main(argv: list[str]) -> int:
    expected = generate()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != expected:
            print(f"{TARGET} is stale: run `uv run python tests/sdk/unasync.py`")
            return 1
        return 0
    TARGET.write_text(expected)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
