"""Every prompt rebuilt from the file is what the model was sent, for LangChain/LangGraph
(a fake chat model that keeps the messages it is handed) and the OpenAI Agents SDK (its
chat-completions model over an httpx.MockTransport that keeps each request body), over
several runs of one conversation, recorded through a real daemon."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_trace_processors,
)
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode, create_react_agent
from openai import AsyncOpenAI

from flightlog.integrations import Recorder
from flightlog.integrations._langchain_messages import to_message
from flightlog.integrations.langchain import FlightlogCallbackHandler
from flightlog.integrations.openai_agents import FlightlogProcessor
from flightlog.protocol import default_codec
from flightlog.sdk import Transcript, check
from support import DaemonProcess

from .helpers import finish, of_type, records
from .test_openai_agents import completion

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    yield recorder
    recorder.close()


# ------------------------------------------------------------------------- LangChain


class KeepingChat(GenericFakeChatModel):
    """LangChain's fake chat model, taking tools as a provider's does, and keeping the
    messages of every call."""

    received: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.received.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def reply(text: str = "", *calls: tuple[str, dict[str, Any]]) -> AIMessage:
    return AIMessage(
        content=text,
        tool_calls=[
            {"name": name, "args": args, "id": f"call_{run}_{name}"}
            for run, (name, args) in enumerate(calls)
        ],
    )


def test_langchain_prompts_rebuild_across_the_runs_of_a_thread(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    script = []
    for run in range(4):
        script += [reply("", ("add", {"a": run, "b": 1})), reply(f"it is {run + 1}")]
    model = KeepingChat(messages=iter(script), received=[])
    graph = create_react_agent(model, ToolNode([add]), name="calc", checkpointer=InMemorySaver())
    handler = FlightlogCallbackHandler(recorder=recorder)
    config: Any = {"callbacks": [handler], "configurable": {"thread_id": "t-1"}}
    for run in range(4):
        graph.invoke({"messages": [("user", f"{run}+1?")]}, config=config)
    recorder.close()
    path = daemon.root / "langchain" / "t-1.jsonl"
    assert check(path).sound and recorder.stats.problems == 0
    expected = [
        msgspec.json.decode(default_codec.encode_value([to_message(m) for m in messages]))
        for messages in model.received
    ]
    assert len(expected) == 8
    assert [p.messages for p in Transcript.read(path).prompts()] == expected
    # Runs after the first continue the previous run's last request.
    requests = of_type(records(path), "model_request")
    assert sum(r["data"]["continues"] is None for r in requests) == 1
    # Each leaves out the response of the call it continues: that call's model_exec_end
    # holds it (the graph sends back the very message the model returned).
    assert [r["data"]["with_response"] for r in requests] == [False] + [True] * 7


# --------------------------------------------------------------------- OpenAI Agents


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def said(messages: list[Any], system: str | None = None) -> list[tuple[str, str]]:
    """A normalisation both shapes of a message share: (role, text, tool calls named),
    the system prompt first.  Chat-completions dicts (what the model was sent) and
    flightlog's messages (what a rebuilt prompt holds) both read this way."""
    out = [("system", system)] if system else []
    roles = {"user": "user", "assistant": "assistant", "tool_result": "tool", "tool": "tool"}
    for m in messages:
        role = str(m.get("$type") or m.get("role"))
        calls = [c["function"]["name"] for c in m.get("tool_calls") or []] + [
            p["name"] for p in m.get("content") or [] if isinstance(p, dict) and "name" in p
        ]
        if role == "system":
            out.append(("system", _text(m.get("content"))))
            continue
        text = _text(m.get("content"))
        out.append((roles.get(role, role), text + "".join(f"->{c}" for c in calls)))
    return out


@pytest.mark.anyio
async def test_openai_agents_prompts_rebuild_across_the_runs_of_a_group(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    bodies: list[dict[str, Any]] = []
    script = []
    for run in range(3):
        script += [completion(None, ("add", {"a": run, "b": 1})), completion(f"it is {run + 1}")]

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=script.pop(0))

    client = AsyncOpenAI(
        api_key="sk-test",
        base_url="http://model.test/v1",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        max_retries=0,
    )

    def plus(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    agent = Agent(
        name="calc",
        instructions="You add.",
        model=OpenAIChatCompletionsModel(model="gpt-test", openai_client=client),
        tools=[function_tool(plus, name_override="add")],
    )
    set_trace_processors([FlightlogProcessor(recorder=recorder)])
    try:
        items: list[Any] = []
        for run in range(3):
            result = await Runner.run(
                agent,
                [*items, {"role": "user", "content": f"{run}+1?"}],
                run_config=RunConfig(group_id="g-1"),
            )
            items = result.to_input_list()
    finally:
        set_trace_processors([])
    await finish(recorder)
    path = daemon.root / "openai-agents" / "g-1.jsonl"
    assert check(path).sound and recorder.stats.problems == 0
    prompts = list(Transcript.read(path).prompts())
    assert len(prompts) == len(bodies) == 6
    for prompt, body in zip(prompts, bodies, strict=True):
        assert said(prompt.messages, prompt.system) == said(body["messages"])
    # The SDK sends an earlier tool call merged into the answer after it, so not every
    # request extends the one before: those are written in full, and still rebuild.
    requests = of_type(records(path), "model_request")
    assert 1 < sum(r["data"]["continues"] is None for r in requests) < len(requests)


@pytest.mark.anyio
async def test_openai_agents_a_plain_conversation_continues_across_runs(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=completion(f"answer {len(bodies)}"))

    client = AsyncOpenAI(
        api_key="sk-test",
        base_url="http://model.test/v1",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        max_retries=0,
    )
    agent = Agent(
        name="chat",
        instructions="Be brief.",
        model=OpenAIChatCompletionsModel(model="gpt-test", openai_client=client),
    )
    set_trace_processors([FlightlogProcessor(recorder=recorder)])
    try:
        items: list[Any] = []
        for run in range(4):
            result = await Runner.run(
                agent,
                [*items, {"role": "user", "content": f"question {run}"}],
                run_config=RunConfig(group_id="g-2"),
            )
            items = result.to_input_list()
    finally:
        set_trace_processors([])
    await finish(recorder)
    path = daemon.root / "openai-agents" / "g-2.jsonl"
    prompts = list(Transcript.read(path).prompts())
    assert [said(p.messages, p.system) for p in prompts] == [said(b["messages"]) for b in bodies]
    requests = of_type(records(path), "model_request")
    assert [r["data"]["continues"] is None for r in requests] == [True, False, False, False]
    # The answer each run got is sent back with the same content: left out, it rebuilds
    # from that call's model_exec_end.
    assert [r["data"]["with_response"] for r in requests] == [False, True, True, True]
