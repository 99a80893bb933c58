"""A run that pauses for a person or the application, and the run that resumes it: each
call handed back ends as ``deferred`` (never left open), every turn ends, the run ends
``interrupted``, and the resumed run's call carries the same tool call id
(docs/format.md 4.5, docs/integrations.md).

pydantic-ai's deferred tools (``requires_approval``, ``CallDeferred``) with
``DeferredToolResults``; the OpenAI Agents SDK's ``needs_approval`` resumed from a
``RunState``; LangGraph's ``interrupt()`` in a tool, resumed with ``Command(resume=...)``.
Each runs the real framework offline through a real daemon.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightlog.integrations import Recorder
from flightlog.sdk import Transcript
from support import DaemonProcess

from .helpers import (
    assert_every_call_ended,
    assert_every_turn_ended,
    calls,
    finish,
    gaps,
    of_type,
    records,
    texts,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    yield recorder
    recorder.close()


def paused_then_resumed(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The tool calls of a file of two runs, the paused one's and the resumed one's,
    each call as its records; the file's sound, and its calls and turns all ended."""
    recs = records(path)
    assert_every_call_ended(recs)
    assert_every_turn_ended(recs)
    assert gaps(path) == {}
    first, second = (r["run_id"] for r in of_type(recs, "run_start"))
    tools = list(calls(recs, "tool").values())
    ends = [
        (e["data"]["ok"], e["data"]["reason"])
        for e in of_type(recs, "agent_end")
        if e["data"]["parent_id"] is None
    ]
    assert ends == [(True, "interrupted"), (True, "completed")]
    return (
        [c for c in tools if c[0]["run_id"] == first],
        [c for c in tools if c[0]["run_id"] == second],
    )


def deferred(call: list[dict[str, Any]]) -> tuple[str, str, str | None, bool, list[Any]]:
    end = call[-1]["data"]
    assert end["tool_call_id"] == call[0]["data"]["tool_call_id"]
    return (end["tool_call_id"], end["disposition"], end["reason"], end["is_error"], end["content"])


@pytest.mark.anyio
async def test_pydantic_ai_deferred_tools_end_as_deferred(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
    from pydantic_ai.exceptions import CallDeferred
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from flightlog.integrations.pydantic_ai import Flightlog

    def answer(messages: list[Any], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(p.part_kind == "user-prompt" for p in last.parts):
            return ModelResponse(
                parts=[
                    ToolCallPart("delete", {"path": "notes.txt"}, "c1"),
                    ToolCallPart("fetch", {"url": "https://example.com"}, "c2"),
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    agent: Agent[None, Any] = Agent(
        FunctionModel(answer),
        name="careful",
        output_type=[str, DeferredToolRequests],
        capabilities=[Flightlog(path="deferred.jsonl", recorder=recorder)],
    )

    @agent.tool_plain(requires_approval=True)
    def delete(path: str) -> str:
        return f"deleted {path}"

    @agent.tool_plain
    def fetch(url: str) -> str:
        raise CallDeferred(metadata={"queue": "fetches"})

    paused = await agent.run("delete notes.txt, fetch the page")
    assert isinstance(paused.output, DeferredToolRequests)
    results = DeferredToolResults(approvals={"c1": True}, calls={"c2": "<html>"})
    resumed = await agent.run(message_history=paused.all_messages(), deferred_tool_results=results)
    assert resumed.output == "done"
    await finish(recorder)
    path = daemon.root / "deferred.jsonl"
    asked, ran = paused_then_resumed(path)
    assert sorted(deferred(c) for c in asked) == [
        ("c1", "deferred", "approval", False, []),
        ("c2", "deferred", "external", False, []),
    ]
    fetched = next(c for c in asked if c[0]["data"]["tool_call_id"] == "c2")
    assert fetched[-1]["data"]["details"] == {"queue": "fetches"}
    approved = next(c for c in asked if c[0]["data"]["tool_call_id"] == "c1")
    assert approved[0]["data"]["arguments"] == {"path": "notes.txt"}
    # Approved, the call runs in the resumed run under its tool call id.
    ((start, *_, end),) = ran
    assert start["data"]["tool_call_id"] == "c1"
    assert list(texts(end["data"]["content"])) == ["deleted notes.txt"]
    # The result the application gave is what the resumed run's model is sent.
    prompt = list(Transcript.read(path).prompts())[-1]
    results_sent = {
        m["tool_call_id"]: list(texts(m["content"]))
        for m in prompt.messages
        if m.get("$type") == "tool_result"
    }
    assert results_sent == {"c1": ["deleted notes.txt"], "c2": ["<html>"]}


@pytest.mark.anyio
async def test_openai_agents_approval_ends_as_deferred(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    from agents import Agent, RunConfig, Runner, function_tool

    from .conformance_openai_agents import Models, recording, text
    from .conformance_openai_agents import calls as asks

    @function_tool(needs_approval=True)
    def delete(path: str) -> str:
        """Delete a file, once a person approves."""
        return f"deleted {path}"

    @function_tool
    def look(city: str) -> str:
        """Look the weather up."""
        return f"{city}: sunny"

    script = [asks(("delete", {"path": "notes.txt"}), ("look", {"city": "Lisbon"})), text("ok")]
    models = Models(lambda n: script[n - 1])
    agent = Agent(name="careful", model=models.model(), tools=[delete, look])
    config = RunConfig(group_id="approval")
    with recording(recorder, "approval.jsonl"):
        paused = await Runner.run(agent, "delete notes.txt", run_config=config)
        assert [i.tool_name for i in paused.interruptions] == ["delete"]
        state = paused.to_state()
        state.approve(paused.interruptions[0])
        resumed = await Runner.run(agent, state, run_config=config)
    assert resumed.final_output == "ok"
    await finish(recorder)
    path = daemon.root / "approval.jsonl"
    asked, ran = paused_then_resumed(path)
    assert sorted(deferred(c) for c in asked) == [
        ("call_1_0", "deferred", "approval", False, []),
        ("call_1_1", "ran", None, False, [{"$type": "text", "text": "Lisbon: sunny"}]),
    ]
    # Approved, the call runs in the resumed run under its tool call id and arguments.
    ((start, *_, end),) = ran
    assert (start["data"]["tool_call_id"], start["data"]["arguments"]) == (
        "call_1_0",
        {"path": "notes.txt"},
    )
    assert list(texts(end["data"]["content"])) == ["deleted notes.txt"]
    # The resumed run's request names the results after their calls, met in the
    # paused run.
    prompt = list(Transcript.read(path).prompts())[-1]
    named = {m["tool_call_id"]: m["name"] for m in prompt.messages if m["$type"] == "tool_result"}
    assert named == {"call_1_0": "delete", "call_1_1": "look"}


def test_a_tool_that_returns_nothing_is_not_deferred(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    # The SDK ends both a call that waits for approval and one whose tool returned None
    # with no output: the run going on tells them apart.
    import asyncio

    from agents import Agent, RunConfig, Runner, function_tool

    from .conformance_openai_agents import Models, recording, text
    from .conformance_openai_agents import calls as asks

    @function_tool
    def forget(key: str) -> None:
        """Forget a key."""

    script = [asks(("forget", {"key": "a"})), text("forgotten")]
    models = Models(lambda n: script[n - 1])
    agent = Agent(name="forgetful", model=models.model(), tools=[forget])
    with recording(recorder, "nothing.jsonl"):
        result = asyncio.run(Runner.run(agent, "forget a", run_config=RunConfig(group_id="n")))
    assert result.final_output == "forgotten"
    recorder.close()
    recs = records(daemon.root / "nothing.jsonl")
    assert_every_call_ended(recs)
    assert_every_turn_ended(recs)
    ((*_, end),) = calls(recs, "tool").values()
    assert (end["data"]["disposition"], end["data"]["is_error"]) == ("ran", False)
    types = [r["type"] for r in recs]
    # Its end comes before its turn's end, and before the next model request.
    assert types.index("tool_exec_end") < types.index("turn_end") < types.index("model_request", 5)
    (agent_end,) = of_type(recs, "agent_end")
    assert agent_end["data"]["reason"] == "completed"


def test_langgraph_interrupt_in_a_tool_ends_as_deferred(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command, interrupt

    from flightlog.integrations.langchain import FlightlogCallbackHandler

    from .conformance_langchain import Scripted, _react, call

    said = "done"

    @tool
    def delete(path: str) -> str:
        """Delete a file, once a person approves."""
        answer = interrupt({"delete": path})
        return f"deleted {path}" if answer == "yes" else "refused"

    def answer(messages: list[Any], n: int) -> AIMessage:
        if n == 1:
            return AIMessage(content="", tool_calls=[call("delete", {"path": "notes.txt"}, "d1")])
        return AIMessage(content=said)

    graph = _react(Scripted(answer=answer, sent=[]), [delete], checkpointer=InMemorySaver())
    handler = FlightlogCallbackHandler(path="interrupt.jsonl", recorder=recorder)
    config: Any = {"callbacks": [handler], "configurable": {"thread_id": "t"}}
    graph.invoke({"messages": [("user", "delete notes.txt")]}, config)
    assert graph.invoke(Command(resume="yes"), config)["messages"][-1].content == said
    recorder.close()
    asked, ran = paused_then_resumed(daemon.root / "interrupt.jsonl")
    ((*_, end),) = asked
    assert deferred(asked[0]) == ("d1", "deferred", "interrupted", False, [])
    assert end["data"]["details"] == [{"delete": "notes.txt"}]
    ((start, *_, done),) = ran
    assert start["data"]["tool_call_id"] == "d1"
    assert list(texts(done["data"]["content"])) == ["deleted notes.txt"]
