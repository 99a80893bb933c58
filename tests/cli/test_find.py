"""``flightlog find`` on a generated corpus of sessions, against the same question answered
by reading every file with ``flightlog.sdk.read`` and filtering the decoded records."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given

from bench._find import Corpus, write_corpus
from flightlog.protocol import format_time, parse_time
from flightlog.sdk import read
from flightlog.sdk._match import between as _between
from flightlog.sdk._query import Query

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    directory = tmp_path_factory.mktemp("corpus")
    written = write_corpus(directory, 3_000_000)
    # The same records, written with JSON whitespace (readers must accept it): the byte
    # prefilter must not miss them.
    source = next(directory.rglob("session-00003.jsonl"))
    spaced = directory / "spaced" / "spaced.jsonl"
    spaced.parent.mkdir()
    spaced.write_text(
        "".join(
            json.dumps(json.loads(line), separators=(", ", ": ")) + "\n"
            for line in source.read_text().splitlines()
        ).replace(json.loads(source.read_text().splitlines()[0])["session_id"], "f" * 32)
    )
    # A last line without its newline is never read, even when it matches.
    tail = directory / "team-0" / "session-00000.jsonl"
    last = json.loads(tail.read_text().splitlines()[-1])
    unfinished = {**last, "seq": last["seq"] + 1, "type": "error", "data": {"message": "x"}}
    with tail.open("a") as fileobj:
        fileobj.write(json.dumps(unfinished, separators=(",", ":")))
    return written


def oracle(paths: list[Path], keep: Callable[[dict[str, Any], dict[str, Any]], bool]) -> list:
    """(path, session_id, seq) of every record ``keep(record, meta)`` accepts."""
    found = []
    for path in sorted(paths):
        meta: dict[str, Any] = {}
        for record in read(path):
            plain = record.to_builtins()
            if record.type == "session_start":
                meta = plain["data"]["meta"]
            if keep(plain, meta):
                found.append((str(path), record.session_id, record.seq))
    return found


def is_failure(record: dict[str, Any]) -> bool:
    data, type = record["data"], record["type"]
    if type in ("error", "retry"):
        return True
    if type in ("model_exec_end", "context_prepare_end", "run_close"):
        return bool(data.get("error"))
    if type in ("tool_exec_end", "tool_invoke_end"):
        return bool(data.get("is_error")) or data.get("disposition", "ran") not in (None, "ran")
    if type == "agent_end":
        return not data.get("ok", True)
    return False


def models_of(data: dict[str, Any]) -> set[Any]:
    config, message = data.get("config"), data.get("message")
    return {
        data.get("model"),
        config.get("model") if isinstance(config, dict) else None,
        message.get("model") if isinstance(message, dict) else None,
    }


def find(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "find", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def found(result: subprocess.CompletedProcess[str]) -> list:
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return [(line["path"], line["session_id"], line["seq"]) for line in lines]


def at(text: str) -> datetime:
    return parse_time(text)


QUESTIONS: dict[str, tuple[list[str], Callable[[dict[str, Any], dict[str, Any]], bool]]] = {
    "failed tool calls": (
        ["--type", "tool_exec_end", "--error"],
        lambda r, m: r["type"] == "tool_exec_end" and is_failure(r),
    ),
    "every failure": (["--error"], lambda r, m: is_failure(r)),
    "successful tool calls": (
        ["--type", "tool_exec_end", "--no-error"],
        lambda r, m: r["type"] == "tool_exec_end" and not is_failure(r),
    ),
    "one tool": (
        ["--tool", "search"],
        lambda r, m: r["type"].startswith("tool_") and r["data"].get("name") == "search",
    ),
    "one model's ends": (
        ["--model", "gpt-y", "--type", "model_exec_end"],
        lambda r, m: r["type"] == "model_exec_end" and "gpt-y" in models_of(r["data"]),
    ),
    "one model": (["--model", "claude-x"], lambda r, m: "claude-x" in models_of(r["data"])),
    "meta": (
        ["--meta", "team=team-3", "--type", "agent_end,run_close"],
        lambda r, m: m.get("team") == "team-3" and r["type"] in ("agent_end", "run_close"),
    ),
    "a time window": (
        ["--since", "2026-11-29T00:00:30.5Z", "--until", "2026-11-29T00:01:10Z"],
        lambda r, m: at("2026-11-29T00:00:30.5Z") <= at(r["time"]) < at("2026-11-29T00:01:10Z"),
    ),
}


@pytest.mark.parametrize("question", QUESTIONS)
def test_find_answers_like_reading_every_file(corpus: Corpus, question: str) -> None:
    args, keep = QUESTIONS[question]
    paths = sorted(corpus.directory.rglob("*.jsonl"))
    expected = oracle(paths, keep)
    assert expected, "the corpus must hold an answer to every question"
    got = found(find(*args, "--json", str(corpus.directory)))
    assert sorted(got) == sorted(expected)
    # Each file's records come in seq order.
    for path in {p for p, _, _ in got}:
        seqs = [seq for p, _, seq in got if p == path]
        assert seqs == sorted(seqs)


def test_find_by_run_prefix_and_counts(corpus: Corpus) -> None:
    paths = sorted(corpus.directory.rglob("*.jsonl"))
    run_id = next(r.run_id for r in read(paths[5]) if r.run_id)
    got = found(find("--run", run_id[:10], "--json", str(corpus.directory)))
    assert sorted(got) == oracle(paths, lambda r, m: (r["run_id"] or "").startswith(run_id[:10]))
    failed = found(find("--type", "tool_exec_end", "--error", "--json", str(corpus.directory)))
    spaced = [hit for hit in failed if hit[1] == "f" * 32]
    # The generator's own count, plus the spaced copy of one session.
    assert len(failed) - len(spaced) == corpus.failed_tool_calls


def test_limit_text_output_and_data_root(corpus: Corpus) -> None:
    limited = find("--tool", "search", "-n", "3", "--json", str(corpus.directory))
    assert len(found(limited)) == 3
    text = find("--type", "agent_end", "-n", "2", env={"FLIGHTLOG_ROOT": str(corpus.directory)})
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(str(corpus.directory))
    assert " 2026-11-29 " in lines[0] and "agent_end" in lines[0]
    nothing = find("--since", "1h", str(corpus.directory))
    assert nothing.returncode == 0 and nothing.stdout == ""
    everything = find("--since", "36500d", "--type", "session_start", str(corpus.directory))
    assert len(everything.stdout.splitlines()) == len(list(corpus.directory.rglob("*.jsonl")))


def test_a_damaged_file_is_named_and_the_others_are_searched(
    corpus: Corpus, tmp_path: Path
) -> None:
    files = sorted(corpus.directory.rglob("session-*.jsonl"))
    source = next(path for path in files if b'"is_error":true' in path.read_bytes())
    lines = source.read_bytes().split(b"\n")
    failed_at = next(i for i, line in enumerate(lines) if b'"is_error":true' in line)
    lines[failed_at] = lines[failed_at][:-1]  # its closing brace gone
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_bytes(b"\n".join(lines))
    good = next(path for path in files if path != source)
    result = find("--type", "tool_exec_end", "--error", "--json", str(damaged), str(good))
    assert result.returncode == 1
    assert f"{damaged}: line {failed_at + 1}: not a valid record" in result.stderr
    expected = oracle([good], lambda r, m: r["type"] == "tool_exec_end" and is_failure(r))
    got = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(g["path"], g["session_id"], g["seq"]) for g in got if g["path"] == str(good)] == (
        expected
    )
    not_a_session = tmp_path / "notes.jsonl"
    not_a_session.write_text('{"hello": 1}\n')
    refused = find("--error", str(not_a_session))
    assert refused.returncode == 1
    assert "line 1" in refused.stderr


# Lines spelled as other writers may spell them, each the body of a record after
# ``{"session_id":"…","seq":N,`` (a raw string: ``\\u0061`` is the JSON escape itself).
# The byte prefilter must let through every line that matches (a string written with
# \\u or \\/ escapes, a key with whitespace, a duplicate member, which JSON readers take
# the last of, a time with an offset) and the exact test must not take a look-alike
# nested in data for the member itself.
TRICKY = [
    r'"type":"session_start","time":"2026-11-29T00:04:59Z","run_id":null,'
    r'"data":{"format_version":1,"meta":{"team":"tricky"}}',
    # Tool names: escaped, nested look-alikes, quotes and backslashes, a slash.
    r'"type":"tool_exec_start","time":"2026-11-29T00:05:01.5Z","run_id":"r1",'
    r'"data":{"name":"se\u0061rch"}',
    r'"type":"tool_exec_start","time":"2026-11-29T00:05:02Z","run_id":"r1",'
    r'"data":{"name":"other","arguments":{"name":"search","is_error":true,"time":"x"}}',
    r'"type":"tool_exec_end","time":"2026-11-29T00:05:03Z","run_id":"r1",'
    r'"data":{"arguments":{"name":"other"},"name":"search","is_error":1}',
    r'"type":"model_exec_end","time":"2026-11-29T00:05:04Z","run_id":"r1",'
    r'"data":{"message":{"content":[{"$type":"tool_call","name":"search"}],'
    r'"model":"gpt\u002dy"},"error":null}',
    r'"type":"tool_exec_end","time":"2026-11-29T00:05:05Z","run_id":"r1",'
    r'"data":{"name":"we\"ird\\name","is_error":false,"disposition":"cancelled"}',
    r'"type":"tool_exec_start","time":"2026-11-29T00:05:06Z","run_id":"r1",'
    r'"data":{"name":"we\u0022ird\u005cname"}',
    r'"type":"tool_exec_start","time":"2026-11-29T00:05:07Z","run_id":"r1","data":{"name":"a\/b"}',
    r'"type":"tool_exec_\u0065nd","time":"2026-11-29T00:05:08Z","run_id":"r1",'
    r'"data":{"name":"search","is_error":true}',
    r'"type":"turn_start","time":"2026-11-29T00:05:09Z","run_id":"r1",'
    r'"data":{"name":"search","model":"gpt-y"},"type":"tool_exec_start"',
    r'"type": "tool_exec_end" ,"time":"2026-11-29T00:05:09.5Z","run_id":"r1",'
    r'"data":{"name" : "search","is_error" :true}',
    # Times: one in data, one after data, offsets and other RFC 3339 spellings,
    # duplicates, nine fraction digits at the bounds.
    r'"type":"turn_start","time":"2026-11-29T01:00:00Z","run_id":"r1",'
    r'"data":{"time":"2026-11-29T00:05:10Z"}',
    r'"type":"turn_start","run_id":"r1","data":{"time":"2026-11-29T09:00:00Z"},'
    r'"time":"2026-11-29T00:05:11Z"',
    r'"type":"turn_end","time":"2026-11-29T02:05:12+02:00","run_id":"r1","data":{}',
    r'"type":"turn_end","time":"2026-11-28T23:05:12-01:00","run_id":"r1","data":{}',
    r'"type":"turn_end","time":"2026-11-29 00:05:13z","run_id":"r1","data":{}',
    r'"type": "turn_end", "time" : "2026-11-29T00:05:14Z", "run_id": "r1", "data": {}',
    r'"type":"turn_end","ti\u006de":"2026-11-29T00:05:15Z","run_id":"r1","data":{}',
    r'"type":"turn_end","time":"2026-11-29T00:05:16Z","run_id":"r1","data":{},'
    r'"time":"2026-11-29T03:00:00Z"',
    r'"type":"turn_end","time":"2026-11-29T03:00:00Z","run_id":"r1","data":{},'
    r'"time":"2026-11-29T00:05:17Z"',
    r'"type":"turn_end","time":"2026-11-29T00:05:00Z","run_id":"r1","data":{}',
    r'"type":"turn_end","time":"2026-11-29T00:04:59.9999999Z","run_id":"r1","data":{}',
    r'"type":"turn_end","time":"2026-11-29T00:05:19.9999999Z","run_id":"r1","data":{}',
    r'"type":"turn_end","time":"2026-11-29T00:05:20.0000001Z","run_id":"r1","data":{}',
    r'"type":"turn_end","time":"2026-11-29T00:05:2\u0031Z","run_id":"r1","data":{}',
    # Failures reported by values other than true and false.
    r'"type":"agent_end","time":"2026-11-29T00:05:18Z","run_id":"r1","data":{"ok":null}',
    r'"type":"agent_end","time":"2026-11-29T00:05:18Z","run_id":"r1","data":{"ok":0}',
    r'"type":"agent_end","time":"2026-11-29T00:05:18Z","run_id":"r1","data":{"ok" : false}',
    r'"type":"agent_end","time":"2026-11-29T00:05:18Z","run_id":"r1","data":{"ok":true}',
    r'"type":"model_exec_end","time":"2026-11-29T00:05:18Z","run_id":"r1",'
    r'"data":{"error":{"message":"boom"},"model":"gpt-y"}',
    r'"type":"run_close","time":"2026-11-29T00:05:18Z","run_id":"r1","data":{"error":"x"}',
    r'"type":"retry","time":"2026-11-29T00:05:18Z","run_id":"r1","data":{}',
    r'"type":"\u0065rror","time":"2026-11-29T00:05:18Z","run_id":"r1","data":{}',
    r'"type":"tool_invoke_end","time":"2026-11-29T00:05:18Z","run_id":"r1",'
    r'"data":{"name":"search","is_error":"yes","disposition":null}',
    # Run ids written with escapes.
    r'"type":"turn_start","time":"2026-11-29T00:05:19Z","run_id":"\u0072un-\"q\"","data":{}',
    r'"type":"turn_start","time":"2026-11-29T00:05:19Z","run_id":"run-\"q\"x","data":{}',
]
# An unfinished last line that would match every question: never read.
UNFINISHED = (
    r'"type":"tool_exec_end","time":"2026-11-29T00:05:10Z","run_id":"r1",'
    r'"data":{"name":"search","is_error":true,"model":"gpt-y"}'
)
# The record types that name a model (docs/cli.md: requests, starts, responses).
NAMES_MODEL = {
    "model_request",
    "model_exec_start",
    "model_exec_end",
    "model_response",
    "message_end",
}
WINDOW = ("2026-11-29T00:05:00Z", "2026-11-29T00:05:20Z")


def in_window(record: dict[str, Any], since: str | None, until: str | None) -> bool:
    try:
        moment = parse_time(record["time"])
    except ValueError:
        return False
    return (since is None or at(since) <= moment) and (until is None or moment < at(until))


TRICKY_QUESTIONS: dict[str, tuple[list[str], Callable[[dict[str, Any]], bool]]] = {
    "one tool": (
        ["--tool", "search"],
        lambda r: r["type"].startswith("tool_") and r["data"].get("name") == "search",
    ),
    "a tool with quotes and backslashes": (
        ["--tool", 'we"ird\\name'],
        lambda r: r["type"].startswith("tool_") and r["data"].get("name") == 'we"ird\\name',
    ),
    "a tool with a slash": (["--tool", "a/b"], lambda r: r["data"].get("name") == "a/b"),
    "one model": (
        ["--model", "gpt-y"],
        lambda r: r["type"] in NAMES_MODEL and "gpt-y" in models_of(r["data"]),
    ),
    "one type": (["--type", "tool_exec_end"], lambda r: r["type"] == "tool_exec_end"),
    "two types": (
        ["--type", "turn_end,error"],
        lambda r: r["type"] in ("turn_end", "error"),
    ),
    "every failure": (["--error"], is_failure),
    "failed calls": (
        ["--type", "tool_exec_end,tool_invoke_end", "--error"],
        lambda r: r["type"] in ("tool_exec_end", "tool_invoke_end") and is_failure(r),
    ),
    "no failure": (["--no-error"], lambda r: not is_failure(r)),
    "a time window": (
        ["--since", WINDOW[0], "--until", WINDOW[1]],
        lambda r: in_window(r, *WINDOW),
    ),
    "since": (
        ["--since", "2026-11-29T00:05:11Z"],
        lambda r: in_window(r, "2026-11-29T00:05:11Z", None),
    ),
    "until": (
        ["--until", "2026-11-29T00:05:03Z"],
        lambda r: in_window(r, None, "2026-11-29T00:05:03Z"),
    ),
    "a tool in a window": (
        ["--tool", "search", "--since", WINDOW[0], "--until", "2026-11-29T00:05:09Z"],
        lambda r: (
            r["type"].startswith("tool_")
            and r["data"].get("name") == "search"
            and in_window(r, WINDOW[0], "2026-11-29T00:05:09Z")
        ),
    ),
    "a run": (["--run", 'run-"q"'], lambda r: (r["run_id"] or "").startswith('run-"q"')),
}


@pytest.fixture(scope="module")
def tricky(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tricky")
    head = '{"session_id":"' + "a" * 32 + '","seq":%d,'
    lines = [head % seq + body + "}\n" for seq, body in enumerate(TRICKY, 1)]
    unfinished = head % (len(TRICKY) + 1) + UNFINISHED + "}"
    (directory / "tricky.jsonl").write_text("".join(lines) + unfinished)
    return directory


@pytest.mark.parametrize("question", TRICKY_QUESTIONS)
def test_find_misses_no_line_however_it_is_spelled(tricky: Path, question: str) -> None:
    args, keep = TRICKY_QUESTIONS[question]
    expected = oracle([tricky / "tricky.jsonl"], lambda record, meta: keep(record))
    assert expected, "every question has an answer in the file"
    got = found(find(*args, "--json", str(tricky)))
    assert got == expected


# The fast paths of the exact test and of the time prefilter, against what they stand for.
moments = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)
seconds = moments.map(lambda moment: format_time(moment)[:19])


@given(st.none() | seconds, st.none() | seconds, seconds)
def test_the_pattern_of_seconds_holds_those_between_its_bounds(
    low: str | None, high: str | None, second: str
) -> None:
    inside = (low is None or low <= second) and (high is None or second <= high)
    assert (re.fullmatch(_between(low, high), second) is not None) == inside


@given(
    st.none() | moments,
    st.none() | moments,
    seconds,
    st.text("0123456789", max_size=10),
    st.sampled_from(["", "2026-02-29", "2024-02-29", "0000-01-01", "2026-13-01", "2026-04-31"]),
)
def test_a_time_in_the_writers_form_is_compared_as_parse_time_reads_it(
    since: datetime | None, until: datetime | None, second: str, fraction: str, date: str
) -> None:
    text = (date + second[10:] if date else second) + ("." + fraction if fraction else "") + "Z"
    try:
        moment = parse_time(text)
    except ValueError:
        expected = False
    else:
        expected = (since is None or since <= moment) and (until is None or moment < until)
    assert Query(since=since, until=until)._in_time(text) == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--meta", "team"], "--meta takes KEY=VALUE"),
        (["--since", "yesterday"], "--since takes an RFC 3339 UTC time"),
        (["--type", "tool_end"], "unknown record type"),
        (["-n", "0"], "--limit takes a number"),
        (["/nonexistent/dir"], "no such file or directory"),
        (["--error", "--no-error"], "not allowed with"),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    result = find(*args)
    assert result.returncode == 2
    assert message in result.stderr


def test_the_benchmark_runs_and_its_tools_agree() -> None:
    # Speeds are never asserted; the bench itself checks that the tools count the same.
    result = subprocess.run(
        # One timed run of each command (three by default): each row, its count checked.
        [sys.executable, "-m", "bench.find", "--gigabytes", "0.002", "--runs", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "| failed tool calls | grep -c |" in result.stdout
    assert "| failed tool calls | jq |" in result.stdout


def test_the_text_benchmark_times_every_row_and_the_counts_agree() -> None:
    # With --before this very tree: four rows of find (bytecode, compiling; after,
    # before) and grep, each counting the same matches (the bench checks that).
    bench = ["-m", "bench.find_text", "--gigabytes", "0.002", "--runs", "1"]
    result = subprocess.run(
        [sys.executable, *bench, "--before", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")][2:]
    assert [row.split(" | ")[0] for row in rows] == [
        "| flightlog find --text",
        "| flightlog find --text, compiling each run",
        "| flightlog find --text, before",
        "| flightlog find --text, before, compiling each run",
        "| grep -c",
    ]


@pytest.mark.parametrize("command", ["find", "export"])
def test_help_has_examples_and_exit_codes(command: str) -> None:
    from flightlog.cli._main import EXIT_CODES

    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "examples:" in result.stdout and "exit status:" in result.stdout
    for code in EXIT_CODES:
        assert f"\n  {code:<4} " in result.stdout
