"""Agents killed with SIGKILL at random points of their model and tool calls: every
session resumes with ``flightlog resume --repair``, and then no tool call is unpaired.

Each agent is a real process running a tool-calling loop through the SDK (a model call
asks for one or two tools, each runs, the next model call continues the previous one
with the results, a checkpoint after each turn).  It says on stdout where it is ("in
model", "in tool") while it waits inside a call; the test kills it with SIGKILL at a
point chosen by a seeded random generator, a moment after one of those words.  What
reached the daemon before the kill is whatever it is: a tool call asked for and never
started, started and never ended, a model call never answered.  Every other session is
repaired the moment its agent is killed (the daemon may still hold it), the others once
the daemon has let go.  The rebuild API then checks the repaired file, and the repair
said it answered exactly the tool calls its marked results answer.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flightlog.sdk import DaemonError, Transcript, check, connect
from support import DaemonProcess, read_lines, run_python

AGENT = textwrap.dedent(
    """
    import sys, time
    from flightlog.protocol import events as e
    from flightlog.sdk import connect

    socket, path, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])

    def wait(where):
        print(where, flush=True)
        time.sleep(pause)

    with connect(socket) as client:
        session = client.create(path)
        with session.begin_run() as run:
            previous, results = None, [e.UserMessage(content="Plan a trip.")]
            for turn in range(1000):
                m = e.Execution(id=f"m{turn}", kind="model", turn_index=turn)
                run.record(e.ModelRequest(
                    execution=m, messages=results, continues=previous,
                    with_response=previous is not None,
                ))
                run.record(e.ModelExecStart(execution=m, model="model-x"))
                wait("in model")
                calls = [
                    e.ToolCallPart(id=f"c{turn}-{i}", name=f"tool{i}", arguments={"turn": turn})
                    for i in range(1 + turn % 2)
                ]
                answer = e.AssistantMessage(content=[e.TextPart(text="ok"), *calls])
                run.record(e.ModelExecEnd(
                    execution=m, message=answer, usage=e.Usage(input_tokens=10, output_tokens=5),
                ))
                results = []
                for call in calls:
                    t = e.Execution(id=call.id, kind="tool", parent_id=m.id, turn_index=turn)
                    run.record(e.ToolQueued(execution=t, tool_call_id=call.id, name=call.name))
                    run.record(e.ToolExecStart(execution=t, tool_call_id=call.id, name=call.name))
                    wait("in tool")
                    content = [e.TextPart(text=f"done {call.id}")]
                    run.record(e.ToolExecEnd(
                        execution=t, tool_call_id=call.id, name=call.name, content=content
                    ))
                    results.append(e.ToolResultMessage(
                        tool_call_id=call.id, name=call.name, content=content
                    ))
                run.save_checkpoint({"turn": turn})
                previous = m.id
    """
)

AGENTS = 8


def _released(socket: str, path: str) -> None:
    """Wait until the daemon let go of the killed agent's session."""
    deadline = time.monotonic() + 30
    with connect(socket) as client:
        while True:
            try:
                client.open(path).close()
                return
            except DaemonError as exc:
                assert exc.code == "session_busy" and time.monotonic() < deadline, exc
                time.sleep(0.01)


@pytest.mark.parametrize("seed", [1, 2])
def test_every_killed_session_resumes_with_no_unpaired_tool_call(
    short_tmp: Path, seed: int
) -> None:
    rng = random.Random(seed)
    daemon = DaemonProcess(short_tmp).start()
    try:
        agents = []
        for index in range(AGENTS):
            path = f"agent-{index}.jsonl"
            agent = run_python(AGENT, daemon.socket, path, f"{rng.uniform(0.001, 0.02):.4f}")
            # Stop after some waits: inside a model or a tool call, a moment in.
            agents.append((agent, path, rng.randint(1, 12), rng.uniform(0, 0.01)))
        kinds: set[bytes] = set()
        repaired = 0
        for index, (agent, path, waits, delay) in enumerate(agents):
            assert agent.stdout is not None
            for _ in range(waits):
                where = agent.stdout.readline()
                assert where in (b"in model\n", b"in tool\n"), where
            kinds.add(where)
            time.sleep(delay)
            agent.kill()
            agent.communicate()
            # Every other one is repaired the moment its agent is killed: the daemon
            # may still be writing what it sent, or not have read its hang-up yet.
            if index % 2:
                repaired += _repair(daemon, path)
        for index, (_, path, _, _) in enumerate(agents):
            if not index % 2:
                _released(daemon.socket, path)
                repaired += _repair(daemon, path)
    finally:
        daemon.stop()
    assert kinds == {b"in model\n", b"in tool\n"}  # both kinds of call were cut
    assert repaired > 0  # the repair had work to do


def _repair(daemon: DaemonProcess, path: str) -> int:
    """``flightlog resume --repair`` on ``path``, checked; returns the tool calls it
    says it answered, which must be those its marked results answer in the file."""
    file = daemon.root / path
    done = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "resume", str(file), "--repair", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "FLIGHTLOG_SOCKET": daemon.socket},
    )
    assert done.returncode == 0, done.stderr + done.stdout
    found = json.loads(done.stdout)
    assert found["unpaired"] == [] and found["conversation_error"] is None
    assert found["writer"] is None and found["cut_runs"] == []
    assert check(file).sound
    marked = [
        line["data"]["tool_call_id"]
        for line in read_lines(file)
        if line["type"] == "tool_exec_end" and line["data"]["disposition"] == "repaired"
    ]
    assert sorted(r["tool_call_id"] for r in found["repaired"]) == sorted(marked), path
    # Checked again with the rebuild API, on the file as written.
    transcript = Transcript.read(file)
    assert transcript.conversation().unpaired == [], path
    for _ in transcript.prompts():  # every prompt rebuilds
        pass
    return len(marked)
