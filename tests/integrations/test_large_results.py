"""A pydantic-ai tool that returns tens of megabytes, recorded through a real daemon.

The integration holds a tool's ``tool_exec_end`` and sends it with the next
``model_request``: two records, each larger than the client's ``max_unacked`` (8 MiB),
go out at once.  The run must finish as it does without flightlog, and the file must
hold the tool's result.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from flightlog.integrations import Recorder
from flightlog.integrations.pydantic_ai import Flightlog
from support import DaemonProcess

from .helpers import assert_every_call_ended, finish, of_type, records

pytestmark = pytest.mark.timeout(180)

MB = 1024 * 1024


@pytest.fixture
def large_daemon() -> Iterator[DaemonProcess]:
    """A daemon whose frames carry a 40 MB record (the default carries 16 MiB)."""
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    proc = DaemonProcess(base, "--log-format", "json", "--max-frame-size", str(64 * MB)).start()
    try:
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(base, ignore_errors=True)


def call_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart(tool_name="dump", args={}, tool_call_id="d1")])
    return ModelResponse(parts=[TextPart(content="done")])


@pytest.mark.anyio
@pytest.mark.parametrize("megabytes", [12, 40])
async def test_a_tool_returning_tens_of_megabytes_finishes_and_is_recorded(
    large_daemon: DaemonProcess, megabytes: int
) -> None:
    size = megabytes * 1000 * 1000
    recorder = Recorder(socket=large_daemon.socket)
    try:
        agent = Agent(
            FunctionModel(call_then_answer),
            capabilities=[Flightlog(path="large.jsonl", recorder=recorder)],
        )

        @agent.tool_plain
        def dump() -> str:
            return "x" * size

        result = await agent.run("dump it")
        assert result.output == "done"
    finally:
        await finish(recorder)
    assert recorder.stats.problems == 0
    recs = records(large_daemon.root / "large.jsonl")
    assert_every_call_ended(recs)
    (tool_end,) = of_type(recs, "tool_exec_end")
    (part,) = tool_end["data"]["content"]
    assert part["$type"] == "text"
    assert len(part["text"]) == size
    assert part["text"] == "x" * size  # (a failure here prints 40 MB: the length first)
    assert of_type(recs, "run_close")[-1]["data"].get("error") is None
