"""A run cancelled in a tool, a model call or a stream, in each framework (a task
cancelled, ``anyio.fail_after``, ``asyncio.timeout``, ``asyncio.wait_for``, Ctrl-C):
the run writes the end of every call, turn and agent it started, the cut call's as
``disposition`` ``cancelled``, before its ``run_close``; ``inspect`` finds no gap."""

from __future__ import annotations

import asyncio
import json
import signal
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from agents import Agent as OpenAIAgent
from agents import (
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_trace_processors,
)
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.prebuilt import create_react_agent
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.exceptions import RunTimedOut
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from flightlog.cli._render import Style
from flightlog.cli._views import show_lines
from flightlog.integrations import Recorder
from flightlog.integrations.langchain import FlightlogCallbackHandler
from flightlog.integrations.openai_agents import FlightlogProcessor
from flightlog.integrations.pydantic_ai import Flightlog
from support import DaemonProcess, communicate, read_lines, run_python, wait_for

from .helpers import (
    assert_cancelled,
    assert_every_call_ended,
    assert_every_turn_ended,
    calls,
    finish,
    gaps,
    of_type,
    records,
    summary,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

HOW = ["task cancelled", "fail_after", "asyncio.timeout", "wait_for"]


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    set_trace_processors([FlightlogProcessor(recorder=recorder)])
    yield recorder
    set_trace_processors([])
    recorder.close()


async def cancel(how: str, run: Callable[[], Awaitable[Any]], started: asyncio.Event) -> None:
    """Run ``run()`` and cancel it ``how`` once ``started`` is set: a deadline that
    expires then (so the cut is where the test says, whatever the machine's speed), or
    its task cancelled."""
    loop = asyncio.get_running_loop()
    if how == "fail_after":
        with pytest.raises(TimeoutError):
            with anyio.fail_after(None) as scope:
                async with anyio.create_task_group() as group:

                    async def expire() -> None:
                        await started.wait()
                        scope.deadline = anyio.current_time()

                    group.start_soon(expire)
                    await run()
    elif how == "asyncio.timeout":
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(None) as deadline:
                waiter = asyncio.ensure_future(started.wait())
                waiter.add_done_callback(lambda _: deadline.reschedule(loop.time()))
                await run()
    else:
        coroutine = run() if how == "task cancelled" else asyncio.wait_for(run(), 3600)
        task = asyncio.ensure_future(coroutine)
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def check(path: Path, where: str) -> list[dict[str, Any]]:
    """The file of a run cut in a ``where`` call: every end written before ``run_close``."""
    recs = records(path)
    assert_every_call_ended(recs)
    assert_every_turn_ended(recs)
    assert gaps(path) == {}
    cut = [p[-1] for p in calls(recs, where).values() if p[-1]["data"]["disposition"] != "ran"]
    assert cut, "\n".join(f"{r['type']} {r['data']}" for r in recs)
    for end in cut:
        assert_cancelled(end)
    (end,) = [e for e in of_type(recs, "agent_end") if e["data"]["parent_id"] is None]
    assert (end["data"]["ok"], end["data"]["reason"]) == (False, "aborted")
    assert recs[-1]["type"] == "run_close"
    return recs


# --- pydantic-ai ------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("where", ["tool", "model", "stream"])
async def test_pydantic_ai(daemon: DaemonProcess, recorder: Recorder, how: str, where: str) -> None:
    started = asyncio.Event()

    async def hangs(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def trickles(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "the first words "
        started.set()
        await anyio.sleep_forever()

    flightlog = Flightlog(path="pa.jsonl", recorder=recorder)
    if where == "stream":
        agent = Agent(FunctionModel(stream_function=trickles), capabilities=[flightlog])
    else:
        model = TestModel() if where == "tool" else FunctionModel(hangs)
        agent = Agent(model, capabilities=[flightlog])

    @agent.tool_plain
    async def wait(x: int) -> int:
        started.set()
        await anyio.sleep_forever()
        return x

    @agent.tool_plain
    async def wait_too(x: int) -> int:
        await anyio.sleep_forever()
        return x

    async def go() -> None:
        if where == "stream":
            async with agent.run_stream("go") as stream:
                async for _ in stream.stream_text(delta=True):
                    pass
        else:
            await agent.run("go")

    await cancel(how, go, started)
    await finish(recorder)
    recs = check(daemon.root / "pa.jsonl", "tool" if where == "tool" else "model")
    if where == "tool":
        # Both tools ran at once: both are cut.
        assert {p[-1]["data"]["name"] for p in calls(recs, "tool").values()} == {"wait", "wait_too"}


CTRL_C = textwrap.dedent(
    """
    import faulthandler, os, signal, sys, threading, time
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel
    from flightlog.integrations.pydantic_ai import Flightlog

    agent = Agent(TestModel(), name="victim", capabilities=[Flightlog(path="ctrl-c.jsonl")])
    main = threading.main_thread().ident
    faulthandler.enable(all_threads=True)  # a SIGABRT shows where it hangs, if it does
    # Ctrl-C as a Python at a terminal takes it, whatever its launcher left ignored or
    # blocked (a process inherits both): twice in fresh-clone runs the agent's main
    # thread slept on in its selector after the SIGINT.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def waiting_in_the_selector() -> bool:
        frame = sys._current_frames().get(main)
        return frame is not None and frame.f_code.co_filename.endswith("selectors.py")

    @agent.tool_plain
    def slow(x: int) -> int:
        # The Ctrl-C comes once the event loop waits for this thread, as it does while
        # a tool runs, and at once: a Ctrl-C inside the agent's task (still on its way
        # here, or woken meanwhile by the SDK's own callbacks) ends the task with the
        # KeyboardInterrupt and leaves the run to the exit, which waits for this
        # thread, which would wait for the test.  (Sent by the test after it read the
        # line below, it landed outside the selector once on a loaded machine.)  It
        # goes to the main thread, as a terminal's does: sent to the process from this
        # thread, the kernel gave it to this thread, and the main thread slept on in
        # its selector with the KeyboardInterrupt pending.
        while not waiting_in_the_selector():
            time.sleep(0.01)
        signal.pthread_kill(main, signal.SIGINT)
        print("in the tool", flush=True)
        # Until the test, after its Ctrl-C, says to stop (the interpreter waits for
        # this thread before it exits).
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        return x

    agent.run_sync("go")
    """
)


def test_pydantic_ai_run_sync_interrupted_by_ctrl_c(daemon: DaemonProcess) -> None:
    stop = daemon.root / "stop"
    agent = run_python(CTRL_C, str(stop), env={"FLIGHTLOG_SOCKET": daemon.socket})
    path = daemon.root / "ctrl-c.jsonl"
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline() == b"in the tool\n"
        wait_for(lambda: any(r["type"] == "tool_exec_start" for r in read_lines(path)))
        # The interrupted run closes as the agent unwinds (slow on a loaded machine).
        try:
            wait_for(lambda: any(r["type"] == "run_close" for r in read_lines(path)), timeout=60)
        except TimeoutError:
            status = Path(f"/proc/{agent.pid}/status").read_text()
            masks = [line for line in status.splitlines() if line.startswith("Sig")]
            agent.send_signal(signal.SIGABRT)
            _, err = agent.communicate(timeout=60)
            lines = [r["type"] for r in read_lines(path)]
            pytest.fail(f"no run_close after the Ctrl-C: {lines}\n{masks}\n{err.decode()}")
        stop.touch()
        _, err = agent.communicate(timeout=60)
    finally:
        agent.kill()
        agent.communicate()  # and its pipes closed, whatever happened
    assert b"KeyboardInterrupt" in err
    wait_for(lambda: any(r["type"] == "run_close" for r in read_lines(path)))
    check(path, "tool")


# --- OpenAI Agents SDK ------------------------------------------------------------------


def openai_model(started: asyncio.Event, where: str) -> OpenAIChatCompletionsModel:
    """A chat-completions model over a transport that asks for the ``wait`` tool, or
    hangs (``model``), or streams a first chunk and hangs (``stream``)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        if where == "model":
            started.set()
            await anyio.sleep_forever()
        if where == "stream":
            return httpx.Response(
                200, content=trickle(), headers={"content-type": "text/event-stream"}
            )
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "wait", "arguments": json.dumps({"x": 1})},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
        return httpx.Response(
            200,
            json={
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": "gpt-test",
                "choices": [choice],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    async def trickle() -> AsyncIterator[bytes]:
        chunk = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "gpt-test",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "the first "}}],
        }
        yield f"data: {json.dumps(chunk)}\n\n".encode()
        started.set()
        await anyio.sleep_forever()

    client = AsyncOpenAI(
        api_key="sk-test",
        base_url="http://model.test/v1",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        max_retries=0,
    )
    return OpenAIChatCompletionsModel(model="gpt-test", openai_client=client)


@pytest.mark.anyio
@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("where", ["tool", "model", "stream"])
async def test_openai_agents(
    daemon: DaemonProcess, recorder: Recorder, how: str, where: str
) -> None:
    started = asyncio.Event()

    @function_tool
    async def wait(x: int) -> int:
        """Wait."""
        started.set()
        await anyio.sleep_forever()
        return x

    agent = OpenAIAgent(name="waiter", model=openai_model(started, where), tools=[wait])
    config = RunConfig(group_id="oa")

    async def go() -> None:
        if where == "stream":
            result = Runner.run_streamed(agent, "go", run_config=config)
            async for _ in result.stream_events():
                pass
        else:
            await Runner.run(agent, "go", run_config=config)

    await cancel(how, go, started)
    await finish(recorder)
    check(daemon.root / "openai-agents" / "oa.jsonl", "tool" if where == "tool" else "model")


# --- LangChain / LangGraph --------------------------------------------------------------


class Script(GenericFakeChatModel):
    """A fake chat model with tools bound as a provider's are; ``hang`` makes it wait
    forever (after a first chunk, when streamed), once ``started`` is set."""

    started: Any = None
    hang: bool = False

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
        if self.hang:
            self.started.set()
            await anyio.sleep_forever()
        return await super()._agenerate(*args, **kwargs)

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        yield ChatGenerationChunk(message=AIMessageChunk(content="the first "))
        self.started.set()
        await anyio.sleep_forever()


@pytest.mark.anyio
@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("where", ["tool", "model", "stream"])
async def test_langgraph(daemon: DaemonProcess, recorder: Recorder, how: str, where: str) -> None:
    started = asyncio.Event()

    @tool
    async def wait(x: int) -> int:
        """Wait."""
        started.set()
        await anyio.sleep_forever()
        return x

    ask = AIMessage("", tool_calls=[{"name": "wait", "args": {"x": 1}, "id": "call_1"}])
    model = Script(messages=iter([ask]), started=started, hang=where == "model")
    graph = create_react_agent(model, [wait], name="waiting")
    config: Any = {"callbacks": [FlightlogCallbackHandler(path="lg.jsonl", recorder=recorder)]}

    async def go() -> None:
        if where == "stream":
            async for _ in graph.astream(
                {"messages": [("user", "go")]}, config, stream_mode="messages"
            ):
                pass
        else:
            await graph.ainvoke({"messages": [("user", "go")]}, config)

    await cancel(how, go, started)
    await finish(recorder)
    check(daemon.root / "lg.jsonl", "tool" if where == "tool" else "model")


@pytest.mark.anyio
async def test_pydantic_ai_cut_inside_an_agent_used_as_a_tool_and_by_its_own_timeout(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    started = asyncio.Event()
    inner = Agent(TestModel(), name="inner", capabilities=[Flightlog(recorder=recorder)])

    @inner.tool_plain
    async def wait(x: int) -> int:
        started.set()
        await anyio.sleep_forever()
        return x

    outer = Agent(
        TestModel(), name="outer", capabilities=[Flightlog(path="nested.jsonl", recorder=recorder)]
    )

    @outer.tool_plain
    async def ask(question: str) -> str:
        return (await inner.run(question)).output

    # pydantic-ai's own run timeout: the deadline passes while the inner agent's tool runs.
    with pytest.raises(RunTimedOut):
        await outer.run("go", timeout=3)
    await finish(recorder)
    path = daemon.root / "nested.jsonl"
    recs = check(path, "tool")
    ends = {p[-1]["data"]["name"]: p[-1] for p in calls(recs, "tool").values()}
    assert_cancelled(ends["wait"])
    assert_cancelled(ends["ask"])
    # The inner agent ends (aborted) before the tool call it ran in.
    (inner_end,) = [e for e in of_type(recs, "agent_end") if e["data"]["agent"] == "inner"]
    assert inner_end["data"]["reason"] == "aborted"
    assert inner_end["seq"] < ends["ask"]["seq"]
    shown = show_lines(summary(path), str(path), Style(False))
    assert sum("CANCELLED" in line for line in shown) == 2


def test_a_run_still_open_when_its_recorder_closes_is_closed_with_the_ends_it_owes(
    daemon: DaemonProcess,
) -> None:
    from flightlog.integrations._recorder import UNFINISHED, cancelled_tool_end
    from flightlog.protocol import (
        Execution,
    )
    from flightlog.protocol.events import (
        AgentEnd,
        AgentStart,
        ToolExecStart,
    )

    recorder = Recorder(socket=daemon.socket)
    run = recorder.begin("open.jsonl")
    tool = Execution(id="t1", kind="tool")
    run.record(AgentStart(agent="a"))
    run.owe("agent", lambda: AgentEnd(ok=False, reason="aborted", agent="a"))
    run.record(ToolExecStart(execution=tool, tool_call_id="call_1", name="wait"))
    run.owe("t1", lambda: cancelled_tool_end(tool, "call_1", "wait"))
    recorder.close()  # as the shared recorder is at the interpreter's exit
    recs = records(daemon.root / "open.jsonl")
    assert [r["type"] for r in recs][-3:] == ["tool_exec_end", "agent_end", "run_close"]
    assert_cancelled(recs[-3])
    assert recs[-1]["data"]["error"] == UNFINISHED
    assert gaps(daemon.root / "open.jsonl") == {}


EXITS = textwrap.dedent(
    """
    from flightlog.integrations import default_recorder
    from flightlog.integrations._recorder import cancelled_tool_end
    from flightlog.protocol.events import AgentStart, Execution, ToolExecStart

    run = default_recorder().begin("exits.jsonl")
    tool = Execution(id="t1", kind="tool")
    run.record(AgentStart(agent="a"))
    run.record(ToolExecStart(execution=tool, tool_call_id="call_1", name="wait"))
    run.owe("t1", lambda: cancelled_tool_end(tool, "call_1", "wait"))
    print("exiting", flush=True)
    """
)


def test_the_shared_recorder_closes_an_open_run_at_the_interpreters_exit(
    daemon: DaemonProcess,
) -> None:
    proc = run_python(EXITS, env={"FLIGHTLOG_SOCKET": daemon.socket})
    _, err = communicate(proc, timeout=60)
    assert proc.returncode == 0, err.decode()
    path = daemon.root / "exits.jsonl"
    wait_for(lambda: any(r["type"] == "run_close" for r in read_lines(path)))
    recs = records(path)
    assert [r["type"] for r in recs][-2:] == ["tool_exec_end", "run_close"]
    assert_cancelled(recs[-2])
