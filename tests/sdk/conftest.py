from __future__ import annotations

import pytest

from .fakes import FakeDaemon


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fake() -> FakeDaemon:
    """A fake daemon in memory, for the mock transports."""
    return FakeDaemon()
