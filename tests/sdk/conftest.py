from __future__ import annotations

import pytest

from flightlog.sdk import MemoryDaemon


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def memory() -> MemoryDaemon:
    """A daemon in memory (the real server connection), for the mock transports."""
    return MemoryDaemon()
