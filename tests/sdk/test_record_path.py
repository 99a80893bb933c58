"""The steps of ``record()`` on its common path (the run open, the connection sound, the
session far from ``max_unacked``), against a real flightlogd, sync and async.

``record()`` is every agent's hot path (docs/benchmarks.md, scenario 3), so the layers
of the client (the run, its link, the :class:`ClientConnection`, the framer, the replay
log, the transport) each take one step there and no more: no callable asked for the
connection's failure, no look at the outbox or at the session's bound through a call.
Counted with a profile hook, never timed.
"""

from __future__ import annotations

import dis
import functools
import inspect
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

import pytest

from flightlog.protocol import Execution
from flightlog.protocol.events import ToolExecStart
from flightlog.sdk import connect
from flightlog.sdk.aio import aconnect
from support import DaemonProcess

pytestmark = pytest.mark.timeout(60)

#: The client's own layers: the codec, the framing and the ring below them are not
#: counted (they differ with and without the accelerators).
LAYERS = (
    "flightlog/sdk/_sync.py",
    "flightlog/sdk/_async.py",
    "flightlog/sdk/_sync_run.py",
    "flightlog/sdk/_async_run.py",
    "flightlog/sdk/_sync_link.py",
    "flightlog/sdk/_async_link.py",
    "flightlog/sdk/_transport.py",
    "flightlog/protocol/_client.py",
    "flightlog/protocol/_client_requests.py",
    "flightlog/protocol/_client_sessions.py",
    "flightlog/protocol/_framer.py",
    "flightlog/protocol/_replay.py",
)

#: One call each per record, and nothing else of the layers on every record.
STEPS = {
    "record": 2,  # the run's, the connection's
    "frame": 1,
    "send_records": 2,  # the link's, the connection's
    "keep": 1,
    "send": 1,  # the transport's
}

RECORDS = 300
EVENT = ToolExecStart(
    execution=Execution(id="t1", kind="tool", turn_index=0), tool_call_id="c1", name="search"
)


@pytest.fixture(scope="module")
def daemon(module_daemon: DaemonProcess) -> DaemonProcess:
    return module_daemon


@contextmanager
def counting() -> Iterator[Counter[str]]:
    """Calls of the client's layers' functions, by name (a module's calls and awaits
    of coroutines count once per call, not per resumption)."""
    calls: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if (
            event == "call"
            and code.co_filename.endswith(LAYERS)
            and (not code.co_flags & inspect.CO_COROUTINE or frame.f_lasti <= _start(code))
        ):
            calls[code.co_name] += 1

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


@functools.cache
def _start(code: CodeType) -> int:
    """Where a coroutine's frame is when it starts (a resumption is further on)."""
    return next(i.offset for i in dis.get_instructions(code) if i.opname == "RESUME")


def every_record(calls: Counter[str]) -> dict[str, int]:
    """The functions called at least once per record, and how many times each."""
    return {name: count // RECORDS for name, count in calls.items() if count >= RECORDS}


def test_sync_record_takes_one_step_per_layer(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("path/sync.jsonl")
        run = session.begin_run()
        record: Callable[[Any], None] = run.record
        for _ in range(20):
            record(EVENT)
        with counting() as calls:
            for _ in range(RECORDS):
                record(EVENT)
        run.close()
        session.close()
    assert every_record(calls) == STEPS


@pytest.mark.anyio
async def test_async_record_takes_one_step_per_layer(daemon: DaemonProcess) -> None:
    async with aconnect(daemon.socket) as client:
        session = await client.create("path/async.jsonl")
        run = await session.begin_run()
        for _ in range(20):
            await run.record(EVENT)
        with counting() as calls:
            for _ in range(RECORDS):
                await run.record(EVENT)
        await run.aclose()
        await session.aclose()
    assert every_record(calls) == STEPS
