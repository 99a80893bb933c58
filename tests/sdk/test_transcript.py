"""``flightlog.sdk.Transcript``: each model call's full request rebuilt from a real file
(recorded through a real daemon), following ``continues`` within and across runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from flightlog.protocol import default_codec, events
from flightlog.sdk import (
    CallNotFound,
    Client,
    Transcript,
    connect,
    conversation,
    prompt,
    read,
)
from support import DaemonProcess


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with connect(daemon.socket) as client:
        yield client


def user(text: str) -> events.UserMessage:
    return events.UserMessage(content=text)


def answer(text: str) -> events.AssistantMessage:
    return events.AssistantMessage(content=[events.TextPart(text=text)])


def model(call: str, attempt: int = 1, parent_id: str | None = None) -> events.Execution:
    return events.Execution(id=call, kind="model", attempt=attempt, parent_id=parent_id)


def request(
    call: str,
    *messages: events.ChatMessage,
    continues: str | None = None,
    with_response: bool = False,
    system: str | None = None,
    attempt: int = 1,
    parent_id: str | None = None,
) -> events.ModelRequest:
    return events.ModelRequest(
        execution=model(call, attempt, parent_id),
        messages=list(messages),
        system=system,
        tools=[events.ToolDeclaration(name="lookup")],
        config=events.CallConfig(model="m"),
        continues=continues,
        with_response=with_response,
    )


def end(call: str, message: events.AssistantMessage, attempt: int = 1) -> events.ModelExecEnd:
    return events.ModelExecEnd(execution=model(call, attempt), message=message)


def j(*messages: events.ChatMessage) -> list[Any]:
    """Messages as a rebuilt prompt holds them: plain JSON values."""
    return list(msgspec.json.decode(default_codec.encode_value(list(messages))))


def record_two_runs(client: Client, root: Path, name: str) -> Path:
    """Two runs of one conversation: the second's first request continues the first
    run's last one."""
    session = client.create(name)
    with session:
        with session.begin_run() as run:
            run.record(request("a", user("q1"), system="Be terse."))
            run.record(end("a", answer("r1")))
            run.record(request("b", answer("r1"), user("q1b"), continues="a"))
            run.record(end("b", answer("r1b")))
        with session.begin_run() as run:
            run.record(request("c", answer("r1b"), user("q2"), continues="b"))
            run.record(end("c", answer("r2")))
    return root / name


@pytest.fixture
def root(daemon: DaemonProcess) -> Path:
    return daemon.root


def test_a_prompt_is_its_chain_of_requests_across_runs(client: Client, root: Path) -> None:
    path = record_two_runs(client, root, "two.jsonl")
    transcript = Transcript.read(path)
    assert [call for call, _, _ in transcript.calls()] == ["a", "b", "c"]
    last = transcript.prompt("c")
    assert last.messages == j(user("q1"), answer("r1"), user("q1b"), answer("r1b"), user("q2"))
    # The system prompt a continuing request leaves null is the one it continues.
    assert last.system == "Be terse."
    assert last.tools == [{"name": "lookup", "description": "", "parameters": {}}]
    assert last.config["model"] == "m"
    assert last.continues == "b"
    runs = [r.run_id for r in read(path) if r.type == "run_start"]
    assert transcript.prompt("a").run_id == runs[0] and last.run_id == runs[1]
    assert transcript.prompt("c", run=runs[1][:8]) == last
    # The conversation: the last call's prompt, and its response.
    talk = conversation(path)
    assert talk.prompt == last
    assert talk.response == j(answer("r2"))[0]
    assert talk.messages == [*last.messages, talk.response]
    # A path, or the records themselves.
    assert prompt(read(path), "b").messages == j(user("q1"), answer("r1"), user("q1b"))
    assert prompt(path, "a").to_builtins()["messages"] == j(user("q1"))


def test_a_request_continuing_a_call_not_in_the_file_is_a_typed_error(
    client: Client, root: Path
) -> None:
    session = client.create("broken.jsonl")
    with session, session.begin_run() as run:
        run.record(request("a", user("q1")))
        # "b" was dropped: it is not in the file, and "c" continues it.
        run.record(request("c", user("q2"), continues="b"))
        run.record(request("d", user("q3"), continues="c"))
        run.record(request("e", user("q4")))
    path = root / "broken.jsonl"
    line = next(r.seq for r in read(path) if r.type == "model_request" and b'"c"' in bytes(r.data))
    transcript = Transcript.read(path)
    assert transcript.prompt("a").messages == j(user("q1"))
    assert transcript.prompt("e").messages == j(user("q4"))  # written in full
    for call in ("c", "d"):
        with pytest.raises(CallNotFound) as caught:
            transcript.prompt(call)
        assert caught.value.call == "b" and caught.value.line == line
        assert f"line {line}" in caught.value.message and "'b'" in caught.value.message
        assert caught.value.code == "call_not_found"
    # Asking for a call the file does not hold at all.
    with pytest.raises(CallNotFound) as missing:
        transcript.prompt("zz")
    assert missing.value.line is None and isinstance(missing.value, LookupError)
    # Every prompt in file order: the first broken one raises, never a partial prompt.
    found = transcript.prompts()
    assert next(found).call == "a"
    with pytest.raises(CallNotFound):
        next(found)


def test_a_retry_continues_its_first_attempt_and_attempts_are_told_apart(
    client: Client, root: Path
) -> None:
    session = client.create("retry.jsonl")
    with session, session.begin_run() as run:
        run.record(request("a", user("q1")))
        run.record(request("a", continues="a", attempt=2))
        run.record(end("a", answer("r1"), attempt=2))
        # A sub-agent's call is not the conversation's last call.
        run.record(request("s", user("sub"), parent_id="t1"))
    transcript = Transcript.read(root / "retry.jsonl")
    assert transcript.prompt("a", attempt=1).messages == j(user("q1"))
    second = transcript.prompt("a")
    assert second.attempt == 2 and second.messages == j(user("q1"))
    talk = transcript.conversation()
    assert talk.prompt == second and talk.response == j(answer("r1"))[0]


def test_a_thousand_step_chain_resolves_in_linear_work(client: Client, root: Path) -> None:
    session = client.create("long.jsonl")
    with session, session.begin_run() as run:
        run.record(request("m0", user("go")))
        for step in range(1, 1000):
            run.record(
                request(f"m{step}", answer(f"r{step}"), user(f"s{step}"), continues=f"m{step - 1}")
            )
    transcript = Transcript.read(root / "long.jsonl")
    last = transcript.latest()
    assert len(last.messages) == 1 + 2 * 999
    assert last.messages[-1] == j(user("s999"))[0]
    # Prompts of one chain share their messages: the file's requests hold each once.
    first_of_last = last.messages[0]
    assert transcript.prompt("m500").messages[0] is first_of_last


def test_an_empty_session_has_an_empty_conversation(client: Client, root: Path) -> None:
    client.create("empty.jsonl").close()
    talk = conversation(root / "empty.jsonl")
    assert talk.prompt is None and talk.messages == []


def test_a_request_with_response_takes_the_continued_calls_answer_from_its_end(
    client: Client, root: Path
) -> None:
    session = client.create("answered.jsonl")
    with session, session.begin_run() as run:
        run.record(request("a", user("q1"), system="Be terse."))
        run.record(end("a", answer("r1")))
        run.record(request("b", user("q2"), continues="a", with_response=True))
        # "c" says "b" was answered, but no model_exec_end of "b" is in the file.
        run.record(request("c", user("q3"), continues="b", with_response=True))
    transcript = Transcript.read(root / "answered.jsonl")
    second = transcript.prompt("b")
    assert second.messages == j(user("q1"), answer("r1"), user("q2"))
    assert second.system == "Be terse."
    with pytest.raises(CallNotFound) as caught:
        transcript.prompt("c")
    assert caught.value.call == "b" and "with its response" in caught.value.message
