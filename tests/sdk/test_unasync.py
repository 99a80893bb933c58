"""The sync client and its tests are generated from the async ones and must not drift."""

from __future__ import annotations

import pytest

from . import unasync


@pytest.mark.parametrize("pair", unasync.PAIRS, ids=lambda pair: pair.target.name)
def test_generated_file_is_current(pair: unasync.Pair) -> None:
    assert pair.target.read_text() == unasync.generate(pair), (
        f"{pair.target.name} is stale: run `uv run python tests/sdk/unasync.py`"
    )


def test_renaming() -> None:
    assert unasync.unasync_line("    async def __aenter__(self) -> AsyncRun:\n") == (
        "    def __enter__(self) -> Run:\n"
    )
    assert unasync.unasync_line("        await self.aclose()\n") == "        self.close()\n"
    assert unasync.unasync_line("    return AwaitableContext(opening)\n") == "    return opening\n"
    assert unasync.unasync_line("    @pytest.mark.anyio\n") is None
