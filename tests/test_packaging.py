"""The distributions' dependencies: an agent installs the SDK without the daemon's, an
operator gets the `flightlog` command with the daemon.  (tests/install builds and
installs them.)"""

from __future__ import annotations

import re
from importlib.metadata import distribution

from packaging.requirements import Requirement


def _closure(name: str) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if current in seen:
            continue
        seen.add(current)
        for text in distribution(current).requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def test_the_sdk_pulls_in_neither_uvloop_nor_structlog() -> None:
    needed = _closure("flightlog-sdk")
    assert "flightlog-protocol" in needed
    assert "msgspec" in needed
    assert not needed & {"uvloop", "structlog", "flightlogd"}


def test_the_protocol_needs_only_msgspec() -> None:
    assert _closure("flightlog-protocol") == {"flightlog-protocol", "msgspec"}


def test_the_daemon_has_its_runtime_and_the_command() -> None:
    assert {"anyio", "uvloop", "structlog", "msgspec", "flightlog-sdk"} <= _closure("flightlogd")
