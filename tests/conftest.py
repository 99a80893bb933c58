from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import DaemonProcess


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="run the long soak tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A real flightlogd on a socket in a fresh temporary directory."""
    # Short base path: AF_UNIX socket paths are limited to 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    proc = DaemonProcess(base, "--log-format", "json").start()
    try:
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path (for sockets)."""
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
