"""Every prompt rebuilt from the file equals what the model was sent: real pydantic-ai
runs (FunctionModel, which is handed the messages) recorded through a real daemon,
rebuilt with ``flightlog.sdk.Transcript`` across the runs of a conversation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from flightlog.integrations import Recorder
from flightlog.integrations._pydantic_ai_messages import request_messages, system_prompt
from flightlog.integrations.pydantic_ai import Flightlog
from flightlog.protocol import default_codec
from flightlog.sdk import CallNotFound, Transcript, check, conversation
from support import DaemonProcess

from .helpers import finish, of_type, records

#: An answer of a chat: a paragraph (about 450 characters).
ANSWER = (
    "In {city} it is sunny today, 21 degrees, with a light wind from the west; "
    "tomorrow brings clouds in the morning and a chance of rain after noon, so take "
    "an umbrella if you go out late. The weekend looks warmer: 24 degrees on Saturday "
    "and 26 on Sunday, clear skies both days, and the sea at 19 degrees, warm enough "
    "for a swim at midday. Next week the wind turns north and brings cooler nights, "
    "around 14 degrees, but the days stay bright. Run {run}."
)


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    yield recorder
    recorder.close()


def plain(messages: list[ModelMessage]) -> dict[str, Any]:
    """What the integration makes of the messages a model was handed, as JSON values:
    the system prompt and the messages, which a rebuilt prompt must equal."""
    return {
        "system": system_prompt(messages),
        "messages": msgspec.json.decode(default_codec.encode_value(request_messages(messages))),
    }


class Chat:
    """A chat agent over a FunctionModel that keeps what it is handed at each call: a
    question makes it look the city up, a tool result makes it answer."""

    def __init__(self, *capabilities: Any) -> None:
        self.received: list[dict[str, Any]] = []
        self.agent = Agent(
            FunctionModel(self.model),
            name="chat",
            system_prompt="You are a weather assistant.",
            capabilities=list(capabilities),
        )

        @self.agent.tool_plain
        def lookup(city: str) -> str:
            return f"{city}: sunny, 21 degrees"

        self.history: list[ModelMessage] | None = None
        self.run = 0

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.received.append(plain(messages))
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(p.part_kind == "user-prompt" for p in last.parts):
            return ModelResponse(parts=[ToolCallPart("lookup", {"city": "Lisbon"})])
        return ModelResponse(parts=[TextPart(ANSWER.format(city="Lisbon", run=self.run))])

    async def ask(self, question: str, **kwargs: Any) -> None:
        result = await self.agent.run(question, message_history=self.history, **kwargs)
        self.history = result.all_messages()
        self.run += 1


def prompts(path: Path) -> list[dict[str, Any]]:
    return [{"system": p.system, "messages": p.messages} for p in Transcript.read(path).prompts()]


@pytest.mark.anyio
async def test_a_hundred_runs_of_a_chat_rebuild_every_prompt_within_3x_the_history(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    chat = Chat(Flightlog(path="chat.jsonl", recorder=recorder))
    for run in range(100):
        await chat.ask(f"And the weather in Lisbon, day {run}?")
    await finish(recorder)
    path = daemon.root / "chat.jsonl"
    assert check(path).sound
    assert recorder.stats.problems == 0
    # Every call's prompt, rebuilt from the file, is what the model was handed.
    assert len(chat.received) == 200
    assert prompts(path) == chat.received
    # One request in full, the first: each run's first request continues the previous
    # run's last one.
    requests = of_type(records(path), "model_request")
    assert [r["data"]["continues"] is None for r in requests] == [True] + [False] * 199
    assert all(r["data"]["with_response"] for r in requests[1:])
    for earlier, later in zip(requests[1::2], requests[2::2], strict=False):
        assert later["run_id"] != earlier["run_id"]
        assert later["data"]["continues"] == earlier["data"]["execution"]["id"]
    # The conversation is the framework's own history.
    assert chat.history is not None
    talk = conversation(path)
    assert talk.prompt is not None and talk.prompt.system == "You are a weather assistant."
    assert talk.messages == plain(chat.history)["messages"]
    # Linear, and at most 3x the framework's own history as JSON (26-50x when each run
    # wrote the whole history again): each request leaves out what the call it continues
    # sent and got back (with_response: the answer is in that call's model_exec_end).
    history = len(ModelMessagesTypeAdapter.dump_json(chat.history))
    assert path.stat().st_size <= 3 * history, (path.stat().st_size, history)


@pytest.mark.anyio
async def test_after_a_request_written_as_a_stub_the_next_is_written_in_full(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # A daemon whose frames are small: a request with a large setting is too large to
    # send, and is written as its stub (its messages left out), as are the other
    # requests of its run that carry the setting.
    daemon = DaemonProcess(tmp_path_factory.mktemp("small"), "--max-frame-size", "65536")
    daemon.start()
    recorder = Recorder(socket=daemon.socket)
    try:
        chat = Chat(Flightlog(path="stub.jsonl", recorder=recorder))
        await chat.ask("Weather in Lisbon?")
        kept = len(chat.received)
        await chat.ask("And tomorrow?", model_settings={"extra_body": {"pad": "x" * 100_000}})
        stubbed = len(chat.received) - kept
        await chat.ask("And the day after?")
        await finish(recorder)
        path = daemon.root / "stub.jsonl"
        assert check(path).sound
        assert recorder.stats.problems == 0
        requests = of_type(records(path), "model_request")
        assert len(requests) == len(chat.received)
        marked = [r["data"].get("$flightlog") == "oversized" for r in requests]
        assert marked == [False] * kept + [True] * stubbed + [False] * (
            len(requests) - kept - stubbed
        )
        # The first request after the stubs is written in full: no continues.
        after = requests[kept + stubbed :]
        assert after[0]["data"]["continues"] is None
        assert after[1]["data"]["continues"] == after[0]["data"]["execution"]["id"]
        # Every request of the file rebuilds, to what the model was handed, but the
        # stubs, which say they cannot.
        transcript = Transcript.read(path)
        for request, received in zip(requests, chat.received, strict=True):
            call = request["data"]["execution"]["id"]
            if request["data"].get("$flightlog") == "oversized":
                with pytest.raises(CallNotFound, match="too large to record"):
                    transcript.prompt(call, run=request["run_id"])
                continue
            prompt = transcript.prompt(call, run=request["run_id"])
            assert {"system": prompt.system, "messages": prompt.messages} == received
    finally:
        recorder.close()
        daemon.stop()


@pytest.mark.anyio
async def test_a_long_run_stays_linear_and_rebuilds(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    # pydantic-ai's own loop is quadratic in its steps (300 take 20 s unrecorded), so
    # 50 and 200 steps here; test_recorder_continuation.py drives 1,000.
    sizes = {}
    for steps in (50, 200):
        received: list[list[ModelMessage]] = []

        def model(
            messages: list[ModelMessage],
            info: AgentInfo,
            steps: int = steps,
            received: list[list[ModelMessage]] = received,
        ) -> ModelResponse:
            received.append(list(messages))
            step = sum(isinstance(m, ModelResponse) for m in messages)
            if step < steps:
                return ModelResponse(parts=[ToolCallPart("lookup", {"step": step})])
            return ModelResponse(parts=[TextPart(f"done after {step} steps")])

        agent = Agent(
            FunctionModel(model),
            capabilities=[Flightlog(path=f"steps{steps}.jsonl", recorder=recorder)],
        )

        @agent.tool_plain
        def lookup(step: int) -> str:
            return f"result {step}: " + "sunny, 21 degrees. " * 4

        await agent.run("go", usage_limits=UsageLimits(request_limit=steps + 1))
        await finish(recorder)
        path = daemon.root / f"steps{steps}.jsonl"
        sizes[steps] = path.stat().st_size
        # Every call's prompt, rebuilt, is what the model got.
        assert prompts(path) == [plain(messages) for messages in received]
    # Four times the steps, about four times the bytes (a quadratic file: sixteen).
    assert sizes[200] <= 4.4 * sizes[50], sizes
