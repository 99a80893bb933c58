"""pydantic-ai's real agent loop, offline (TestModel, FunctionModel), recorded through a
real daemon by the ``Flightlog`` capability, and read back from the file."""

from __future__ import annotations

import itertools
import logging
import signal
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pydantic
import pytest
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from flightlog.integrations import Recorder
from flightlog.integrations.pydantic_ai import Flightlog
from support import DaemonProcess, communicate, read_lines, run_python, wait_for

from .helpers import assert_every_call_ended, calls, finish, gaps, of_type, records, texts


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    yield recorder
    recorder.close()


def tool_agent(*capabilities: Any, name: str = "helper") -> Agent[None, str]:
    """An agent whose TestModel calls both tools at once, then answers."""
    agent = Agent(TestModel(), name=name, capabilities=list(capabilities))
    attempts = {"lookup": 0}

    @agent.tool_plain
    def lookup(city: str) -> str:
        attempts["lookup"] += 1
        if attempts["lookup"] == 1:
            raise ModelRetry("no such city, try again")
        return f"{city}: sunny"

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        return a + b

    return agent


@pytest.mark.anyio
async def test_a_multi_turn_run_with_parallel_tools_and_a_model_retry(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    plain = await tool_agent().run("weather?")
    result = await tool_agent(Flightlog(path="pa/run.jsonl", recorder=recorder)).run("weather?")
    assert result.output == plain.output
    await finish(recorder)
    path = daemon.root / "pa" / "run.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    assert recorder.stats.problems == 0
    models = calls(recs, "model")
    assert len(models) == 3
    usage = [parts[2]["data"]["usage"] for parts in models.values()]
    expected = [m.usage for m in result.all_messages() if isinstance(m, ModelResponse)]
    assert [(u["input_tokens"], u["output_tokens"]) for u in usage] == [
        (e.input_tokens, e.output_tokens) for e in expected
    ]
    # The first model call asked for both tools; they ran at once, under its id.
    first_model = next(iter(models))
    tools = calls(recs, "tool")
    assert len(tools) == 3
    starts = [parts[0] for parts in tools.values()]
    assert [s["data"]["execution"]["parent_id"] for s in starts[:2]] == [
        first_model.split("#")[0]
    ] * 2
    failed, retried = [p for p in tools.values() if p[0]["data"]["name"] == "lookup"]
    assert failed[-1]["data"]["is_error"] is True
    assert "no such city" in failed[-1]["data"]["content"][0]["text"]
    assert retried[0]["data"]["execution"]["replaces"] == failed[0]["data"]["execution"]["id"]
    assert list(texts(retried[-1]["data"]["content"])) == ["a: sunny"]
    (end,) = of_type(recs, "agent_end")
    assert end["data"]["ok"] is True
    assert end["data"]["output"] == result.output
    assert end["data"]["usage"]["input_tokens"] == result.usage.input_tokens
    assert end["data"]["turns"] == 3
    assert [r["data"]["turn_index"] for r in of_type(recs, "turn_start")] == [1, 2, 3]
    # Each request after the first continues the one before: only its new messages.
    requests = of_type(recs, "model_request")
    assert requests[0]["data"]["continues"] is None
    assert requests[0]["data"]["messages"] == [{"$type": "user", "content": "weather?"}]
    for earlier, later in itertools.pairwise(requests):
        assert later["data"]["continues"] == earlier["data"]["execution"]["id"]
    # The response it goes on with is its model_exec_end's message: not written again.
    assert requests[1]["data"]["with_response"] is True
    sent = requests[1]["data"]["messages"]
    assert [m["$type"] for m in sent] == ["tool_result", "tool_result"]
    assert of_type(recs, "run_close")[0]["data"]["error"] is None


@pytest.mark.anyio
async def test_a_failing_tool_fails_the_run_as_without_flightlog(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    agent = Agent(
        TestModel(), name="broken", capabilities=[Flightlog(path="fail.jsonl", recorder=recorder)]
    )

    @agent.tool_plain
    def explode() -> str:
        raise ValueError("the tool broke")

    with pytest.raises(ValueError, match="the tool broke"):
        await agent.run("go")
    await finish(recorder)
    path = daemon.root / "fail.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    (tool,) = calls(recs, "tool").values()
    assert tool[-1]["data"]["is_error"] is True
    (end,) = of_type(recs, "agent_end")
    assert end["data"]["ok"] is False
    assert end["data"]["reason"] == "error"
    assert "ValueError: the tool broke" in end["data"]["error"]
    assert "ValueError: the tool broke" in of_type(recs, "run_close")[0]["data"]["error"]
    assert gaps(path) == {}


def rate_limited(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise ModelHTTPError(429, "primary", "rate limited")


@pytest.mark.anyio
async def test_a_fallback_after_a_429_is_a_retry_of_the_same_call(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    from pydantic_ai.capabilities import ModelFallback

    agent = Agent(
        FunctionModel(rate_limited),
        name="fallback",
        capabilities=[Flightlog(path="fb.jsonl", recorder=recorder), ModelFallback(TestModel())],
    )
    result = await agent.run("hi")
    await finish(recorder)
    recs = records(daemon.root / "fb.jsonl")
    models = calls(recs, "model")
    (first, second) = models.values()
    assert [r["type"] for r in first] == ["model_request", "model_exec_start", "retry"]
    # The error the fallback moved on from, as pydantic-ai describes the attempt.
    assert (
        first[2]["data"]["error"]
        == "ModelHTTPError: status_code: 429, model_name: primary, body: rate limited"
    )
    assert first[0]["data"]["execution"]["id"] == second[0]["data"]["execution"]["id"]
    assert second[0]["data"]["execution"]["attempt"] == 2
    assert second[1]["data"]["model"] == "test"
    assert second[2]["data"]["message"]["content"][0]["text"] == result.output
    assert gaps(daemon.root / "fb.jsonl") == {}


@pytest.mark.anyio
async def test_a_fallback_model_records_the_model_that_answered(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    model = FallbackModel(FunctionModel(rate_limited), TestModel())
    agent = Agent(model, capabilities=[Flightlog(path="fbm.jsonl", recorder=recorder)])
    await agent.run("hi")
    await finish(recorder)
    recs = records(daemon.root / "fbm.jsonl")
    assert_every_call_ended(recs)
    (model_end,) = of_type(recs, "model_exec_end")
    assert model_end["data"]["message"]["model"] == "test"


@pytest.mark.anyio
async def test_a_streamed_run(daemon: DaemonProcess, recorder: Recorder) -> None:
    agent = tool_agent(Flightlog(path="stream.jsonl", recorder=recorder))
    async with agent.run_stream("weather?") as stream:
        output = await stream.get_output()
    await finish(recorder)
    recs = records(daemon.root / "stream.jsonl")
    assert_every_call_ended(recs)
    assert len(calls(recs, "model")) == 3
    (end,) = of_type(recs, "agent_end")
    assert end["data"]["output"] == output
    assert gaps(daemon.root / "stream.jsonl") == {}


class Forecast(pydantic.BaseModel):
    city: str
    degrees: int


@pytest.mark.anyio
async def test_structured_output_is_written_faithfully(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    agent = Agent(
        TestModel(),
        output_type=Forecast,
        capabilities=[Flightlog(path="out.jsonl", recorder=recorder)],
    )
    result = await agent.run("forecast")
    await finish(recorder)
    (end,) = of_type(records(daemon.root / "out.jsonl"), "agent_end")
    assert end["data"]["output"] == {"$class": f"{__name__}.Forecast", **result.output.model_dump()}


@pytest.mark.anyio
async def test_an_agent_used_as_a_tool_is_nested_under_that_tool_call(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    researcher = Agent(
        TestModel(custom_output_text="found it"),
        name="researcher",
        capabilities=[Flightlog(recorder=recorder)],
    )
    boss = Agent(
        TestModel(), name="boss", capabilities=[Flightlog(path="team.jsonl", recorder=recorder)]
    )

    @boss.tool
    async def research(ctx: RunContext[None], topic: str) -> str:
        found = await researcher.run(topic, usage=ctx.usage)
        return found.output

    await boss.run("plan")
    await finish(recorder)
    assert sorted(p.name for p in daemon.root.rglob("*.jsonl")) == ["team.jsonl"]
    path = daemon.root / "team.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    starts = of_type(recs, "agent_start")
    assert [s["data"]["agent"] for s in starts] == ["boss", "researcher"]
    (tool,) = calls(recs, "tool").values()
    tool_id = tool[0]["data"]["execution"]["id"]
    assert starts[1]["data"]["parent_id"] == tool_id
    ends = of_type(recs, "agent_end")
    assert [(e["data"]["agent"], e["data"]["parent_id"]) for e in ends] == [
        ("researcher", tool_id),
        ("boss", None),
    ]
    assert ends[0]["data"]["output"] == "found it"
    sub_models = [
        p
        for p in calls(recs, "model").values()
        if p[0]["data"]["execution"]["agent"] == "researcher"
    ]
    assert len(sub_models) == 1
    assert sub_models[0][0]["data"]["execution"]["parent_id"] == tool_id
    # The sub-agent's records lie inside its tool call.
    seqs = [r["seq"] for r in tool]
    assert seqs[0] < starts[1]["seq"] < ends[0]["seq"] < seqs[-1]
    assert gaps(path) == {}


@pytest.mark.anyio
async def test_a_continued_conversation_goes_on_in_the_same_session(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    agent = Agent(TestModel(), capabilities=[Flightlog(recorder=recorder)])
    first = await agent.run("hello")
    await agent.run("more", message_history=first.all_messages())
    await agent.run("unrelated")
    await finish(recorder)
    files = sorted((daemon.root / "pydantic-ai").glob("*.jsonl"))
    assert len(files) == 2
    runs = {f: len(of_type(records(f), "run_start")) for f in files}
    assert sorted(runs.values()) == [1, 2]
    continued = next(f for f, n in runs.items() if n == 2)
    prompts = [
        r["data"]["messages"][0]["content"] for r in of_type(records(continued), "agent_start")
    ]
    assert prompts == ["hello", "more"]
    assert gaps(continued) == {}


@pytest.mark.anyio
async def test_without_a_daemon_the_agent_runs_as_before_and_says_so_once(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder(socket=str(short_tmp / "nothing.sock"))
    agent = tool_agent(Flightlog(path="x.jsonl", recorder=recorder))
    plain = await tool_agent().run("weather?")
    with caplog.at_level(logging.WARNING, logger="flightlog.integrations"):
        first = await agent.run("weather?")
        second = await agent.run("weather?")
    assert first.output == second.output == plain.output
    assert recorder.stats.by_code == {"daemon_not_running": 2}
    assert len(caplog.records) == 1
    assert "daemon_not_running" in caplog.records[0].getMessage()


AGENT_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, signal, socket, sys, time
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel
    from flightlog.integrations import Recorder
    from flightlog.integrations.pydantic_ai import Flightlog

    mode = sys.argv[1]
    recorder = Recorder()
    flightlog = Flightlog(path="kill.jsonl", recorder=recorder)
    agent = Agent(TestModel(), name="victim", capabilities=[flightlog])

    @agent.tool_plain
    def quick(x: int) -> int:
        return x

    @agent.tool_plain
    def slow(x: int) -> int:
        if mode == "agent":
            print("in the tool", flush=True)
            time.sleep(60)
        else:
            os.kill(int(os.environ["DAEMON_PID"]), signal.SIGKILL)
            while True:  # until the daemon is gone: its socket refuses
                with socket.socket(socket.AF_UNIX) as probe:
                    try:
                        probe.connect(os.environ["FLIGHTLOG_SOCKET"])
                    except OSError:
                        break
                time.sleep(0.01)
        return x

    result = asyncio.run(agent.run("go"))
    print("output", result.output, recorder.stats.by_code, flush=True)
    """
)


def test_kill_9_in_a_tool_call_leaves_exactly_its_gaps(daemon: DaemonProcess) -> None:
    agent = run_python(AGENT_SCRIPT, "agent", env={"FLIGHTLOG_SOCKET": daemon.socket})
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline() == b"in the tool\n"
        path = daemon.root / "kill.jsonl"
        # The tool's start is sent before it runs: wait until the daemon has written it.
        wait_for(lambda: sum(r["type"] == "tool_exec_start" for r in read_lines(path)) == 2)
        wait_for(lambda: any(r["type"] == "tool_exec_end" for r in read_lines(path)))
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.communicate(timeout=30)
    wait_for(lambda: path.exists() and not _held(daemon, path))
    recs = records(path)
    slow = next(p for p in calls(recs, "tool").values() if p[0]["data"]["name"] == "slow")
    (run_gaps,) = gaps(path).values()
    assert run_gaps == [
        "no run_close: the run was interrupted, or is still being written",
        "no agent_end: the agent loop did not finish",
        f"tool call {slow[0]['data']['execution']['id']} (slow): no tool_exec_end "
        f"(seq {slow[0]['seq']})",
    ]


def _held(daemon: DaemonProcess, path: Path) -> bool:
    from flightlog.sdk import connect

    with connect(daemon.socket) as client:
        return any(s.path == str(path) for s in client.status().sessions)


VALIDATOR_SCRIPT = textwrap.dedent(
    """
    import asyncio, time
    import pydantic
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel
    from flightlog.integrations.pydantic_ai import Flightlog

    class Weather(pydantic.BaseModel):
        city: str

    agent = Agent(
        TestModel(), name="victim", output_type=Weather, capabilities=[Flightlog(path="v.jsonl")]
    )

    @agent.output_validator
    def slow(output: Weather) -> Weather:
        print("in the validator", flush=True)
        time.sleep(60)
        return output

    asyncio.run(agent.run("go"))
    """
)


def test_kill_9_in_an_output_validator_keeps_the_response_it_validates(
    daemon: DaemonProcess,
) -> None:
    # The response that asks for the output tool is held back while pydantic-ai works on
    # it, and sent before the validator (the agent's own code) runs.
    agent = run_python(VALIDATOR_SCRIPT, env={"FLIGHTLOG_SOCKET": daemon.socket})
    path = daemon.root / "v.jsonl"
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline() == b"in the validator\n"
        wait_for(lambda: any(r["type"] == "message_end" for r in read_lines(path)))
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.communicate(timeout=30)
    wait_for(lambda: not _held(daemon, path))
    recs = records(path)
    assert_every_call_ended(recs)
    (model_end,) = of_type(recs, "model_exec_end")
    (call,) = model_end["data"]["message"]["content"]
    assert call["$type"] == "tool_call"
    assert call["name"] == "final_result"
    (run_gaps,) = gaps(path).values()
    assert run_gaps == [
        "no run_close: the run was interrupted, or is still being written",
        "no agent_end: the agent loop did not finish",
    ]


def test_the_daemon_killed_mid_run_does_not_break_the_agent(daemon: DaemonProcess) -> None:
    agent = run_python(
        AGENT_SCRIPT,
        "daemon",
        env={"FLIGHTLOG_SOCKET": daemon.socket, "DAEMON_PID": str(daemon.pid)},
    )
    out, err = communicate(agent, timeout=60)
    assert agent.returncode == 0, err.decode()
    assert out.decode().startswith('output {"quick":0,"slow":0}')
    assert "daemon_unreachable" in out.decode()
    # Logged once, on one logger (the client's, which dropped the events).
    warnings = [line for line in err.decode().splitlines() if line.startswith("flightlog ")]
    assert len(warnings) == 1, warnings
    lines = read_lines(daemon.root / "kill.jsonl")
    assert [line["type"] for line in lines][:3] == ["session_start", "run_start", "agent_start"]


@pytest.mark.anyio
async def test_two_runs_of_one_session_at_once_are_both_recorded(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    # A session has one open run at a time: the second run, started while the first is
    # open, goes into the session next to it.
    plain = await tool_agent().run("weather?")
    outputs: list[str] = []

    async def one() -> None:
        agent = tool_agent(Flightlog(path="pa/shared.jsonl", recorder=recorder))
        outputs.append((await agent.run("weather?")).output)

    async with anyio.create_task_group() as group:
        group.start_soon(one)
        group.start_soon(one)
    assert outputs == [plain.output] * 2
    await finish(recorder)
    assert recorder.stats.problems == 0
    paths = sorted((daemon.root / "pa").glob("*.jsonl"))
    assert [p.name for p in paths] == ["shared.2.jsonl", "shared.jsonl"]
    for path in paths:
        recs = records(path)
        assert_every_call_ended(recs)
        assert gaps(path) == {}
        (end,) = of_type(recs, "agent_end")
        assert end["data"]["output"] == plain.output


async def never_answers(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["task cancelled", "timeout"])
async def test_a_run_cancelled_while_the_model_is_asked(
    daemon: DaemonProcess, recorder: Recorder, how: str
) -> None:
    flightlog = Flightlog(path="cancelled.jsonl", recorder=recorder)
    agent = Agent(FunctionModel(never_answers), name="waiting", capabilities=[flightlog])
    path = daemon.root / "cancelled.jsonl"
    if how == "timeout":
        with anyio.move_on_after(0.2) as scope:
            await agent.run("hi")
        assert scope.cancelled_caught
    else:
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run, "hi")
            await anyio.to_thread.run_sync(
                lambda: wait_for(lambda: path.exists() and "model_exec_start" in path.read_text())
            )
            group.cancel_scope.cancel()
    await finish(recorder)
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    (model_end,) = of_type(recs, "model_exec_end")
    assert model_end["data"]["error"] == "cancelled: the run ended before this call did"
    (end,) = of_type(recs, "agent_end")
    assert (end["data"]["ok"], end["data"]["reason"]) == (False, "aborted")


@pytest.mark.anyio
async def test_a_stream_left_halfway_is_not_a_whole_response(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    async def words(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        for n in range(50):
            await anyio.sleep(0.01)
            yield f"w{n} "

    agent = Agent(
        FunctionModel(stream_function=words),
        name="talker",
        capabilities=[Flightlog(path="left.jsonl", recorder=recorder)],
    )
    async with agent.run_stream("talk") as stream:
        async for first in stream.stream_text(delta=True):
            assert first.startswith("w0")
            break
    await finish(recorder)
    path = daemon.root / "left.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    (model_end,) = of_type(recs, "model_exec_end")
    assert model_end["data"]["error"].startswith("the response is incomplete")
    (text,) = texts(model_end["data"]["message"]["content"])
    assert text.startswith("w0 ") and "w49" not in text
    assert of_type(recs, "message_end") == []
    (end,) = of_type(recs, "agent_end")
    assert (end["data"]["ok"], end["data"]["reason"]) == (False, "aborted")


@pytest.mark.anyio
async def test_an_iteration_left_halfway_ends_the_run_as_aborted(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    agent = tool_agent(Flightlog(path="iter.jsonl", recorder=recorder))
    async with agent.iter("weather?") as run:
        async for node in run:
            if Agent.is_call_tools_node(node):
                break
    await finish(recorder)
    path = daemon.root / "iter.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    assert len(calls(recs, "model")) == 1
    (end,) = of_type(recs, "agent_end")
    assert (end["data"]["ok"], end["data"]["reason"]) == (False, "aborted")
    assert of_type(recs, "run_close")[0]["data"]["error"] == end["data"]["error"]


@pytest.mark.anyio
async def test_a_tool_that_raises_cancels_the_one_running_beside_it(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    agent = Agent(
        TestModel(), name="pair", capabilities=[Flightlog(path="pair.jsonl", recorder=recorder)]
    )

    @agent.tool_plain
    async def wait(x: int) -> int:
        await anyio.sleep_forever()
        return x

    @agent.tool_plain
    async def fail(x: int) -> int:
        raise KeyError("missing")

    with pytest.raises(KeyError):
        await agent.run("go")
    await finish(recorder)
    path = daemon.root / "pair.jsonl"
    recs = records(path)
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    ends = {p[-1]["data"]["name"]: p[-1]["data"] for p in calls(recs, "tool").values()}
    assert list(texts(ends["fail"]["content"])) == ["KeyError: 'missing'"]
    assert list(texts(ends["wait"]["content"])) == ["cancelled: the run ended before this call did"]
    assert ends["wait"]["is_error"] is True
    (end,) = of_type(recs, "agent_end")
    assert (end["data"]["reason"], end["data"]["error"]) == ("error", "KeyError: 'missing'")
