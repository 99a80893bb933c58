"""The benchmark harness keeps working: ``python -m bench --quick`` runs every scenario
and produces every row.  Speeds are never asserted (CI machines vary); fairness is:
the baselines write the very bytes the daemon writes.  The syslog peers (rsyslog,
syslog-ng) are measured where they can be found and reported as skipped where not."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import bench._syslog
from bench._context import Context
from bench._events import LineEncoder, large_event, line_lengths, small_event
from bench._report import DASH, Row
from bench._syslog import (
    ENV_SYSLOG_NG,
    PEERS,
    LineCheckFailed,
    SyslogSink,
    find_peers,
    find_rsyslog,
)
from flightlog.sdk import connect
from support import DaemonProcess

ROOT = Path(__file__).resolve().parent.parent
#: A deadline for each harness run, not a measurement: the quick run takes about 40 s
#: of CPU, which was 11 minutes of wall on a loaded 2-core machine.
DEADLINE = 3000
pytestmark = pytest.mark.timeout(DEADLINE)

ROWS = {
    # row key: the systems it must have figures for
    "1": {"flightlog", "jsonl", "sqlite"},
    "1b": {"flightlog", "jsonl", "sqlite"},
    "1c": {"flightlog"},
    "2": {"flightlog", "jsonl", "sqlite"},
    "2b": {"flightlog", "jsonl", "sqlite"},
    "2c": {"flightlog"},
    "3": {"flightlog", "jsonl", "sqlite"},
    "3b": {"flightlog", "jsonl", "sqlite"},
    "3c": {"flightlog", "jsonl"},
    "4-1k": {"flightlog", "sqlite"},
    "4-1k-p99": {"flightlog", "sqlite"},
    "4-1k-rate": {"flightlog", "sqlite"},
    "4-20k": {"flightlog", "sqlite"},
    "4-20k-p99": {"flightlog", "sqlite"},
    "4-20k-rate": {"flightlog", "sqlite"},
    "5": {"flightlog", "jsonl", "sqlite"},
    "5b": {"flightlog", "jsonl", "sqlite"},
    "5c": {"flightlog", "jsonl"},
    "6": {"flightlog"},
    "6b": {"flightlog", "jsonl", "sqlite"},
    "6c": {"flightlog", "jsonl", "sqlite"},
    "7": {"flightlog"},
    "7b": {"flightlog"},
    "7c": {"flightlog"},
    "8": {"flightlog", "otel"},
    "8b": {"flightlog", "unrecorded", "otel"},
    "8c": {"flightlog", "otel"},
    "9": {"flightlog"},
    "9b": {"flightlog"},
    "9c": {"flightlog"},
}
#: The rows the syslog peers, when measured, have figures in.
PEER_ROWS = ("1", "1b", "1c", "2", "2b", "2c")


def _python_m(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m ARGS`` from the repository root; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.mark.parametrize(
    ("probe", "lines"),
    [
        (
            # A tenth of its frames: each round's code path, not its 2 s of pacing.
            "bench.wakeup --frames 500",
            ["reader asleep in epoll_wait: send p50", "reader spinning on recv"],
        ),
        (
            "bench.roundtrip",
            [
                "status()",
                "session.sync()",
                "load_checkpoint()",
                "save_checkpoint(",
                "write + fsync",
            ],
        ),
    ],
)
def test_probes_run_and_print_every_line(probe: str, lines: list[str]) -> None:
    """The probes docs/benchmarks.md quotes for the floors under scenarios 3 and 5."""
    done = _python_m(*probe.split())
    for line in lines:
        assert line in done.stdout, done.stdout


def test_ring_probe_prints_both_sides_of_both_hand_overs() -> None:
    """The probe docs/benchmarks.md quotes for what the ring saves per frame."""
    args = ("--frames", "2000", "--rounds", "2", "--sdk-events", "2000", "--sdk-rounds", "2")
    out = _python_m("bench.ring", *args).stdout
    cells = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("|")]
    assert [cell for cell in cells if cell not in ("side", "---")] == [
        "sender",
        "reader",
        "agent (record())",
        "daemon",
    ], out


def test_event_ids_probe_prints_every_way_for_both_sides() -> None:
    """The probe docs/benchmarks.md quotes for what an event id costs record()."""
    out = _python_m("bench.event_ids", "--events", "500", "--rounds", "2").stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    rows = [row for row in rows if row[0].strip() != "---"]
    assert [row[0].strip() for row in rows] == ["side", "agent (record())", "daemon"], out
    # The daemon's CPU is read in clock ticks: a short round may show none.
    assert all(float(cell) > 0 for cell in rows[1][1:4]), out
    assert all(float(cell) >= 0 for cell in rows[2][1:4]), out


def test_saturated_probe_prints_the_daemon_cpu_per_record_of_both_sizes() -> None:
    """The probe docs/benchmarks.md quotes for the daemon's steps per record."""
    # One round of each size (--quick: two), of the full count: the daemon's CPU is
    # read in clock ticks.
    out = _python_m("bench.saturated", "--rounds", "1").stdout
    lines = [line for line in out.splitlines() if "daemon CPU per record" in line]
    assert len(lines) == 2, out  # small events, 64 KiB events
    for line in lines:
        best = float(line.split("best ")[1].split(" µs")[0])
        assert best > 0, line


def test_steps_probe_prints_every_step_for_every_system() -> None:
    """The probe docs/benchmarks.md quotes for where the CPU of an event goes."""
    done = _python_m("bench.steps", "--quick")
    out = done.stdout
    tables = [block.splitlines() for block in out.split("\n\n") if block.startswith("| ")]
    assert len(tables) == 2  # small events, 64 KiB events
    for table in tables:
        columns = [cell.strip() for cell in table[0].split("|")[2:-1]]
        assert columns[0] == "flightlogd"
        for peer in PEERS:
            assert any(column.startswith(peer) for column in columns) != (
                f"{peer} skipped: " in out
            ), peer
        steps = [line.split("|")[1].strip() for line in table[2:]]
        assert steps[0] == "agent: codec (encode_event)"
        assert steps[-1] == "agent + daemon"
        assert len(steps) == 7
    own = re.findall(r"record\(\) without its send: ([\d.]+) µs, of which the codec ([\d.]+)", out)
    assert len(own) == 2
    # Figures, not their order: for a 64 KiB event the call's own work is within the
    # codec's noise, so one can come out above the other either way.
    assert all(float(call) > 0 and float(codec) > 0 for call, codec in own)


def test_check_probe_prints_every_payload_and_the_thread_hop() -> None:
    """The probe docs/benchmarks.md quotes for the cost of the JSON check."""
    out = _python_m("bench.check", "--quick").stdout
    rows = [line.split("|")[1].strip() for line in out.splitlines()[2:] if line.startswith("| ")]
    assert rows == [
        "small event",
        "64 KiB event",
        "256 KiB event",
        "1 MiB event",
        "nested 254 deep, 64 KiB",
        "nested 254 deep, 1 MiB",
        'the same, 16 MiB, and a string "e000"',
    ], out
    assert "a worker thread's hop (anyio.to_thread.run_sync): " in out


def test_several_runs_give_a_median_and_a_range_and_rotate_the_systems(tmp_path: Path) -> None:
    """What a run of several runs a scenario adds to one (the quick run below runs
    each scenario once): the median, the range, and another system first each run."""
    row = Row("1", "small events", "aggregate", "events/s", fmt="{:,.0f}")
    for value in (3000.0, 1000.0, 2000.0):
        row.add("flightlog", value)
    row.add("jsonl", 500.0)
    assert row.cell("flightlog") == f"2,000 (1,000{DASH}3,000)"
    assert row.cell("jsonl") == "500"  # one run: no range
    assert row.ratio("jsonl") == 4.0
    assert row.to_json()["values"]["flightlog"] == {
        "median": 2000.0,
        "min": 1000.0,
        "max": 3000.0,
        "runs": [3000.0, 1000.0, 2000.0],
    }
    ctx = Context(base=tmp_path, quick=True, runs=3)
    daemon = ctx.daemon(tmp_path)
    orders = [[s.name for s in ctx.systems(tmp_path, daemon, run)] for run in range(3)]
    assert [order[0] for order in orders] == ["flightlog", "jsonl", "sqlite"]
    assert all(sorted(order) == ["flightlog", "jsonl", "sqlite"] for order in orders)


def _missing_syslog_ng(tmp_path: Path) -> tuple[list[str], dict[str, str], str]:
    """The options and environment that name a syslog-ng not to be had; the reason the
    harness must give."""
    missing = tmp_path / "no-syslog-ng"
    env = {key: value for key, value in os.environ.items() if key != ENV_SYSLOG_NG}
    return ["--syslog-ng", str(missing)], env, f"no usr/sbin/syslog-ng under {missing}"


def _says_syslog_ng_is_missing(done: subprocess.CompletedProcess[str], reason: str) -> None:
    """The harness said why syslog-ng was skipped, in its log and its table."""
    assert f"syslog-ng skipped in scenarios 1 and 2: {reason}" in done.stderr
    cells = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in done.stdout.splitlines()
        if line.startswith("| ")
    }
    assert cells["syslog-ng"] == f"skipped: {reason}"


def test_quick_run_produces_every_row(tmp_path: Path) -> None:
    """Every row, and the peers measured or skipped with the reason.  Where syslog-ng
    is not to be had anyway, the run is told of one that is missing (a directory
    without it): what the harness says then is checked on this run, not on one of
    scenario 1 more (4.5 s of CPU)."""
    report = tmp_path / "bench.json"
    options, env, reason = _missing_syslog_ng(tmp_path)
    missing_here = bool(find_peers(None)[1].skipped)
    if not missing_here:
        options, env = [], None
    # One run of every scenario: each row's code path once (what several runs add is
    # tested above, in process).
    done = _python_m("bench", "--quick", "--runs", "1", "--json", str(report), *options, env=env)
    out = done.stdout
    for heading in ("command: python -m bench --quick --runs 1", "date:", "machine:", "cores"):
        assert heading in out
    # The main table, then the syslog peers' table.
    table, peer_table = [
        block.splitlines() for block in out.split("\n\n") if block.startswith("| ")
    ]
    keys = [line.split("|")[1].strip() for line in table[2:]]
    assert keys == list(ROWS)

    data = json.loads(report.read_text())
    assert data["quick"] is True
    assert data["runs"] == 1
    assert data["machine"]["cores"] >= 1
    assert set(data["peers"]) == set(PEERS)
    measured = {name for name, peer in data["peers"].items() if not peer["skipped"]}
    peer_lines = {line.split("|")[1].strip().split()[0]: line for line in peer_table[2:]}
    for name, peer in data["peers"].items():
        assert name in peer_lines, name  # in the peers' table, measured or not
        if peer["skipped"]:
            assert f"skipped: {peer['skipped']}" in peer_lines[name]
            assert f"{name} skipped in scenarios 1 and 2" in done.stderr
        else:
            assert peer["version"] in peer_lines[name]
            assert "skipped" not in peer_lines[name]
    rows = {row["key"]: row for row in data["rows"]}
    assert list(rows) == list(ROWS)
    for key, systems in ROWS.items():
        values = rows[key]["values"]
        if key in PEER_ROWS:
            systems = systems | measured
        assert set(values) == systems, key
        for system in systems:
            assert len(values[system]["runs"]) == data["runs"], (key, system)
        if rows[key]["targets"]:
            assert rows[key]["met"] in (True, False), key
    if missing_here:
        _says_syslog_ng_is_missing(done, reason)
        assert data["peers"]["syslog-ng"]["skipped"] == reason
    else:
        # syslog-ng was measured above: a run of scenario 1 told of one that is missing.
        _bench_says_when_syslog_ng_cannot_be_had(tmp_path)


def test_baselines_write_the_daemons_bytes(daemon: DaemonProcess) -> None:
    events = [small_event(), large_event(), small_event(123)]
    with connect(daemon.socket) as client:
        session = client.create("fair.jsonl")
        run = session.begin_run()
        for event in events:
            run.record(event)
        run.close()
        session.close()
        path = Path(session.path)
    lines = path.read_bytes().splitlines(keepends=True)
    assert [line.startswith(b'{"session_id"') for line in lines] == [True] * len(lines)
    written = lines[2 : 2 + len(events)]  # after session_start and run_start
    ours = LineEncoder(session.session_id, run.run_id, first_seq=3)
    assert [ours.line(event) for event in events] == written


def test_line_lengths_counts_the_seq_digits() -> None:
    event = small_event()
    at_one = len(LineEncoder("a" * 32, "b" * 32).line(event))
    for first, count in [(1, 1), (3, 20), (95, 10), (999, 2), (9990, 30), (1, 12000)]:
        lines = LineEncoder("a" * 32, "b" * 32, first_seq=first)
        expected = sum(len(lines.line(event)) for _ in range(count))
        assert line_lengths(at_one, first, count) == expected


def _bench_says_when_syslog_ng_cannot_be_had(tmp_path: Path) -> None:
    options, env, reason = _missing_syslog_ng(tmp_path)
    done = _python_m(
        *("bench", "--quick", "--only", "1", "--runs", "1", *options),
        *("--json", str(tmp_path / "peerless.json")),
        env=env,
    )
    _says_syslog_ng_is_missing(done, reason)
    data = json.loads((tmp_path / "peerless.json").read_text())
    assert data["peers"]["syslog-ng"]["skipped"] == reason
    assert "syslog-ng" not in data["rows"][0]["values"]


def test_peers_are_found_on_the_path_or_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench._syslog, "_SBIN", ())  # the PATH alone
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(ENV_SYSLOG_NG, raising=False)
    rsyslog, syslog_ng = find_peers(None)
    assert rsyslog.skipped == "rsyslogd not found on PATH nor in sbin (apt-get install rsyslog)"
    assert syslog_ng.skipped.startswith("syslog-ng not found on PATH")

    fake = tmp_path / "rsyslogd"
    fake.write_text("#!/bin/sh\necho 'rsyslogd  8.2302.0 (aka 2023.02) compiled with:'\n")
    fake.chmod(0o755)
    found = find_rsyslog()
    assert (found.binary, found.version, found.skipped) == (str(fake), "8.2302.0", "")
    fake.write_text("#!/bin/sh\necho 'cannot run' >&2\nexit 1\n")
    assert find_rsyslog().skipped == f"{fake} -v failed: cannot run"


def _frames(data: bytes) -> list[bytes]:
    """Octet-counted frames (RFC 6587) back out of a stream."""
    frames = []
    while data:
        length, _, rest = data.partition(b" ")
        frames.append(rest[: int(length)])
        data = rest[int(length) :]
    return frames


@pytest.mark.parametrize("peer", PEERS)
def test_syslog_sink_sends_a_syslog_message_per_line(peer: str, short_tmp: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(short_tmp / "in.sock"))
    listener.listen()
    sink = SyslogSink(peer, str(short_tmp / "in.sock"), str(short_tmp), "r3/agent-1.jsonl")
    events = [small_event(), small_event(), large_event(), small_event(7)]
    with listener, listener.accept()[0] as conn:
        for event in events:
            sink.record(event)
        sink.sock.close()
        received = b"".join(iter(lambda: conn.recv(1 << 16), b""))
    lines = LineEncoder(sink.lines.session_id, sink.lines.run_id)
    header = b"<14>1 - - r3-agent-1 - - - "
    sent = [header + lines.line(event) for event in events]
    if peer == "rsyslog":
        assert _frames(received) == sent
    else:
        assert received == b"".join(sent)
    assert sink.path == str(short_tmp / "r3-agent-1.jsonl")


def _recorded(directory: Path) -> tuple[SyslogSink, list[bytes]]:
    """A sink that recorded five events of two kinds, drained from a file holding
    their lines as a peer writes them; and those lines."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(directory / "in.sock"))
    listener.listen()
    with listener:
        sink = SyslogSink("syslog-ng", str(directory / "in.sock"), str(directory), "agent-0")
        events = [small_event(), small_event(), small_event(9), small_event(9), small_event()]
        for event in events:
            sink.record(event)
    expected = LineEncoder(sink.lines.session_id, sink.lines.run_id)
    lines = [expected.line(event) for event in events]
    Path(sink.path).write_bytes(b"".join(lines))
    sink.drain()
    return sink, lines


def test_syslog_sink_check_accepts_exactly_the_lines_sent(short_tmp: Path) -> None:
    sink, _ = _recorded(short_tmp)
    sink.close()  # checks the file


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (lambda lines: lines[:3], "2 of 5 lines missing"),
        (lambda lines: [*lines[:2], *lines[3:], lines[2]], "seq 4 leaves a gap"),
        (lambda lines: [*lines[:2], lines[1], *lines[2:4]], "seq 2 repeats the seq"),
        (lambda lines: [lines[0], lines[2], lines[1], *lines[3:]], "seq 3 leaves a gap"),
        (lambda lines: [*lines[:4], b"<14>" + lines[4]], "line 5: not a valid record"),
        (lambda lines: [*lines[:4], lines[4][:100] + b"\n"], "line 5: not a valid record"),
        (
            lambda lines: [*lines[:4], lines[4].replace(b"read_file", b"read_fild")],
            "line 5: not byte for byte the line sent",
        ),
        (lambda lines: [*lines, lines[4]], "line 6: a line beyond the 5 sent"),
    ],
)
def test_syslog_sink_check_finds_every_fault(
    short_tmp: Path, tamper: Callable[[list[bytes]], list[bytes]], reason: str
) -> None:
    sink, lines = _recorded(short_tmp)
    Path(sink.path).write_bytes(b"".join(tamper(lines)))
    with pytest.raises(LineCheckFailed, match=reason):
        sink.close()


def test_transcript_probe_prints_every_chat_ratio_and_a_linear_file() -> None:
    """The probe docs/benchmarks.md quotes for how a conversation grows."""
    out = _python_m("bench.transcript", "--quick").stdout
    ratios = [float(r) for r in re.findall(r"= ([\d.]+)x", out)]
    assert len(ratios) == 4, out  # the four chats
    assert all(ratio > 0 for ratio in ratios)
    per_step = re.search(r"1,000 over 100 steps: ([\d.]+)", out)
    assert per_step is not None, out
    assert 0.9 < float(per_step.group(1)) < 1.1  # linear: the same bytes per step


def test_resume_probe_prints_every_step_and_agrees_with_the_full_scan() -> None:
    """The probe docs/benchmarks.md quotes for resuming a big session (it asserts
    that resume() and the full scan find the same cut runs and open calls)."""
    out = _python_m("bench.resume", "--mb", "5", "--runs", "1").stdout
    steps = (
        "read whole (no index)",
        "from the index",
        "compressed, from the index",
        "as it was",
        "the first write to the compressed file",
    )
    for step in steps:
        assert step in out, out


def test_sql_probe_answers_every_question_as_find_and_grep_do() -> None:
    """The probe docs/benchmarks.md quotes for SQL (it exits non-zero when a tool's
    answer differs from the corpus's count)."""
    out = _python_m("bench.sql", "--gigabytes", "0.005", "--runs", "1").stdout
    rows = [line.split(" | ")[:2] for line in out.splitlines() if line.startswith("| ")]
    tools = {(question.lstrip("| "), tool) for question, tool in rows[2:]}
    assert tools == {
        ("failing tool calls", "sql (records)"),
        ("failing tool calls", "sql (calls)"),
        ("failing tool calls", "find"),
        ("failing tool calls", "grep"),
        ("records mentioning 'timed out'", "sql (records)"),
        ("records mentioning 'timed out'", "find"),
        ("records mentioning 'timed out'", "grep"),
        ("input tokens by model", "sql (calls)"),
        ("input tokens by model", "find"),
    }, out
