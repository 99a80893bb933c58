"""How a recorded conversation grows, and what rebuilding its prompts costs.

``uv run python -m bench.transcript [--quick]`` records, through a real flightlogd:

* 100 runs of one pydantic-ai chat (a ``FunctionModel``; each run a question, one tool
  call, an answer; the next run carries the history), in a few shapes of chat: the row
  is the session file's size over the framework's own history serialized as JSON
  (``result.all_messages_json()``; target: at most 3x; 26-50x before a run continued
  the previous run's last request);
* one run of 100 and one of 1,000 model steps through the integrations' recorder
  (``Continuation``, as the integrations use it): bytes per step at each length (a
  linear file has the same at both) and the time to rebuild the 1,000th prompt from
  the file with ``flightlog.sdk.Transcript`` (read and resolve), and every prompt of it.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from flightlog.integrations import Recorder
from flightlog.integrations.pydantic_ai import Flightlog
from flightlog.protocol import events
from flightlog.sdk import Transcript

from ._daemon import Daemon

__all__ = ["main"]

_SENTENCE = "It is sunny in Lisbon today, 21 degrees, with a light wind from the west. "

#: name -> (tools, answer length in sentences, question)
CHATS: dict[str, tuple[bool, int, str]] = {
    "tool call, 3-sentence answer": (True, 3, "And the weather in Lisbon, day {run}?"),
    "tool call, 6-sentence answer": (True, 6, "And the weather in Lisbon, day {run}?"),
    "no tools, 3-sentence answer": (False, 3, "And the weather in Lisbon, day {run}?"),
    "no tools, one-line answer": (False, 1, "Weather, day {run}?"),
}


async def _chat(recorder: Recorder, path: str, runs: int, shape: tuple[bool, int, str]) -> int:
    """Record ``runs`` runs of one chat; the framework's history size, in bytes."""
    tools, sentences, question = shape

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        asked = isinstance(last, ModelRequest) and any(
            part.part_kind == "user-prompt" for part in last.parts
        )
        if tools and asked:
            return ModelResponse(parts=[ToolCallPart("lookup", {"city": "Lisbon"})])
        return ModelResponse(parts=[TextPart(_SENTENCE * sentences)])

    agent = Agent(
        FunctionModel(model),
        system_prompt="You are a weather assistant.",
        capabilities=[Flightlog(path=path, recorder=recorder)],
    )
    if tools:

        @agent.tool_plain
        def lookup(city: str) -> str:
            return f"{city}: sunny, 21 degrees"

    history: list[ModelMessage] | None = None
    size = 0
    for run in range(runs):
        result = await agent.run(question.format(run=run), message_history=history)
        history = result.all_messages()
        size = len(result.all_messages_json())
    return size


def _steps(recorder: Recorder, path: str, steps: int) -> None:
    """One run of ``steps`` model calls, each sending the whole history, as the
    integrations record it."""
    run = recorder.begin(path)
    history: list[Any] = [events.UserMessage(content="go")]
    for step in range(steps):
        execution = events.Execution(id=events.new_execution_id(), kind="model")
        continues, new = run.continuation("bench").split(execution.id, history)
        run.record(
            events.ModelRequest(
                execution=execution,
                messages=new,
                config=events.CallConfig(model="m"),
                continues=continues,
            )
        )
        history.append(
            events.AssistantMessage(
                content=[events.ToolCallPart(id=f"c{step}", name="lookup", arguments={})]
            )
        )
        history.append(
            events.ToolResultMessage(
                tool_call_id=f"c{step}", name="lookup", content=[events.TextPart(text=_SENTENCE)]
            )
        )
    run.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.transcript")
    parser.add_argument("--quick", action="store_true", help="10 runs of each chat")
    args = parser.parse_args(argv)
    runs = 10 if args.quick else 100
    with tempfile.TemporaryDirectory(prefix="flt-", dir="/tmp") as base, Daemon(Path(base)) as d:
        recorder = Recorder(socket=d.socket)
        print(f"{runs} runs of one pydantic-ai chat: session file / framework history")
        for index, (name, shape) in enumerate(CHATS.items()):
            history = asyncio.run(_chat(recorder, f"chat{index}.jsonl", runs, shape))
            recorder.close()
            size = (d.root / f"chat{index}.jsonl").stat().st_size
            print(f"  {name:30} {size:>9,} B / {history:>9,} B = {size / history:.2f}x")
        print("one run of N model steps (Continuation), and rebuilding its prompts")
        per_step = {}
        for steps in (100, 1000):
            _steps(recorder, f"steps{steps}.jsonl", steps)
            recorder.close()
            path = d.root / f"steps{steps}.jsonl"
            per_step[steps] = path.stat().st_size / steps
            begin = time.perf_counter()
            transcript = Transcript.read(path)
            last = transcript.latest()
            one = time.perf_counter() - begin
            begin = time.perf_counter()
            count = sum(len(prompt.messages) for prompt in transcript.prompts())
            every = time.perf_counter() - begin
            print(
                f"  {steps:>5} steps: {per_step[steps]:,.0f} B per step; read + last prompt "
                f"({len(last.messages)} messages) {1000 * one:.1f} ms; every prompt "
                f"({count:,} messages in all) {1000 * every:.1f} ms"
            )
        print(f"  bytes per step, 1,000 over 100 steps: {per_step[1000] / per_step[100]:.2f}")


if __name__ == "__main__":
    main()
