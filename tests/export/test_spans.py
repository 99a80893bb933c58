"""The span builder on its own: records in, spans out, no backend (the backend tests are
test_export.py and test_follow.py)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from flightlog.cli._demo import record_demo_run
from flightlog.cli._spans import Span, SpanBuilder, span_id, trace_id
from flightlog.protocol import Execution, Record
from flightlog.protocol.events import AgentStart, ModelExecStart, TurnStart
from flightlog.sdk import connect, read
from support import DaemonProcess, read_lines, wait_for

DOCS_EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "format.md"


def example_file(tmp_path: Path) -> Path:
    text = DOCS_EXAMPLE.read_text().split("## 10. An example file", 1)[1]
    lines = [line for line in text.split("```")[1].splitlines() if line.startswith("{")]
    path = tmp_path / "example.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def build(path: Path, **options: bool) -> list[Span]:
    builder = SpanBuilder(**options)
    return [span for record in read(path) for span in builder.add(record)]


def test_the_format_example_as_spans(tmp_path: Path) -> None:
    spans = build(example_file(tmp_path))
    by_name = {span.name: span for span in spans}
    assert sorted(by_name) == [
        "chat claude-x",
        "execute_tool read_file",
        "invoke_agent demo",
        "turn 0",
    ]
    run = by_name["invoke_agent demo"]
    session_id = "5f0c2a9e8b7d4c1fa3e6b2d9c8a7f015"
    run_id = "a41e7c3b9d2f4e8a8c6b1f0e2d3c4b5a"
    assert run.trace_id == trace_id(session_id, run_id)
    assert run.span_id == span_id(session_id, run_id)
    assert run.parent_id is None and run.end_seq == 18
    # The run has no agent_end: it is not reported as a success.
    assert run.error is not None and run.error.startswith("interrupted")
    chat = by_name["chat claude-x"]
    assert chat.span_id == span_id(session_id, run_id, "model", "m1", 1)
    turn = by_name["turn 0"]
    assert turn.span_id == span_id(session_id, run_id, "turn", 0)
    assert turn.parent_id == run.span_id and turn.trace_id == run.trace_id
    assert (turn.end_seq, turn.error) == (16, None)
    assert turn.attributes["flightlog.turn.stop_reason"] == "tool_use"
    assert turn.attributes["flightlog.turn.tool_call_count"] == 1
    assert turn.attributes["gen_ai.usage.input_tokens"] == 412
    assert chat.parent_id == turn.span_id and chat.kind == "client"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 412
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["tool_use"]
    assert chat.attributes["gen_ai.request.max_tokens"] == 1024
    assert chat.end_seq == 8 and chat.error is None
    tool = by_name["execute_tool read_file"]
    assert tool.attributes["gen_ai.tool.call.id"] == "call_1"
    # Asked for by the model call: a link to it, not a child of it.
    assert tool.parent_id == turn.span_id
    assert [link.span_id for link in tool.links] == [chat.span_id]
    assert not any(key.startswith("gen_ai.input") for s in spans for key in s.attributes)
    # The checkpoint is an event on the run.
    assert [event.name for event in run.events] == ["flightlog.checkpoint"]


def test_the_same_file_gives_the_same_ids(tmp_path: Path) -> None:
    first = build(example_file(tmp_path))
    second = build(example_file(tmp_path))
    assert [(s.trace_id, s.span_id, s.parent_id) for s in first] == [
        (s.trace_id, s.span_id, s.parent_id) for s in second
    ]


def test_content_is_added_only_when_asked(tmp_path: Path) -> None:
    spans = build(example_file(tmp_path), content=True)
    chat = next(span for span in spans if span.name.startswith("chat"))
    assert json.loads(str(chat.attributes["gen_ai.system_instructions"])) == [
        {"type": "text", "content": "You are terse."}
    ]
    output = json.loads(str(chat.attributes["gen_ai.output.messages"]))
    assert output[0]["finish_reason"] == "tool_use"
    assert output[0]["parts"][1]["type"] == "tool_call"
    tool = next(span for span in spans if span.name.startswith("execute_tool"))
    assert json.loads(str(tool.attributes["gen_ai.tool.call.arguments"])) == {
        "path": "/etc/hostname"
    }
    # Headers and provider options are never exported.
    assert not any("anthropic-version" in str(v) for s in spans for v in s.attributes.values())


def test_a_run_cut_short_ends_at_the_next_run_start(tmp_path: Path) -> None:
    lines = example_file(tmp_path).read_text().splitlines()[:12]  # up to tool_invoke_start
    second_run = json.loads(lines[1]) | {"seq": 13, "run_id": "b" * 32}
    path = tmp_path / "cut.jsonl"
    path.write_text("".join(line + "\n" for line in [*lines, json.dumps(second_run)]))
    spans = build(path)
    assert {span.name for span in spans} == {
        "chat claude-x",
        "execute_tool read_file",
        "invoke_agent demo",
        "turn 0",
    }
    tool = next(span for span in spans if span.name.startswith("execute_tool"))
    assert tool.error is not None and tool.error.startswith("interrupted")
    assert tool.attributes["error.type"] == "interrupted"
    # The open turn ends where the open call does, with the run, and is no success.
    turn = next(span for span in spans if span.name == "turn 0")
    assert turn.error == "interrupted: no turn_end (turn 0)"
    assert turn.attributes["error.type"] == "interrupted"
    assert turn.end_ns == tool.end_ns and turn.start_ns < turn.end_ns
    assert tool.parent_id == turn.span_id
    assert all(span.end_seq == 13 for span in spans if span.name != "chat claude-x")


# ------------------------------------------------------------- records made by hand

SESSION = "c" * 32
RUN_1, RUN_2 = "1" * 32, "2" * 32


def records(*items: tuple[str, str | None, dict[str, object]]) -> list[Record]:
    """Records of one session, seq and time counted up (100 ms apart)."""
    made = [
        Record(
            session_id=SESSION,
            seq=1,
            type="session_start",
            time="2026-11-29T20:00:00.000000Z",
            data=msgspec.Raw(b'{"format_version":1,"meta":{"app":"t","nested":{"x":1}}}'),
        )
    ]
    for seq, (type, run_id, data) in enumerate(items, 2):
        made.append(
            Record(
                session_id=SESSION,
                seq=seq,
                type=type,
                time=f"2026-11-29T20:00:{seq // 10:02d}.{seq % 10}00000Z",
                run_id=run_id,
                data=msgspec.Raw(json.dumps(data).encode()),
            )
        )
    return made


def spans_of(made: list[Record], **options: bool) -> list[Span]:
    builder = SpanBuilder(**options)
    return [span for record in made for span in builder.add(record)]


def execution(id: str, kind: str, attempt: int = 1, parent: str | None = None) -> dict:
    return {"id": id, "kind": kind, "attempt": attempt, "parent_id": parent}


def test_a_retry_links_to_the_attempt_it_replaces() -> None:
    spans = spans_of(
        records(
            ("run_start", RUN_1, {"pid": 7, "client": "t"}),
            ("model_exec_start", RUN_1, {"execution": execution("m", "model"), "model": "x"}),
            ("model_exec_end", RUN_1, {"execution": execution("m", "model"), "error": "429"}),
            (
                "retry",
                RUN_1,
                {"execution": execution("m", "model"), "error": "429", "delay_seconds": 2},
            ),
            ("model_exec_start", RUN_1, {"execution": execution("m", "model", 2), "model": "x"}),
            ("model_exec_end", RUN_1, {"execution": execution("m", "model", 2), "error": None}),
            ("run_close", RUN_1, {"error": None}),
        )
    )
    first, second, run = spans
    assert (first.name, first.error, first.attributes["error.type"]) == (
        "chat x",
        "429",
        "model_error",
    )
    assert second.error is None
    assert second.attributes["flightlog.retry.error"] == "429"
    assert second.attributes["flightlog.retry.delay_seconds"] == 2.0
    (link,) = second.links
    assert (link.span_id, link.attributes) == (first.span_id, {"flightlog.link": "retry_of"})
    # No agent loop in this run: a run of standalone calls is not an error.
    assert run.error is None and run.name == "invoke_agent"
    assert run.attributes["process.pid"] == 7
    assert run.attributes["flightlog.meta.app"] == "t"
    assert "flightlog.meta.nested" not in run.attributes


def test_a_sub_agent_tool_call_is_the_child_of_its_tool_call() -> None:
    outer, inner = execution("t1", "tool"), execution("t2", "tool", parent="t1")
    spans = spans_of(
        records(
            ("run_start", RUN_1, {}),
            ("agent_start", RUN_1, {"agent": "boss"}),
            (
                "tool_exec_start",
                RUN_1,
                {"execution": outer, "tool_call_id": "c1", "name": "delegate"},
            ),
            ("tool_exec_start", RUN_1, {"execution": inner, "tool_call_id": "c2", "name": "grep"}),
            (
                "tool_exec_end",
                RUN_1,
                {"execution": inner, "tool_call_id": "c2", "name": "grep", "is_error": False},
            ),
            (
                "tool_exec_end",
                RUN_1,
                {
                    "execution": outer,
                    "tool_call_id": "c1",
                    "name": "delegate",
                    "disposition": "ran",
                },
            ),
            ("error", RUN_1, {"message": "boom", "code": "E1", "fatal": True}),
            ("agent_end", RUN_1, {"ok": False, "error": "gave up", "turns": 3}),
            ("run_close", RUN_1, {"error": "disk full"}),
        )
    )
    grep, delegate, run = spans
    assert grep.parent_id == delegate.span_id
    assert delegate.parent_id == run.span_id
    assert (run.error, run.attributes["error.type"]) == ("gave up", "agent_error")
    assert run.attributes["flightlog.recording_error"] == "disk full"
    (event,) = run.events
    assert event.name == "exception"
    assert event.attributes == {
        "exception.message": "boom",
        "flightlog.error.fatal": True,
        "exception.type": "E1",
    }


def test_a_refused_tool_call_and_an_end_without_its_start() -> None:
    spans = spans_of(
        records(
            ("run_start", RUN_1, {}),
            (
                "tool_exec_end",
                RUN_1,
                {
                    "execution": execution("t", "tool"),
                    "tool_call_id": "c",
                    "name": "rm",
                    "is_error": True,
                    "content": [],
                    "disposition": "refused",
                    "reason": "not allowed",
                },
            ),
            ("run_close", RUN_1, {"error": None}),
        )
    )
    tool = spans[0]
    assert tool.start_ns == tool.end_ns  # only its end is known: an instant
    assert tool.error == "not allowed"
    assert tool.attributes["flightlog.tool.disposition"] == "refused"


def test_a_reissued_tool_call_links_to_its_first_run() -> None:
    tool = execution("t", "tool")
    start = {"execution": tool, "tool_call_id": "c9", "name": "pay"}
    spans = spans_of(
        records(
            ("run_start", RUN_1, {}),
            ("tool_exec_start", RUN_1, start),
            ("run_start", RUN_2, {}),  # the first run died with the call open
            ("tool_exec_start", RUN_2, start),
            ("tool_exec_end", RUN_2, start),
            ("run_close", RUN_2, {"error": None}),
        )
    )
    interrupted, first_run, again, second_run = spans
    assert interrupted.error is not None and first_run.error is not None
    assert interrupted.trace_id == first_run.trace_id != again.trace_id
    assert again.attributes["flightlog.reissued"] is True
    (link,) = again.links
    assert (link.trace_id, link.span_id) == (interrupted.trace_id, interrupted.span_id)
    assert second_run.error is None


# --------------------------------------------------------------------- turns


def test_turn_spans_of_a_recorded_session(daemon: DaemonProcess) -> None:
    """A session recorded through a real daemon: the demo loop (two turns, retries), then
    a run killed in its first turn; every call is its turn's child, every turn the run's."""
    with connect(daemon.socket, client_name="turns") as client:
        session = client.create("turns.jsonl")
        with session.begin_run() as run:
            record_demo_run(run, pace=0)
        cut = session.begin_run()
        cut.record(AgentStart(agent="booker"))
        cut.record(TurnStart(turn_index=0))
        model = Execution(id="m0", kind="model", turn_index=0)
        cut.record(ModelExecStart(execution=model, model="m-x"))
        session.sync()
    # The agent's connection is gone with the cut run open: it has no run_close, and
    # ends where the next run starts.
    path = daemon.root / "turns.jsonl"
    with connect(daemon.socket) as client:
        wait_for(lambda: all(s.path != str(path) for s in client.status().sessions))
        again = client.open("turns.jsonl")
        with again.begin_run():
            pass
        again.close()
    assert [line["type"] for line in read_lines(path)].count("run_close") == 2
    spans = build(path)
    runs = {s.trace_id: s for s in spans if s.parent_id is None and s.name != "invoke_agent"}
    turns = {s.span_id: s for s in spans if s.name.startswith("turn ")}
    assert sorted(t.name for t in turns.values()) == ["turn 0", "turn 0", "turn 1"]
    for turn in turns.values():
        assert turn.parent_id == runs[turn.trace_id].span_id
    calls = [s for s in spans if s.name.startswith(("chat", "execute_tool"))]
    assert len(calls) == 7
    for call in calls:
        turn = turns[call.parent_id]  # type: ignore[index]
        assert turn.trace_id == call.trace_id
        assert (
            turn.attributes["flightlog.turn.index"]
            == call.attributes["flightlog.execution.turn_index"]
        )
        assert turn.start_ns <= call.start_ns <= call.end_ns <= turn.end_ns
    demo = next(s for s in runs.values() if s.name == "invoke_agent trip-planner")
    demo_turns = [t for t in turns.values() if t.trace_id == demo.trace_id]
    # Turn 1 retried its rate-limited model call to success: the turn did not fail.
    assert [t.error for t in demo_turns] == [None, None]
    cut_run = next(s for s in runs.values() if s is not demo)
    (open_turn,) = [t for t in turns.values() if t.trace_id == cut_run.trace_id]
    (open_call,) = [c for c in calls if c.trace_id == cut_run.trace_id]
    assert open_turn.error == "interrupted: no turn_end (turn 0)"
    assert open_turn.end_ns == open_call.end_ns == cut_run.end_ns
    assert open_turn.end_seq == cut_run.end_seq


def test_a_turn_sums_its_calls_and_fails_with_them() -> None:
    model = {**execution("m", "model"), "turn_index": 0}
    delegate = {**execution("t", "tool"), "turn_index": 0}
    sub_model = {**execution("s", "model", parent="t"), "turn_index": 0}
    usage = {"input_tokens": 10, "output_tokens": 2}
    spans = spans_of(
        records(
            ("run_start", RUN_1, {}),
            ("agent_start", RUN_1, {"agent": "boss"}),
            ("turn_start", RUN_1, {"turn_index": 0}),
            ("model_exec_end", RUN_1, {"execution": model, "usage": usage}),
            ("tool_exec_start", RUN_1, {"execution": delegate, "name": "delegate"}),
            ("model_exec_end", RUN_1, {"execution": sub_model, "usage": usage}),
            (
                "tool_exec_end",
                RUN_1,
                {
                    "execution": delegate,
                    "name": "delegate",
                    "is_error": True,
                    "disposition": "cancelled",
                    "content": [{"$type": "text", "text": "cancelled"}],
                },
            ),
            ("turn_end", RUN_1, {"turn_index": 0, "tool_call_count": 1}),
            ("agent_end", RUN_1, {"ok": False, "error": "cancelled"}),
            ("run_close", RUN_1, {"error": None}),
        )
    )
    chat, sub_chat, tool, turn, run = spans
    assert turn.parent_id == run.span_id
    assert chat.parent_id == tool.parent_id == turn.span_id
    # A sub-agent's model call is in its calling tool's turn.
    assert sub_chat.parent_id == turn.span_id
    assert turn.attributes["gen_ai.usage.input_tokens"] == 20
    assert turn.attributes["gen_ai.usage.output_tokens"] == 4
    assert (turn.error, turn.attributes["error.type"]) == ("cancelled", "turn_error")


def test_a_fatal_error_fails_its_turn_and_a_turn_index_used_again_gets_its_own_id() -> None:
    spans = spans_of(
        records(
            ("run_start", RUN_1, {}),
            ("turn_start", RUN_1, {"turn_index": 0}),
            ("turn_end", RUN_1, {"turn_index": 0}),
            ("turn_start", RUN_1, {"turn_index": 0}),  # a second loop in the same run
            ("error", RUN_1, {"message": "boom", "fatal": True}),
            ("turn_end", RUN_1, {"turn_index": 0}),
            ("run_close", RUN_1, {"error": None}),
        )
    )
    first, second, run = spans
    assert first.parent_id == second.parent_id == run.span_id
    assert first.span_id == span_id(SESSION, RUN_1, "turn", 0) != second.span_id
    assert first.error is None
    assert (second.error, second.attributes["error.type"]) == ("boom", "turn_error")
