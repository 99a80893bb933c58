"""pydantic-ai details recorded as the model saw them: the system prompt of every
request, the failed call a re-asked one replaces, a fallback's error text."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.capabilities import ModelFallback
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from flightlog.cli._render import Style
from flightlog.cli._views import show_lines
from flightlog.integrations import Recorder
from flightlog.integrations.pydantic_ai import Flightlog
from support import DaemonProcess

from .helpers import calls, finish, of_type, records, summary


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    yield recorder
    recorder.close()


@pytest.mark.anyio
async def test_every_request_records_the_system_prompt_the_model_got(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    seen: list[str] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts]
        seen.append("\n\n".join(p.content for p in parts if p.part_kind == "system-prompt"))
        if len(seen) < 3:
            return ModelResponse(parts=[ToolCallPart("add", {"a": 1, "b": len(seen)})])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(
        FunctionModel(answer),
        system_prompt="You add numbers.",
        capabilities=[Flightlog(path="system.jsonl", recorder=recorder)],
    )

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        return a + b

    await agent.run("go")
    await finish(recorder)
    requests = of_type(records(daemon.root / "system.jsonl"), "model_request")
    assert seen == ["You add numbers."] * 3
    assert [r["data"]["system"] for r in requests] == seen
    assert [r["data"]["continues"] is not None for r in requests] == [False, True, True]


@pytest.mark.anyio
async def test_a_re_asked_call_replaces_the_failed_one_beside_one_that_succeeded(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = sum(isinstance(m, ModelResponse) for m in messages)
        if step == 0:
            # One tool twice at once: one call fails (ModelRetry), the other succeeds.
            return ModelResponse(
                parts=[
                    ToolCallPart("lookup", {"city": "Atlantis"}, tool_call_id="call_1"),
                    ToolCallPart("lookup", {"city": "Paris"}, tool_call_id="call_2"),
                ]
            )
        if step == 1:
            return ModelResponse(
                parts=[ToolCallPart("lookup", {"city": "Athens"}, tool_call_id="call_3")]
            )
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(
        FunctionModel(answer), capabilities=[Flightlog(path="replaces.jsonl", recorder=recorder)]
    )

    @agent.tool_plain
    def lookup(city: str) -> str:
        if city == "Atlantis":
            raise ModelRetry("no such city")
        return f"{city}: sunny"

    await agent.run("go")
    await finish(recorder)
    tools = {
        p[0]["data"]["tool_call_id"]: p[0]["data"]["execution"]
        for p in calls(records(daemon.root / "replaces.jsonl"), "tool").values()
    }
    assert tools["call_3"]["replaces"] == tools["call_1"]["id"]
    assert tools["call_2"]["replaces"] is None


def rate_limited(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise ModelHTTPError(429, "primary", "rate limited")


@pytest.mark.anyio
async def test_show_prints_the_error_a_fallback_moved_on_from(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    agent = Agent(
        FunctionModel(rate_limited),
        capabilities=[Flightlog(path="fb.jsonl", recorder=recorder), ModelFallback(TestModel())],
    )
    await agent.run("hi")
    await finish(recorder)
    path = daemon.root / "fb.jsonl"
    (retry,) = of_type(records(path), "retry")
    assert retry["data"]["error"] == (
        "ModelHTTPError: status_code: 429, model_name: primary, body: rate limited"
    )
    shown = "\n".join(show_lines(summary(path), str(path), Style(False)))
    assert "FAILED: ModelHTTPError: status_code: 429" in shown
    assert "FAILED: failed" not in shown


@pytest.mark.anyio
async def test_every_model_of_a_fallback_failing_keeps_each_error(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    def overloaded(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ModelHTTPError(503, "secondary", "overloaded")

    agent = Agent(
        FunctionModel(rate_limited),
        capabilities=[
            Flightlog(path="fb-all.jsonl", recorder=recorder),
            ModelFallback(FunctionModel(overloaded)),
        ],
    )
    with pytest.raises(Exception, match="All models"):
        await agent.run("hi")
    await finish(recorder)
    recs = records(daemon.root / "fb-all.jsonl")
    (retry,) = of_type(recs, "retry")
    assert "429" in retry["data"]["error"]
    (end,) = of_type(recs, "model_exec_end")
    assert end["data"]["execution"]["attempt"] == 2
