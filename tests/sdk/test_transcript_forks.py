"""Forks and tool results in the rebuild: ``Transcript.read`` follows a fork's origin,
and a conversation holds the results recorded for its last response's tool calls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from flightlog.protocol import Origin, Record, events
from flightlog.protocol.format import encode_line
from flightlog.sdk import (
    Client,
    DaemonError,
    MemoryDaemon,
    MockTransport,
    OriginNotFound,
    Transcript,
    connect,
    origin_of,
    read,
)
from support import DaemonProcess


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with connect(daemon.socket) as client:
        yield client


def ask(call: str, *messages: events.ChatMessage, continues: str | None = None) -> events.Event:
    return events.ModelRequest(
        execution=events.Execution(id=call, kind="model"),
        messages=list(messages),
        continues=continues,
        with_response=continues is not None,
    )


def answer(call: str, *tools: str, parent: str | None = None) -> events.Event:
    parts: list[events.Part] = [events.TextPart(text="ok")]
    parts += [events.ToolCallPart(id=tool, name=f"tool-{tool}") for tool in tools]
    return events.ModelExecEnd(
        execution=events.Execution(id=call, kind="model", parent_id=parent),
        message=events.AssistantMessage(content=parts),
    )


def tool_end(call_id: str, parent: str, text: str = "done") -> events.Event:
    return events.ToolExecEnd(
        execution=events.Execution(id=f"t-{call_id}", kind="tool", parent_id=parent),
        tool_call_id=call_id,
        name=f"tool-{call_id}",
        content=[events.TextPart(text=text)],
    )


def origin_at(path: Path, seq: int) -> Origin:
    first = next(iter(read(path)))
    return Origin(session_id=first.session_id, path=str(path), seq=seq)


def test_a_fork_of_a_fork_rebuilds_across_both_origins(
    client: Client, daemon: DaemonProcess
) -> None:
    root = daemon.root
    with client.create("a.jsonl") as session, session.begin_run() as run:
        run.record(ask("m1", events.UserMessage(content="one")))
        run.record(answer("m1"))
        run.record(ask("m2", events.UserMessage(content="not in the forks"), continues="m1"))
    a = root / "a.jsonl"
    at_m1 = max(r.seq for r in read(a) if r.type == "model_exec_end")
    with (
        client.create("b.jsonl", origin=origin_at(a, at_m1)) as session,
        session.begin_run() as run,
    ):
        run.record(ask("m2", events.UserMessage(content="two"), continues="m1"))
        run.record(answer("m2"))
    b = root / "b.jsonl"
    assert origin_of(next(iter(read(b)))) == origin_at(a, at_m1)
    with client.create("c.jsonl", origin=origin_at(b, 5)) as session, session.begin_run() as run:
        run.record(ask("m3", events.UserMessage(content="three"), continues="m2"))
    prompt = Transcript.read(root / "c.jsonl").prompt("m3")
    texts = [m.get("content") for m in prompt.messages if m["$type"] == "user"]
    assert texts == ["one", "two", "three"]
    # The origin's line 1..seq only: a's m2 (after the point) is not b's history.
    assert "not in the forks" not in str(Transcript.read(b).conversation().messages)


def _write(path: Path, session_id: str, origin: Origin | None, extra: int = 0) -> None:
    data = {"format_version": 1, "meta": {}}
    if origin is not None:
        data["origin"] = msgspec.to_builtins(origin)
    lines = [
        Record(
            session_id=session_id,
            seq=1,
            type="session_start",
            time="2026-12-03T00:00:00.000000Z",
            data=msgspec.Raw(msgspec.json.encode(data)),
        )
    ]
    lines += [
        Record(
            session_id=session_id,
            seq=seq,
            type="note",
            time="2026-12-03T00:00:00.000000Z",
            run_id="0" * 32,
            data=msgspec.Raw(b"{}"),
        )
        for seq in range(2, 2 + extra)
    ]
    path.write_bytes(b"".join(encode_line(line) for line in lines))


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("gone", "cannot be read"),
        ("another session", "is session"),
        ("shorter", "holds only 3 lines"),
        ("itself", "forks away"),
    ],
)
def test_an_origin_that_cannot_be_followed_is_a_typed_error(
    tmp_path: Path, case: str, reason: str
) -> None:
    fork, origin = tmp_path / "fork.jsonl", tmp_path / "origin.jsonl"
    link = Origin(session_id="a" * 32, path=str(origin), seq=4)
    if case == "another session":
        _write(origin, "b" * 32, None, extra=5)
    elif case == "shorter":
        _write(origin, "a" * 32, None, extra=2)
    elif case == "itself":
        link = Origin(session_id="c" * 32, path=fork.name, seq=1)  # relative: beside it
    _write(fork, "c" * 32, link)
    with pytest.raises(OriginNotFound) as raised:
        Transcript.read(fork)
    assert reason in raised.value.message and raised.value.code == "origin_not_found"
    assert raised.value.origin == link


def test_results_follow_the_order_asked_and_skip_nested_calls(
    client: Client, daemon: DaemonProcess
) -> None:
    with client.create("order.jsonl") as session, session.begin_run() as run:
        run.record(ask("m1", events.UserMessage(content="go")))
        run.record(answer("m1", "c1", "c2", "c3"))
        sub = events.Execution(id="s1", kind="model", parent_id="t-c1")
        run.record(events.ModelRequest(execution=sub, messages=[]))
        run.record(tool_end("s-tool", parent="s1"))
        run.record(tool_end("c2", parent="m1", text="second"))
        run.record(tool_end("c1", parent="m1", text="first"))
        run.record(
            events.ToolExecStart(
                execution=events.Execution(id="t-c9", kind="tool", parent_id="m1"),
                tool_call_id="c9",
                name="extra",
            )
        )
    found = Transcript.read(daemon.root / "order.jsonl").conversation()
    assert found.prompt is not None and found.prompt.call == "m1"
    assert [r["tool_call_id"] for r in found.results] == ["c1", "c2"]
    assert found.results[0] == {
        "$type": "tool_result",
        "tool_call_id": "c1",
        "name": "tool-c1",
        "content": [{"$type": "text", "text": "first"}],
        "is_error": False,
    }
    assert [m["$type"] for m in found.messages] == [
        "user",
        "assistant",
        "tool_result",
        "tool_result",
    ]
    assert found.unpaired == [("c3", "tool-c3"), ("c9", "extra")]


def test_the_memory_daemon_writes_the_origin_too(memory: MemoryDaemon) -> None:
    origin = Origin(session_id="a" * 32, path="/x/origin.jsonl", seq=7, run_id="b" * 32)
    with connect(transport=MockTransport(memory)) as client:
        client.create("fork.jsonl", origin=origin).close()
        client.create("plain.jsonl").close()
    fork, plain = memory.session("fork.jsonl"), memory.session("plain.jsonl")
    assert origin_of(fork.records()[0]) == origin
    assert origin_of(plain.records()[0]) is None
    assert b'"origin"' not in plain.lines[0]  # a session that is not a fork is unchanged


@pytest.mark.parametrize(
    ("origin", "wrong"),
    [
        (Origin(session_id="not-an-id", path="/x.jsonl", seq=3), "session_id"),
        (Origin(session_id="a" * 32, path="/x.jsonl", seq=3, run_id="r1"), "run_id"),
        (Origin(session_id="a" * 32, path="", seq=3), "path is empty"),
        (Origin(session_id="a" * 32, path="/x.jsonl", seq=0), "seq is 0"),
    ],
)
def test_an_origin_that_names_no_line_is_refused_and_nothing_is_created(
    client: Client, daemon: DaemonProcess, origin: Origin, wrong: str
) -> None:
    with pytest.raises(DaemonError) as refused:
        client.create("bad-fork.jsonl", origin=origin)
    assert refused.value.code == "bad_message" and wrong in refused.value.message
    assert not (daemon.root / "bad-fork.jsonl").exists()
    client.create("after.jsonl").close()  # the connection goes on
