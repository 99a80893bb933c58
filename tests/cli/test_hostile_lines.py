"""Every reader survives every line the daemon could have written (issue 27, 5 and 7).

A hand-made session file holds lines the daemon accepts (or an older one accepted):
times at both ends of what is allowed and before 1970, year 0000 (refused now, in old
files), ``\\n``, escape sequences and separators inside execution ids, tool names,
paths and content, data of every unexpected shape, a 4,000-digit integer, the deepest
nesting.  ``tail``, ``show``, ``inspect``, ``find``, ``check`` and ``export`` each run on
it as the real command: each reports what it cannot use and goes on, none dies with a
traceback, and no value prints a line of its own (a forged one).
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from flightlog.protocol import (
    Record,
)
from flightlog.protocol.format import (
    encode_line,
)
from support import DaemonProcess

SID = "5f0c2a9e8b7d4c1fa3e6b2d9c8a7f015"
RUN = "a41e7c3b9d2f4e8a8c6b1f0e2d3c4b5a"
TIME = "2026-11-29T20:00:00.000000Z"
FORGED = "FORGED"
EVIL = f"\n{FORGED} \x1b]0;title\x07\x1b[2J\r\u2028\x85\x0b"


def _execution(id_: object, kind: object = "tool", attempt: object = 1) -> dict[str, object]:
    return {"id": id_, "kind": kind, "attempt": attempt, "turn_index": 0}


def _deep(depth: int) -> object:
    value: object = []
    for _ in range(depth - 2):
        value = [value]
    return value


# (type, time, data): each a line the daemon writes (but the year 0000 one, which an
# older daemon wrote).
FACTS: list[tuple[str, str, object]] = [
    ("agent_start", "0001-01-01T00:00:00Z", {"agent": f"agent{EVIL}", "messages": "none"}),
    ("turn_start", "9999-12-31T23:59:59.999999999Z", {"turn_index": f"one{EVIL}"}),
    (
        "model_exec_start",
        "1969-07-20T20:17:40.5Z",
        {"execution": _execution(f"m1{EVIL}", "model"), "model": f"gpt{EVIL}"},
    ),
    (
        "tool_exec_start",
        TIME,
        {
            "execution": _execution(f"t1{EVIL}"),
            "name": f"read_file{EVIL}",
            "arguments": {"path": f"/etc/passwd{EVIL}"},
        },
    ),
    ("tool_exec_end", "0000-01-01T00:00:00Z", {"execution": _execution(f"t1{EVIL}")}),
    (
        "tool_exec_end",
        TIME,
        {"execution": _execution(f"t1{EVIL}"), "result": f"ok{EVIL}", "is_error": "maybe"},
    ),
    ("model_exec_end", TIME, {"execution": "not an object", "usage": "lots"}),
    ("model_exec_end", TIME, {"execution": _execution(5, ["x"], "one"), "usage": [1, 2]}),
    ("model_request", TIME, {"execution": _execution("m2", "model", "two"), "messages": 3}),
    (
        "model_exec_end",
        TIME,
        {
            "execution": _execution("m2", "model", "two"),
            "usage": {"input_tokens": "lots", "output_tokens": {"a": 1}, "cache_read_tokens": -5},
            "message": {"$type": "assistant", "content": [{"$type": "tool_call", "id": 7}]},
        },
    ),
    ("message_end", TIME, {"text": int("9" * 4000), "big": 1e308, "deep": _deep(256)}),
    ("error", TIME, {"message": f"boom{EVIL}", "fatal": "yes", "where": {"a": None}}),
    ("retry", TIME, {"attempt": -1, "reason": f"again{EVIL}", "execution": None}),
    ("agent_end", TIME, {"ok": "sometimes", "reason": f"done{EVIL}", "turns": 1e300}),
]


def hostile_file(path: Path) -> None:
    def line(seq: int, type_: str, time: str, data: object, run: str | None = RUN) -> bytes:
        return encode_line(
            Record(
                session_id=SID,
                seq=seq,
                type=type_,
                time=time,
                run_id=run,
                data=msgspec.Raw(msgspec.json.encode(data)),
            )
        )

    lines = [
        line(
            1,
            "session_start",
            TIME,
            {"format_version": 1, "meta": {"app": f"app{EVIL}", "n": 10**300}},
            None,
        ),
        line(2, "run_start", TIME, {"pid": 7, "client": f"client{EVIL}", "uid": "x"}),
    ]
    for seq, (type_, time, data) in enumerate(FACTS, start=3):
        lines.append(line(seq, type_, time, data))
    seq = len(lines) + 1
    lines.append(line(seq, "checkpoint", "0000-06-01T00:00:00Z", {"state": {"k": EVIL}}))
    lines.append(line(seq + 1, "run_close", TIME, {"error": f"closed{EVIL}"}))
    lines.append(line(seq + 2, "run_start", "0000-01-01T00:00:00Z", {"pid": 8}, RUN[::-1]))
    lines.append(line(seq + 3, "run_close", TIME, {"error": None}, RUN[::-1]))
    path.write_bytes(b"".join(lines))


class _Otlp(http.server.BaseHTTPRequestHandler):
    """A minimal OTLP/HTTP traces endpoint: takes every request, counts the spans."""

    spans = 0

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                type(self).spans += len(scope.spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def otlp() -> Iterator[str]:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Otlp)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hostile(daemon: DaemonProcess) -> Path:
    path = daemon.root / "hostile" / "session.jsonl"
    path.parent.mkdir(parents=True)
    hostile_file(path)
    return path


def _flightlog(daemon: DaemonProcess, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLIGHTLOG_SOCKET": daemon.socket, "FLIGHTLOG_ROOT": str(daemon.root)}
    env.pop("NO_COLOR", None)
    return subprocess.run(
        [sys.executable, "-m", "flightlog.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _no_forged_line(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    for stream in (result.stdout, result.stderr):
        for line in stream.split("\n"):
            assert not line.startswith(FORGED), (line, stream)
            assert "\r" not in line and "\u2028" not in line and "\x85" not in line, line


@pytest.mark.parametrize(
    "command",
    [
        ["tail"],
        ["tail", "--color", "always"],
        ["show"],
        ["inspect"],
        ["find"],
        ["check"],
    ],
    ids=["tail", "tail-colours", "show", "inspect", "find", "check"],
)
def test_every_reader_survives_hostile_lines(
    daemon: DaemonProcess, hostile: Path, command: list[str]
) -> None:
    name = command[0]
    argv = [*command, str(hostile.parent if name == "find" else hostile)]
    result = _flightlog(daemon, *argv)
    _no_forged_line(result)
    # 0, or 3 for inspect: runs that end without a run_close are gaps.
    assert result.returncode in {0, 3}, (result.returncode, result.stdout, result.stderr)
    if name != "check":
        assert "\\n" + FORGED in result.stdout, result.stdout


@pytest.mark.parametrize(
    "command",
    [
        ["sessions"],
        ["sessions", "--json"],
        ["resume"],
        ["resume", "--json"],
        ["diff"],
        ["diff", "--json"],
        ["find", "--text", "FORGED|ok"],
        ["show", "--html"],
    ],
    ids=["sessions", "sessions-json", "resume", "resume-json", "diff", "diff-json", "text", "html"],
)
def test_the_investigating_commands_survive_hostile_lines(
    daemon: DaemonProcess, hostile: Path, command: list[str]
) -> None:
    """sessions, resume, diff, find --text and show --html (issue 30) on the same file:
    an attempt that is not a number, token counts that are not numbers."""
    name = command[0]
    where = [f"{hostile}@1"] * 2 if name == "diff" else [str(hostile)]
    result = _flightlog(daemon, *command, *where)
    if command[-1] == "--html":
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == 0 and result.stdout.endswith("</html>\n"), result.stderr
        return
    assert "Traceback" not in result.stderr, result.stderr
    # resume: 3 when a tool call is left unpaired.
    assert result.returncode in {0, 3}, (result.returncode, result.stdout, result.stderr)
    if "--json" in command:  # exact, as tail --json: JSON escapes, one object a line
        for line in result.stdout.split("\n")[:-1]:
            found = json.loads(line)
            if name == "sessions":  # -5 cache reads are no tokens, as for the price
                assert found["tokens"] == {}, found
    else:
        _no_forged_line(result)


@pytest.mark.parametrize("command", ["tail", "find"])
def test_json_output_stays_exact(daemon: DaemonProcess, hostile: Path, command: str) -> None:
    argv = [command, "--json", str(hostile.parent if command == "find" else hostile)]
    result = _flightlog(daemon, *argv)
    assert result.returncode == 0, result.stderr
    lines = hostile.read_text().split("\n")[:-1]
    printed = [json.loads(line) for line in result.stdout.split("\n")[:-1]]
    expected = [json.loads(line) for line in lines]
    if command == "find":
        for item in printed:
            item.pop("path", None)
        expected = [item for item in expected if item in printed]
        assert printed, result.stdout
    assert printed == expected


def test_export_survives_hostile_lines(daemon: DaemonProcess, hostile: Path, otlp: str) -> None:
    _Otlp.spans = 0
    result = _flightlog(daemon, "export", "--endpoint", otlp, str(hostile))
    _no_forged_line(result)
    assert result.returncode == 0, result.stderr
    # The times no span carries are named and skipped; the rest is exported.
    assert "seq 3 (agent_start): time 0001-01-01T00:00:00Z is outside" in result.stderr
    assert "not an RFC 3339 time: '0000-01-01T00:00:00Z'" in result.stderr
    assert _Otlp.spans > 0
    assert f"exported {_Otlp.spans} spans of 1 sessions" in result.stderr


# Times no daemon writes, as a hand (or another tool) leaves them: offsets that move
# the moment out of the years 0001 to 9999, a year of 20 digits or of five, a leap
# second, 5,000 digits of fraction, a sign before the year.
HAND_DAMAGED_TIMES = [
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-00:01",
    "99999999999999999999-01-01T00:00:00Z",
    "+10000-01-01T00:00:00Z",
    "2026-12-31T23:59:60Z",
    "2026-11-29T20:00:00." + "1" * 5000 + "Z",
]


@pytest.fixture
def hand_damaged(daemon: DaemonProcess) -> Path:
    """A sound file whose last lines' times were edited by hand, one line each."""
    path = daemon.root / "damaged" / "session.jsonl"
    path.parent.mkdir(parents=True)
    lines = []
    for seq, stamp in enumerate([TIME, TIME, *HAND_DAMAGED_TIMES], start=1):
        type_, data = ("message_end", {"text": f"line {seq}"})
        if seq == 1:
            type_, data = ("session_start", {"format_version": 1, "meta": {}})
        elif seq == 2:
            type_, data = ("run_start", {"pid": 7, "client": "c"})
        record = Record(
            session_id=SID,
            seq=seq,
            type=type_,
            time=TIME,
            run_id=None if seq == 1 else RUN,
            data=msgspec.Raw(msgspec.json.encode(data)),
        )
        lines.append(encode_line(record).replace(TIME.encode(), stamp.encode(), 1))
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize(
    "command",
    [["sessions"], ["sessions", "--json"], ["export"], ["show"], ["find"], ["tail"]],
    ids=["sessions", "sessions-json", "export", "show", "find", "tail"],
)
def test_every_reader_survives_hand_damaged_times(
    daemon: DaemonProcess, hand_damaged: Path, otlp: str, command: list[str]
) -> None:
    name = command[0]
    target = str(hand_damaged.parent if name in {"find", "sessions"} else hand_damaged)
    extra = ["--endpoint", otlp] if name == "export" else []
    result = _flightlog(daemon, *command, *extra, target)
    # Before, `sessions` died with ValueError on the last line's time, and `export`
    # with OverflowError on an offset that moved a time before the year 0001.
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, (result.stdout, result.stderr)
    if name == "export":
        for stamp in HAND_DAMAGED_TIMES[:4]:
            assert f"not an RFC 3339 time: '{stamp}'; skipped" in result.stderr
    elif name == "sessions":
        assert SID[:8] in result.stdout or "session.jsonl" in result.stdout, result.stdout
    else:  # every line is read, to the last
        assert " 8 message_end" in result.stdout or "(seq 1..8)" in result.stdout, result.stdout
