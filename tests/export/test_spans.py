"""The span builder on its own: records in, spans out, no backend (the backend tests are
test_export.py and test_follow.py)."""

from __future__ import annotations

import json
from pathlib import Path

from flightlog.cli._spans import Span, SpanBuilder, span_id, trace_id
from flightlog.sdk import read

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
    assert sorted(by_name) == ["chat claude-x", "execute_tool read_file", "invoke_agent demo"]
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
    assert chat.parent_id == run.span_id and chat.kind == "client"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 412
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["tool_use"]
    assert chat.attributes["gen_ai.request.max_tokens"] == 1024
    assert chat.end_seq == 8 and chat.error is None
    tool = by_name["execute_tool read_file"]
    assert tool.attributes["gen_ai.tool.call.id"] == "call_1"
    # Asked for by the model call: a link to it, not a child of it.
    assert tool.parent_id == run.span_id
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
    }
    tool = next(span for span in spans if span.name.startswith("execute_tool"))
    assert tool.error is not None and tool.error.startswith("interrupted")
    assert tool.attributes["error.type"] == "interrupted"
    assert all(span.end_seq == 13 for span in spans if span.name != "chat claude-x")
