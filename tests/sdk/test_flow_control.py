"""Flow control against a real flightlogd: ``record()`` waits while a session keeps more
than ``max_unacked`` bytes of records the daemon has not acknowledged, and every such
wait ends, whatever the sizes and the number of records sent at once (sync and async
clients, over the ring and over the socket alone).

A wait that never ended is what these tests catch: each has a timeout (its failure),
and none measures anything.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from flightlog.protocol import (
    Execution,
)
from flightlog.protocol.events import (
    ToolExecEnd,
)
from flightlog.sdk import Client, connect
from flightlog.sdk.aio import aconnect
from support import DaemonProcess, read_lines

pytestmark = pytest.mark.timeout(90)

#: Small, so that a few records of tens of KiB prove what 8 MiB and 12 MB records do.
BOUND = 64 * 1024

TOOL = Execution(id="t1", kind="tool", turn_index=0)

_paths = itertools.count()


@pytest.fixture(scope="module")
def daemon(module_daemon: DaemonProcess) -> DaemonProcess:
    """The module's flightlogd (each test writes its own file)."""
    return module_daemon


@pytest.fixture
def path() -> str:
    return f"flow-{next(_paths)}.jsonl"


def result(index: int, size: int) -> ToolExecEnd:
    """A tool_exec_end whose result is ``size`` characters (its index first)."""
    text = f"{index:06d}"
    return ToolExecEnd(
        execution=TOOL, tool_call_id=f"c{index}", name="big", content=[text.ljust(size, "x")]
    )


def frame_size(client: Client, session_id: str, run_id: str, event: ToolExecEnd) -> int:
    frame = client._conn.record(session_id, run_id, event, "2026-01-01T00:00:00.000000Z")
    assert frame is not None
    return len(frame)


#: Batches of result sizes, in units of BOUND (a float) or bytes of the frame (an int,
#: "at the bound" cases); a batch of one goes through record(), more through
#: record_many().
SCENARIOS: dict[str, list[list[float | str]]] = {
    "one record larger than the bound": [[3.0], [0.01], [5.0]],
    "records at the bound": [["bound-1"], ["bound"], ["bound+1"], ["bound"], ["bound+1"]],
    "two large records held and sent at once": [[0.01], [1.5, 1.5], [0.01], [2.0, 0.2, 3.0]],
    "a large record while an acknowledgement is on its way": [[0.6], [1.2], [0.6], [0.45, 2.5]],
    "many small records crossing the bound": [[0.02]] * 300 + [[0.02] * 40] * 10,
    "a burst that together crosses the bound": [[0.3] * 7, [0.3] * 4, [0.9] * 3],
}


def sizes(scenario: list[list[float | str]], base: int) -> list[list[int]]:
    """The result sizes that make frames of the scenario's sizes (``base``: the frame
    size of an empty result)."""
    exact = {"bound-1": BOUND - 1, "bound": BOUND, "bound+1": BOUND + 1}
    batches = []
    for batch in scenario:
        batches.append(
            [
                exact[size] - base if isinstance(size, str) else max(6, int(size * BOUND))
                for size in batch
            ]
        )
    return batches


def expected_lines(batches: list[list[int]]) -> list[tuple[str, int]]:
    events = [result(n, size) for n, size in enumerate(s for batch in batches for s in batch)]
    return [(event.tool_call_id, len(event.content[0])) for event in events]


def written(path: Path) -> list[tuple[str, int]]:
    return [
        (line["data"]["tool_call_id"], len(line["data"]["content"][0]))
        for line in read_lines(path)
        if line["type"] == "tool_exec_end"
    ]


@pytest.fixture(params=[True, False], ids=["ring", "socket"])
def ring(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    if not request.param:
        monkeypatch.setenv("FLIGHTLOG_RING", "0")
    yield request.param


@pytest.mark.parametrize("best_effort", [False, True], ids=["strict", "best-effort"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_wait_for_acknowledgements_ends(
    daemon: DaemonProcess, path: str, ring: bool, scenario: str, best_effort: bool
) -> None:
    with connect(daemon.socket, max_unacked=BOUND, best_effort=best_effort) as client:
        assert (client._link.transport._ring is not None) == ring  # type: ignore[attr-defined]
        session = client.create(path)
        run = session.begin_run()
        base = frame_size(client, session.session_id, run.run_id, result(0, 0))
        batches = sizes(SCENARIOS[scenario], base)
        n = 0
        for batch in batches:
            events = [result(n + i, size) for i, size in enumerate(batch)]
            if len(events) == 1:
                run.record(events[0])
            else:
                run.record_many(events)
            n += len(events)
            # Whatever was sent, what is kept is back within the bound once record()
            # returns: it waited for what it had to, and no longer.
            assert sum(client._conn.replay_log.unacknowledged_bytes().values()) <= BOUND
        run.close()
        session.close()
        assert run.dropped == 0
    assert written(daemon.root / path) == expected_lines(batches)


@pytest.mark.anyio
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_every_wait_for_acknowledgements_ends_async(
    daemon: DaemonProcess, path: str, ring: bool, scenario: str
) -> None:
    async with aconnect(daemon.socket, max_unacked=BOUND) as client:
        assert (client._link.transport._ring is not None) == ring  # type: ignore[attr-defined]
        session = await client.create(path)
        run = await session.begin_run()
        frame = client._conn.record(
            session.session_id, run.run_id, result(0, 0), "2026-01-01T00:00:00.000000Z"
        )
        assert frame is not None
        batches = sizes(SCENARIOS[scenario], len(frame))
        n = 0
        for batch in batches:
            events = [result(n + i, size) for i, size in enumerate(batch)]
            if len(events) == 1:
                await run.record(events[0])
            else:
                await run.record_many(events)
            n += len(events)
            assert sum(client._conn.replay_log.unacknowledged_bytes().values()) <= BOUND
        await run.aclose()
        await session.aclose()
    assert written(daemon.root / path) == expected_lines(batches)


def test_records_of_several_threads_and_requests_in_flight(daemon: DaemonProcess) -> None:
    """Two threads record large and small records into one run while a third asks for
    syncs and checkpoints: acknowledgements of every kind are on their way while records
    cross the bound, and every record() returns."""
    with connect(daemon.socket, max_unacked=BOUND) as client:
        session = client.create("threads.jsonl")
        run = session.begin_run()
        done = threading.Event()
        errors: list[BaseException] = []

        def recorder(first: int, size: int) -> None:
            try:
                for n in range(first, first + 60):
                    if n % 3:
                        run.record(result(n, size))
                    else:
                        run.record_many([result(n, size), result(n + 1000, size // 7)])
            except BaseException as exc:  # pragma: no cover - the failure shown below
                errors.append(exc)

        def requester() -> None:
            try:
                while not done.is_set():
                    session.sync()
                    run.save_checkpoint({"at": "somewhere"})
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        threads = [
            threading.Thread(target=recorder, args=(0, int(BOUND * 0.8))),
            threading.Thread(target=recorder, args=(100, int(BOUND * 1.7))),
        ]
        asking = threading.Thread(target=requester)
        asking.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done.set()
        asking.join()
        assert errors == []
        run.close()
        session.close()
    ids = [call_id for call_id, _ in written(daemon.root / "threads.jsonl")]
    assert sorted(ids) == sorted(
        [f"c{n}" for first in (0, 100) for n in range(first, first + 60)]
        + [f"c{n + 1000}" for first in (0, 100) for n in range(first, first + 60) if n % 3 == 0]
    )


@pytest.mark.anyio
async def test_async_tasks_and_requests_in_flight(daemon: DaemonProcess) -> None:
    async with aconnect(daemon.socket, max_unacked=BOUND) as client:
        session = await client.create("tasks.jsonl")
        run = await session.begin_run()
        done = anyio.Event()

        async def recorder(first: int, size: int) -> None:
            for n in range(first, first + 40):
                if n % 3:
                    await run.record(result(n, size))
                else:
                    await run.record_many([result(n, size), result(n + 1000, size // 7)])

        async def requester() -> None:
            while not done.is_set():
                await session.sync()
                await run.save_checkpoint({"at": "somewhere"})

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(requester)
            async with anyio.create_task_group() as recorders:
                recorders.start_soon(recorder, 0, int(BOUND * 0.8))
                recorders.start_soon(recorder, 100, int(BOUND * 1.7))
            done.set()
        await run.aclose()
        await session.aclose()
    ids = [call_id for call_id, _ in written(daemon.root / "tasks.jsonl")]
    assert sorted(ids) == sorted(
        [f"c{n}" for first in (0, 100) for n in range(first, first + 40)]
        + [f"c{n + 1000}" for first in (0, 100) for n in range(first, first + 40) if n % 3 == 0]
    )
