"""The CLI's understanding of a session, in process: pairing starts and ends, run
status and gaps, and the text that ``tail``, ``show`` and ``inspect`` print.

Records are built here line by line (the envelope the daemon writes around codec-encoded
events), so each test states exactly the file it reasons about.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from flightlog.cli._commands import (
    EXIT_GAPS,
    EXIT_OK,
    EXIT_UNSOUND,
    EXIT_USAGE,
    CommandError,
    _parse_call,
    _record_types,
    daemon_path,
    local_path,
)
from flightlog.cli._inspect import SessionSummary, summarize_records
from flightlog.cli._main import run
from flightlog.cli._render import (
    Style,
    call_label,
    format_args,
    format_bytes,
    format_duration,
    format_usage,
    message_text,
    short,
    summarize,
    tail_line,
)
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
    AssistantMessage,
    CallConfig,
    ContextCompacted,
    ModelExecEnd,
    ModelExecStart,
    ModelRequest,
    ModelResponse,
    Retry,
    TextPart,
    ToolCallPart,
    ToolExecEnd,
    ToolExecStart,
    ToolInvokeEnd,
    ToolInvokeStart,
    ToolQueued,
    TurnStart,
    Usage,
    UserMessage,
)
from flightlog.protocol.format import (
    encode_line,
)

T0 = "2026-11-29T20:00:00.000000Z"


class Session:
    """Builds the records of one session file, seq by seq."""

    def __init__(self) -> None:
        self.session_id = new_id()
        self.records: list[Record] = []
        self.raw("session_start", None, {"format_version": 1, "meta": {"app": "t"}})

    def raw(self, type: str, run_id: str | None, data: Any, time: str = T0) -> Record:
        record = Record(
            session_id=self.session_id,
            seq=len(self.records) + 1,
            type=type,
            time=time,
            run_id=run_id,
            data=msgspec.Raw(msgspec.json.encode(data)),
        )
        self.records.append(record)
        return record

    def begin(self) -> str:
        run_id = new_id()
        self.raw("run_start", run_id, {"pid": 42, "client": "agent"})
        return run_id

    def event(self, run_id: str, event: Event) -> Record:
        encoded = encode_event(event)
        assert encoded is not None
        data = msgspec.json.decode(encoded.data)
        return self.raw(encoded.type, run_id, data, time=encoded.time)

    def close(self, run_id: str, error: str | None = None) -> None:
        self.raw("run_close", run_id, {"error": error})

    def checkpoint(self, run_id: str, snapshot: Any) -> None:
        self.raw("checkpoint", run_id, {"snapshot": snapshot})

    def summary(self) -> SessionSummary:
        return summarize_records(self.records)

    def write(self, path: Path) -> Path:
        path.write_bytes(b"".join(encode_line(record) for record in self.records))
        return path


def at(seconds: float) -> str:
    return f"2026-11-29T20:00:{seconds:09.6f}Z"


def model(exec_id: str = "m0", attempt: int = 1) -> Execution:
    return Execution(id=exec_id, kind="model", attempt=attempt, turn_index=0)


def tool(exec_id: str = "t0", attempt: int = 1) -> Execution:
    return Execution(id=exec_id, kind="tool", attempt=attempt, turn_index=0)


def model_call(
    s: Session,
    run_id: str,
    execution: Execution,
    *,
    end: bool = True,
    error: str | None = None,
    text: str = "hello",
) -> None:
    config = CallConfig(model="m-1", extra={"api_key": "secret"})
    s.event(run_id, ModelRequest(execution=execution, config=config, time=at(1)))
    s.event(run_id, ModelExecStart(execution=execution, model="m-1", time=at(1)))
    if end:
        message = None if error else AssistantMessage(content=[TextPart(text=text)])
        s.event(
            run_id,
            ModelExecEnd(
                execution=execution,
                message=message,
                error=error,
                usage=Usage(input_tokens=1200, output_tokens=34),
                time=at(2.5),
            ),
        )


def tool_call(
    s: Session,
    run_id: str,
    execution: Execution,
    *,
    end: bool = True,
    is_error: bool = False,
    disposition: str = "ran",
    result: str = "42",
) -> None:
    args = {"q": "x"}
    s.event(run_id, ToolQueued(execution=execution, tool_call_id="c", name="calc", arguments=args))
    s.event(
        run_id,
        ToolExecStart(
            execution=execution, tool_call_id="c", name="calc", arguments=args, time=at(3)
        ),
    )
    if end:
        s.event(
            run_id,
            ToolExecEnd(
                execution=execution,
                tool_call_id="c",
                name="calc",
                content=[TextPart(text=result)],
                is_error=is_error,
                disposition=disposition,  # type: ignore[arg-type]
                reason="not allowed" if disposition == "refused" else None,
                time=at(3.25),
            ),
        )


# ------------------------------------------------------------------------ pairing


def test_starts_and_ends_pair_by_run_execution_id_attempt_and_kind() -> None:
    s = Session()
    one = s.begin()
    # The same id as a model and as a tool call: two calls, paired by kind.
    model_call(s, one, model("x"), end=True)
    tool_call(s, one, tool("x"), end=False)
    two = s.begin()
    # The same id again in another run: a third call, with no end of its own.
    model_call(s, two, model("x"), end=False)
    summary = s.summary()
    run_one, run_two = summary.runs[one], summary.runs[two]
    assert run_one.calls[("model", "x", 1)].status == "ok"
    assert run_one.calls[("tool", "x", 1)].status == "no end"
    assert run_two.calls[("model", "x", 1)].status == "no end"
    # An end of one attempt does not end another.
    s2 = Session()
    r = s2.begin()
    model_call(s2, r, model("y", 1), end=False)
    model_call(s2, r, model("y", 2), end=True)
    calls = s2.summary().runs[r].calls
    assert calls[("model", "y", 1)].status == "no end"
    assert calls[("model", "y", 2)].status == "ok"


def test_a_missing_end_is_never_read_as_success() -> None:
    s = Session()
    r = s.begin()
    s.event(r, AgentStart(agent="a"))
    model_call(s, r, model(), end=True)
    tool_call(s, r, tool(), end=False)
    s.event(r, AgentEnd(ok=True, reason="completed"))
    s.close(r)
    run = s.summary().runs[r]
    # Even with agent_end ok and a run_close, the tool call has no result.
    assert run.calls[("tool", "t0", 1)].status == "no end"
    assert run.gaps() == ["tool call t0 (calc): no tool_exec_end (seq 7)"]
    assert run.status == "completed"


def test_model_calls_without_their_end_are_gaps() -> None:
    s = Session()
    r = s.begin()
    s.event(r, ModelRequest(execution=model("m9"), config=CallConfig(model="big")))
    run = s.summary().runs[r]
    assert run.calls[("model", "m9", 1)].missing() == "no model_exec_end"
    assert "model call m9 (big): no model_exec_end (seq 3)" in run.gaps()
    assert run.status == "no model_exec_end, no run_close"
    assert not run.ok


def test_tool_invoked_without_invoke_end_is_a_gap() -> None:
    s = Session()
    r = s.begin()
    s.event(r, ToolInvokeStart(execution=tool(), tool_call_id="c", name="calc"))
    s.event(r, ToolExecEnd(execution=tool(), tool_call_id="c", name="calc"))
    s.close(r)
    gaps = s.summary().runs[r].gaps()
    assert gaps == ["tool call t0 (calc): tool_invoke_start without tool_invoke_end (seq 3)"]


def test_retries_link_failed_attempts_to_the_next() -> None:
    s = Session()
    r = s.begin()
    tool_call(s, r, tool("t1", 1), is_error=True, result="timeout")
    s.event(r, Retry(execution=tool("t1", 1), error="timeout", delay_seconds=0.5))
    tool_call(s, r, tool("t1", 2), result="ok now")
    # A model attempt given up on without an end, then retried: failed, not a gap.
    s.event(r, ModelExecStart(execution=model("m1", 1)))
    s.event(r, Retry(execution=model("m1", 1), error="stream stalled"))
    model_call(s, r, model("m1", 2))
    s.close(r)
    run = s.summary().runs[r]
    assert [c.label for c in run.failed_calls()] == ["t1", "m1"]
    assert run.calls[("tool", "t1", 1)].status == "failed"
    assert run.calls[("tool", "t1", 1)].error == "timeout"
    assert run.calls[("model", "m1", 1)].status == "retried"
    assert run.calls[("tool", "t1", 2)].status == "ok"
    assert [(label, error) for _, label, error in run.retries] == [
        ("t1", "timeout"),
        ("m1", "stream stalled"),
    ]
    assert run.gaps() == []
    text = "\n".join(inspect_lines(s.summary(), "f.jsonl", Style(False)))
    assert 'failed   tool t1 calc(q="x"): timeout (seq 3); retried as t1#2: ok' in text
    assert "failed   model m1: stream stalled (seq 10); retried as m1#2: ok" in text


def test_refused_and_skipped_tools_are_not_failures_nor_successes() -> None:
    s = Session()
    r = s.begin()
    tool_call(s, r, tool("t1"), disposition="refused")
    s.close(r)
    call = s.summary().runs[r].calls[("tool", "t1", 1)]
    assert call.status == "refused"
    assert call.result == "not allowed"
    assert not call.failed


@pytest.mark.parametrize(
    ("events", "closed", "close_error", "status", "ok"),
    [
        ([AgentStart(), AgentEnd(ok=True, reason="completed")], True, None, "completed", True),
        (
            [AgentStart(), AgentEnd(ok=False, reason="max_turns")],
            True,
            None,
            "failed (max_turns)",
            False,
        ),
        ([AgentStart()], True, None, "no agent_end", False),
        ([AgentStart(), AgentEnd()], False, None, "completed, no run_close", False),
        ([AgentStart(), AgentEnd()], True, "disk full", "completed, closed with error", False),
        ([], True, None, "no calls", True),
    ],
)
def test_run_status(
    events: list[Event], closed: bool, close_error: str | None, status: str, ok: bool
) -> None:
    s = Session()
    r = s.begin()
    for event in events:
        s.event(r, event)
    if closed:
        s.close(r, close_error)
    run = s.summary().runs[r]
    assert run.status == status
    assert run.ok is ok


def test_standalone_model_calls_decide_the_status() -> None:
    s = Session()
    r = s.begin()
    model_call(s, r, model("a"))
    s.close(r)
    assert s.summary().runs[r].status == "calls ok"
    s = Session()
    r = s.begin()
    model_call(s, r, model("a"), error="overloaded")
    s.close(r)
    run = s.summary().runs[r]
    assert run.status == "calls failed"
    assert not run.ok


def test_records_of_a_run_that_never_started() -> None:
    s = Session()
    orphan = new_id()
    s.event(orphan, TurnStart(turn_index=0))
    run = s.summary().runs[orphan]
    assert "records of a run that has no run_start" in run.gaps()


def test_checkpoints_and_compaction() -> None:
    s = Session()
    r = s.begin()
    s.checkpoint(r, {"n": 1})
    s.event(r, ContextCompacted(execution=Execution(id="c1", kind="compaction"), kept_count=3))
    s.checkpoint(r, {"n": 2, "pad": "x" * 100})
    s.close(r)
    summary = s.summary()
    assert summary.checkpoints == 2
    assert summary.latest_checkpoint is not None
    assert summary.latest_checkpoint.seq == 5
    assert summary.runs[r].calls[("compaction", "c1", 1)].status == "ok"
    assert summary.gaps() == {}


# ------------------------------------------------------------------------- text


def test_show_lines_for_a_session() -> None:
    s = Session()
    r = s.begin()
    s.event(r, AgentStart(agent="helper", messages=[UserMessage(content="What is 6*7?")]))
    s.event(r, TurnStart(turn_index=0))
    model_call(s, r, model(), text="Let me compute.")
    tool_call(s, r, tool(), result="42")
    s.event(r, AgentEnd(ok=True, reason="completed", turns=1))
    s.close(r)
    lines = list(show_lines(s.summary(), "x.jsonl", Style(False)))
    text = "\n".join(lines)
    assert lines[0] == f"session {s.session_id}  x.jsonl"
    assert 'agent helper started "What is 6*7?"' in text
    # A model genai-prices does not know costs "unknown", never $0.
    assert '    model m0  m-1  1,200→34 tok  cost unknown  1.50s  "Let me compute."' in text
    # The provider's tool call id beside the execution id, which show --call accepts.
    assert '    tool  t0  calc(q="x")  [c]  250ms  → "42"' in text
    assert "agent end: ok, completed, 1 turns" in text
    assert "run closed" in text
    assert "\x1b[" not in text


def test_tail_line_and_colours() -> None:
    s = Session()
    r = s.begin()
    record = s.event(
        r,
        ToolExecEnd(
            execution=tool("t3", 2),
            tool_call_id="c",
            name="calc",
            content=[TextPart(text="boom")],
            is_error=True,
            time=at(7),
        ),
    )
    plain = tail_line(record, Style(False))
    assert plain == ("20:00:07.000      3 tool_exec_end         [tool t3#2] calc FAILED: boom")
    coloured = tail_line(record, Style(True))
    assert "\x1b[31m" in coloured  # a failure is red
    assert msgspec.json.decode(encode_line(record)) == record.to_builtins()


def test_style_follows_the_terminal_and_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert Style.for_stream(Terminal()).enabled
    assert not Style.for_stream(io.StringIO()).enabled
    assert Style.for_stream(io.StringIO(), "always").enabled
    assert not Style.for_stream(Terminal(), "never").enabled
    monkeypatch.setenv("NO_COLOR", "1")
    assert not Style.for_stream(Terminal()).enabled
    monkeypatch.setenv("NO_COLOR", "")  # empty means unset (no-color.org)
    assert Style.for_stream(Terminal()).enabled
    monkeypatch.setenv("TERM", "dumb")
    assert not Style.for_stream(Terminal()).enabled
    assert Style(False).red("x") == "x"
    assert Style(True).paint("x", "bold", "red") == "\x1b[1;31mx\x1b[0m"


@pytest.mark.parametrize(
    ("type", "data", "expected"),
    [
        ("session_start", {"format_version": 1, "meta": {"a": 1}}, 'format 1, meta {"a": 1}'),
        ("run_start", {"pid": 7, "client": "bot"}, "run started by bot (pid 7)"),
        ("run_close", {"error": "disk full"}, "run closed with error: disk full"),
        ("turn_end", {"turn_index": 2, "stop_reason": "end_turn"}, "turn 2 ended, stop=end_turn"),
        ("model_response", {"length_recovery": "continue"}, "length recovery: continue"),
        ("retry_wait_end", {"cancelled": True}, "wait cancelled"),
        ("error", {"message": "bad", "code": "E1", "fatal": True}, "FATAL [E1] bad"),
        ("context_projected", {"source_count": 9, "message_count": 4}, "9 → 4 messages"),
        (
            "tool_exec_end",
            {"name": "rm", "disposition": "refused", "reason": "no"},
            "rm refused: no",
        ),
        ("future_type", {"new": "field"}, '{"new": "field"}'),
    ],
)
def test_summaries(type: str, data: dict[str, Any], expected: str) -> None:
    assert summarize(type, data) == expected


def test_messages_of_application_types_still_print() -> None:
    # An application's own message type, tagged with a $type this process never
    # registered: shown as it is, never dropped or guessed at.
    message = {"$type": "my_app.note", "body": "hi"}
    assert message_text(message) == '{"$type": "my_app.note", "body": "hi"}'
    parts = {
        "content": [
            {"$type": "text", "text": "a"},
            {"$type": "image", "media_type": "png"},
            {"$type": "tool_call", "name": "f", "arguments": {"x": 1}},
            5,
        ]
    }
    assert message_text(parts) == "a [image png] →f(x=1) 5"
    assert message_text(None) == ""


def test_small_formatters() -> None:
    assert short("a  b\nc", 10) == "a b c"
    assert short("abcdefghijkl", 5) == "abcd…"
    assert format_args({"city": "Paris", "n": 3}) == 'city="Paris", n=3'
    assert (
        format_usage(
            {"input_tokens": 1234, "output_tokens": 5, "cache_read_tokens": 1000, "cost": 0.5}
        )
        == "1,234→5 tok (1,000 cache read) provider cost $0.5000"
    )
    assert (
        format_usage({"input_tokens": 9, "cache_read_tokens": 2, "cache_write_tokens": 3})
        == "9→0 tok (2 cache read, 3 cache write)"
    )
    assert format_usage(None) == ""
    assert format_bytes(10) == "10 B" and format_bytes(2048) == "2.0 kB"
    assert format_bytes(3 * 1024 * 1024) == "3.0 MB"
    assert format_duration(0.012) == "12ms" and format_duration(3.5) == "3.50s"
    assert format_duration(3725) == "1h02m05s" and format_duration(None) == ""
    assert call_label("tool", "t1", 1) == "tool t1" and call_label("model", "m", 3) == "model m#3"


def test_model_response_without_a_decision_is_not_written() -> None:
    assert encode_event(ModelResponse(execution=model())) is None


# -------------------------------------------------------------- the command, in process


def test_argument_helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _parse_call("call_1:2") == ("call_1", 2)
    assert _parse_call("call_1") == ("call_1", None)
    assert _parse_call("a:b") == ("a:b", None)
    assert _record_types(["tool_exec_end, run_close", "checkpoint"]) == [
        "tool_exec_end",
        "run_close",
        "checkpoint",
    ]
    assert _record_types(None) is None
    with pytest.raises(CommandError) as caught:
        _record_types(["message_update"])  # never written, so never in a file
    assert caught.value.code == EXIT_USAGE

    root = tmp_path / "root"
    (root / "demo").mkdir(parents=True)
    (root / "demo" / "a.jsonl").write_bytes(b"")
    monkeypatch.setenv("FLIGHTLOG_ROOT", str(root))
    monkeypatch.chdir(tmp_path)
    assert local_path("demo/a.jsonl") == str(root / "demo" / "a.jsonl")
    assert local_path("demo/b.jsonl") == "demo/b.jsonl"
    (tmp_path / "here.jsonl").write_bytes(b"")
    assert local_path("here.jsonl") == str(tmp_path / "here.jsonl")
    assert daemon_path("here.jsonl") == os.path.realpath(tmp_path / "here.jsonl")
    assert daemon_path("demo/a.jsonl") == "demo/a.jsonl"  # the daemon resolves it
    assert daemon_path("/abs/x.jsonl") == "/abs/x.jsonl"


def test_run_check_and_inspect_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = Session()
    r = s.begin()
    s.event(r, AgentStart())
    tool_call(s, r, tool(), end=False)
    path = s.write(tmp_path / "s.jsonl")
    assert run(["check", str(path)]) == EXIT_OK
    assert "sound" in capsys.readouterr().out
    assert run(["inspect", str(path)]) == EXIT_GAPS
    out = capsys.readouterr().out
    assert "gap      tool call t0 (calc): no tool_exec_end (seq 4)" in out
    path.write_bytes(path.read_bytes().replace(b'"seq":3', b'"seq":30'))
    assert run(["inspect", str(path)]) == EXIT_UNSOUND
    assert "NOT SOUND: line 3: seq 30 leaves a gap" in capsys.readouterr().out
    assert (
        run(["show", str(tmp_path / "nothing.jsonl"), "--socket", str(tmp_path / "no.sock")])
        == EXIT_USAGE
    )
    assert "no such file, and no daemon listens on" in capsys.readouterr().err
    assert run(["show", str(tmp_path)]) == EXIT_USAGE
    assert "is a directory" in capsys.readouterr().err


def test_a_tool_call_from_a_model_message_in_show(tmp_path: Path) -> None:
    s = Session()
    r = s.begin()
    call = ToolCallPart(id="c1", name="search", arguments={"q": "flights"})
    s.event(r, ModelExecEnd(execution=model(), message=AssistantMessage(content=[call])))
    s.event(r, ToolInvokeEnd(execution=tool("c1"), tool_call_id="c1", name="search"))
    text = "\n".join(show_lines(s.summary(), "x", Style(False)))
    assert '  model m0  cost unknown  0ms  "→search(q="flights")"' in text  # no usage recorded
    assert "tool  c1  search()  NO END (no tool_exec_end): never read as a success" in text
