"""The conformance suite's OpenAI Agents SDK scenarios: the SDK's real runner and its
chat-completions model, offline (its HTTP client over an httpx.MockTransport), the
model keeping the system instructions and input the runner hands it at each call; each
scenario returns what every model call was handed, in call order, in the normal form
(conformance.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx
import pydantic
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_trace_processors,
)
from agents.retry import ModelRetrySettings, retry_policies
from openai import AsyncOpenAI

from flightlog.integrations import Recorder
from flightlog.integrations.openai_agents import FlightlogProcessor

from .conformance import PDF64, PNG64, WAV64, Sent, from_openai_agents

Scenario = Callable[[Recorder, str], Awaitable[list[Sent]]]
#: A reply: a completion's message (its text, its tool calls), or a status code that fails.
Reply = tuple[str | None, list[tuple[str, dict[str, Any]]]] | int
Script = Callable[[int], Reply]


def text(answer: str) -> Reply:
    return (answer, [])


def calls(*wanted: tuple[str, dict[str, Any]]) -> Reply:
    return (None, list(wanted))


def _message(reply: tuple[str | None, list[tuple[str, dict[str, Any]]]], n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply[0]}
    if reply[1]:
        message["tool_calls"] = [
            {
                "id": f"call_{n}_{index}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for index, (name, args) in enumerate(reply[1])
        ]
    return message


_USAGE = {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}


def _completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": _USAGE,
    }


def _stream(message: dict[str, Any]) -> bytes:
    base = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "gpt-test",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant"})]
    for word in (message["content"] or "").split(" "):
        if word:
            chunks.append(chunk({"content": word + " "}))
    for index, tool_call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, **tool_call}]}))
    chunks += [chunk({}, "stop"), {**base, "choices": [], "usage": _USAGE}]
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


def _response(message: dict[str, Any], n: int) -> dict[str, Any]:
    """A chat-completions message as a Responses API response."""
    output: list[dict[str, Any]] = []
    if message["content"]:
        output.append(
            {
                "type": "message",
                "id": f"msg_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
            }
        )
    for tool_call in message.get("tool_calls") or []:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{tool_call['id']}",
                "call_id": tool_call["id"],
                "name": tool_call["function"]["name"],
                "arguments": tool_call["function"]["arguments"],
                "status": "completed",
            }
        )
    return {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": 0,
        "model": "gpt-test",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 100,
            "output_tokens": 7,
            "total_tokens": 107,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


class Models:
    """Chat-completions models (or Responses API ones: ``responses``) answered from one
    script, keeping in one list and in call order what the runner hands each call (its
    system instructions and input)."""

    def __init__(self, script: Script, *, responses: bool = False) -> None:
        self.sent: list[Sent] = []
        self.script = script
        self.replies = 0
        self.responses = responses

    def _handler(self, request: httpx.Request) -> httpx.Response:
        self.replies += 1
        reply = self.script(self.replies)
        if isinstance(reply, int):
            return httpx.Response(reply, json={"error": {"message": "slow down"}})
        message = _message(reply, self.replies)
        if self.responses:
            # The Responses API echoes the request's instructions in its response.
            instructions = json.loads(request.content).get("instructions")
            answer = {**_response(message, self.replies), "instructions": instructions}
            return httpx.Response(200, json=answer)
        if json.loads(request.content).get("stream"):
            return httpx.Response(
                200, content=_stream(message), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=_completion(message))

    def model(self) -> OpenAIChatCompletionsModel:
        client = AsyncOpenAI(
            api_key="sk-test",
            base_url="http://model.test/v1",
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(self._handler)),
            max_retries=0,
        )
        sent = self.sent
        kind = OpenAIResponsesModel if self.responses else OpenAIChatCompletionsModel

        class Keeping(kind):  # type: ignore[valid-type,misc]
            async def get_response(
                self, system_instructions: Any, input: Any, *a: Any, **k: Any
            ) -> Any:
                sent.append(from_openai_agents(system_instructions, input))
                return await super().get_response(system_instructions, input, *a, **k)

            async def stream_response(  # type: ignore[override]
                self, system_instructions: Any, input: Any, *a: Any, **k: Any
            ) -> AsyncIterator[Any]:
                sent.append(from_openai_agents(system_instructions, input))
                async for event in super().stream_response(system_instructions, input, *a, **k):
                    yield event

        return Keeping(model="gpt-test", openai_client=client)


@contextmanager
def recording(recorder: Recorder, path: str) -> Iterator[None]:
    set_trace_processors([FlightlogProcessor(path=path, recorder=recorder)])
    try:
        yield
    finally:
        set_trace_processors([])


def lookup(city: str) -> str:
    """Look the weather up."""
    return f"{city}: sunny, 21 degrees"


SYSTEM = "You are a weather assistant."


def _agent(models: Models, **kwargs: Any) -> Agent[Any]:
    kwargs.setdefault("tools", [function_tool(lookup)])
    return Agent(name="weather", instructions=SYSTEM, model=models.model(), **kwargs)


def _tool_then_text(n: int) -> Reply:
    return calls(("lookup", {"city": "Lisbon"})) if n % 2 else text(f"sunny, after {n} calls")


async def parallel_tools(recorder: Recorder, path: str) -> list[Sent]:
    models = Models(
        lambda n: (
            ("Looking both up.", [("lookup", {"city": "Lisbon"}), ("lookup", {"city": "Porto"})])
            if n == 1
            else text("Both sunny.")
        )
    )
    with recording(recorder, path):
        await Runner.run(_agent(models), "Lisbon and Porto?")
    return models.sent


async def retries(recorder: Recorder, path: str) -> list[Sent]:
    # The runner's retry of a 429, and a failing tool whose error the model is shown.
    def strict(n: int) -> str:
        """A tool that refuses small numbers."""
        if n < 2:
            raise ValueError("n must be at least 2")
        return f"ok {n}"

    script: list[Reply] = [
        429,
        calls(("strict", {"n": 1})),
        calls(("strict", {"n": 2})),
        text("done"),
    ]
    models = Models(lambda n: script[n - 1])
    retry = ModelRetrySettings(
        max_retries=2, backoff={"initial_delay": 0}, policy=retry_policies.http_status([429])
    )
    agent = _agent(models, tools=[function_tool(strict)], model_settings=ModelSettings(retry=retry))
    with recording(recorder, path):
        await Runner.run(agent, "go")
    return models.sent


class Weather(pydantic.BaseModel):
    city: str
    degrees: int


async def structured_output(recorder: Recorder, path: str) -> list[Sent]:
    models = Models(
        lambda n: (
            _tool_then_text(n) if n == 1 else text(json.dumps({"city": "Lisbon", "degrees": 21}))
        )
    )
    with recording(recorder, path):
        await Runner.run(_agent(models, output_type=Weather), "Lisbon?")
    return models.sent


async def streaming(recorder: Recorder, path: str) -> list[Sent]:
    models = Models(_tool_then_text)
    with recording(recorder, path):
        result = Runner.run_streamed(_agent(models), "Lisbon?")
        async for _ in result.stream_events():
            pass
    return models.sent


async def handoffs(recorder: Recorder, path: str) -> list[Sent]:
    models = Models(lambda n: calls(("transfer_to_expert", {})) if n == 1 else _tool_then_text(n))
    expert = Agent(
        name="expert",
        instructions="You know the weather.",
        model=models.model(),
        tools=[function_tool(lookup)],
    )
    front = Agent(name="front", instructions="You triage.", model=models.model(), handoffs=[expert])
    with recording(recorder, path):
        await Runner.run(front, "Lisbon?")
    return models.sent


async def agents_as_tools(recorder: Recorder, path: str) -> list[Sent]:
    script: list[Reply] = [
        calls(("ask_expert", {"input": "Lisbon?"})),
        calls(("lookup", {"city": "Lisbon"})),
        text("sunny"),
        text("The expert says sunny."),
    ]
    models = Models(lambda n: script[n - 1])
    expert = Agent(
        name="expert",
        instructions="You know the weather.",
        model=models.model(),
        tools=[function_tool(lookup)],
    )
    boss = _agent(models, tools=[expert.as_tool("ask_expert", "Ask the expert.")])
    with recording(recorder, path):
        await Runner.run(boss, "Ask the expert.")
    return models.sent


async def cancellation(recorder: Recorder, path: str) -> list[Sent]:
    # A run cancelled in a tool, after a run of the conversation that was not, and a run
    # after it.
    started = anyio.Event()

    async def wait(city: str) -> str:
        """Wait for the weather."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    models = Models(
        lambda n: (
            calls(("wait", {"city": "x"})) if n == 3 else _tool_then_text(n if n < 3 else n - 1)
        )
    )
    agent = _agent(models, tools=[function_tool(lookup), function_tool(wait)])
    config = RunConfig(group_id="g")
    with recording(recorder, path):
        first = await Runner.run(agent, "Lisbon?", run_config=config)
        history = first.to_input_list()
        async with anyio.create_task_group() as group:
            group.start_soon(
                lambda: Runner.run(
                    agent, [*history, {"role": "user", "content": "Wait."}], run_config=config
                )
            )
            await started.wait()
            group.cancel_scope.cancel()
        await Runner.run(
            agent, [*history, {"role": "user", "content": "Porto?"}], run_config=config
        )
    return models.sent


async def responses_api(recorder: Recorder, path: str) -> list[Sent]:
    # The SDK's default model, on the Responses API: parallel tools, then a conversation.
    return await conversation(recorder, path, Models(_parallel_then_text, responses=True))


def _parallel_then_text(n: int) -> Reply:
    if n % 2:
        return ("Looking up.", [("lookup", {"city": "Lisbon"}), ("lookup", {"city": "Porto"})])
    return text(f"sunny, after {n} calls")


async def conversation(recorder: Recorder, path: str, models: Models | None = None) -> list[Sent]:
    models = models or Models(_tool_then_text)
    agent = _agent(models)
    items: list[Any] = []
    with recording(recorder, path):
        for question in ("Lisbon?", "And tomorrow?", "And Porto?"):
            result = await Runner.run(
                agent,
                [*items, {"role": "user", "content": question}],
                run_config=RunConfig(group_id="g"),
            )
            items = result.to_input_list()
    return models.sent


def _question(*more: dict[str, Any]) -> list[Any]:
    """A question with images, files and audio, in the Responses API's input items."""
    content = [
        {"type": "input_text", "text": "What is the weather in these?"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG64}", "detail": "low"},
        {"type": "input_image", "image_url": "https://example.com/sky.jpg"},
        {
            "type": "input_file",
            "file_data": f"data:application/pdf;base64,{PDF64}",
            "filename": "forecast.pdf",
        },
        {"type": "input_file", "file_id": "file-123"},
        {"type": "input_audio", "input_audio": {"data": WAV64, "format": "wav"}},
        *more,
    ]
    return [{"role": "user", "content": content}]


async def multimodal(recorder: Recorder, path: str) -> list[Sent]:
    # Sent by the chat-completions model: as image_url, file and input_audio parts.
    models = Models(_tool_then_text)
    with recording(recorder, path):
        await Runner.run(_agent(models), _question())
    return models.sent


async def multimodal_responses(recorder: Recorder, path: str) -> list[Sent]:
    # Sent by the Responses API model as they are, with a file by URL and an image by
    # file id besides (which chat completions cannot send).
    models = Models(_tool_then_text, responses=True)
    more = [
        {"type": "input_file", "file_url": "https://example.com/forecast.pdf"},
        {"type": "input_image", "file_id": "file-img"},
    ]
    with recording(recorder, path):
        await Runner.run(_agent(models), _question(*more))
    return models.sent


async def system_midway(recorder: Recorder, path: str, models: Models | None = None) -> list[Sent]:
    # A system message in the conversation's course, in its second run: sent in place.
    models = models or Models(_tool_then_text)
    agent = _agent(models)
    config = RunConfig(group_id="g")
    with recording(recorder, path):
        first = await Runner.run(agent, "Lisbon?", run_config=config)
        later = [
            {"role": "system", "content": "Answer in French from now on."},
            {"role": "user", "content": "And Porto?"},
        ]
        await Runner.run(agent, [*first.to_input_list(), *later], run_config=config)
    return models.sent


async def system_midway_responses(recorder: Recorder, path: str) -> list[Sent]:
    return await system_midway(recorder, path, Models(_tool_then_text, responses=True))


async def approval(recorder: Recorder, path: str) -> list[Sent]:
    # A run paused on a tool that needs approval, beside one that ran, and the run
    # resumed from its RunState once a person approved.
    @function_tool(needs_approval=True)
    def delete(path: str) -> str:
        """Delete a file, once a person approves."""
        return f"deleted {path}"

    script: list[Reply] = [
        calls(("delete", {"path": "notes.txt"}), ("lookup", {"city": "Lisbon"})),
        text("done"),
    ]
    models = Models(lambda n: script[n - 1])
    agent = _agent(models, tools=[delete, function_tool(lookup)])
    config = RunConfig(group_id="g")
    with recording(recorder, path):
        paused = await Runner.run(agent, "Delete notes.txt.", run_config=config)
        state = paused.to_state()
        state.approve(paused.interruptions[0])
        await Runner.run(agent, state, run_config=config)
    return models.sent


SCENARIOS: dict[str, Scenario] = {
    "parallel_tools": parallel_tools,
    "retries": retries,
    "structured_output": structured_output,
    "streaming": streaming,
    "handoffs": handoffs,
    "agents_as_tools": agents_as_tools,
    "cancellation": cancellation,
    "conversation": conversation,
    "responses_api": responses_api,
    "multimodal": multimodal,
    "multimodal_responses": multimodal_responses,
    "system_midway": system_midway,
    "system_midway_responses": system_midway_responses,
    "approval": approval,
}
