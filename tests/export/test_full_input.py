"""``flightlog export --content``: a model span's ``gen_ai.input.messages`` is the call's
whole input, rebuilt across ``continues`` (within and across runs) from a real file."""

from __future__ import annotations

import json
from pathlib import Path

from flightlog.cli._spans import Span, SpanBuilder
from flightlog.protocol import events
from flightlog.sdk import connect, read
from support import DaemonProcess


def call(
    run: object, name: str, *messages: events.ChatMessage, continues: str | None = None
) -> None:
    execution = events.Execution(id=name, kind="model")
    run.record_many(  # type: ignore[attr-defined]
        [
            events.ModelRequest(
                execution=execution,
                messages=list(messages),
                system="Be terse." if continues is None else None,
                config=events.CallConfig(model="x"),
                continues=continues,
            ),
            events.ModelExecStart(execution=execution, model="x"),
            events.ModelExecEnd(
                execution=execution,
                message=events.AssistantMessage(content=[events.TextPart(text=f"re {name}")]),
            ),
        ]
    )


def record(daemon: DaemonProcess) -> Path:
    with connect(daemon.socket) as client:
        session = client.create("export.jsonl")
        with session:
            with session.begin_run() as run:
                call(run, "a", events.UserMessage(content="q1"))
            with session.begin_run() as run:
                reply = events.AssistantMessage(content=[events.TextPart(text="re a")])
                call(run, "b", reply, events.UserMessage(content="q2"), continues="a")
                call(run, "c", events.UserMessage(content="q3"), continues="lost")
    return daemon.root / "export.jsonl"


def inputs(span: Span) -> list[str]:
    messages = json.loads(str(span.attributes["gen_ai.input.messages"]))
    return [part["content"] for message in messages for part in message["parts"]]


def test_input_messages_are_the_whole_prompt_across_runs(daemon: DaemonProcess) -> None:
    path = record(daemon)
    builder = SpanBuilder(content=True)
    spans = [span for record in read(path) for span in builder.add(record)]
    chats = [s for s in spans if s.name == "chat x"]
    assert len(chats) == 3
    first, second, broken = chats
    assert inputs(first) == ["q1"]
    # The second run's call continues the first run's: its input is all of it.
    assert inputs(second) == ["q1", "re a", "q2"]
    system = json.loads(str(second.attributes["gen_ai.system_instructions"]))
    assert system == [{"type": "text", "content": "Be terse."}]
    # A broken chain is never exported as if whole: it says why.
    assert inputs(broken) == ["q3"]
    assert "'lost'" in str(broken.attributes["flightlog.prompt_error"])
    # Without content, nothing of it.
    plain = SpanBuilder(content=False)
    for span in (span for record in read(path) for span in plain.add(record)):
        assert "gen_ai.input.messages" not in span.attributes
        assert "flightlog.prompt_error" not in span.attributes
