"""OpenAI Agents SDK requests recorded as the model saw them, in flightlog's messages:
the system prompt as ``system``, tool arguments decoded, the tools offered."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agents import Agent, set_trace_processors

from flightlog.integrations import Recorder
from flightlog.integrations.openai_agents import FlightlogProcessor
from support import DaemonProcess

from .helpers import finish, of_type, records, sent
from .test_openai_agents import Reply, add, completion, model, run, session


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    set_trace_processors([FlightlogProcessor(recorder=recorder)])
    yield recorder
    set_trace_processors([])
    recorder.close()


@pytest.mark.anyio
async def test_requests_are_flightlog_messages_with_the_system_prompt_apart(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    script: list[Reply] = [completion(None, ("add", {"a": 1, "b": 2})), completion("3")]
    agent = Agent(name="calc", instructions="You add numbers.", model=model(script), tools=[add])
    assert await run(agent, "1+2?", "requests") == "3"
    await finish(recorder)
    recs = records(session(daemon, "requests"))
    requests = [r["data"] for r in of_type(recs, "model_request")]
    assert [r["system"] for r in requests] == ["You add numbers.", "You add numbers."]
    assert [[t["name"] for t in r["tools"]] for r in requests] == [["add"], ["add"]]
    assert requests[0]["messages"] == [{"$type": "user", "content": "1+2?"}]
    user, asked, result = sent(recs)[1]
    assert user == {"$type": "user", "content": "1+2?"}
    assert asked["$type"] == "assistant"
    assert asked["content"] == [
        {"$type": "tool_call", "id": "call_0_add", "name": "add", "arguments": {"a": 1, "b": 2}}
    ]
    assert (result["$type"], result["tool_call_id"], result["name"]) == (
        "tool_result",
        "call_0_add",
        "add",
    )
    assert result["content"] == [{"$type": "text", "text": "3"}]
