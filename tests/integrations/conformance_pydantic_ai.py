"""The conformance suite's pydantic-ai scenarios: real agents over FunctionModels, which
are handed the messages of each call; each scenario returns what every model call was
handed, in call order, in the normal form (conformance.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pydantic
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from flightlog.integrations import Recorder
from flightlog.integrations.pydantic_ai import Flightlog

from .conformance import Sent, from_pydantic_ai

Scenario = Callable[[Recorder, str], Awaitable[list[Sent]]]
Answer = Callable[[list[ModelMessage], int], ModelResponse]


class Models:
    """FunctionModels that keep, in one list and in call order, what each call was handed."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []

    def model(self, answer: Answer) -> FunctionModel:
        calls = 0

        def function(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            nonlocal calls
            self.sent.append(from_pydantic_ai(messages))
            calls += 1
            return answer(messages, calls)

        return FunctionModel(function)


def _last_is_prompt(messages: list[ModelMessage]) -> bool:
    last = messages[-1]
    return isinstance(last, ModelRequest) and any(p.part_kind == "user-prompt" for p in last.parts)


def _tool_then_text(messages: list[ModelMessage], calls: int) -> ModelResponse:
    if _last_is_prompt(messages):
        return ModelResponse(parts=[ToolCallPart("lookup", {"city": "Lisbon"}, "call_a")])
    return ModelResponse(parts=[TextPart(f"sunny, after {calls} calls")])


def _agent(model: Any, recorder: Recorder, path: str, **kwargs: Any) -> Agent[None, Any]:
    agent: Agent[None, Any] = Agent(
        model,
        name="weather",
        system_prompt="You are a weather assistant.",
        capabilities=[Flightlog(path=path, recorder=recorder)],
        **kwargs,
    )

    @agent.tool_plain
    def lookup(city: str) -> str:
        return f"{city}: sunny, 21 degrees"

    return agent


async def parallel_tools(recorder: Recorder, path: str) -> list[Sent]:
    models = Models()

    def answer(messages: list[ModelMessage], calls: int) -> ModelResponse:
        if calls == 1:
            return ModelResponse(
                parts=[
                    TextPart("Looking both up."),
                    ToolCallPart("lookup", {"city": "Lisbon"}, "call_1"),
                    ToolCallPart("lookup", {"city": "Porto"}, "call_2"),
                ]
            )
        return ModelResponse(parts=[TextPart("Both sunny.")])

    await _agent(models.model(answer), recorder, path).run("Lisbon and Porto?")
    return models.sent


async def retries(recorder: Recorder, path: str) -> list[Sent]:
    # A tool that asks the model to try again, and an output validator that does.
    models = Models()
    agent = _agent(
        models.model(
            lambda messages, calls: ModelResponse(
                parts=[ToolCallPart("strict", {"n": calls}, f"call_{calls}")]
                if calls < 3
                else [TextPart(f"answer {calls}")]
            )
        ),
        recorder,
        path,
        retries=3,
    )

    @agent.tool_plain
    def strict(n: int) -> str:
        if n < 2:
            raise ModelRetry("n must be at least 2")
        return f"ok {n}"

    @agent.output_validator
    def validate(output: str) -> str:
        if output == "answer 3":
            raise ModelRetry("say it again")
        return output

    await agent.run("go")
    return models.sent


async def fallback(recorder: Recorder, path: str) -> list[Sent]:
    # The ModelFallback capability: each model it tries is an attempt of the step's call.
    from pydantic_ai.capabilities import ModelFallback

    models = Models()

    def overloaded(messages: list[ModelMessage], calls: int) -> ModelResponse:
        raise ModelHTTPError(429, "first", body={"error": "overloaded"})

    agent = Agent(
        models.model(overloaded),
        name="weather",
        system_prompt="You are a weather assistant.",
        capabilities=[
            Flightlog(path=path, recorder=recorder),
            ModelFallback(models.model(_tool_then_text)),
        ],
    )

    @agent.tool_plain
    def lookup(city: str) -> str:
        return f"{city}: sunny, 21 degrees"

    await agent.run("Weather in Lisbon?")
    return models.sent


async def fallback_model(recorder: Recorder, path: str) -> list[Sent]:
    # A FallbackModel is one model to the agent: the models it tried and moved on from
    # are inside its call, which no hook sees; the call is the one that answered.
    models, tried = Models(), Models()

    def overloaded(messages: list[ModelMessage], calls: int) -> ModelResponse:
        raise ModelHTTPError(429, "first", body={"error": "overloaded"})

    model = FallbackModel(tried.model(overloaded), models.model(_tool_then_text))
    await _agent(model, recorder, path).run("Weather in Lisbon?")
    assert tried.sent == models.sent
    return models.sent


class Weather(pydantic.BaseModel):
    city: str
    degrees: int


async def structured_output(recorder: Recorder, path: str) -> list[Sent]:
    # A tool, an output the schema refuses (the model is asked again), then one it takes.
    models = Models()

    def answer(messages: list[ModelMessage], calls: int) -> ModelResponse:
        if calls == 1:
            return ModelResponse(parts=[ToolCallPart("lookup", {"city": "Lisbon"}, "call_1")])
        degrees: Any = "warm" if calls == 2 else 21
        args = {"city": "Lisbon", "degrees": degrees}
        return ModelResponse(parts=[ToolCallPart("final_result", args, f"out_{calls}")])

    await _agent(models.model(answer), recorder, path, output_type=Weather).run("Lisbon?")
    return models.sent


async def streaming(recorder: Recorder, path: str) -> list[Sent]:
    models = Models()

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        models.sent.append(from_pydantic_ai(messages))
        if _last_is_prompt(messages):
            yield {
                0: DeltaToolCall(name="lookup", json_args='{"city": "Lisbon"}', tool_call_id="c1")
            }
            return
        for chunk in ("Sunny ", "and ", "21 degrees."):
            yield chunk

    agent = _agent(FunctionModel(stream_function=stream), recorder, path)
    async with agent.run_stream("Lisbon?") as result:
        await result.get_output()
    return models.sent


async def agents_as_tools(recorder: Recorder, path: str) -> list[Sent]:
    models = Models()
    expert: Agent[None, str] = Agent(
        models.model(_tool_then_text),
        name="expert",
        instructions="You know the weather.",
        capabilities=[Flightlog(recorder=recorder)],
    )

    @expert.tool_plain
    def lookup(city: str) -> str:
        return f"{city}: sunny"

    def answer(messages: list[ModelMessage], calls: int) -> ModelResponse:
        if calls == 1:
            return ModelResponse(parts=[ToolCallPart("ask", {"question": "Lisbon?"}, "call_q")])
        return ModelResponse(parts=[TextPart("The expert says sunny.")])

    agent = _agent(models.model(answer), recorder, path)

    @agent.tool
    async def ask(ctx: RunContext[None], question: str) -> str:
        result = await expert.run(question, usage=ctx.usage)
        return result.output

    await agent.run("Ask the expert about Lisbon.")
    return models.sent


async def cancellation(recorder: Recorder, path: str) -> list[Sent]:
    # A run cancelled in a tool, between two runs of the conversation that are not.
    models = Models()
    agent = _agent(models.model(_tool_then_text), recorder, path)
    first = await agent.run("Lisbon?")
    started = anyio.Event()

    def stuck(messages: list[ModelMessage], calls: int) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("wait", {}, "call_w")])

    waiting = _agent(models.model(stuck), recorder, path)

    @waiting.tool_plain
    async def wait() -> str:
        started.set()
        await anyio.sleep_forever()
        return "never"

    async with anyio.create_task_group() as group:
        group.start_soon(lambda: waiting.run("Wait.", message_history=first.all_messages()))
        await started.wait()
        group.cancel_scope.cancel()
    await agent.run("And Porto?", message_history=first.all_messages())
    return models.sent


async def conversation(recorder: Recorder, path: str) -> list[Sent]:
    models = Models()
    agent = _agent(models.model(_tool_then_text), recorder, path)
    history: list[ModelMessage] | None = None
    for question in ("Lisbon?", "And tomorrow?", "And Porto?"):
        result = await agent.run(question, message_history=history)
        history = result.all_messages()
    # A history the application edited: the tool's result replaced.
    edited = [
        ModelRequest(parts=[ToolReturnPart("lookup", "rain", "call_a")])
        if isinstance(m, ModelRequest) and any(p.part_kind == "tool-return" for p in m.parts)
        else m
        for m in (history or [])
    ]
    await agent.run("Once more?", message_history=edited)
    return models.sent


async def multimodal(recorder: Recorder, path: str) -> list[Sent]:
    # Images in the prompt (by URL, and as bytes), documents, audio, video and a file
    # uploaded to the provider, and a response that thinks first.
    from pydantic_ai import AudioUrl, BinaryContent, DocumentUrl, ImageUrl, VideoUrl
    from pydantic_ai.messages import ThinkingPart, UploadedFile

    models = Models()

    def answer(messages: list[ModelMessage], calls: int) -> ModelResponse:
        thought = ThinkingPart("Two pictures of the sky.", signature="sig")
        if calls == 1:
            return ModelResponse(parts=[thought, ToolCallPart("lookup", {"city": "Lisbon"}, "c1")])
        return ModelResponse(parts=[thought, TextPart("Sunny in both.")])

    prompt = [
        "What is the weather in these?",
        ImageUrl("https://example.com/sky.png"),
        BinaryContent(data=b"\x89PNG\r\n", media_type="image/png"),
        DocumentUrl("https://example.com/forecast.pdf"),
        AudioUrl("https://example.com/wind.mp3"),
        VideoUrl("https://example.com/clouds.mp4"),
        BinaryContent(data=b"%PDF-1.4\n", media_type="application/pdf"),
        BinaryContent(data=b"RIFF\x24\x00\x00\x00WAVE", media_type="audio/wav"),
        UploadedFile(file_id="file-123", provider_name="openai", media_type="application/pdf"),
    ]
    await _agent(models.model(answer), recorder, path).run(prompt)
    return models.sent


async def deferred_tools(recorder: Recorder, path: str) -> list[Sent]:
    # A run that pauses on a tool needing approval and one deferred to the
    # application, and the run that resumes it with their results.
    from pydantic_ai import DeferredToolRequests, DeferredToolResults
    from pydantic_ai.exceptions import CallDeferred

    models = Models()

    def answer(messages: list[ModelMessage], calls: int) -> ModelResponse:
        if calls == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart("delete", {"path": "notes.txt"}, "c1"),
                    ToolCallPart("fetch", {"url": "https://example.com"}, "c2"),
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    agent = _agent(models.model(answer), recorder, path, output_type=[str, DeferredToolRequests])

    @agent.tool_plain(requires_approval=True)
    def delete(path: str) -> str:
        return f"deleted {path}"

    @agent.tool_plain
    def fetch(url: str) -> str:
        raise CallDeferred

    paused = await agent.run("Delete notes.txt and fetch the page.")
    results = DeferredToolResults(approvals={"c1": True}, calls={"c2": "<html>"})
    await agent.run(message_history=paused.all_messages(), deferred_tool_results=results)
    return models.sent


SCENARIOS: dict[str, Scenario] = {
    "parallel_tools": parallel_tools,
    "retries": retries,
    "fallback": fallback,
    "fallback_model": fallback_model,
    "structured_output": structured_output,
    "streaming": streaming,
    "agents_as_tools": agents_as_tools,
    "cancellation": cancellation,
    "conversation": conversation,
    "multimodal": multimodal,
    "deferred_tools": deferred_tools,
}
