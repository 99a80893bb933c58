"""``flightlog export`` into a real OTLP backend, Arize Phoenix, read back through its API.

One daemon records one session: the demo's agent run (model calls with usage, a tool call
that fails and is retried, a rate-limited model call that is retried), a run left
interrupted with calls that never ended, and, after the session is opened again, a run
that re-issues the interrupted run's tool call.  Each test exports into its own Phoenix
project (``openinference.project.name``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flightlog.cli._demo import record_demo_run
from flightlog.protocol import (
    Execution,
)
from flightlog.protocol.events import (
    AgentEnd,
    AgentStart,
    CallConfig,
    ModelExecStart,
    ModelRequest,
    ToolExecEnd,
    ToolExecStart,
    ToolQueued,
    TurnStart,
    UserMessage,
)
from flightlog.sdk import connect
from support import DaemonProcess, read_lines, wait_for

from .phoenix_backend import Phoenix


@dataclass
class Session:
    daemon: DaemonProcess
    path: Path
    session_id: str
    runs: list[str]  # complete demo run, interrupted run, re-issuing run


def _interrupted_run(run: Any) -> None:
    question = UserMessage(content="Book a table for two in Lisbon tonight.")
    run.record(AgentStart(agent="booker", messages=[question]))
    run.record(TurnStart(turn_index=0))
    model = Execution(id="m0", kind="model", turn_index=0)
    run.record(ModelRequest(execution=model, messages=[question], config=CallConfig(model="m-x")))
    run.record(ModelExecStart(execution=model, model="m-x"))
    tool = Execution(id="t0", kind="tool", parent_id="m0", turn_index=0)
    run.record(ToolQueued(execution=tool, tool_call_id="call_book", name="book_table"))
    run.record(ToolExecStart(execution=tool, tool_call_id="call_book", name="book_table"))


def _reissuing_run(run: Any) -> None:
    run.record(AgentStart(agent="booker"))
    tool = Execution(id="t0", kind="tool", turn_index=0)
    run.record(ToolExecStart(execution=tool, tool_call_id="call_book", name="book_table"))
    run.record(ToolExecEnd(execution=tool, tool_call_id="call_book", name="book_table"))
    run.record(AgentEnd(ok=True, reason="completed", turns=1))


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    daemon = DaemonProcess(base, "--log-format", "json").start()
    try:
        relative = "export/session.jsonl"
        with connect(daemon.socket, client_name="export-test") as client:
            opened = client.create(relative, meta={"app": "export-test", "team": "qa"})
            with opened.begin_run() as run:
                record_demo_run(run, pace=0)
            interrupted = opened.begin_run()
            _interrupted_run(interrupted)
            opened.sync()
        path = daemon.root / relative
        with connect(daemon.socket) as client:
            wait_for(lambda: all(s.path != str(path) for s in client.status().sessions))
            reopened = client.open(relative)
            with reopened.begin_run() as third:
                _reissuing_run(third)
            reopened.close()
        lines = read_lines(path)
        runs = list(dict.fromkeys(line["run_id"] for line in lines if line["run_id"]))
        assert runs[1] == interrupted.run_id and len(runs) == 3
        yield Session(daemon, path, lines[0]["session_id"], runs)
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def export(
    phoenix: Phoenix, project: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={project}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "10",
        **env,
    }
    environ.pop("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", None)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "export", "--endpoint", phoenix.endpoint, *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )


def fresh_copy(session: Session, directory: Path) -> Path:
    """The session under a new session id, so its spans have ids Phoenix has not seen
    (Phoenix keeps one span per span id across all its projects)."""
    path = directory / "session.jsonl"
    path.write_bytes(
        session.path.read_bytes().replace(session.session_id.encode(), uuid.uuid4().hex.encode())
    )
    return path


def new_project() -> str:
    return f"flightlog-{uuid.uuid4().hex[:12]}"


def spans_of(phoenix: Phoenix, project: str, count: int) -> list[dict[str, Any]]:
    """Phoenix's spans of ``project`` once it holds ``count`` (it ingests in batches)."""
    wait_for(lambda: len(phoenix.spans(project)) >= count, timeout=60, interval=0.2)
    return phoenix.spans(project)


# The demo run: 1 invoke_agent, 2 turns, 3 chat (one of them a failed attempt 1), 3
# execute_tool (one a failed attempt 1); the interrupted run: invoke_agent, its open turn,
# chat, execute_tool; the re-issuing run (no turn records): invoke_agent, execute_tool.
EXPECTED_SPANS = 9 + 4 + 2


def by_name(spans: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"].startswith(prefix)]


def test_export_follows_the_genai_conventions(phoenix: Phoenix, session: Session) -> None:
    project = new_project()
    result = export(phoenix, project, str(session.path))
    assert result.returncode == 0, result.stderr
    assert f"exported {EXPECTED_SPANS} spans of 1 sessions" in result.stderr
    spans = spans_of(phoenix, project, EXPECTED_SPANS)
    assert len(spans) == EXPECTED_SPANS

    roots = [span for span in spans if span["parent_id"] is None]
    assert sorted(span["name"] for span in roots) == [
        "invoke_agent booker",
        "invoke_agent booker",
        "invoke_agent trip-planner",
    ]
    # One trace per run; a turn hangs under its run's invoke_agent span, and a call
    # under its turn (or the run, in a run with no turn records).
    root_of_trace = {span["context"]["trace_id"]: span["context"]["span_id"] for span in roots}
    assert len(root_of_trace) == 3
    turns = by_name(spans, "turn ")
    turn_ids = {span["context"]["span_id"] for span in turns}
    for span in turns:
        assert span["parent_id"] == root_of_trace[span["context"]["trace_id"]], span
    for span in spans:
        if span["parent_id"] is not None and span not in turns:
            root = root_of_trace[span["context"]["trace_id"]]
            assert span["parent_id"] in turn_ids | {root}, span
        attributes = span["attributes"]
        assert attributes["gen_ai.conversation.id"] == session.session_id
        if span not in turns:
            assert attributes["gen_ai.operation.name"] in ("invoke_agent", "chat", "execute_tool")
        assert "gen_ai.input.messages" not in attributes  # content is opt-in

    demo_trace = next(s for s in roots if s["name"] == "invoke_agent trip-planner")
    demo = [s for s in spans if s["context"]["trace_id"] == demo_trace["context"]["trace_id"]]
    assert demo_trace["status_code"] == "UNSET"
    assert demo_trace["attributes"]["gen_ai.agent.name"] == "trip-planner"
    assert demo_trace["attributes"]["flightlog.meta.app"] == "export-test"
    demo_turns = {s["name"]: s for s in by_name(demo, "turn ")}
    assert sorted(demo_turns) == ["turn 0", "turn 1"]
    children = {
        name: sorted(s["name"] for s in demo if s["parent_id"] == turn["context"]["span_id"])
        for name, turn in demo_turns.items()
    }
    assert children == {
        "turn 0": ["chat demo-sonnet-1", *["execute_tool get_weather"] * 3],
        "turn 1": ["chat demo-sonnet-1", "chat demo-sonnet-1"],
    }
    assert demo_turns["turn 1"]["attributes"]["flightlog.turn.stop_reason"] == "end_turn"
    assert all(turn["status_code"] == "UNSET" for turn in demo_turns.values())

    chats = by_name(demo, "chat ")
    assert {s["name"] for s in chats} == {"chat demo-sonnet-1"}
    assert len(chats) == 3
    failed_chat = [s for s in chats if s["status_code"] == "ERROR"]
    assert len(failed_chat) == 1
    assert "429" in failed_chat[0]["status_message"]
    assert failed_chat[0]["attributes"]["error.type"] == "model_error"
    ok_chats = [s for s in chats if s["status_code"] == "UNSET"]
    for chat in ok_chats:
        attributes = chat["attributes"]
        assert attributes["gen_ai.request.model"] == "demo-sonnet-1"
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert attributes["gen_ai.response.finish_reasons"]
    retried_chat = [s for s in ok_chats if s["attributes"]["flightlog.execution.attempt"] == 2]
    assert len(retried_chat) == 1
    assert "429" in retried_chat[0]["attributes"]["flightlog.retry.error"]
    assert (
        retried_chat[0]["attributes"]["flightlog.execution.id"]
        == failed_chat[0]["attributes"]["flightlog.execution.id"]
    )

    tools = by_name(demo, "execute_tool ")
    assert {s["name"] for s in tools} == {"execute_tool get_weather"}
    lisbon = sorted(
        (s for s in tools if s["attributes"]["gen_ai.tool.call.id"] == "call_lisbon"),
        key=lambda s: s["attributes"]["flightlog.execution.attempt"],
    )
    assert [s["status_code"] for s in lisbon] == ["ERROR", "UNSET"]
    assert "timed out" in lisbon[0]["status_message"]
    assert lisbon[0]["attributes"]["error.type"] == "tool_error"
    assert lisbon[1]["attributes"]["flightlog.retry.delay_seconds"] > 0
    for tool in tools:
        assert tool["attributes"]["gen_ai.tool.name"] == "get_weather"

    # The interrupted run: its calls never ended, and are never shown as successes.
    interrupted_trace = next(
        s for s in roots if s["attributes"]["flightlog.run_id"] == session.runs[1]
    )
    interrupted = [
        s for s in spans if s["context"]["trace_id"] == interrupted_trace["context"]["trace_id"]
    ]
    assert len(interrupted) == 4
    (open_turn,) = by_name(interrupted, "turn ")
    assert open_turn["status_message"] == "interrupted: no turn_end (turn 0)"
    for span in interrupted:
        assert span["status_code"] == "ERROR"
        assert span["status_message"].startswith("interrupted")
        assert span["attributes"]["error.type"] == "interrupted"

    # The third run re-issues the interrupted run's tool call, and says so.
    third_trace = next(s for s in roots if s["attributes"]["flightlog.run_id"] == session.runs[2])
    (reissued,) = [
        s
        for s in spans
        if s["context"]["trace_id"] == third_trace["context"]["trace_id"] and s["parent_id"]
    ]
    assert reissued["name"] == "execute_tool book_table"
    assert reissued["attributes"]["flightlog.reissued"] is True
    assert reissued["status_code"] == "UNSET"


def marker_session(directory: Path) -> Path:
    """A one-run session written by hand, exported after the export under test: Phoenix
    ingests in order, so once its span is there, so is everything sent before it."""
    session_id, run_id = uuid.uuid4().hex, uuid.uuid4().hex
    lines = [
        {"type": "session_start", "run_id": None, "data": {"format_version": 1, "meta": {}}},
        {"type": "run_start", "run_id": run_id, "data": {"pid": 1, "client": "marker"}},
        {"type": "run_close", "run_id": run_id, "data": {"error": None}},
    ]
    path = directory / "marker.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"session_id": session_id, "seq": seq, "time": "2026-11-29T20:00:00.000000Z"} | line
            )
            + "\n"
            for seq, line in enumerate(lines, 1)
        )
    )
    return path


def test_a_second_export_changes_nothing(
    phoenix: Phoenix, session: Session, tmp_path: Path
) -> None:
    project = new_project()
    root = tmp_path / "root"
    root.mkdir()
    copy = fresh_copy(session, root)
    assert export(phoenix, project, str(copy)).returncode == 0
    first = spans_of(phoenix, project, EXPECTED_SPANS)
    result = export(phoenix, project, "--all", f"--root={root}")
    assert result.returncode == 0, result.stderr
    assert f"exported {EXPECTED_SPANS} spans" in result.stderr
    assert export(phoenix, project, str(marker_session(tmp_path))).returncode == 0
    again = [
        s for s in spans_of(phoenix, project, EXPECTED_SPANS + 1) if s["name"] != "invoke_agent"
    ]
    key = lambda s: s["context"]["span_id"]  # noqa: E731
    assert sorted(again, key=key) == sorted(first, key=key)


def test_content_only_when_asked_and_without_credentials(
    phoenix: Phoenix, session: Session, tmp_path: Path
) -> None:
    project = new_project()
    result = export(phoenix, project, "--content", str(fresh_copy(session, tmp_path)))
    assert result.returncode == 0, result.stderr
    spans = spans_of(phoenix, project, EXPECTED_SPANS)
    chats = [s for s in by_name(spans, "chat demo-sonnet-1") if s["status_code"] == "UNSET"]
    for chat in chats:
        messages = json.loads(chat["attributes"]["gen_ai.input.messages"])
        assert messages[0]["role"] == "user"
        assert messages[0]["parts"][0]["type"] == "text"
        output = json.loads(chat["attributes"]["gen_ai.output.messages"])
        assert output[0]["role"] == "assistant"
    tool = next(
        s for s in by_name(spans, "execute_tool get_weather") if s["status_code"] == "UNSET"
    )
    assert json.loads(tool["attributes"]["gen_ai.tool.call.arguments"])["city"]
    assert "gen_ai.tool.call.result" in tool["attributes"]
    everything = json.dumps(spans)
    assert "sk-demo-never-written" not in everything
    assert "api_key" not in everything

    # The environment variable of the conventions turns it on too.
    other = new_project()
    (tmp_path / "other").mkdir()
    result = export(
        phoenix,
        other,
        str(fresh_copy(session, tmp_path / "other")),
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
    )
    assert result.returncode == 0, result.stderr
    assert any(
        "gen_ai.input.messages" in s["attributes"] for s in spans_of(phoenix, other, EXPECTED_SPANS)
    )


def test_export_over_grpc(phoenix: Phoenix, session: Session, tmp_path: Path) -> None:
    grpc = new_project()
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "export", str(fresh_copy(session, tmp_path))],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={grpc}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{phoenix.grpc_port}",
        },
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    spans = spans_of(phoenix, grpc, EXPECTED_SPANS)
    assert len(spans) == EXPECTED_SPANS
    assert len(by_name(spans, "execute_tool get_weather")) == 3


def test_an_absent_backend_is_an_error_with_a_reason(session: Session) -> None:
    from .phoenix_backend import free_port

    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "export", str(session.path)],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        },
        timeout=120,
    )
    assert result.returncode == 5
    assert "did not take the spans" in result.stderr


def test_export_usage_errors(session: Session) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flightlog.cli", "export", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run().returncode == 2
    missing = run("/nonexistent/session.jsonl")
    assert missing.returncode == 2
    assert "no such file" in missing.stderr
    unsupported = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "export", str(session.path)],
        capture_output=True,
        text=True,
        env={**os.environ, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
        timeout=60,
    )
    assert unsupported.returncode == 2
    assert "http/json" in unsupported.stderr


def test_a_run_still_open_waits_for_its_end(phoenix: Phoenix, tmp_path: Path) -> None:
    path = marker_session(tmp_path)
    lines = path.read_text().splitlines()
    path.write_text("".join(line + "\n" for line in lines[:2]))  # run_start, no end yet
    project = new_project()
    result = export(phoenix, project, str(path))
    assert result.returncode == 0, result.stderr
    assert "exported 0 spans of 1 sessions" in result.stderr
    assert "1 runs not ended yet" in result.stderr
    missing = export(phoenix, project, "--all", f"--root={tmp_path / 'nowhere'}")
    assert missing.returncode == 2
    assert "the data root does not exist" in missing.stderr


def test_a_damaged_file_exports_what_comes_before_the_bad_line(
    phoenix: Phoenix, session: Session, tmp_path: Path
) -> None:
    copy = fresh_copy(session, tmp_path)
    lines = copy.read_bytes().split(b"\n")
    first_run_close = next(i for i, line in enumerate(lines) if b'"type":"run_close"' in line)
    lines[first_run_close + 2] = b"{not a record"
    copy.write_bytes(b"\n".join(lines))
    project = new_project()
    result = export(phoenix, project, str(copy))
    assert result.returncode == 1
    assert f"line {first_run_close + 3}: not a valid record" in result.stderr
    # The demo run (7 spans and its 2 turns), complete before the damage, is there; the
    # rest is not.
    spans = spans_of(phoenix, project, 9)
    assert len(spans) == 9
    assert sum(span["parent_id"] is None for span in spans) == 1
