"""flightlog's async client (anyio): the names of :mod:`flightlog.sdk`, awaited.

::

    from flightlog.sdk.aio import aconnect

    async with aconnect() as client:
        async with client.create("demo/hello.jsonl") as session:
            async with session.begin_run() as run:
                await run.record(event)
"""

from __future__ import annotations

from ._async import AsyncClient, AsyncRun, AsyncSession, AsyncTail, aconnect
from ._mock_transport import AsyncMockTransport
from ._transport import AsyncSocketTransport, AsyncTransport

__all__ = [
    "AsyncClient",
    "AsyncMockTransport",
    "AsyncRun",
    "AsyncSession",
    "AsyncSocketTransport",
    "AsyncTail",
    "AsyncTransport",
    "aconnect",
]
