from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .phoenix_backend import Phoenix, phoenix_command


@pytest.fixture(scope="session")
def phoenix() -> Iterator[Phoenix]:
    """One Arize Phoenix for every export test (it takes about 20 s to start)."""
    if phoenix_command() is None:
        pytest.skip("arize-phoenix is not installed here (the export group: uv run --all-groups)")
    workdir = Path(tempfile.mkdtemp(prefix="fl-phoenix-"))
    backend = Phoenix(workdir).start()
    try:
        yield backend
    finally:
        backend.stop()
        shutil.rmtree(workdir, ignore_errors=True)
