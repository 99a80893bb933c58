"""The provider's tool call ids, in each framework: ``flightlog show`` prints them
beside the execution ids, and ``flightlog show --call <tool call id>`` finds the call."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import Agent as OpenAIAgent
from agents import RunConfig, Runner, set_trace_processors
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from flightlog.integrations import Recorder
from flightlog.integrations.langchain import FlightlogCallbackHandler
from flightlog.integrations.openai_agents import FlightlogProcessor
from flightlog.integrations.pydantic_ai import Flightlog
from support import DaemonProcess

from . import test_langchain as lc
from . import test_openai_agents as oa
from .helpers import finish

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    set_trace_processors([FlightlogProcessor(recorder=recorder)])
    yield recorder
    set_trace_processors([])
    recorder.close()


def show(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "--color", "never", "show", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_found(path: Path, call_id: str, tool: str) -> None:
    timeline = show(path)
    assert timeline.returncode == 0, timeline.stderr
    assert f"[{call_id}]" in timeline.stdout
    found = show(path, "--call", call_id)
    assert found.returncode == 0, found.stderr
    assert found.stdout.startswith("tool call ")
    assert f"{tool}(" in found.stdout


@pytest.mark.anyio
async def test_pydantic_ai(daemon: DaemonProcess, recorder: Recorder) -> None:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[ToolCallPart("add", {"a": 1, "b": 2}, tool_call_id="call_2")]
            )
        return ModelResponse(parts=[TextPart("3")])

    agent = Agent(
        FunctionModel(answer), capabilities=[Flightlog(path="pa.jsonl", recorder=recorder)]
    )

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        return a + b

    await agent.run("1+2?")
    await finish(recorder)
    assert_found(daemon.root / "pa.jsonl", "call_2", "add")


@pytest.mark.anyio
async def test_openai_agents(daemon: DaemonProcess, recorder: Recorder) -> None:
    script: list[oa.Reply] = [oa.completion(None, ("add", {"a": 1, "b": 2})), oa.completion("3")]
    agent = OpenAIAgent(name="calc", model=oa.model(script), tools=[oa.add])
    await Runner.run(agent, "1+2?", run_config=RunConfig(group_id="ids"))
    await finish(recorder)
    assert_found(daemon.root / "openai-agents" / "ids.jsonl", "call_0_add", "add")


def test_langgraph(daemon: DaemonProcess, recorder: Recorder) -> None:
    graph = lc.agent(lc.reply("", ("add", {"a": 1, "b": 2})), lc.reply("3"), tools=[lc.add])
    handler = FlightlogCallbackHandler(path="lg.jsonl", recorder=recorder)
    graph.invoke({"messages": [("user", "1+2?")]}, config={"callbacks": [handler]})
    recorder.close()
    assert_found(daemon.root / "lg.jsonl", "call_0_add", "add")
