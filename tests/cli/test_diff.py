"""``flightlog diff``: runs recorded by a real daemon, compared where they part ways."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flightlog.protocol import events
from flightlog.sdk import connect
from support import DaemonProcess

WEATHER = "get_weather"


def _run(
    session: Any,
    tag: str,
    *,
    question: str = "Walk in Paris tomorrow?",
    forecast: str = "14°C, rain",
    extra_tool: bool = False,
    answer: str = "No: it rains.",
    fail_tool: bool = False,
) -> None:
    """One agent run; ``tag`` makes every id differ from the other runs' ids, as a
    provider's do."""
    with session.begin_run() as run:
        run.record(
            events.AgentStart(agent="walker", messages=[events.UserMessage(content=question)])
        )
        m1 = events.Execution(id=f"m1-{tag}", kind="model", turn_index=0)
        call_id = f"call_{tag}"
        run.record(
            events.ModelRequest(execution=m1, messages=[events.UserMessage(content=question)])
        )
        run.record(events.ModelExecStart(execution=m1, model="model-x"))
        ask = events.AssistantMessage(
            content=[events.ToolCallPart(id=call_id, name=WEATHER, arguments={"city": "Paris"})],
            model="model-x",
            response_id=f"resp-{tag}",
        )
        run.record(
            events.ModelExecEnd(
                execution=m1, message=ask, usage=events.Usage(input_tokens=100, output_tokens=10)
            )
        )
        t1 = events.Execution(id=call_id, kind="tool", parent_id=m1.id, turn_index=0)
        run.record(
            events.ToolExecStart(
                execution=t1, tool_call_id=call_id, name=WEATHER, arguments={"city": "Paris"}
            )
        )
        run.record(
            events.ToolExecEnd(
                execution=t1,
                tool_call_id=call_id,
                name=WEATHER,
                content=[events.TextPart(text=forecast)],
                is_error=fail_tool,
            )
        )
        if extra_tool:
            t2 = events.Execution(id=f"call2_{tag}", kind="tool", parent_id=m1.id, turn_index=0)
            run.record(
                events.ToolExecStart(
                    execution=t2, tool_call_id=t2.id, name="get_pollen", arguments={"city": "Paris"}
                )
            )
            run.record(
                events.ToolExecEnd(
                    execution=t2,
                    tool_call_id=t2.id,
                    name="get_pollen",
                    content=[events.TextPart(text="low")],
                )
            )
        m2 = events.Execution(id=f"m2-{tag}", kind="model", turn_index=1)
        result = events.ToolResultMessage(
            tool_call_id=call_id, name=WEATHER, content=[events.TextPart(text=forecast)]
        )
        run.record(events.ModelRequest(execution=m2, messages=[ask, result]))
        run.record(events.ModelExecStart(execution=m2, model="model-x"))
        run.record(
            events.ModelExecEnd(
                execution=m2,
                message=events.AssistantMessage(
                    content=[events.TextPart(text=answer)], model="model-x"
                ),
                usage=events.Usage(input_tokens=150, output_tokens=20),
            )
        )
        run.record(events.AgentEnd(agent="walker", ok=True, reason="completed", turns=2))


@pytest.fixture(scope="module")
def recorded(module_daemon: DaemonProcess) -> tuple[DaemonProcess, Path]:
    daemon = module_daemon
    with connect(daemon.socket) as client:
        session = client.create("walks.jsonl")
        _run(session, "a")  # 1
        _run(session, "b")  # 2: the same run, other ids
        _run(session, "c", forecast="24°C, sun", answer="Yes: sunny.")  # 3
        _run(session, "d", extra_tool=True)  # 4
        _run(session, "e", question="Walk in Rome tomorrow?")  # 5
        _run(session, "f", fail_tool=True, forecast="timed out")  # 6
        session.close()
    return daemon, daemon.root / "walks.jsonl"


def diff(path: Path, a: str, b: str, *options: str) -> tuple[int, str, str]:
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "diff", f"{path}@{a}", f"{path}@{b}", *options],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.returncode, result.stdout, result.stderr


def test_same_calls_with_other_ids_are_alike(recorded: tuple[DaemonProcess, Path]) -> None:
    _, path = recorded
    status, out, _ = diff(path, "1", "2")
    assert status == 0
    assert "the runs made the same calls alike" in out
    assert out.count("  = ") == 3


def test_a_tool_result_that_differs(recorded: tuple[DaemonProcess, Path]) -> None:
    _, path = recorded
    status, out, _ = diff(path, "1", "3")
    assert status == 6
    lines = out.splitlines()
    assert lines[2].startswith("  = model model-x")
    assert "! first divergence at call 2: tool get_weather" in out
    assert "    input: the same" in out
    assert "-14°C, rain" in out and "+24°C, sun" in out
    # What followed: the last model call of each, with its tokens.
    assert "what followed (a | b):" in out
    followed = out.split("what followed (a | b):\n")[1].splitlines()
    assert len(followed) == 1 and followed[0].count("model model-x") == 2
    assert "170 tok" in followed[0]


def test_a_call_only_one_run_made(recorded: tuple[DaemonProcess, Path]) -> None:
    _, path = recorded
    status, out, _ = diff(path, "1", "4")
    assert status == 6
    assert "! first divergence at call 3: only b made tool get_pollen" in out
    # What the call only b made was given and gave back, as added lines.
    assert '      +  "city": "Paris"' in out, out
    assert '      +    "text": "low"' in out, out


def test_another_question(recorded: tuple[DaemonProcess, Path]) -> None:
    _, path = recorded
    status, out, _ = diff(path, "1", "5", "--color", "never")
    assert status == 6
    assert "! first divergence at call 1: model model-x" in out
    assert '      -      "content": "Walk in Paris tomorrow?"' in out
    assert '      +      "content": "Walk in Rome tomorrow?"' in out
    assert "    output: the same" in out


def test_json(recorded: tuple[DaemonProcess, Path]) -> None:
    _, path = recorded
    status, out, _ = diff(path, "1", "-1", "--json")
    assert status == 6
    report = json.loads(out)
    assert report["alike"] == 1
    assert report["a"]["calls"] == 3 and report["a"]["tokens"] == 280
    divergence = report["divergence"]
    assert divergence["call"] == 2
    assert divergence["a"]["status"] == "ok" and divergence["b"]["status"] == "failed"
    assert divergence["b"]["error"] == "timed out"
    assert divergence["b"]["input"] == {"city": "Paris"}
    assert [f["a"]["kind"] for f in report["followed"]] == ["model"]


def test_last_run_of_two_files(recorded: tuple[DaemonProcess, Path], tmp_path: Path) -> None:
    _, path = recorded
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(path.read_bytes())
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "diff", str(path), str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [("9", "no run 9; the session has 6"), ("0", "no run 0"), ("zz", "no run 'zz'")],
)
def test_a_run_that_is_not_there(
    recorded: tuple[DaemonProcess, Path], spec: str, message: str
) -> None:
    _, path = recorded
    status, _, err = diff(path, "1", spec)
    assert status == 2
    assert message in err


def _order_run(session: Any, tag: str, order: int) -> None:
    """A model call whose history holds a tool call with an ``id`` argument, then the
    tool called with it; ``tag`` makes the provider's ids differ."""
    ask = events.AssistantMessage(
        content=[events.ToolCallPart(id=f"call_{tag}", name="get_order", arguments={"id": order})]
    )
    result = events.ToolResultMessage(
        tool_call_id=f"call_{tag}", name="get_order", content=[events.TextPart(text="shipped")]
    )
    with session.begin_run() as run:
        m1 = events.Execution(id=f"m1-{tag}", kind="model")
        history = [events.UserMessage(content="Where is my order?"), ask, result]
        run.record(events.ModelRequest(execution=m1, messages=history))
        run.record(
            events.ModelExecEnd(
                execution=m1,
                message=events.AssistantMessage(content=[events.TextPart(text="It shipped.")]),
            )
        )
        t1 = events.Execution(id=f"t-{tag}", kind="tool")
        run.record(
            events.ToolExecStart(
                execution=t1, tool_call_id=f"c-{tag}", name="get_order", arguments={"id": order}
            )
        )
        run.record(
            events.ToolExecEnd(
                execution=t1,
                tool_call_id=f"c-{tag}",
                name="get_order",
                content=[events.TextPart(text="shipped")],
            )
        )


def test_an_argument_named_id_is_compared(module_daemon: DaemonProcess) -> None:
    """Only the ids the protocol's objects carry (a tool call's, a result's) are left
    out: a tool's own argument named ``id`` is what it was given."""
    with connect(module_daemon.socket) as client:
        session = client.create("orders.jsonl")
        _order_run(session, "a", 17)
        _order_run(session, "b", 17)
        _order_run(session, "c", 18)
        session.close()
    path = module_daemon.root / "orders.jsonl"
    status, out, _ = diff(path, "1", "2")
    assert status == 0, out
    status, out, _ = diff(path, "1", "3", "--json")
    assert status == 6, out
    divergence = json.loads(out)["divergence"]
    assert divergence["call"] == 1 and divergence["a"]["kind"] == "model"
    tool_call = divergence["b"]["input"]["messages"][1]["content"][0]
    assert tool_call == {"$type": "tool_call", "name": "get_order", "arguments": {"id": 18}}
    followed = json.loads(out)["followed"]
    assert followed[0]["a"]["input"] == {"id": 17} and followed[0]["b"]["input"] == {"id": 18}


def _write_run(session: Any, tag: str, body: str, thought: str) -> None:
    """A model call that thinks, then asks for write_file with a long ``content``."""
    with session.begin_run() as run:
        m1 = events.Execution(id=f"m1-{tag}", kind="model")
        run.record(
            events.ModelRequest(execution=m1, messages=[events.UserMessage(content="Save it.")])
        )
        ask = events.ToolCallPart(
            id=f"call_{tag}", name="write_file", arguments={"path": "/tmp/out", "content": body}
        )
        message = events.AssistantMessage(
            content=[events.ThinkingPart(thinking=thought, signature=f"sig-{tag}"), ask]
        )
        run.record(events.ModelExecEnd(execution=m1, message=message))


def test_what_a_model_gave_back_is_compared_whole(module_daemon: DaemonProcess) -> None:
    """The short form of a response (a tool call's arguments cut at 40 characters, a
    thinking part as [thinking]) is how it is shown, not what is compared."""
    body = "line one of a long file, " * 4
    with connect(module_daemon.socket) as client:
        session = client.create("writes.jsonl")
        _write_run(session, "a", body + "the end", "Save to /tmp.")
        _write_run(session, "b", body + "the end", "Save to /tmp.")
        _write_run(session, "c", body + "THE END", "Save to /tmp.")
        _write_run(session, "d", body + "the end", "Save to /var.")
        session.close()
    path = module_daemon.root / "writes.jsonl"
    assert diff(path, "1", "2")[0] == 0
    status, out, _ = diff(path, "1", "3", "--color", "never")
    assert status == 6 and "! first divergence at call 1: model" in out, out
    assert "the endline" not in out and "the end" in out and "THE END" in out
    status, out, _ = diff(path, "1", "4", "--json")
    assert status == 6, out
    divergence = json.loads(out)["divergence"]
    assert divergence["a"]["output"] == divergence["b"]["output"]
    assert divergence["b"]["returned"]["content"][0] == {
        "$type": "thinking",
        "thinking": "Save to /var.",
        "redacted": False,
    }
