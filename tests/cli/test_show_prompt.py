"""``flightlog show --call ID --prompt``: the prompt a model call was sent, rebuilt across
``continues`` from a real file, readable or as JSON, with control characters escaped on
a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol import events
from flightlog.sdk import connect
from support import DaemonProcess, on_a_terminal


def flightlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightlog.cli", *args], capture_output=True, text=True, timeout=60
    )


def request(call: str, *messages: events.ChatMessage, **fields: object) -> events.ModelRequest:
    return events.ModelRequest(
        execution=events.Execution(id=call, kind="model"),
        messages=list(messages),
        tools=[events.ToolDeclaration(name="lookup")],
        config=events.CallConfig(model="claude-x", temperature=0.2),
        **fields,  # type: ignore[arg-type]
    )


@pytest.fixture
def session(daemon: DaemonProcess) -> Iterator[Path]:
    """Two runs: m2 (second run) continues m1, which a dropped m0 would have preceded."""
    with connect(daemon.socket) as client:
        session = client.create("prompt.jsonl")
        with session:
            with session.begin_run() as run:
                run.record(
                    request(
                        "m1", events.UserMessage(content="hi\x1b]0;pwned\x07"), system="Be terse."
                    )
                )
            with session.begin_run() as run:
                run.record(
                    request(
                        "m2",
                        events.AssistantMessage(content=[events.TextPart(text="hello\nthere")]),
                        events.ToolResultMessage(
                            tool_call_id="call_1",
                            name="lookup",
                            content=[events.TextPart(text="sunny")],
                        ),
                        continues="m1",
                    )
                )
                run.record(request("m3", continues="m0"))
    yield daemon.root / "prompt.jsonl"


def test_show_prompt_prints_the_whole_rebuilt_prompt(session: Path) -> None:
    done = flightlog("show", str(session), "--call", "m2", "--prompt")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("model call m2 attempt 1  (run ")
    assert "config: model claude-x · temperature 0.2" in lines
    assert "tools: lookup" in lines
    assert "system: Be terse." in lines
    assert "messages (3):" in lines
    at = lines.index("messages (3):")
    assert lines[at + 1].startswith("  [1] user: hi")
    # A message of several lines keeps them, indented under its head.
    assert lines[at + 2] == "  [2] assistant: hello"
    assert lines[at + 3] == " " * len("  [2] assistant: ") + "there"
    assert lines[at + 4] == "  [3] tool_result lookup (call_1): sunny"


def test_show_prompt_json_is_the_prompt_as_json(session: Path) -> None:
    done = flightlog("show", str(session), "--call", "m2", "--prompt", "--json")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    prompt = json.loads(line)
    assert prompt["call"] == "m2" and prompt["system"] == "Be terse."
    assert [m["$type"] for m in prompt["messages"]] == ["user", "assistant", "tool_result"]
    assert prompt["messages"][0]["content"] == "hi\x1b]0;pwned\x07"
    assert prompt["tools"][0]["name"] == "lookup"
    assert prompt["config"]["model"] == "claude-x"


def test_control_characters_are_escaped_on_a_terminal(session: Path) -> None:
    shown = on_a_terminal(
        [sys.executable, "-m", "flightlog.cli", "show", str(session), "--call", "m1", "--prompt"],
        {**os.environ, "TERM": "xterm", "NO_COLOR": "1"},
    ).decode()
    assert "hi\\x1b]0;pwned\\x07" in shown
    assert "\x1b]0" not in shown and "\x07" not in shown


def test_a_broken_chain_and_a_missing_call_are_errors(session: Path) -> None:
    broken = flightlog("show", str(session), "--call", "m3", "--prompt")
    assert broken.returncode == 1
    assert "continues call 'm0'" in broken.stderr and "line " in broken.stderr
    missing = flightlog("show", str(session), "--call", "nope", "--prompt")
    assert missing.returncode == 2 and "no model call 'nope'" in missing.stderr
    alone = flightlog("show", str(session), "--prompt")
    assert alone.returncode == 2 and "--prompt needs --call" in alone.stderr
