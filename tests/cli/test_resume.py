"""``flightlog resume``: a session a real daemon recorded, resumed, repaired and forked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from flightlog.protocol import events
from flightlog.sdk import Client, Transcript, check, connect, read, sql
from support import DaemonProcess, read_lines, reaped

QUESTION = "What is in /etc/hostname?"


def cli(
    daemon: DaemonProcess, *args: str | Path, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", *map(str, args), "--socket", daemon.socket],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )
    return done.returncode, done.stdout, done.stderr


def resume_json(
    daemon: DaemonProcess, *args: str | Path, env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    code, out, err = cli(daemon, "resume", *args, "--json", env=env)
    assert out, err
    return code, json.loads(out)


def _ask(call_id: str, tool: str = "read_file") -> events.AssistantMessage:
    return events.AssistantMessage(
        content=[
            events.TextPart(text="Let me look."),
            events.ToolCallPart(id=call_id, name=tool, arguments={"path": "/etc/hostname"}),
        ],
        model="claude-x",
    )


def record_cut_session(
    client: Client, path: str, *, start_tool: bool = True, finished_turn: bool = True
) -> str:
    """A run that finishes one turn (a tool call and its result, a checkpoint), then
    asks for a tool call and stops: in the tool (``start_tool``) or before it started.
    The run is left without ``run_close``, as a crash leaves it.  Returns its run id."""
    session = client.create(path, meta={"name": "hostname"})
    run = session.begin_run()
    m1 = events.Execution(id="m1", kind="model", turn_index=0)
    run.record(events.ModelRequest(execution=m1, messages=[events.UserMessage(content=QUESTION)]))
    run.record(events.ModelExecEnd(execution=m1, message=_ask("c1")))
    if finished_turn:
        t1 = events.Execution(id="t1", kind="tool", parent_id="m1", turn_index=0)
        run.record(events.ToolExecStart(execution=t1, tool_call_id="c1", name="read_file"))
        run.record(
            events.ToolExecEnd(
                execution=t1,
                tool_call_id="c1",
                name="read_file",
                content=[events.TextPart(text="devbox")],
            )
        )
        run.save_checkpoint({"turn": 1})
        m2 = events.Execution(id="m2", kind="model", turn_index=1)
        result = events.ToolResultMessage(
            tool_call_id="c1", name="read_file", content=[events.TextPart(text="devbox")]
        )
        run.record(
            events.ModelRequest(execution=m2, messages=[result], continues="m1", with_response=True)
        )
        run.record(events.ModelExecEnd(execution=m2, message=_ask("c2", "cat")))
        if start_tool:
            t2 = events.Execution(id="t2", kind="tool", parent_id="m2", turn_index=1)
            run.record(events.ToolQueued(execution=t2, tool_call_id="c2", name="cat"))
            run.record(events.ToolExecStart(execution=t2, tool_call_id="c2", name="cat"))
    session.sync()
    run_id = run.run_id
    session.close()  # the run stays open: no run_close, as after a crash
    return run_id


def test_resume_prints_what_a_program_needs(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        run_id = record_cut_session(client, "cut.jsonl")
    path = daemon.root / "cut.jsonl"
    code, found = resume_json(daemon, path)
    assert code == 3  # a tool call is left unpaired
    assert found["checkpoint"]["snapshot"] == {"turn": 1}
    assert found["checkpoint"]["run_id"] == run_id
    assert found["cut_runs"] == [run_id]
    assert [(c["kind"], c["id"], c["tool_call_id"]) for c in found["open_calls"]] == [
        ("tool", "t2", "c2")
    ]
    conversation = found["conversation"]
    assert conversation["call"] == "m2" and conversation["answered"] is True
    types = [m["$type"] for m in conversation["messages"]]
    assert types == ["user", "assistant", "tool_result", "assistant"]
    assert found["unpaired"] == [{"tool_call_id": "c2", "name": "cat"}]
    assert found["origin"] is None
    code, text, _ = cli(daemon, "resume", path)
    assert code == 3
    assert "checkpoint  line" in text and '{"turn":1}' in text
    assert f"{run_id[:8]} (no run_close)" in text
    assert "tool t2 cat c2" in text
    assert "unpaired tool calls  c2 (cat)" in text and "--repair" in text


def test_repair_pairs_every_tool_call_once(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        run_id = record_cut_session(client, "cut.jsonl")
    path = daemon.root / "cut.jsonl"
    code, found = resume_json(daemon, path, "--repair")
    assert code == 0, found
    assert found["repaired"] == [{"tool_call_id": "c2", "name": "cat"}]
    assert found["unpaired"] == [] and found["cut_runs"] == []
    conversation = Transcript.read(path).conversation()
    assert conversation.unpaired == []
    last = conversation.messages[-1]
    assert last["$type"] == "tool_result" and last["tool_call_id"] == "c2" and last["is_error"]
    # Written in the cut run itself, after its run_resume, marked as a repair.
    lines = read_lines(path)
    assert [line["type"] for line in lines[-3:]] == ["run_resume", "tool_exec_end", "run_close"]
    assert lines[-2]["run_id"] == run_id and lines[-2]["data"]["disposition"] == "repaired"
    # Again: nothing new is written.
    code, again = resume_json(daemon, path, "--repair")
    assert code == 0 and again["repaired"] == []
    assert len(read_lines(path)) == len(lines)


def test_repair_answers_a_tool_call_that_never_started(daemon: DaemonProcess) -> None:
    """The model asked for c2 and the agent died before it recorded any of the tool's
    records: no run holds it open, yet the history lacks its result."""
    with connect(daemon.socket) as client:
        record_cut_session(client, "asked.jsonl", start_tool=False)
    path = daemon.root / "asked.jsonl"
    code, before = resume_json(daemon, path)
    assert code == 3 and before["open_calls"] == []
    assert before["unpaired"] == [{"tool_call_id": "c2", "name": "cat"}]
    code, found = resume_json(daemon, path, "--repair")
    assert code == 0 and found["repaired"] == [{"tool_call_id": "c2", "name": "cat"}]
    assert Transcript.read(path).conversation().unpaired == []
    ends = [line for line in read_lines(path) if line["type"] == "tool_exec_end"]
    assert ends[-1]["data"]["disposition"] == "repaired"
    assert ends[-1]["data"]["execution"]["parent_id"] == "m2"
    code, text, _ = cli(daemon, "inspect", path)
    assert "repaired" in text


def test_repair_refused_while_a_writer_holds_the_session(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        session = client.create("held.jsonl")
        code, _, err = cli(daemon, "resume", daemon.root / "held.jsonl", "--repair")
        assert code == 5 and "session_busy" in err
        session.close()


def _fork(daemon: DaemonProcess, origin: Path, new: str, *point: str) -> dict[str, Any]:
    code, found = resume_json(daemon, origin, "--fork", new, *point)
    assert code in (0, 3), found
    return found


def test_fork_at_a_checkpoint_names_its_origin_and_carries_the_checkpoint(
    daemon: DaemonProcess,
) -> None:
    with connect(daemon.socket) as client:
        run_id = record_cut_session(client, "origin.jsonl")
    origin = daemon.root / "origin.jsonl"
    checkpoint_seq = next(r.seq for r in read(origin) if r.type == "checkpoint")
    found = _fork(daemon, origin, "fork.jsonl", "--at-checkpoint")
    fork = daemon.root / "fork.jsonl"
    assert found["path"] == str(fork)
    start = read_lines(fork)[0]
    assert start["data"]["origin"] == {
        "session_id": read_lines(origin)[0]["session_id"],
        "path": str(origin),
        "seq": checkpoint_seq,
        "run_id": run_id,
    }
    assert start["data"]["meta"] == {"name": "hostname"}
    assert found["origin"] == start["data"]["origin"]
    # The conversation is rebuilt from the origin up to that line: one turn, paired.
    messages = found["conversation"]["messages"]
    assert [m["$type"] for m in messages] == ["user", "assistant", "tool_result"]
    assert found["unpaired"] == [] and found["checkpoint"]["snapshot"] == {"turn": 1}
    with connect(daemon.socket) as client:
        session = client.open("fork.jsonl")
        assert session.load_checkpoint() == {"turn": 1}
        # The fork goes on from the origin's call: its request continues m1.
        with session.begin_run() as run:
            m3 = events.Execution(id="m3", kind="model")
            more = events.UserMessage(content="And /etc/os-release?")
            run.record(
                events.ModelRequest(
                    execution=m3, messages=[more], continues="m1", with_response=True
                )
            )
        session.close()
    prompt = Transcript.read(fork).prompt("m3")
    assert [m["$type"] for m in prompt.messages] == ["user", "assistant", "user"]
    assert prompt.messages[0]["content"] == QUESTION


@pytest.mark.parametrize("point", ["--at-run", "--at-seq"])
def test_fork_at_a_run_or_a_line(daemon: DaemonProcess, point: str) -> None:
    with connect(daemon.socket) as client:
        session = client.create("two.jsonl")
        runs = []
        for index, question in enumerate(["first?", "second?"]):
            with session.begin_run() as run:
                call = events.Execution(id=f"m{index}", kind="model")
                run.record(
                    events.ModelRequest(
                        execution=call, messages=[events.UserMessage(content=question)]
                    )
                )
                run.record(
                    events.ModelExecEnd(
                        execution=call,
                        message=events.AssistantMessage(content=[events.TextPart(text="yes")]),
                    )
                )
                runs.append(run.run_id)
        session.close()
    origin = daemon.root / "two.jsonl"
    first_end = max(r.seq for r in read(origin) if r.run_id == runs[0])
    value = runs[0][:8] if point == "--at-run" else str(first_end)
    found = _fork(daemon, origin, "one.jsonl", point, value)
    assert found["origin"]["seq"] == first_end and found["origin"]["run_id"] == runs[0]
    assert found["checkpoint"] is None
    assert found["conversation"]["messages"][0]["content"] == "first?"
    assert found["conversation"]["call"] == "m0"


def test_show_and_sql_follow_the_link(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        record_cut_session(client, "origin.jsonl")
    origin = daemon.root / "origin.jsonl"
    _fork(daemon, origin, "fork.jsonl", "--at-checkpoint")
    fork = daemon.root / "fork.jsonl"
    code, text, _ = cli(daemon, "show", fork)
    assert code == 0, text
    assert f"forked from {origin} at line" in text
    head, _, own = text.partition("── the fork:")
    assert "── the origin, up to line" in head and "read_file" in head
    assert "read_file" not in own  # the fork's own runs hold only the checkpoint
    session_id = read_lines(origin)[0]["session_id"]
    try:
        rows = sql(
            "SELECT origin_session_id, origin_path, origin_seq FROM sessions "
            "WHERE origin_seq IS NOT NULL",
            [fork, origin],
        ).rows
    except ImportError:
        pytest.skip("duckdb is not installed")
    assert len(rows) == 1 and rows[0][0] == session_id and rows[0][1] == str(origin)
    # The origin gone: show says so, and the rebuild names what is missing.
    origin.rename(origin.with_suffix(".gone"))
    code, text, _ = cli(daemon, "show", fork)
    assert "the origin cannot be read" in text and "── the origin" not in text
    code, found = resume_json(daemon, fork)
    assert "the origin of this fork" in found["conversation_error"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--at-seq", "3"], "go with --fork NEW"),
        (["--fork", "x.jsonl", "--repair"], "--repair and --fork go apart"),
        (["--fork", "x.jsonl", "--at-seq", "999"], "has lines 1 to"),
        (["--fork", "x.jsonl", "--at-run", "ffff"], "names no run"),
        (["--fork", "x.jsonl", "--at-checkpoint", "2"], "no such checkpoint"),
    ],
)
def test_bad_arguments_say_why(daemon: DaemonProcess, args: list[str], message: str) -> None:
    with connect(daemon.socket) as client:
        record_cut_session(client, "cut.jsonl")
    code, _, err = cli(daemon, "resume", daemon.root / "cut.jsonl", *args)
    assert code == 2 and message in err, err
    assert not (daemon.root / "x.jsonl").exists()


def test_a_fork_onto_an_existing_session_is_refused(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        record_cut_session(client, "cut.jsonl")
        client.create("taken.jsonl").close()
    before = (daemon.root / "taken.jsonl").read_bytes()
    code, _, err = cli(daemon, "resume", daemon.root / "cut.jsonl", "--fork", "taken.jsonl")
    assert code == 5 and "session_exists" in err, err
    assert (daemon.root / "taken.jsonl").read_bytes() == before


#: No data root here: a relative path is found only by the daemon, under its root.
ELSEWHERE = {"FLIGHTLOG_ROOT": "/nonexistent"}


def test_resume_reads_through_the_daemon_when_the_file_is_not_here(
    daemon: DaemonProcess,
) -> None:
    with connect(daemon.socket) as client:
        record_cut_session(client, "cut.jsonl")
    code, here = resume_json(daemon, daemon.root / "cut.jsonl")
    code_there, there = resume_json(daemon, "cut.jsonl", env=ELSEWHERE)
    assert code == code_there == 3
    assert here.pop("path") == str(daemon.root / "cut.jsonl")
    assert there.pop("path") == "cut.jsonl"
    assert there == here  # the same state: checkpoint, open calls, conversation
    assert there["unpaired"] == [{"tool_call_id": "c2", "name": "cat"}]
    _, text_here, _ = cli(daemon, "resume", daemon.root / "cut.jsonl")
    _, text_there, _ = cli(daemon, "resume", "cut.jsonl", env=ELSEWHERE)
    assert text_there == text_here.replace(str(daemon.root / "cut.jsonl"), "cut.jsonl")
    code, _, err = cli(daemon, "resume", "not-there.jsonl", env=ELSEWHERE)
    assert code == 2 and "does not exist" in err, err


def test_repair_and_fork_through_the_daemon(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:
        record_cut_session(client, "cut/a.jsonl")
    code, repaired = resume_json(daemon, "cut/a.jsonl", "--repair", env=ELSEWHERE)
    assert code == 0, repaired
    assert repaired["repaired"] == [{"tool_call_id": "c2", "name": "cat"}]
    assert Transcript.read(daemon.root / "cut" / "a.jsonl").conversation().unpaired == []
    # A fork under the same root names its origin relative to its own directory.
    code, forked = resume_json(
        daemon, "cut/a.jsonl", "--fork", "cut/b.jsonl", "--at-checkpoint", env=ELSEWHERE
    )
    assert code == 0, forked
    assert forked["path"] == str(daemon.root / "cut" / "b.jsonl")
    assert forked["origin"]["path"] == "a.jsonl"
    messages = forked["conversation"]["messages"]
    assert [m["$type"] for m in messages] == ["user", "assistant", "tool_result"]
    assert Transcript.read(daemon.root / "cut" / "b.jsonl").prompt("m1").messages
    # A fork to an absolute path cannot name an origin only the daemon can place.
    code, _, err = cli(
        daemon, "resume", "cut/a.jsonl", "--fork", daemon.root / "c.jsonl", env=ELSEWHERE
    )
    assert code == 2 and "read through the daemon" in err, err


# ------------------------------------------------------------ a live agent's session

#: An agent process: a tool-calling loop through the SDK (a model call asks for one
#: tool, it runs, the next model call continues with its result, a checkpoint after
#: each turn).  ``hold``: in turn 2's tool it syncs, says "in tool" and waits on stdin;
#: ``share`` the same, having forked a child that keeps its connection open and does
#: nothing (it says "in tool CHILD_PID"); ``stream``: it never stops, and says "turn N"
#: every 20 turns.
LIVE_AGENT = textwrap.dedent(
    """
    import os, sys, time
    from flightlog.protocol import events as e
    from flightlog.sdk import connect

    socket, path, mode = sys.argv[1:4]
    with connect(socket, client_name="live-agent") as client:
        session = client.create(path, meta={"name": "live"})
        run = session.begin_run()
        previous, results = None, [e.UserMessage(content="Plan a trip.")]
        for turn in range(10**6):
            m = e.Execution(id=f"m{turn}", kind="model", turn_index=turn)
            run.record(e.ModelRequest(
                execution=m, messages=results, continues=previous,
                with_response=previous is not None,
            ))
            call = e.ToolCallPart(id=f"c{turn}", name="tool", arguments={"turn": turn})
            run.record(e.ModelExecEnd(
                execution=m, message=e.AssistantMessage(content=[e.TextPart(text="ok"), call])
            ))
            t = e.Execution(id=f"t{turn}", kind="tool", parent_id=m.id, turn_index=turn)
            run.record(e.ToolExecStart(execution=t, tool_call_id=call.id, name="tool"))
            if mode in ("hold", "share") and turn == 2:
                session.sync()
                child = os.fork() if mode == "share" else 0
                if mode == "share" and child == 0:
                    os.closerange(0, 3)  # the connection's socket stays open
                    time.sleep(600)
                    os._exit(0)
                print("in tool", child or "", flush=True)
                sys.stdin.read()
            content = [e.TextPart(text=f"done {call.id}")]
            run.record(e.ToolExecEnd(
                execution=t, tool_call_id=call.id, name="tool", content=content
            ))
            results = [e.ToolResultMessage(tool_call_id=call.id, name="tool", content=content)]
            run.save_checkpoint({"turn": turn})
            previous = m.id
            if mode == "stream" and turn % 20 == 0:
                print(f"turn {turn}", flush=True)
    """
)


def _live_agent(
    daemon: DaemonProcess, path: str, mode: str
) -> tuple[subprocess.Popen[bytes], bytes]:
    agent = subprocess.Popen(
        [sys.executable, "-c", LIVE_AGENT, daemon.socket, path, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert agent.stdout is not None
    line = agent.stdout.readline()
    said = b"turn" if mode == "stream" else b"in tool"
    assert line.startswith(said), agent.stderr.read() if agent.stderr else line
    return agent, line


def test_resume_repair_and_fork_of_a_session_a_live_agent_writes(daemon: DaemonProcess) -> None:
    """The agent's run is open, not cut, and its tool call in flight; --repair is
    refused naming the agent, and writes nothing; --fork may start from it.  SIGKILLed,
    it leaves a cut run: --repair, at once, mends it."""
    path = daemon.root / "live.jsonl"
    agent, _ = _live_agent(daemon, "live.jsonl", "hold")
    with reaped(agent):
        code, found = resume_json(daemon, path)
        assert code == 0, found  # nothing is left unpaired: the writer may answer it
        (run_id,) = {line["run_id"] for line in read_lines(path)[1:]}
        assert found["writer"] == {"pid": agent.pid, "run_id": run_id, "last_seq": 15}
        assert found["last_seq"] == 15 and found["cut_runs"] == []
        assert [(c["id"], c["tool_call_id"]) for c in found["open_calls"]] == [("t2", "c2")]
        assert found["unpaired"] == [{"tool_call_id": "c2", "name": "tool"}]
        code, text, _ = cli(daemon, "resume", path)
        assert code == 0
        assert f"pid {agent.pid} holds this session (run {run_id[:8]} open)" in text, text
        assert "cut runs  none" in text and "a provider refuses" not in text
        before = path.read_bytes()
        code, out, err = cli(daemon, "resume", path, "--repair")
        assert code == 5 and not out, out
        assert "session_busy" in err and f"pid {agent.pid} (live-agent)" in err, err
        assert path.read_bytes() == before
        # Through the daemon (not readable here), the same moment.
        code, there = resume_json(daemon, "live.jsonl", env=ELSEWHERE)
        assert code == 0 and there.pop("path") == "live.jsonl"
        assert there == {k: v for k, v in found.items() if k != "path"}
        forked = _fork(daemon, path, "from-live.jsonl")
        assert forked["origin"]["seq"] == 15 and forked["origin"]["run_id"] == run_id
        assert forked["writer"] is None
        assert forked["conversation"]["messages"] == found["conversation"]["messages"]
        agent.kill()  # SIGKILL: whether the daemon has let go yet or not
        agent.communicate()
    code, found = resume_json(daemon, path)
    assert found["cut_runs"] == ([] if found["writer"] else [run_id]), found
    code, repaired = resume_json(daemon, path, "--repair")
    assert code == 0, repaired
    assert repaired["writer"] is None and repaired["cut_runs"] == []
    assert repaired["repaired"] == [{"tool_call_id": "c2", "name": "tool"}]
    assert repaired["unpaired"] == [] and check(path).sound
    assert Transcript.read(path).conversation().unpaired == []


def test_resume_of_a_session_being_written_reads_one_moment(daemon: DaemonProcess) -> None:
    """While the agent writes on, each resume reads the file up to the line the daemon
    had written when it was asked: the open calls and the conversation of that line."""
    path = daemon.root / "stream.jsonl"
    agent, _ = _live_agent(daemon, "stream.jsonl", "stream")
    with reaped(agent):
        for _ in range(6):
            code, found = resume_json(daemon, path)
            assert code == 0, found
            last = found["last_seq"]
            assert found["writer"]["last_seq"] == last and found["cut_runs"] == []
            lines = read_lines(path)[:last]
            asked = {
                line["data"]["execution"]["id"]: line["seq"]
                for line in lines
                if line["type"] == "model_request"
            }
            # The conversation is that of the last model call up to that line.
            assert found["conversation"]["call"] == max(asked, key=asked.__getitem__)
            begun = ("model_request", "tool_exec_start")
            started = {line["data"]["execution"]["id"] for line in lines if line["type"] in begun}
            ended = {line["data"]["execution"]["id"] for line in lines if "_end" in line["type"]}
            assert {c["id"] for c in found["open_calls"]} == started - ended


def test_repair_says_it_removed_an_unfinished_last_line(daemon: DaemonProcess) -> None:
    """The daemon's open removes a last line a crash cut short: --repair says so."""
    with connect(daemon.socket) as client:
        record_cut_session(client, "torn.jsonl")
    path = daemon.root / "torn.jsonl"
    torn = b'{"session_id":"x","seq":99,"type":"tool_exec_en'
    with path.open("ab") as file:
        file.write(torn)
    code, found = resume_json(daemon, path, "--repair")
    assert code == 0, found
    assert found["truncated_bytes"] == len(torn)
    assert found["repaired"] == [{"tool_call_id": "c2", "name": "cat"}]
    assert path.read_bytes().endswith(b"\n") and check(path).sound
    code, text, _ = cli(daemon, "resume", path, "--repair")
    assert code == 0 and "removed an unfinished" not in text


def test_repair_after_a_sigkill_whose_connection_outlives_the_agent(
    daemon: DaemonProcess,
) -> None:
    """SIGKILLed, the agent is gone, but a child it forked holds its connection: the
    daemon still has a writer, and --repair, having tried a while, says so; once the
    child is gone too, --repair mends the run."""
    path = daemon.root / "shared.jsonl"
    agent, line = _live_agent(daemon, "shared.jsonl", "share")
    child = int(line.split()[-1])
    assert child > 0, line
    try:
        with reaped(agent):
            agent.kill()
            agent.communicate()
        before = path.read_bytes()
        code, out, err = cli(daemon, "resume", path, "--repair")
        assert code == 5 and not out, out
        assert f"pid {agent.pid} has exited, but its connection is still open" in err, err
        assert path.read_bytes() == before
    finally:
        os.kill(child, signal.SIGKILL)
    code, repaired = resume_json(daemon, path, "--repair")
    assert code == 0, repaired
    assert repaired["repaired"] == [{"tool_call_id": "c2", "name": "tool"}]
    assert repaired["unpaired"] == [] and check(path).sound
