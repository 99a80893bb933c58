"""The OpenAI Agents SDK's real runner and chat-completions model, offline (its HTTP client
over an httpx.MockTransport), recorded by ``FlightlogProcessor`` through a real daemon."""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrailTripwireTriggered,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OutputGuardrailTripwireTriggered,
    RunConfig,
    Runner,
    custom_span,
    function_tool,
    input_guardrail,
    output_guardrail,
    set_trace_processors,
    trace,
)
from agents.retry import ModelRetrySettings, retry_policies
from openai import AsyncOpenAI

from flightlog.integrations import Recorder
from flightlog.integrations.openai_agents import FlightlogProcessor
from support import DaemonProcess, communicate, read_lines, run_python, wait_for

from .helpers import (
    assert_every_call_ended,
    calls,
    finish,
    gaps,
    of_type,
    records,
    sent,
    texts,
)

Reply = dict[str, Any] | int


def completion(text: str | None = None, *calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{index}_{name}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for index, (name, args) in enumerate(calls)
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-test",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107},
    }


def stream_of(reply: dict[str, Any]) -> bytes:
    """A text completion as the server-sent events of a streamed one."""
    (choice,) = reply["choices"]
    base = {"id": reply["id"], "object": "chat.completion.chunk", "created": 0, "model": "gpt-test"}
    chunks = [
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": choice["message"]["content"]},
                    "finish_reason": None,
                }
            ],
        },
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**base, "choices": [], "usage": reply["usage"]},
    ]
    events = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    return ("".join(events) + "data: [DONE]\n\n").encode()


def model(script: list[Reply]) -> OpenAIChatCompletionsModel:
    """The SDK's chat-completions model, answered from ``script`` (a status code fails)."""

    def handler(request: httpx.Request) -> httpx.Response:
        reply = script.pop(0)
        if isinstance(reply, int):
            return httpx.Response(reply, json={"error": {"message": "slow down"}})
        if json.loads(request.content).get("stream"):
            return httpx.Response(
                200, content=stream_of(reply), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=reply)

    client = AsyncOpenAI(
        api_key="sk-test-never-recorded",
        base_url="http://model.test/v1",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        max_retries=0,
    )
    return OpenAIChatCompletionsModel(model="gpt-test", openai_client=client)


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@function_tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    set_trace_processors([FlightlogProcessor(recorder=recorder)])
    yield recorder
    set_trace_processors([])
    recorder.close()


def session(daemon: DaemonProcess, group: str) -> Path:
    return daemon.root / "openai-agents" / f"{group}.jsonl"


async def run(agent: Agent[Any], text: str, group: str, **settings: Any) -> Any:
    result = await Runner.run(agent, text, run_config=RunConfig(group_id=group, **settings))
    return result.final_output


@pytest.mark.anyio
async def test_parallel_tools_and_a_failing_tool(daemon: DaemonProcess, recorder: Recorder) -> None:
    script: list[Reply] = [
        completion(None, ("add", {"a": 1, "b": 2}), ("divide", {"a": 1, "b": 0})),
        completion("3, and no division"),
    ]
    agent = Agent(name="calc", model=model(script), tools=[add, divide])
    output = await run(agent, "compute", "parallel")
    assert output == "3, and no division"
    await finish(recorder)
    path = session(daemon, "parallel")
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    models = list(calls(recs, "model").values())
    assert len(models) == 2
    assert [m[2]["data"]["usage"]["input_tokens"] for m in models] == [100, 100]
    request = models[0][0]["data"]
    assert request["messages"] == [{"$type": "user", "content": "compute"}]
    # The second request continues the first: it holds only the messages after those,
    # and not the first call's response, which its model_exec_end holds.
    second = models[1][0]["data"]
    assert second["continues"] == request["execution"]["id"]
    assert second["with_response"] is True
    assert [m["$type"] for m in second["messages"]] == ["tool_result", "tool_result"]
    assert [m["$type"] for m in sent(recs)[1]] == [
        "user",
        "assistant",
        "tool_result",
        "tool_result",
    ]
    assert "sk-test" not in path.read_text()
    tools = {parts[0]["data"]["name"]: parts for parts in calls(recs, "tool").values()}
    assert tools["add"][0]["data"]["tool_call_id"] == "call_0_add"
    assert tools["add"][0]["data"]["arguments"] == {"a": 1, "b": 2}
    assert (
        tools["add"][0]["data"]["execution"]["parent_id"] == models[0][0]["data"]["execution"]["id"]
    )
    assert list(texts(tools["add"][-1]["data"]["content"])) == ["3"]
    assert tools["divide"][-1]["data"]["tool_call_id"] == "call_1_divide"
    assert tools["divide"][-1]["data"]["is_error"] is True
    (end,) = of_type(recs, "agent_end")
    assert end["data"]["output"] == output
    assert end["data"]["usage"]["input_tokens"] == 200
    assert end["data"]["turns"] == 2


@pytest.mark.anyio
async def test_a_429_and_the_runners_retry(daemon: DaemonProcess, recorder: Recorder) -> None:
    script: list[Reply] = [429, completion("done")]
    retry = ModelRetrySettings(
        max_retries=2,
        backoff={"initial_delay": 0},
        policy=retry_policies.http_status([429]),
    )
    agent = Agent(name="r", model=model(script), model_settings=ModelSettings(retry=retry))
    assert await run(agent, "hi", "retry") == "done"
    await finish(recorder)
    path = session(daemon, "retry")
    recs = records(path)
    failed, retried = calls(recs, "model").values()
    assert failed[-1]["type"] == "model_exec_end"
    assert "429" in failed[-1]["data"]["error"] or "slow down" in failed[-1]["data"]["error"]
    assert retried[0]["data"]["execution"]["replaces"] == failed[0]["data"]["execution"]["id"]
    assert retried[2]["type"] == "model_exec_end"
    assert retried[2]["data"]["error"] is None
    assert gaps(path) == {}


class Answer(pydantic.BaseModel):
    value: int


@pytest.mark.anyio
async def test_structured_output_and_streaming(daemon: DaemonProcess, recorder: Recorder) -> None:
    script: list[Reply] = [completion(json.dumps({"value": 42}))]
    agent = Agent(name="typed", model=model(script), output_type=Answer)
    result = Runner.run_streamed(agent, "answer", run_config=RunConfig(group_id="typed"))
    async for _ in result.stream_events():
        pass
    assert result.final_output == Answer(value=42)
    await finish(recorder)
    recs = records(session(daemon, "typed"))
    assert_every_call_ended(recs)
    (end,) = of_type(recs, "agent_end")
    assert end["data"]["output"] == {"value": 42}


@pytest.mark.anyio
async def test_a_handoff_and_an_agent_used_as_a_tool(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    script: list[Reply] = [
        completion(None, ("transfer_to_expert", {})),
        completion(None, ("ask_helper", {"input": "what is 2+2"})),
        completion("4"),  # the helper, run as a tool
        completion("it is 4"),
    ]
    shared = model(script)
    helper = Agent(name="helper", model=shared)
    expert = Agent(
        name="expert",
        model=shared,
        tools=[helper.as_tool(tool_name="ask_helper", tool_description="Ask the helper")],
    )
    triage = Agent(name="triage", model=shared, handoffs=[expert])
    assert await run(triage, "2+2?", "team") == "it is 4"
    await finish(recorder)
    path = session(daemon, "team")
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    models = list(calls(recs, "model").values())
    assert [m[0]["data"]["execution"]["agent"] for m in models] == [
        "triage",
        "expert",
        "helper",
        "expert",
    ]
    tools = list(calls(recs, "tool").values())
    handoff, ask = tools
    assert handoff[0]["data"]["name"] == "transfer_to_expert"
    assert handoff[0]["data"]["tool_call_id"] == "call_0_transfer_to_expert"
    assert ask[0]["data"]["name"] == "ask_helper"
    starts = of_type(recs, "agent_start")
    assert [(s["data"]["agent"], s["data"]["parent_id"]) for s in starts] == [
        ("triage", None),
        ("helper", ask[0]["data"]["execution"]["id"]),
    ]
    assert models[2][0]["data"]["execution"]["parent_id"] == ask[0]["data"]["execution"]["id"]
    ends = of_type(recs, "agent_end")
    # Each agent_end names its agent_start's agent (the run's: triage, who handed off).
    assert [e["data"]["agent"] for e in ends] == ["helper", "triage"]
    assert ends[0]["data"]["output"] == "4"
    # The handoff as the model sent it, and what the model saw as its result.
    assert handoff[0]["data"]["arguments"] == {}
    assert list(texts(handoff[-1]["data"]["content"])) == ['{"assistant": "expert"}']
    assert handoff[-1]["data"]["details"] == {"from": "triage", "to": "expert"}
    # The expert's next request: the handoff call and its result, as flightlog's messages.
    after = models[1][0]["data"]
    assert after["tools"] == [{"name": "ask_helper", "description": "", "parameters": {}}]
    assert [m["$type"] for m in sent(recs)[1]] == ["user", "assistant", "tool_result"]
    call, result = sent(recs)[1][1:]
    assert call["content"] == [
        {
            "$type": "tool_call",
            "id": "call_0_transfer_to_expert",
            "name": "transfer_to_expert",
            "arguments": {},
        }
    ]
    assert (result["tool_call_id"], result["name"]) == (
        "call_0_transfer_to_expert",
        "transfer_to_expert",
    )
    assert list(texts(result["content"])) == ['{"assistant": "expert"}']


@pytest.mark.anyio
async def test_a_conversation_goes_on_in_the_same_session(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    script: list[Reply] = [completion("one"), completion("two")]
    agent = Agent(name="chat", model=model(script))
    await run(agent, "first", "conv-7")
    await run(agent, "second", "conv-7")
    await finish(recorder)
    recs = records(session(daemon, "conv-7"))
    assert len(of_type(recs, "run_start")) == 2
    assert [e["data"]["output"] for e in of_type(recs, "agent_end")] == ["one", "two"]


@pytest.mark.anyio
async def test_without_a_daemon_the_run_is_the_same(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder(socket=str(short_tmp / "none.sock"))
    set_trace_processors([FlightlogProcessor(recorder=recorder)])
    try:
        script: list[Reply] = [
            completion(None, ("add", {"a": 1, "b": 2})),
            completion("3"),
            completion(None, ("add", {"a": 1, "b": 2})),
            completion("3"),
        ]
        agent = Agent(name="calc", model=model(script), tools=[add])
        with caplog.at_level(logging.WARNING, logger="flightlog.integrations"):
            assert await run(agent, "1+2", "x") == "3"
            assert await run(agent, "1+2", "x") == "3"
    finally:
        set_trace_processors([])
    assert recorder.stats.by_code == {"daemon_not_running": 2}
    assert len(caplog.records) == 1


@pytest.mark.anyio
async def test_max_turns_exceeded_ends_the_agent_with_that_reason(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    script: list[Reply] = [completion(None, ("add", {"a": 1, "b": 2}))] * 2
    agent = Agent(name="loop", model=model(script), tools=[add])
    with pytest.raises(MaxTurnsExceeded):
        await Runner.run(agent, "go", max_turns=1, run_config=RunConfig(group_id="turns"))
    await finish(recorder)
    path = session(daemon, "turns")
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    (end,) = of_type(recs, "agent_end")
    assert (end["data"]["ok"], end["data"]["reason"]) == (False, "max_turns")
    assert of_type(recs, "run_close")[0]["data"]["error"] == end["data"]["error"]


@input_guardrail
async def refuse_input(ctx: Any, agent: Any, text: Any) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info="off topic", tripwire_triggered=True)


@output_guardrail
async def refuse_output(ctx: Any, agent: Any, output: Any) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info="leaks", tripwire_triggered=True)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("where", "tripwire"),
    [("input", InputGuardrailTripwireTriggered), ("output", OutputGuardrailTripwireTriggered)],
)
async def test_a_guardrail_tripwire_fails_the_agent(
    daemon: DaemonProcess, recorder: Recorder, where: str, tripwire: type[Exception]
) -> None:
    guardrails: dict[str, Any] = (
        {"input_guardrails": [refuse_input]}
        if where == "input"
        else {"output_guardrails": [refuse_output]}
    )
    agent = Agent(name="guarded", model=model([completion("hi")]), **guardrails)
    with pytest.raises(tripwire):
        await run(agent, "go", where)
    await finish(recorder)
    path = session(daemon, where)
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    (end,) = of_type(recs, "agent_end")
    assert end["data"]["ok"] is False
    name = "refuse_input" if where == "input" else "refuse_output"
    assert end["data"]["error"] == f"Guardrail tripwire triggered: {name}"
    assert of_type(recs, "run_close")[0]["data"]["error"] == end["data"]["error"]


@pytest.mark.anyio
async def test_a_run_cancelled_in_a_tool_call_ends_the_call_as_cancelled(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    started = asyncio.Event()

    @function_tool
    async def wait(seconds: int) -> int:
        """Wait."""
        started.set()
        await asyncio.sleep(seconds)
        return seconds

    agent = Agent(name="waiter", model=model([completion(None, ("wait", {"seconds": 60}))]))
    agent.tools.append(wait)
    task = asyncio.ensure_future(run(agent, "go", "cancelled"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await finish(recorder)
    path = session(daemon, "cancelled")
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    (tool,) = calls(recs, "tool").values()
    assert tool[-1]["data"]["is_error"] is True
    assert list(texts(tool[-1]["data"]["content"])) == [
        "cancelled: the run ended before this call did"
    ]
    (end,) = of_type(recs, "agent_end")
    assert (end["data"]["ok"], end["data"]["reason"]) == (False, "aborted")


@pytest.mark.anyio
async def test_a_streamed_run_cancelled_after_its_first_event_is_aborted(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    agent = Agent(name="talker", model=model([completion("never read")]))
    result = Runner.run_streamed(agent, "talk", run_config=RunConfig(group_id="stream-cut"))
    async for event in result.stream_events():
        assert event.type == "agent_updated_stream_event"
        result.cancel()
    assert result.final_output is None
    await finish(recorder)
    path = session(daemon, "stream-cut")
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    (end,) = of_type(recs, "agent_end")
    assert (end["data"]["ok"], end["data"]["reason"]) == (False, "aborted")
    assert end["data"]["output"] is None


@pytest.mark.anyio
async def test_runs_of_one_group_at_once_are_all_recorded(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    agent = Agent(name="twin", model=model([completion("one"), completion("two")]))
    outputs = await asyncio.gather(run(agent, "a", "twins"), run(agent, "b", "twins"))
    assert sorted(outputs) == ["one", "two"]
    await finish(recorder)
    assert recorder.stats.problems == 0
    found = []
    for path in (session(daemon, "twins"), session(daemon, "twins.2")):
        recs = records(path)
        assert_every_call_ended(recs)
        assert gaps(path) == {}
        found += [e["data"]["output"] for e in of_type(recs, "agent_end")]
    assert sorted(found) == ["one", "two"]


@pytest.mark.anyio
async def test_runs_one_after_the_other_under_one_trace_are_runs_of_its_session(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    agent = Agent(name="chat", model=model([completion("one"), completion("two")]))
    with trace("conversation", group_id="one-trace"), custom_span("mine", {"k": 1}):
        first = await Runner.run(agent, "first")
        second = await Runner.run(agent, "second")
    assert (first.final_output, second.final_output) == ("one", "two")
    await finish(recorder)
    path = session(daemon, "one-trace")
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    assert len(of_type(recs, "run_start")) == 2
    ends = of_type(recs, "agent_end")
    assert [(e["data"]["output"], e["data"]["turns"]) for e in ends] == [("one", 1), ("two", 1)]
    assert [e["data"]["usage"]["input_tokens"] for e in ends] == [100, 100]


@pytest.mark.anyio
async def test_runs_at_once_under_one_trace_are_each_a_run(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    agent = Agent(name="twin", model=model([completion("one"), completion("two")]))
    with trace("batch", group_id="gathered"):
        results = await asyncio.gather(Runner.run(agent, "a"), Runner.run(agent, "b"))
    assert sorted(r.final_output for r in results) == ["one", "two"]
    await finish(recorder)
    assert recorder.stats.problems == 0
    found = []
    for path in (session(daemon, "gathered"), session(daemon, "gathered.2")):
        recs = records(path)
        assert_every_call_ended(recs)
        assert gaps(path) == {}
        assert len(of_type(recs, "agent_start")) == 1
        (end,) = of_type(recs, "agent_end")
        assert [r["data"]["turn_index"] for r in of_type(recs, "turn_start")] == [1]
        (request,) = of_type(recs, "model_request")
        found.append((request["data"]["messages"][0]["content"], end["data"]["output"]))
    assert sorted(found) in (
        [("a", "one"), ("b", "two")],
        [("a", "two"), ("b", "one")],
    )


@function_tool(needs_approval=True)
def delete(path: str) -> str:
    """Delete a file, once a person approves."""
    return f"deleted {path}"


@pytest.mark.anyio
async def test_a_run_resumed_after_a_tool_approval_is_recorded(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    script: list[Reply] = [completion(None, ("delete", {"path": "notes.txt"})), completion("done")]
    agent = Agent(name="careful", model=model(script), tools=[delete])
    config = RunConfig(group_id="approval")
    paused = await Runner.run(agent, "delete notes.txt", run_config=config)
    assert [i.tool_name for i in paused.interruptions] == ["delete"]
    state = paused.to_state()
    state.approve(paused.interruptions[0])
    # The resumed run goes on in the trace of the paused one, which has ended.
    resumed = await Runner.run(agent, state, run_config=config)
    assert resumed.final_output == "done"
    await finish(recorder)
    path = session(daemon, "approval")
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    assert len(of_type(recs, "run_start")) == 2
    ran = list(calls(recs, "tool").values())[-1]
    assert list(texts(ran[-1]["data"]["content"])) == ["deleted notes.txt"]
    assert of_type(recs, "agent_end")[-1]["data"]["output"] == "done"


SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, signal, socket, sys, time
    import httpx
    from openai import AsyncOpenAI
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, add_trace_processor
    from agents import function_tool, set_trace_processors
    from flightlog.integrations import Recorder
    from flightlog.integrations.openai_agents import FlightlogProcessor

    mode = sys.argv[1]
    replies = [json.loads(line) for line in sys.argv[2:]]
    set_trace_processors([])  # no exporter to OpenAI's servers in a test
    recorder = Recorder()
    add_trace_processor(FlightlogProcessor(recorder=recorder))

    def handler(request):
        return httpx.Response(200, json=replies.pop(0))

    client = AsyncOpenAI(
        api_key="sk-test",
        base_url="http://model.test/v1",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )

    @function_tool
    def slow(x: int) -> int:
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

    agent = Agent(
        name="victim",
        model=OpenAIChatCompletionsModel(model="gpt-test", openai_client=client),
        tools=[slow],
    )
    result = asyncio.run(Runner.run(agent, "go", run_config=RunConfig(group_id="kill")))
    print("output", result.final_output, recorder.stats.by_code, flush=True)
    """
)

TWO_TURNS = [json.dumps(completion(None, ("slow", {"x": 1}))), json.dumps(completion("done"))]


def test_kill_9_in_a_tool_call_leaves_exactly_its_gaps(daemon: DaemonProcess) -> None:
    agent = run_python(SCRIPT, "agent", *TWO_TURNS, env={"FLIGHTLOG_SOCKET": daemon.socket})
    path = session(daemon, "kill")
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline() == b"in the tool\n"
        wait_for(lambda: path.exists() and read_lines(path)[-1]["type"] == "tool_exec_start")
    finally:
        agent.kill()
        agent.communicate(timeout=30)
    recs = records(path)
    (tool,) = calls(recs, "tool").values()
    (run_gaps,) = gaps(path).values()
    assert run_gaps == [
        "no run_close: the run was interrupted, or is still being written",
        "no agent_end: the agent loop did not finish",
        f"tool call {tool[0]['data']['execution']['id']} (slow): no tool_exec_end "
        f"(seq {tool[0]['seq']})",
    ]


def test_the_daemon_killed_mid_run_does_not_break_the_agent(daemon: DaemonProcess) -> None:
    agent = run_python(
        SCRIPT,
        "daemon",
        *TWO_TURNS,
        env={"FLIGHTLOG_SOCKET": daemon.socket, "DAEMON_PID": str(daemon.pid)},
    )
    out, err = communicate(agent, timeout=60)
    assert agent.returncode == 0, err.decode()
    assert out.decode().startswith("output done ")
    assert "daemon_unreachable" in out.decode()
    # Logged once, on one logger (the client's, which dropped the events).
    warnings = [line for line in err.decode().splitlines() if line.startswith("flightlog ")]
    assert len(warnings) == 1, warnings
