"""A repair mends every interrupted run of a file, not only the last.

One file holds the runs of several agents, real processes killed with SIGKILL at
different points (inside a model call, inside a tool call, with a tool call queued and
never started, between turns).  A repair (``client.session(path, repair=True)``, or
``flightlog resume --repair``) then continues each cut run after a ``run_resume`` marked
``repair``, answers each of its open calls with an end marked as a repair, closes it with
a ``run_close`` marked ``repaired``: every call has an end, ``check`` is clean, and a
second repair writes nothing.  A repair killed half way and run again writes each end
once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from flightlog.sdk import check, read, sql
from support import DaemonProcess, run_python

#: Opens the file (or creates it), begins a run, and kills itself at ``argv[3]``:
#: ``model`` (a model call started), ``tool`` (a tool call started), ``queued`` (a
#: tool call queued, never started) or ``turn`` (after a complete turn).
AGENT = """
import os, signal, sys
from flightlog.protocol import events as e
from flightlog.sdk import connect

socket, path, stop = sys.argv[1], sys.argv[2], sys.argv[3]
with connect(socket) as client:
    session = client.session(path)
    run = session.begin_run()
    m = e.Execution(id="m0", kind="model", turn_index=0)
    run.record(e.ModelRequest(execution=m, messages=[e.UserMessage(content="go")]))
    run.record(e.ModelExecStart(execution=m, model="model-x"))
    if stop != "model":
        call = e.ToolCallPart(id=f"call-{stop}", name="search", arguments={})
        answer = e.AssistantMessage(content=[call])
        run.record(e.ModelExecEnd(execution=m, message=answer))
        t = e.Execution(id=call.id, kind="tool", parent_id="m0", turn_index=0)
        run.record(e.ToolQueued(execution=t, tool_call_id=call.id, name="search"))
        if stop != "queued":
            run.record(e.ToolExecStart(execution=t, tool_call_id=call.id, name="search"))
        if stop == "turn":
            run.record(e.ToolExecEnd(execution=t, tool_call_id=call.id, name="search"))
    session.sync()
    os.kill(os.getpid(), signal.SIGKILL)
"""

#: Opens with repair=True and prints the calls and runs it repaired.
REPAIR = """
import sys
from flightlog.sdk import connect

with connect(sys.argv[1]) as client:
    with client.session(sys.argv[2], repair=True) as session:
        found = session.resumption
        print(len(found.repaired), len(found.repaired_runs), flush=True)
"""

#: Begins the repair of the file's first cut run, records the end of its first open
#: call as the repair does, and dies.
CUT_IN_THE_REPAIR = """
import os, signal, sys
from flightlog.sdk import connect
from flightlog.sdk._resume import repair_event, repair_id

with connect(sys.argv[1]) as client:
    session = client.open(sys.argv[2])
    cut, calls = session.resume().cut_runs, session.resume().open_calls
    pending = client._conn.continue_run(session.session_id, cut[0], repair=True)
    run_id = client._link.call(pending).run_id
    call = [c for c in calls if c.run_id == run_id][0]
    frame = client._conn.record(
        session.session_id, run_id, repair_event(call), None, repair_id(call)
    )
    client._link.send_records(session.session_id, [frame])
    session.sync()
    os.kill(os.getpid(), signal.SIGKILL)
"""

STOPS = ["model", "tool", "queued", "turn"]


def run(code: str, daemon: DaemonProcess, *args: str) -> tuple[int, str]:
    proc = run_python(code, daemon.socket, *args)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGKILL), err.decode()
    return proc.returncode, out.decode().strip()


def cut_runs(daemon: DaemonProcess, name: str) -> list[str]:
    """Kill an agent at each stop, one after the other, all in the file ``name``."""
    for stop in STOPS:
        assert run(AGENT, daemon, name, stop)[0] == -signal.SIGKILL
    report = check(daemon.root / name)
    assert len(report.open_runs) == len(STOPS)
    return report.open_runs


def assert_mended(path: Path, runs: list[str]) -> None:
    """Every call has an end, each cut run is closed as repaired, check is clean."""
    report = check(path)
    assert report.sound and report.open_runs == [] and report.warnings == [], report
    starts: dict[tuple[str | None, str, str], int] = {}
    ends: dict[tuple[str | None, str, str], int] = {}
    closes = {}
    resumes = []
    for record in read(path):
        data = record.decode_data()
        if record.type in ("model_exec_start", "tool_queued", "tool_exec_start"):
            kind = "model" if record.type == "model_exec_start" else "tool"
            starts[record.run_id, kind, data["execution"]["id"]] = record.seq
        elif record.type in ("model_exec_end", "tool_exec_end"):
            kind = "model" if record.type == "model_exec_end" else "tool"
            key = (record.run_id, kind, data["execution"]["id"])
            assert key not in ends, f"{key} ends twice"  # never written twice
            ends[key] = record.seq
        elif record.type == "run_close":
            closes[record.run_id] = data
        elif record.type == "run_resume":
            assert data["repair"] is True
            resumes.append(record.run_id)
    assert set(starts) <= set(ends)  # every call has an end
    assert sorted(closes) == sorted(runs)
    assert all(closes[run]["repaired"] is True for run in runs)
    assert sorted(set(resumes)) == sorted(runs)


def repaired_ends(path: Path) -> list[dict[str, object]]:
    return [
        r.decode_data() | {"event_id": r.event_id}
        for r in read(path)
        if r.type.endswith("_exec_end")
        and r.decode_data().get("disposition") in ("repaired", "cancelled")
    ]


def test_every_cut_run_is_mended_and_a_second_repair_writes_nothing(
    daemon: DaemonProcess,
) -> None:
    path = daemon.root / "many.jsonl"
    runs = cut_runs(daemon, "many.jsonl")
    # Open calls: m0 of the first run; the tool calls of the next two.
    assert run(REPAIR, daemon, "many.jsonl") == (0, "3 4")
    assert_mended(path, runs)
    ends = repaired_ends(path)
    assert [e["disposition"] for e in ends] == ["cancelled", "repaired", "repaired"]
    assert all(str(e["event_id"]).startswith("flightlog-repair-") for e in ends)
    before = path.read_bytes()
    assert run(REPAIR, daemon, "many.jsonl") == (0, "0 0")
    assert path.read_bytes() == before
    # SQL reads the repair as such: no open call, each run closed as repaired.
    statuses = sql("SELECT kind, status, count(*) FROM calls GROUP BY ALL ORDER BY ALL", [path])
    assert statuses.rows == [
        ("model", "cancelled", 1),
        ("model", "ok", 3),
        ("tool", "ok", 1),
        ("tool", "repaired", 2),
    ]
    repaired = sql("SELECT count(*) FROM runs WHERE closed AND repaired", [path])
    assert repaired.rows == [(4,)]


def test_a_repair_killed_half_way_is_finished_once(daemon: DaemonProcess) -> None:
    path = daemon.root / "half.jsonl"
    runs = cut_runs(daemon, "half.jsonl")
    assert run(CUT_IN_THE_REPAIR, daemon, "half.jsonl")[0] == -signal.SIGKILL
    assert check(path).open_runs == runs  # the first run is still cut, one end written
    assert len(repaired_ends(path)) == 1
    assert run(REPAIR, daemon, "half.jsonl") == (0, "2 4")
    assert_mended(path, runs)
    assert len(repaired_ends(path)) == 3
    assert run(REPAIR, daemon, "half.jsonl") == (0, "0 0")


def test_flightlog_resume_repair_mends_every_run(daemon: DaemonProcess) -> None:
    path = daemon.root / "cli.jsonl"
    runs = cut_runs(daemon, "cli.jsonl")
    done = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "resume", str(path), "--repair", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "FLIGHTLOG_SOCKET": daemon.socket},
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert json.loads(done.stdout)["unpaired"] == []
    assert_mended(path, runs)
    checked = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0 and "warn" not in checked.stdout.lower(), checked.stdout
