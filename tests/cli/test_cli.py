"""The ``flightlog`` command, run as a program against a real daemon and real files.

One daemon serves the whole module; a realistic session is recorded into it once (the
demo's simulated agent, then a second run left interrupted, with a tool call and a model
call that never ended).  Damaged variants of its file are made by editing copies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from flightlog.cli._demo import record_demo_run
from flightlog.cli._main import EXIT_CODES
from flightlog.protocol import (
    Execution,
)
from flightlog.protocol.events import (
    AgentStart,
    AssistantMessage,
    CallConfig,
    ModelExecEnd,
    ModelExecStart,
    ModelRequest,
    ToolCallPart,
    ToolExecStart,
    ToolQueued,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
)
from flightlog.sdk import connect
from support import DaemonProcess, on_a_terminal, read_lines, wait_for

COMMANDS = ("tail", "show", "check", "inspect", "status", "demo", "vacuum", "compress")


@dataclass
class Recorded:
    """The module's session: a complete run, then an interrupted one."""

    daemon: DaemonProcess
    relative: str
    path: Path
    complete_run: str
    interrupted_run: str

    @property
    def records(self) -> list[dict[str, object]]:
        return read_lines(self.path)


def _env(daemon: DaemonProcess | None, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "NO_COLOR"}
    if daemon is not None:
        env["FLIGHTLOG_SOCKET"] = daemon.socket
        env["FLIGHTLOG_ROOT"] = str(daemon.root)
    env.update(extra)
    return env


def flightlog(
    daemon: DaemonProcess | None, *args: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``flightlog ARGS`` with the daemon's socket and root in its environment."""
    return subprocess.run(
        [sys.executable, "-m", "flightlog.cli", *args],
        capture_output=True,
        text=True,
        env=_env(daemon, **env),
        timeout=timeout,
        cwd=tempfile.gettempdir(),
    )


@pytest.fixture(scope="module")
def cli_daemon(module_daemon: DaemonProcess) -> DaemonProcess:
    return module_daemon


def _record_interrupted_run(run: object) -> None:
    from flightlog.sdk import Run

    assert isinstance(run, Run)
    question = UserMessage(content="Book a table for two in Lisbon tonight.")
    run.record(AgentStart(agent="trip-planner", messages=[question]))
    run.record(TurnStart(turn_index=0))
    model = Execution(id="m0", kind="model", turn_index=0)
    call = ToolCallPart(
        id="call_book", name="book_table", arguments={"city": "Lisbon", "people": 2}
    )
    run.record(ModelRequest(execution=model, messages=[question], config=CallConfig(model="m-x")))
    run.record(ModelExecStart(execution=model, model="m-x"))
    run.record(
        ModelExecEnd(
            execution=model,
            message=AssistantMessage(content=[call], stop_reason="tool_use"),
            usage=Usage(input_tokens=100, output_tokens=20),
        )
    )
    tool = Execution(id="call_book", kind="tool", parent_id="m0", turn_index=0)
    run.record(
        ToolQueued(execution=tool, tool_call_id=call.id, name=call.name, arguments=call.arguments)
    )
    run.record(
        ToolExecStart(
            execution=tool, tool_call_id=call.id, name=call.name, arguments=call.arguments
        )
    )
    # A second model call that never ends either (the process "crashed").
    model2 = Execution(id="m1", kind="model", turn_index=0)
    run.record(ModelRequest(execution=model2, messages=[question], config=CallConfig(model="m-x")))
    run.record(ModelExecStart(execution=model2, model="m-x"))


@pytest.fixture(scope="module")
def recorded(cli_daemon: DaemonProcess) -> Recorded:
    relative = "cli/session.jsonl"
    with connect(cli_daemon.socket, client_name="cli-test") as client:
        session = client.create(relative, meta={"app": "cli-test"})
        with session.begin_run() as run:
            record_demo_run(run, pace=0)
        complete = run.run_id
        interrupted = session.begin_run()
        _record_interrupted_run(interrupted)
        session.sync()
        # Leaving without closing the run or the session: the daemon releases it,
        # and the run stays without run_close.
    path = cli_daemon.root / relative
    wait_for(lambda: read_lines(path)[-1]["type"] == "model_exec_start")
    with connect(cli_daemon.socket) as client:
        wait_for(lambda: all(s.path != str(path) for s in client.status().sessions))
    return Recorded(cli_daemon, relative, path, complete, interrupted.run_id)


@pytest.fixture
def complete_file(recorded: Recorded, tmp_path: Path) -> Path:
    """A copy of the session holding only the complete run (and its run_close)."""
    lines = recorded.path.read_bytes().split(b"\n")[:-1]
    kept = [line for line in lines if json.loads(line)["run_id"] in (None, recorded.complete_run)]
    path = tmp_path / "complete.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in kept))
    return path


def _damaged(source: Path, tmp_path: Path, how: str) -> Path:
    lines = source.read_bytes().split(b"\n")[:-1]
    if how == "corrupt middle line":
        lines[9] = lines[9][: len(lines[9]) // 2] + b"#garbage"
    elif how == "seq gap":
        del lines[9]
    elif how == "foreign session id":
        record = json.loads(lines[9])
        record["session_id"] = "f" * 32
        lines[9] = json.dumps(record, separators=(",", ":")).encode()
    data = b"".join(line + b"\n" for line in lines)
    if how == "torn tail":
        data += b'{"session_id":"abc","seq":'
    path = tmp_path / f"{how.replace(' ', '-')}.jsonl"
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------------------ help


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_everywhere_with_examples_and_exit_codes(command: str | None) -> None:
    args = ["--help"] if command is None else [command, "--help"]
    result = flightlog(None, *args)
    assert result.returncode == 0, result.stderr
    assert "examples:" in result.stdout
    assert "exit status:" in result.stdout
    for code in EXIT_CODES:
        assert f"\n  {code:<4} " in result.stdout


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "flightlog"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "usage: flightlog" in result.stdout


def test_exit_codes_are_documented_in_docs_cli_md() -> None:
    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    for code in EXIT_CODES:
        assert f"| {code} |" in text


def test_usage_error_exits_2() -> None:
    result = flightlog(None, "tail", "--after", "x", "a.jsonl")
    assert result.returncode == 2
    assert "usage:" in result.stderr


# ------------------------------------------------------------------------------ show


def test_show_prints_a_timeline_of_runs_turns_and_calls(recorded: Recorded) -> None:
    result = flightlog(recorded.daemon, "show", recorded.relative)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "\x1b[" not in out  # not a terminal: no colour
    assert f"session {read_lines(recorded.path)[0]['session_id']}" in out
    assert "\nrun 1 " in out and "\nrun 2 " in out
    assert recorded.complete_run[:8] in out
    assert "completed" in out
    assert "turn 0" in out and "turn 1" in out
    # Model calls: model, tokens, stop reason; tool calls: name, arguments, result.
    assert "demo-sonnet-1  412→61 tok" in out
    assert "stop=tool_use" in out and "stop=end_turn" in out
    assert 'get_weather(city="Paris")' in out
    assert '→ "Paris tomorrow: 14°C' in out
    assert "FAILED: weather service timed out" in out
    assert "call_lisbon#2" in out
    assert "FAILED: 429 Too Many Requests" in out
    assert "checkpoint seq" in out
    # The interrupted run: nothing missing is shown as a success.
    assert "NO END (no tool_exec_end)" in out
    assert "NO END (no model_exec_end)" in out
    assert "gap: no run_close" in out


def test_show_one_run_and_one_call(recorded: Recorded) -> None:
    result = flightlog(
        recorded.daemon, "show", recorded.relative, "--run", recorded.interrupted_run[:6]
    )
    assert result.returncode == 0, result.stderr
    assert "\nrun 2 " in result.stdout and "\nrun 1 " not in result.stdout

    result = flightlog(recorded.daemon, "show", recorded.relative, "--call", "call_lisbon")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "tool call call_lisbon attempt 1" in out and "tool call call_lisbon attempt 2" in out
    assert '"is_error": true' in out
    assert "weather service timed out after 0.5s" in out
    assert "Lisbon tomorrow: 22°C, sunny, light breeze" in out

    result = flightlog(
        recorded.daemon,
        "show",
        recorded.relative,
        "--call",
        "m0:1",
        "--run",
        recorded.complete_run,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "model call m0 attempt 1" in out
    assert out.count("model call m0") == 1  # only the complete run's m0
    assert '"model": "demo-sonnet-1"' in out  # the full request: config
    assert '"input_tokens": 412' in out  # and result: usage
    assert "sk-demo-never-written" not in out  # credentials never reached the file


def test_show_nothing_matching_exits_2(recorded: Recorded) -> None:
    result = flightlog(recorded.daemon, "show", recorded.relative, "--call", "nope")
    assert result.returncode == 2
    assert "no call 'nope'" in result.stderr
    result = flightlog(recorded.daemon, "show", recorded.relative, "--run", "zzzz")
    assert result.returncode == 2
    assert "no run 'zzzz'" in result.stderr


def test_show_reads_through_the_daemon_when_the_file_is_not_here(recorded: Recorded) -> None:
    # No data root here: the relative path is found only by the daemon, under its root.
    result = flightlog(recorded.daemon, "show", recorded.relative, FLIGHTLOG_ROOT="/nonexistent")
    assert result.returncode == 0, result.stderr
    assert "\nrun 1 " in result.stdout and "completed" in result.stdout
    assert "NO END (no model_exec_end)" in result.stdout


def test_show_of_a_missing_file(recorded: Recorded) -> None:
    result = flightlog(recorded.daemon, "show", "cli/not-there.jsonl")
    assert result.returncode == 2
    assert "does not exist" in result.stderr


# ------------------------------------------------------------------------------ tail


def _tail_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if not line.startswith("-- ")]


def test_tail_prints_one_line_per_record(recorded: Recorded) -> None:
    result = flightlog(recorded.daemon, "tail", recorded.relative)
    assert result.returncode == 0, result.stderr
    records = recorded.records
    lines = _tail_lines(result.stdout)
    assert len(lines) == len(records)
    assert result.stdout.startswith(f"-- {str(records[0]['time'])[:10]} (UTC) --\n")
    for line, record in zip(lines, records, strict=True):
        time_, seq, type_ = line.split()[:3]
        assert str(record["time"])[11:23] == time_
        assert int(seq) == record["seq"]
        assert type_ == record["type"]
    joined = "\n".join(lines)
    assert "[tool call_lisbon#2]" in joined  # the call: kind, id, attempt
    assert 'get_weather(city="Paris")' in joined


def test_tail_json_is_exactly_the_file(recorded: Recorded) -> None:
    result = flightlog(recorded.daemon, "tail", "--json", recorded.relative)
    assert result.returncode == 0, result.stderr
    assert result.stdout.encode() == recorded.path.read_bytes()


def test_tail_after_type_and_run_filters(recorded: Recorded) -> None:
    result = flightlog(
        recorded.daemon,
        "tail",
        "--json",
        "--after",
        "20",
        "--type",
        "tool_exec_end,model_exec_end",
        "--type",
        "run_close",
        recorded.relative,
    )
    assert result.returncode == 0, result.stderr
    got = [json.loads(line) for line in result.stdout.splitlines()]
    expected = [
        r
        for r in recorded.records
        if int(str(r["seq"])) > 20 and r["type"] in ("tool_exec_end", "model_exec_end", "run_close")
    ]
    assert got == expected and got

    result = flightlog(
        recorded.daemon, "tail", "--json", "--run", recorded.interrupted_run[:5], recorded.relative
    )
    assert result.returncode == 0, result.stderr
    got = [json.loads(line) for line in result.stdout.splitlines()]
    assert got == [r for r in recorded.records if r["run_id"] == recorded.interrupted_run]


def test_tail_refuses_an_unknown_type(recorded: Recorded) -> None:
    result = flightlog(recorded.daemon, "tail", "--type", "model_end", recorded.relative)
    assert result.returncode == 2
    assert "unknown record type 'model_end'" in result.stderr


def test_tail_outside_the_roots_is_refused(recorded: Recorded) -> None:
    # Not here to read directly, and the daemon will not look.
    result = flightlog(recorded.daemon, "tail", "/nonexistent/session.jsonl")
    assert result.returncode == 5
    assert "path_refused" in result.stderr
    # Here, but not the daemon's to follow.
    result = flightlog(recorded.daemon, "tail", "-f", "/etc/passwd")
    assert result.returncode == 5
    assert "nothing live to follow; without -f, tail reads the file directly" in result.stderr


def test_tail_of_a_missing_session(recorded: Recorded) -> None:
    result = flightlog(recorded.daemon, "tail", "missing.jsonl")
    assert result.returncode == 2
    assert "does not exist" in result.stderr


def test_tail_without_a_daemon(recorded: Recorded, short_tmp: Path) -> None:
    nowhere = str(short_tmp / "no.sock")
    # Without -f the file is read directly...
    result = flightlog(recorded.daemon, "tail", str(recorded.path), FLIGHTLOG_SOCKET=nowhere)
    assert result.returncode == 0, result.stderr
    assert len(_tail_lines(result.stdout)) == len(recorded.records)
    # ... following needs the daemon.
    result = flightlog(recorded.daemon, "tail", "-f", str(recorded.path), FLIGHTLOG_SOCKET=nowhere)
    assert result.returncode == 4
    assert f"no flightlog daemon is listening on {nowhere}" in result.stderr


def test_tail_follow_ends_cleanly_when_the_writer_closes_the_session(
    cli_daemon: DaemonProcess,
) -> None:
    with connect(cli_daemon.socket) as client:
        session = client.create("cli/follow.jsonl")
        run = session.begin_run()
        run.record(TurnStart(turn_index=0))
        session.sync()
        proc = subprocess.Popen(
            [sys.executable, "-m", "flightlog.cli", "tail", "-f", "cli/follow.jsonl"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(cli_daemon),
        )
        try:
            assert proc.stdout is not None
            lines = []
            while not any(" turn_start " in line for line in lines):
                line = proc.stdout.readline()
                assert line, "tail -f ended early"
                lines.append(line)
            # Live from here on.
            run.record(TurnEnd(turn_index=0, stop_reason="end_turn"))
            run.close()
            session.close()
            out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    seqs = [int(line.split()[1]) for line in _tail_lines("".join(lines) + out)]
    assert seqs == [1, 2, 3, 4, 5]
    assert "run_close" in out
    assert "-- end of cli/follow.jsonl: the writer closed the session" in err
    assert "(last seq 5) --" in err


def test_tail_follow_is_stopped_by_ctrl_c(recorded: Recorded) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "flightlog.cli", "tail", "-f", recorded.relative],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(recorded.daemon),
    )
    try:
        assert proc.stdout is not None
        for _ in recorded.records:  # caught up with the file at rest, then following
            assert proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 130
        assert "Traceback" not in err
    finally:  # a failure leaves no follower behind for the module's other tests
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# ----------------------------------------------------------------------------- check


def test_check_a_sound_file(recorded: Recorded) -> None:
    result = flightlog(recorded.daemon, "check", str(recorded.path), recorded.relative)
    assert result.returncode == 0, result.stdout
    count = len(recorded.records)
    assert result.stdout.count(f"sound, {count} records (last seq {count}), 2 runs") == 2
    assert "(1 without run_close)" in result.stdout


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("corrupt middle line", "line 10: not a valid record"),
        ("seq gap", "line 10: seq 11 leaves a gap: expected 10, 1 record(s) missing"),
        ("foreign session id", f"line 10: session_id '{'f' * 32}' is not the file's"),
    ],
)
def test_check_a_damaged_file(recorded: Recorded, tmp_path: Path, how: str, reason: str) -> None:
    path = _damaged(recorded.path, tmp_path, how)
    result = flightlog(None, "check", str(path))
    assert result.returncode == 1, result.stdout
    assert f"{path}: NOT SOUND: {reason}" in result.stdout
    assert "the first 9 records" in result.stdout


def test_check_an_unfinished_tail_is_reported_not_an_error(
    recorded: Recorded, tmp_path: Path
) -> None:
    path = _damaged(recorded.path, tmp_path, "torn tail")
    result = flightlog(None, "check", str(path))
    assert result.returncode == 0, result.stdout
    assert "sound" in result.stdout
    assert "unfinished tail of 26 bytes" in result.stdout


def test_check_several_files_says_which(recorded: Recorded, tmp_path: Path) -> None:
    broken = _damaged(recorded.path, tmp_path, "seq gap")
    missing = tmp_path / "missing.jsonl"
    result = flightlog(None, "check", str(recorded.path), str(broken))
    assert result.returncode == 1
    assert f"{recorded.path}: sound" in result.stdout
    assert f"{broken}: NOT SOUND" in result.stdout
    result = flightlog(None, "check", str(recorded.path), str(missing))
    assert result.returncode == 2
    assert f"{missing}: cannot read: No such file or directory" in result.stdout


# --------------------------------------------------------------------------- inspect


def test_inspect_a_complete_session(complete_file: Path) -> None:
    result = flightlog(None, "inspect", str(complete_file))
    assert result.returncode == 0, result.stdout
    out = result.stdout
    assert "completed" in out
    assert "gaps     none" in out
    assert "calls    3 model (1 failed), 3 tool (1 failed), 2 retries, 2 turns" in out
    assert "retried as call_lisbon#2: ok" in out
    assert "retried as m1#2: ok" in out
    assert "latest checkpoint: seq 45" in out


def test_inspect_names_every_gap(recorded: Recorded) -> None:
    result = flightlog(recorded.daemon, "inspect", recorded.relative)
    assert result.returncode == 3, result.stdout
    out = result.stdout
    run2 = out[out.index("\nrun 2 ") :]
    assert "no agent_end, no run_close" in run2
    assert "gap      no run_close: the run was interrupted" in run2
    assert "gap      no agent_end" in run2
    assert "gap      tool call call_book (book_table): no tool_exec_end" in run2
    assert "gap      model call m1 (m-x): no model_exec_end" in run2
    # The model call that did end is no gap.
    assert "model call m0" not in run2
    run1 = out[out.index("\nrun 1 ") : out.index("\nrun 2 ")]
    assert "gaps     none" in run1


def test_inspect_a_damaged_file(recorded: Recorded, tmp_path: Path) -> None:
    for how in ("corrupt middle line", "seq gap"):
        path = _damaged(recorded.path, tmp_path, how)
        result = flightlog(None, "inspect", str(path))
        assert result.returncode == 1, (how, result.stdout)
        assert "NOT SOUND: line 10:" in result.stdout
        # What precedes the bad line is still summarised: run 1 without its end.
        assert "no run_close" in result.stdout
    path = _damaged(recorded.path, tmp_path, "torn tail")
    result = flightlog(None, "inspect", str(path))
    assert result.returncode == 3  # the gaps of run 2; the torn tail is no error
    assert "unfinished tail: the last 26 B have no newline" in result.stdout


def test_show_a_damaged_file(recorded: Recorded, tmp_path: Path) -> None:
    path = _damaged(recorded.path, tmp_path, "seq gap")
    result = flightlog(None, "show", str(path))
    assert result.returncode == 1
    assert "NOT SOUND: line 10: seq 11 leaves a gap" in result.stdout
    assert "turn 0" in result.stdout


# ---------------------------------------------------------------------------- status


def test_status_shows_sessions_writers_and_subscribers(cli_daemon: DaemonProcess) -> None:
    with connect(cli_daemon.socket) as client:
        session = client.create("cli/status.jsonl")
        run = session.begin_run()
        run.record(TurnStart(turn_index=0))
        session.sync()
        with client.tail("cli/status.jsonl", follow=True) as tail:
            next(tail)
            result = flightlog(cli_daemon, "status")
            as_json = flightlog(cli_daemon, "status", "--json")
        run.close()
        session.close()
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"flightlogd 0.1.0, pid {cli_daemon.pid}" in out
    assert str(cli_daemon.root / "cli/status.jsonl") in out
    assert f"writer pid {os.getpid()}, run {run.run_id[:8]}, last seq 3" in out
    assert "1 subscriber\n" in out
    assert f"uid {os.getuid()}: the daemon's own, no per-uid limits\n" in out
    reply = json.loads(as_json.stdout)
    assert reply["pid"] == cli_daemon.pid
    entry = next(s for s in reply["sessions"] if s["path"].endswith("cli/status.jsonl"))
    assert entry["writer_pid"] == os.getpid() and entry["subscribers"] == 1


def test_status_without_a_daemon(short_tmp: Path) -> None:
    result = flightlog(None, "status", FLIGHTLOG_SOCKET=str(short_tmp / "none.sock"))
    assert result.returncode == 4
    assert "no flightlog daemon is listening" in result.stderr


# ----------------------------------------------------------------------------- colour


def _on_a_terminal(*args: str, **env: str) -> str:
    command = [sys.executable, "-m", "flightlog.cli", *args]
    return on_a_terminal(command, _env(None, TERM="xterm", **env)).decode()


def test_colour_only_on_a_terminal_and_never_with_no_color(recorded: Recorded) -> None:
    path = str(recorded.path)
    assert "\x1b[" in _on_a_terminal("check", path)
    assert "\x1b[" not in _on_a_terminal("check", path, NO_COLOR="1")
    assert "\x1b[" not in _on_a_terminal("--color", "never", "check", path)
    assert "\x1b[" not in flightlog(None, "check", path).stdout
    assert "\x1b[" in flightlog(None, "check", "--color", "always", path).stdout


# ------------------------------------------------------------------------------ demo


def test_demo_records_a_realistic_session_and_shows_it(cli_daemon: DaemonProcess) -> None:
    result = flightlog(cli_daemon, "demo", "--fast", "--path", "cli/demo.jsonl")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "completed" in out and "FAILED: weather service timed out" in out
    assert "call_lisbon#2" in out and "checkpoint seq" in out
    assert "flightlog tail -f cli/demo.jsonl" in result.stderr
    path = cli_daemon.root / "cli/demo.jsonl"
    records = read_lines(path)
    types = [r["type"] for r in records]
    for expected in ("model_request", "model_exec_end", "tool_exec_end", "retry", "checkpoint"):
        assert expected in types
    assert b"sk-demo-never-written" not in path.read_bytes()
    # A second demo adds a run to the same session, and shows only that run.
    again = flightlog(cli_daemon, "demo", "--fast", "--path", "cli/demo.jsonl")
    assert again.returncode == 0, again.stderr
    assert "\nrun 2 " in again.stdout and "\nrun 1 " not in again.stdout
    assert flightlog(None, "check", str(path)).returncode == 0


def test_demo_starts_a_daemon_when_none_is_running(short_tmp: Path) -> None:
    env = {
        "FLIGHTLOG_SOCKET": str(short_tmp / "run" / "flightlog.sock"),
        "FLIGHTLOG_ROOT": str(short_tmp / "root"),
    }
    result = flightlog(None, "demo", "--fast", **env)
    pid = None
    try:
        assert result.returncode == 0, result.stderr
        assert "started flightlogd (pid " in result.stderr
        pid = int(result.stderr.split("started flightlogd (pid ")[1].split(")")[0])
        status = flightlog(None, "status", "--json", **env)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["pid"] == pid
        assert (short_tmp / "root" / "demo" / "session.jsonl").exists()
        assert (short_tmp / "root" / "flightlogd.log").exists()
        # It runs detached: its own session, not this test's process group.
        assert os.getsid(pid) == pid
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: _gone(pid), timeout=20)


def _gone(pid: int) -> bool:
    # Detached, it is not our child: once it exits it is a zombie until init reaps it.
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_demo_without_a_daemon_and_without_starting_one(short_tmp: Path) -> None:
    result = flightlog(
        None, "demo", "--fast", "--no-start", FLIGHTLOG_SOCKET=str(short_tmp / "x.sock")
    )
    assert result.returncode == 4
    assert "no flightlog daemon is listening" in result.stderr
