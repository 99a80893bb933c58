"""Generate the sync client and its tests from the async ones, as httpcore does.

``flightlog/sdk/_async.py`` is the one source of truth of both clients, and
``tests/sdk/test_client_async.py`` of both clients' tests.  Run this script after
editing either::

    uv run python tests/sdk/unasync.py          # rewrite the generated files
    uv run python tests/sdk/unasync.py --check  # exit 1 when one of them is stale

``tests/sdk/test_unasync.py`` runs the check, so the two never drift apart.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk" / "src" / "flightlog" / "sdk"
TESTS = ROOT / "tests" / "sdk"

# Whole lines that change meaning, not just names (None: the line goes).
LINES: dict[str, str | None] = {
    "from ._synchronization import AsyncLock, AwaitableContext, asleep, async_wait_blocks_loop": (
        "from ._synchronization import Lock, sleep, wait_blocks_loop"
    ),
    "from ._synchronization import AsyncLock, async_wait_blocks_loop, asleep": (
        "from ._synchronization import Lock, sleep, wait_blocks_loop"
    ),
    "from ._synchronization import AwaitableContext": None,
    "@pytest.mark.anyio": None,
}

# (pattern, replacement), applied in order to every other line.
SUBS = [
    (r"AwaitableContext\[(\w+)\]", r"\1"),
    (r"AwaitableContext\((\w+)\)", r"\1"),
    (r"\bflightlog\.sdk\.aio\b", "flightlog.sdk"),
    (r"\b_async_link\b", "_sync_link"),
    (r"\b_async_tail\b", "_sync_tail"),
    (r"\b_async_run\b", "_sync_run"),
    (r"\bAsyncRunBase\b", "RunBase"),
    (r"\bAsyncResource\b", "Resource"),
    (r"\bAsyncLink\b", "Link"),
    (r"\bAsyncClient\b", "Client"),
    (r"\bAsyncSession\b", "Session"),
    (r"\bAsyncRun\b", "Run"),
    (r"\bAsyncTail\b", "Tail"),
    (r"\bAsyncCursorTail\b", "CursorTail"),
    (r"\bAsyncTransport\b", "Transport"),
    (r"\bAsyncSocketTransport\b", "SocketTransport"),
    (r"\bAsyncMockTransport\b", "MockTransport"),
    (r"\bAsyncLock\b", "Lock"),
    (r"\.try_acquire\(\)", ".acquire(blocking=False)"),
    (r"\basync_wait_blocks_loop\b", "wait_blocks_loop"),
    (r"\basleep\b", "sleep"),
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
]

GENERATED = "# Generated from {source} by tests/sdk/unasync.py: edit that file, then run this.\n"


class Pair(NamedTuple):
    source: Path
    target: Path
    #: Replaces the source's module docstring (None: keep it, unasynced).
    docstring: str | None


PAIRS = [
    Pair(
        SDK / "_async.py",
        SDK / "_sync.py",
        '''\
"""The sync client: :class:`Client`, :class:`Session`, :class:`Run`, over a plain socket.

Generated from ``_async.py``, the one source of truth of both clients.  Every protocol
rule lives in :class:`ClientConnection`; the classes here only move bytes between it
and the transport.

One client may be shared by several threads: frames are sent whole under a lock, and
the thread that holds the receive lock feeds whatever arrives to the connection, so
each thread finds its own reply there.
"""
''',
    ),
    Pair(SDK / "_async_link.py", SDK / "_sync_link.py", None),
    Pair(SDK / "_async_tail.py", SDK / "_sync_tail.py", None),
    Pair(SDK / "_async_run.py", SDK / "_sync_run.py", None),
    Pair(TESTS / "test_client_async.py", TESTS / "test_client_sync.py", None),
]


def unasync_line(line: str) -> str | None:
    stripped = line.strip()
    if stripped in LINES:
        replacement = LINES[stripped]
        if replacement is None:
            return None
        return line[: len(line) - len(line.lstrip())] + replacement + "\n"
    for pattern, replacement in SUBS:
        line = re.sub(pattern, replacement, line)
    return line


def _split_docstring(source: str) -> tuple[str, str]:
    if not source.startswith('"""'):
        raise ValueError("the source must start with its module docstring")
    end = source.index('"""', 3) + 3
    return source[:end], source[end:]


def generate(pair: Pair) -> str:
    """The text ``pair.target`` must have, formatted as ``ruff format`` leaves it."""
    docstring, body = _split_docstring(pair.source.read_text())
    lines = (docstring + body).splitlines(keepends=True)
    if pair.docstring is not None:
        lines = [pair.docstring, *body.splitlines(keepends=True)]
    converted = [line for line in map(unasync_line, lines) if line is not None]
    text = GENERATED.format(source=pair.source.name) + "".join(converted)
    # Renaming can merge imports and nested with-blocks: let ruff tidy them, then format.
    text = _ruff(text, pair.target, "check", "--fix", "--exit-zero", "--select", "I,SIM117")
    return _ruff(text, pair.target, "format")


def _ruff(text: str, path: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--quiet", "--stdin-filename", str(path), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return done.stdout


def stale() -> list[Path]:
    """The generated files that do not match their sources."""
    return [
        pair.target
        for pair in PAIRS
        if not pair.target.exists() or pair.target.read_text() != generate(pair)
    ]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        targets = stale()
        for target in targets:
            print(f"{target} is stale: run `uv run python tests/sdk/unasync.py`")
        return 1 if targets else 0
    for pair in PAIRS:
        pair.target.write_text(generate(pair))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
