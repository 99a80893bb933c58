"""``show`` and ``inspect`` with the vocabulary added within format 1: the agent of a call,
a call re-issued under a new id, the final output, sub-agents, and a reused execution id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from flightlog.cli._commands import EXIT_GAPS, EXIT_OK
from flightlog.cli._inspect import SessionSummary, summarize_records
from flightlog.cli._main import run
from flightlog.cli._render import Style
from flightlog.cli._views import inspect_lines, show_lines
from flightlog.protocol import (
    Event,
    Execution,
    Record,
    encode_event,
    new_id,
)
from flightlog.protocol.events import (
    AgentEnd,
    AgentStart,
    ModelExecEnd,
    ModelExecStart,
    ModelRequest,
    TextPart,
    ToolExecEnd,
    ToolExecStart,
    TurnStart,
)
from flightlog.protocol.format import (
    encode_line,
)


class Builder:
    def __init__(self) -> None:
        self.session_id = new_id()
        self.run_id = new_id()
        self.records: list[Record] = []
        self.raw("session_start", None, {"format_version": 1, "meta": {}})
        self.raw("run_start", self.run_id, {"pid": 1, "client": "t"})

    def raw(self, type: str, run_id: str | None, data: Any, time: str = "") -> None:
        self.records.append(
            Record(
                session_id=self.session_id,
                seq=len(self.records) + 1,
                type=type,
                time=time or "2026-11-29T20:00:00.000000Z",
                run_id=run_id,
                data=msgspec.Raw(msgspec.json.encode(data)),
            )
        )

    def add(self, *events: Event) -> None:
        for event in events:
            encoded = encode_event(event)
            assert encoded is not None
            self.raw(encoded.type, self.run_id, msgspec.json.decode(encoded.data), encoded.time)

    def summary(self) -> SessionSummary:
        self.raw("run_close", self.run_id, {"error": None})
        return summarize_records(self.records)


def t(seconds: int) -> str:
    return f"2026-11-29T20:00:{seconds:02d}.000000Z"


def model(b: Builder, ex: Execution, *, error: str | None = None, at: int = 1) -> None:
    b.add(
        ModelRequest(execution=ex, time=t(at)),
        ModelExecStart(execution=ex, model="m-1", time=t(at)),
        ModelExecEnd(execution=ex, error=error, time=t(at + 1)),
    )


def test_sub_agents_are_indented_under_the_tool_call_that_started_them() -> None:
    b = Builder()
    tool = Execution(id="t1", kind="tool", agent="boss")
    b.add(AgentStart(agent="boss"), TurnStart(turn_index=0))
    model(b, Execution(id="m1", kind="model", agent="boss"))
    b.add(ToolExecStart(execution=tool, tool_call_id="c1", name="research"))
    b.add(AgentStart(agent="researcher", parent_id="t1"), TurnStart(turn_index=0))
    model(b, Execution(id="m2", kind="model", agent="researcher"))
    b.add(AgentEnd(agent="researcher", parent_id="t1", output="found it"))
    b.add(ToolExecEnd(execution=tool, tool_call_id="c1", name="research"))
    b.add(AgentEnd(agent="boss", output={"answer": 42}))
    lines = list(show_lines(b.summary(), "x.jsonl", Style(False)))
    body = [line[14:] for line in lines[lines.index("") + 2 :]]
    assert body[0] == "  agent boss started"
    assert body[2].startswith("    model m1  m-1")
    assert "@boss" not in body[2]
    assert body[3].startswith("    tool  t1  research()")
    assert body[4] == "    agent researcher started by t1"
    assert body[5] == "      turn 0"
    assert body[6].startswith("        model m2  m-1  @researcher")
    assert body[7] == '    agent end: ok, output "found it"'
    assert body[8] == '  agent end: ok, output "{"answer": 42}"'


def test_a_re_issued_call_names_the_one_it_replaces() -> None:
    b = Builder()
    model(b, Execution(id="m1", kind="model"), error="HTTP 429")
    model(b, Execution(id="m2", kind="model", replaces="m1"), at=3)
    summary = b.summary()
    shown = "\n".join(show_lines(summary, "x.jsonl", Style(False)))
    assert "model m2  m-1  (replaces m1)" in shown
    inspected = "\n".join(inspect_lines(summary, "x.jsonl", Style(False)))
    assert "re-issued as m2: ok" in inspected
    assert "gaps     none" in inspected


def test_a_reused_execution_id_is_a_gap_not_a_negative_duration() -> None:
    b = Builder()
    model(b, Execution(id="m1", kind="model"), at=5)
    model(b, Execution(id="m1", kind="model"), at=1)
    summary = b.summary()
    (run,) = summary.run_list()
    assert run.gaps() == [
        "model call m1: its execution id is used again by another call (seq 6); "
        "the two cannot be told apart"
    ]
    shown = "\n".join(show_lines(summary, "x.jsonl", Style(False)))
    # No duration; a response with no usage recorded is priced unknown.
    assert shown.split("model m1", 1)[1].split("\n", 1)[0] == "  m-1  cost unknown"
    assert "gap: model call m1" in shown


def test_a_start_recorded_twice_is_a_reused_id() -> None:
    b = Builder()
    ex = Execution(id="t1", kind="tool")
    b.add(ToolExecStart(execution=ex, tool_call_id="a", name="x"))
    b.add(ToolExecStart(execution=ex, tool_call_id="b", name="x"))
    b.add(ToolExecEnd(execution=ex, tool_call_id="a", name="x", content=[TextPart(text="1")]))
    (run,) = b.summary().run_list()
    assert len(run.gaps()) == 1
    assert "used again" in run.gaps()[0]


def test_flightlog_inspect_exits_with_gaps_for_a_reused_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = Builder()
    model(b, Execution(id="m1", kind="model"))
    model(b, Execution(id="m1", kind="model"), at=3)
    b.raw("run_close", b.run_id, {"error": None})
    path = tmp_path / "reused.jsonl"
    path.write_bytes(b"".join(encode_line(record) for record in b.records))
    # Sound format-wise: check warns, and inspect names the gap.
    assert run(["check", str(path)]) == EXIT_OK
    assert "warning: seq 6: model_request in run" in capsys.readouterr().out
    assert run(["inspect", str(path)]) == EXIT_GAPS
    assert "its execution id is used again by another call" in capsys.readouterr().out
