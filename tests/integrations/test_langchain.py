"""LangGraph's prebuilt ReAct agent over a LangChain fake chat model with tools, offline,
recorded by ``FlightlogCallbackHandler`` through a real daemon."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pydantic
import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode, create_react_agent

from flightlog.integrations import Recorder
from flightlog.integrations.langchain import FlightlogCallbackHandler
from support import DaemonProcess, communicate, read_lines, run_python, wait_for

from .helpers import (
    assert_every_call_ended,
    assert_every_turn_ended,
    calls,
    finish,
    gaps,
    of_type,
    records,
    sent,
    texts,
)

# create_react_agent is deprecated in LangGraph 1.0 in favour of langchain's create_agent;
# it is still what most LangGraph agents are built with.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class FakeChat(GenericFakeChatModel):
    """LangChain's fake chat model, able to take tools as a provider's model does (bound
    in OpenAI's form); it answers from its script."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def reply(text: str = "", *calls: tuple[str, dict[str, Any]], tokens: int = 10) -> AIMessage:
    return AIMessage(
        content=text,
        tool_calls=[
            {"name": name, "args": args, "id": f"call_{index}_{name}"}
            for index, (name, args) in enumerate(calls)
        ],
        usage_metadata={"input_tokens": tokens, "output_tokens": 2, "total_tokens": tokens + 2},
    )


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def explode(x: int) -> int:
    """A tool that fails."""
    raise ValueError("kaboom")


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    yield recorder
    recorder.close()


def agent(*script: AIMessage, tools: list[Any], name: str = "calc", **options: Any) -> Any:
    model = FakeChat(messages=iter(script))
    return create_react_agent(model, ToolNode(tools, handle_tool_errors=True), name=name, **options)


def test_parallel_tools_and_a_failing_tool(daemon: DaemonProcess, recorder: Recorder) -> None:
    graph = agent(
        reply("", ("add", {"a": 1, "b": 2}), ("explode", {"x": 1}), tokens=10),
        reply("3", tokens=20),
        tools=[add, explode],
    )
    handler = FlightlogCallbackHandler(path="lc.jsonl", recorder=recorder)
    out = graph.invoke({"messages": [("user", "1+2?")]}, config={"callbacks": [handler]})
    assert out["messages"][-1].content == "3"
    recorder.close()
    path = daemon.root / "lc.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    assert_every_turn_ended(recs)
    assert gaps(path) == {}
    (start,) = of_type(recs, "agent_start")
    assert start["data"]["agent"] == "calc"
    assert start["data"]["messages"] == [{"$type": "user", "content": "1+2?"}]
    models = list(calls(recs, "model").values())
    assert [m[2]["data"]["usage"]["input_tokens"] for m in models] == [10, 20]
    # The second request continues the first: it holds only the messages after those,
    # and not the first call's response, which its model_exec_end holds.
    first, second = (m[0]["data"] for m in models)
    assert first["continues"] is None
    assert second["continues"] == first["execution"]["id"]
    assert second["with_response"] is True
    assert [m["$type"] for m in second["messages"]] == ["tool_result", "tool_result"]
    assert [m["$type"] for m in sent(recs)[1]] == [
        "user",
        "assistant",
        "tool_result",
        "tool_result",
    ]
    tools = {parts[0]["data"]["name"]: parts for parts in calls(recs, "tool").values()}
    assert tools["add"][0]["data"]["tool_call_id"] == "call_0_add"
    assert tools["add"][0]["data"]["arguments"] == {"a": 1, "b": 2}
    assert list(texts(tools["add"][-1]["data"]["content"])) == ["3"]
    model_id = models[0][0]["data"]["execution"]["id"]
    assert tools["add"][0]["data"]["execution"]["parent_id"] == model_id
    assert tools["explode"][-1]["data"]["is_error"] is True
    (end,) = of_type(recs, "agent_end")
    assert end["data"]["output"] == "3"
    assert end["data"]["turns"] == 2
    assert [t["data"]["tool_call_count"] for t in of_type(recs, "turn_end")] == [2, 0]
    # The run's usage: its model calls' summed.
    assert (end["data"]["usage"]["input_tokens"], end["data"]["usage"]["output_tokens"]) == (30, 4)


class Weather(pydantic.BaseModel):
    city: str
    degrees: int


def test_structured_output_is_the_final_output(daemon: DaemonProcess, recorder: Recorder) -> None:
    # The ReAct agent's response_format: one more model call after the loop, which answers
    # through a tool call named after the schema (tool-calling based structured output).
    graph = agent(
        reply("", ("add", {"a": 20, "b": 1})),
        reply("Paris is at 21 degrees"),
        reply("", ("Weather", {"city": "Paris", "degrees": 21})),
        tools=[add],
        response_format=Weather,
    )
    handler = FlightlogCallbackHandler(path="structured.jsonl", recorder=recorder)
    out = graph.invoke({"messages": [("user", "weather?")]}, config={"callbacks": [handler]})
    assert out["structured_response"] == Weather(city="Paris", degrees=21)
    recorder.close()
    path = daemon.root / "structured.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    models = list(calls(recs, "model").values())
    assert len(models) == 3
    structured = models[2]
    assert [d["name"] for d in structured[0]["data"]["tools"]] == ["Weather"]
    (call,) = structured[2]["data"]["message"]["content"]
    assert call == {
        "$type": "tool_call",
        "id": "call_0_Weather",
        "name": "Weather",
        "arguments": {"city": "Paris", "degrees": 21},
    }
    (end,) = of_type(recs, "agent_end")
    # The pydantic model, written with its class: faithful, and no snapshot_error.
    assert end["data"]["output"] == {
        "$class": f"{__name__}.Weather",
        "city": "Paris",
        "degrees": 21,
    }
    assert end["data"]["ok"] is True


class FailingOnce(FakeChat):
    """Fails its first call, as a provider's 429 would."""

    failures: int = 1

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("429 Too Many Requests")
        return super()._generate(messages, *args, **kwargs)


def test_a_retried_model_call_replaces_the_failed_one(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    model = FailingOnce(messages=iter([reply("fine")]))
    chain = ChatPromptTemplate.from_messages([("user", "{q}")]) | model.with_retry(
        stop_after_attempt=2, wait_exponential_jitter=False
    )
    handler = FlightlogCallbackHandler(path="retry.jsonl", recorder=recorder)
    assert chain.invoke({"q": "hi"}, config={"callbacks": [handler]}).content == "fine"
    recorder.close()
    recs = records(daemon.root / "retry.jsonl")
    failed, retried = calls(recs, "model").values()
    assert "429" in failed[2]["data"]["error"]
    assert retried[0]["data"]["execution"]["replaces"] == failed[0]["data"]["execution"]["id"]
    assert retried[2]["data"]["error"] is None
    assert gaps(daemon.root / "retry.jsonl") == {}
    # A retry, not a turn: both attempts are the one turn's, which ends with the run.
    assert [r["type"] for r in of_type(recs, "turn_start", "turn_end")] == [
        "turn_start",
        "turn_end",
    ]
    assert failed[0]["data"]["execution"]["turn_index"] == 1
    assert retried[0]["data"]["execution"]["turn_index"] == 1
    assert of_type(recs, "agent_end")[0]["data"]["turns"] == 1


@pytest.mark.anyio
async def test_a_streamed_async_run(daemon: DaemonProcess, recorder: Recorder) -> None:
    graph = agent(reply("", ("add", {"a": 2, "b": 2})), reply("four"), tools=[add])
    handler = FlightlogCallbackHandler(path="stream.jsonl", recorder=recorder)
    chunks = [
        chunk
        async for chunk in graph.astream(
            {"messages": [("user", "2+2")]}, config={"callbacks": [handler]}
        )
    ]
    assert chunks
    await finish(recorder)
    recs = records(daemon.root / "stream.jsonl")
    assert_every_call_ended(recs)
    assert len(calls(recs, "model")) == 2
    assert of_type(recs, "agent_end")[0]["data"]["output"] == "four"


def test_an_agent_used_as_a_tool_is_nested_under_that_tool_call(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    helper = agent(reply("it is 4"), tools=[add], name="helper")

    @tool
    def ask_helper(question: str) -> str:
        """Ask the helper agent."""
        return str(helper.invoke({"messages": [("user", question)]})["messages"][-1].content)

    boss = agent(
        reply("", ("ask_helper", {"question": "2+2?"})), reply("helper says 4"), tools=[ask_helper]
    )
    handler = FlightlogCallbackHandler(path="team.jsonl", recorder=recorder)
    boss.invoke({"messages": [("user", "ask")]}, config={"callbacks": [handler]})
    recorder.close()
    path = daemon.root / "team.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    (ask,) = calls(recs, "tool").values()
    tool_id = ask[0]["data"]["execution"]["id"]
    starts = of_type(recs, "agent_start")
    assert [(s["data"]["agent"], s["data"]["parent_id"]) for s in starts] == [
        ("calc", None),
        ("helper", tool_id),
    ]
    models = list(calls(recs, "model").values())
    assert [m[0]["data"]["execution"]["agent"] for m in models] == ["calc", "helper", "calc"]
    assert models[1][0]["data"]["execution"]["parent_id"] == tool_id
    ends = of_type(recs, "agent_end")
    assert [(e["data"]["agent"], e["data"]["output"]) for e in ends] == [
        ("helper", "it is 4"),
        ("calc", "helper says 4"),
    ]
    assert ask[0]["seq"] < starts[1]["seq"] < ends[0]["seq"] < ask[-1]["seq"]


def test_a_thread_goes_on_in_the_same_session(daemon: DaemonProcess, recorder: Recorder) -> None:
    graph = agent(reply("one"), reply("two"), tools=[add], checkpointer=InMemorySaver())
    handler = FlightlogCallbackHandler(recorder=recorder)
    config: Any = {"callbacks": [handler], "configurable": {"thread_id": "thread-9"}}
    graph.invoke({"messages": [("user", "first")]}, config=config)
    graph.invoke({"messages": [("user", "second")]}, config=config)
    recorder.close()
    recs = records(daemon.root / "langchain" / "thread-9.jsonl")
    assert len(of_type(recs, "run_start")) == 2
    assert [e["data"]["output"] for e in of_type(recs, "agent_end")] == ["one", "two"]


def test_without_a_daemon_the_run_is_the_same(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder(socket=str(short_tmp / "none.sock"))
    graph = agent(reply("", ("add", {"a": 1, "b": 2})), reply("3"), tools=[add])
    handler = FlightlogCallbackHandler(recorder=recorder)
    with caplog.at_level(logging.WARNING, logger="flightlog.integrations"):
        out = graph.invoke({"messages": [("user", "1+2")]}, config={"callbacks": [handler]})
    assert out["messages"][-1].content == "3"
    assert recorder.stats.by_code == {"daemon_not_running": 1}
    assert len(caplog.records) == 1


SCRIPT = textwrap.dedent(
    """
    import os, signal, socket, sys, time, warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent
    from flightlog.integrations import default_recorder
    from flightlog.integrations.langchain import FlightlogCallbackHandler

    mode = sys.argv[1]

    class FakeChat(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

    @tool
    def slow(x: int) -> int:
        \"\"\"Slow.\"\"\"
        if mode == "plain":
            return x
        if mode == "agent":
            print("in the tool", flush=True)
            time.sleep(60)
        os.kill(int(os.environ["DAEMON_PID"]), signal.SIGKILL)
        while True:
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(os.environ["FLIGHTLOG_SOCKET"])
                except OSError:
                    break
            time.sleep(0.01)
        return x

    script = [
        AIMessage(content="", tool_calls=[{"name": "slow", "args": {"x": 1}, "id": "c1"}]),
        AIMessage(content="done"),
    ]
    graph = create_react_agent(FakeChat(messages=iter(script)), [slow], name="victim")
    config = {"configurable": {"thread_id": "kill"}}
    if mode != "plain":  # plain: no handler, whatever the environment says
        config["callbacks"] = [FlightlogCallbackHandler()]
    out = graph.invoke({"messages": [("user", "go")]}, config=config)
    print("output", out["messages"][-1].content, default_recorder().stats.by_code, flush=True)
    """
)


def test_kill_9_in_a_tool_call_leaves_exactly_its_gaps(daemon: DaemonProcess) -> None:
    env = {"FLIGHTLOG_SOCKET": daemon.socket}
    proc = run_python(SCRIPT, "agent", env=env)
    path = daemon.root / "langchain" / "kill.jsonl"
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"in the tool\n"
        wait_for(lambda: path.exists() and read_lines(path)[-1]["type"] == "tool_exec_start")
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    recs = records(path)
    (tool_call,) = calls(recs, "tool").values()
    (run_gaps,) = gaps(path).values()
    assert run_gaps == [
        "no run_close: the run was interrupted, or is still being written",
        "no agent_end: the agent loop did not finish",
        f"tool call {tool_call[0]['data']['execution']['id']} (slow): no tool_exec_end "
        f"(seq {tool_call[0]['seq']})",
    ]


def test_the_daemon_killed_mid_run_does_not_break_the_agent(daemon: DaemonProcess) -> None:
    env = {
        "FLIGHTLOG_SOCKET": daemon.socket,
        "DAEMON_PID": str(daemon.pid),
    }
    proc = run_python(SCRIPT, "daemon", env=env)
    out, err = communicate(proc, timeout=60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().startswith("output done ")
    assert "daemon_unreachable" in out.decode()
    # Logged once, on one logger (the client's, which dropped the events).
    warnings = [line for line in err.decode().splitlines() if line.startswith("flightlog ")]
    assert len(warnings) == 1, warnings


def test_flightlog_tracing_is_not_a_switch(daemon: DaemonProcess) -> None:
    # Recording is the handler's, passed in the run's config: no environment variable
    # records runs that were not given one (it could not without the module imported).
    proc = run_python(
        SCRIPT, "plain", env={"FLIGHTLOG_SOCKET": daemon.socket, "FLIGHTLOG_TRACING": "1"}
    )
    out, err = communicate(proc, timeout=60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().startswith("output done {}")
    assert not (daemon.root / "langchain").exists()


def test_a_chat_model_invoked_on_its_own_is_a_run(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    # No chain, no graph: invoke, stream and batch of a bare chat model.
    model = FakeChat(messages=iter([reply("one"), reply("two"), reply("three"), reply("four")]))
    handler = FlightlogCallbackHandler(path="bare/model.jsonl", recorder=recorder)
    config: Any = {"callbacks": [handler]}
    assert model.invoke("first", config=config).content == "one"
    assert "".join(str(c.content) for c in model.stream("second", config=config)) == "two"
    batch = model.batch(["third", "fourth"], config=config)
    assert sorted(str(m.content) for m in batch) == ["four", "three"]
    recorder.close()
    assert recorder.stats.problems == 0
    outputs = []
    # The batch's calls run in threads: one started while the other runs is in the
    # session next to the first (model.2.jsonl).
    for path in (daemon.root / "bare").glob("*.jsonl"):
        recs = records(path)
        assert_every_call_ended(recs)
        assert gaps(path) == {}
        for run_records in _runs(recs):
            (model_call,) = calls(run_records, "model").values()
            # A streamed response (an AIMessageChunk) is an assistant message too.
            message = model_call[2]["data"]["message"]
            assert message["$type"] == "assistant"
            (end,) = of_type(run_records, "agent_end")
            assert end["data"]["agent"] == "FakeChat"
            assert [end["data"]["output"]] == list(texts(message["content"]))
            outputs.append(end["data"]["output"])
    assert sorted(outputs) == ["four", "one", "three", "two"]


def _runs(recs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        if r.get("run_id"):
            runs.setdefault(r["run_id"], []).append(r)
    return list(runs.values())


@pytest.mark.anyio
async def test_astream_events_of_a_chat_model(daemon: DaemonProcess, recorder: Recorder) -> None:
    model = FakeChat(messages=iter([reply("streamed")]))
    handler = FlightlogCallbackHandler(path="events.jsonl", recorder=recorder)
    kinds = [e["event"] async for e in model.astream_events("hi", config={"callbacks": [handler]})]
    assert kinds[0] == "on_chat_model_start" and kinds[-1] == "on_chat_model_end"
    await finish(recorder)
    recs = records(daemon.root / "events.jsonl")
    assert_every_call_ended(recs)
    assert of_type(recs, "agent_end")[0]["data"]["output"] == "streamed"
    assert gaps(daemon.root / "events.jsonl") == {}


def test_a_graph_interrupted_and_resumed_on_its_thread(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.types import Command, interrupt

    model = FakeChat(messages=iter([reply("deleted")]))

    def approve(state: MessagesState) -> dict[str, Any]:
        answer = interrupt({"question": "delete the file?"})
        return {"messages": [("user", f"approved: {answer}")]}

    def act(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("approve", approve)
    builder.add_node("act", act)
    builder.add_edge(START, "approve")
    builder.add_edge("approve", "act")
    builder.add_edge("act", END)
    graph = builder.compile(name="careful", checkpointer=InMemorySaver())
    handler = FlightlogCallbackHandler(recorder=recorder)
    config: Any = {"callbacks": [handler], "configurable": {"thread_id": "hitl-1"}}
    paused = graph.invoke({"messages": [("user", "delete it")]}, config=config)
    assert [i.value for i in paused["__interrupt__"]] == [{"question": "delete the file?"}]
    done = graph.invoke(Command(resume="yes"), config=config)
    assert done["messages"][-1].content == "deleted"
    recorder.close()
    path = daemon.root / "langchain" / "hitl-1.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    first, second = (
        (e["data"]["ok"], e["data"]["reason"], e["data"]["output"])
        for e in of_type(recs, "agent_end")
    )
    assert first == (True, "interrupted", [{"question": "delete the file?"}])
    assert second == (True, "completed", "deleted")
    assert [r["data"]["error"] for r in of_type(recs, "run_close")] == [None, None]


class Unanswering(FakeChat):
    """A model that never answers: its caller is cancelled first."""

    async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


@tool
async def wait_forever(x: int) -> int:
    """A tool that never returns."""
    await anyio.sleep_forever()
    return x


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["model", "tool"])
async def test_a_run_cancelled_in_a_call_ends_the_call_as_cancelled(
    daemon: DaemonProcess, recorder: Recorder, where: str
) -> None:
    if where == "model":
        model: FakeChat = Unanswering(messages=iter([]))
    else:
        model = FakeChat(messages=iter([reply("", ("wait_forever", {"x": 1}))]))
    graph = create_react_agent(model, [wait_forever], name="waiting")
    handler = FlightlogCallbackHandler(path="cancelled.jsonl", recorder=recorder)
    path = daemon.root / "cancelled.jsonl"
    started = "model_exec_start" if where == "model" else "tool_exec_start"
    async with anyio.create_task_group() as group:
        group.start_soon(
            lambda: graph.ainvoke({"messages": [("user", "go")]}, config={"callbacks": [handler]})
        )
        await anyio.to_thread.run_sync(
            lambda: wait_for(lambda: path.exists() and started in path.read_text())
        )
        group.cancel_scope.cancel()
    await finish(recorder)
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    (call,) = calls(recs, where).values()
    if where == "model":
        assert call[-1]["data"]["error"] == "cancelled: the run ended before this call did"
    else:
        assert call[-1]["data"]["is_error"] is True
    (end,) = of_type(recs, "agent_end")
    assert (end["data"]["ok"], end["data"]["reason"]) == (False, "aborted")


def test_a_tool_that_asks_a_person_is_deferred_then_run_on_resume(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    from langgraph.types import Command, interrupt

    @tool
    def delete(path: str) -> str:
        """Delete a file, once a person approves."""
        answer = interrupt({"delete": path})
        return f"deleted {path}" if answer == "yes" else "refused"

    graph = agent(
        reply("", ("delete", {"path": "notes.txt"})),
        reply("done"),
        tools=[delete],
        checkpointer=InMemorySaver(),
    )
    handler = FlightlogCallbackHandler(recorder=recorder)
    config: Any = {"callbacks": [handler], "configurable": {"thread_id": "approve"}}
    graph.invoke({"messages": [("user", "delete notes.txt")]}, config=config)
    assert graph.invoke(Command(resume="yes"), config=config)["messages"][-1].content == "done"
    recorder.close()
    path = daemon.root / "langchain" / "approve.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    asked, ran = calls(recs, "tool").values()
    assert asked[0]["run_id"] != ran[0]["run_id"]
    assert [t[0]["data"]["tool_call_id"] for t in (asked, ran)] == ["call_0_delete"] * 2
    paused = asked[-1]["data"]
    assert (paused["is_error"], paused["disposition"], paused["reason"]) == (
        False,
        "deferred",
        "interrupted",
    )
    assert paused["details"] == [{"delete": "notes.txt"}]
    assert list(texts(ran[-1]["data"]["content"])) == ["deleted notes.txt"]
    assert ran[-1]["data"]["is_error"] is False
    assert [e["data"]["reason"] for e in of_type(recs, "agent_end")] == [
        "interrupted",
        "completed",
    ]


def test_the_calls_of_agents_run_as_subgraphs_carry_their_names(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    # A multi-agent graph: each agent a compiled graph used as a node.
    from langgraph.graph import END, START, MessagesState, StateGraph

    researcher = agent(
        reply("", ("add", {"a": 20, "b": 1})), reply("it is 21"), tools=[add], name="researcher"
    )
    writer = agent(reply("Report: 21."), tools=[add], name="writer")
    builder = StateGraph(MessagesState)
    builder.add_node("researcher", researcher)
    builder.add_node("writer", writer)
    builder.add_edge(START, "researcher")
    builder.add_edge("researcher", "writer")
    builder.add_edge("writer", END)
    team = builder.compile(name="team", checkpointer=InMemorySaver())
    handler = FlightlogCallbackHandler(recorder=recorder)
    config: Any = {"callbacks": [handler], "configurable": {"thread_id": "team-1"}}
    out = team.invoke({"messages": [("user", "report on 20+1")]}, config=config)
    assert out["messages"][-1].content == "Report: 21."
    recorder.close()
    path = daemon.root / "langchain" / "team-1.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    by = [p[0]["data"]["execution"]["agent"] for p in calls(recs, "model").values()]
    assert by == ["researcher", "researcher", "writer"]
    (tool_call,) = calls(recs, "tool").values()
    assert tool_call[0]["data"]["execution"]["agent"] == "researcher"
    (start,) = of_type(recs, "agent_start")
    (end,) = of_type(recs, "agent_end")
    assert (start["data"]["agent"], end["data"]["agent"]) == ("team", "team")
    assert end["data"]["output"] == "Report: 21."


def test_the_work_per_step_does_not_grow_with_the_steps(
    daemon: DaemonProcess, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every node of a graph starts a chain with the whole state: converting it there
    # made each step cost more than the one before (quadratic in the steps).
    from flightlog.integrations import _langchain_messages as messages
    from flightlog.integrations import langchain as integration

    converted = 0
    convert = messages.to_message

    def counting(message: Any) -> Any:
        nonlocal converted
        converted += 1
        return convert(message)

    # Both where the handler converts a message and where a run's input is converted.
    monkeypatch.setattr(integration, "to_message", counting)
    monkeypatch.setattr(messages, "to_message", counting)

    def conversions(steps: int) -> int:
        nonlocal converted
        script = [reply("", ("add", {"a": n, "b": 1})) for n in range(steps)] + [reply("done")]
        handler = FlightlogCallbackHandler(path=f"steps-{steps}.jsonl", recorder=recorder)
        converted = 0
        graph = agent(*script, tools=[add])
        config: Any = {"callbacks": [handler], "recursion_limit": 4 * steps + 10}
        assert (
            graph.invoke({"messages": [("user", "go")]}, config)["messages"][-1].content == "done"
        )
        return converted

    ten, twenty, forty = conversions(10), conversions(20), conversions(40)
    assert forty - twenty == 2 * (twenty - ten)


def test_a_string_input_is_the_users_message(daemon: DaemonProcess, recorder: Recorder) -> None:
    from langchain_core.runnables import RunnableLambda

    model = FakeChat(messages=iter([reply("sunny"), reply("rainy")]))
    chain = RunnableLambda(lambda question: [("user", question)]) | model
    handler = FlightlogCallbackHandler(path="string.jsonl", recorder=recorder)
    assert chain.invoke("Weather in Paris?", config={"callbacks": [handler]}).content == "sunny"
    # A chat model invoked on its own with a string: the same.
    assert model.invoke("And Rome?", config={"callbacks": [handler]}).content == "rainy"
    recorder.close()
    starts = of_type(records(daemon.root / "string.jsonl"), "agent_start")
    assert [s["data"]["messages"] for s in starts] == [
        [{"$type": "user", "content": "Weather in Paris?"}],
        [{"$type": "user", "content": "And Rome?"}],
    ]
