"""``flightlog find`` on a generated corpus of sessions, against the same question answered
by reading every file with ``flightlog.sdk.read`` and filtering the decoded records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from flightlog.protocol import parse_time
from flightlog.sdk import read

ROOT = Path(__file__).resolve().parents[2]
# The corpus generator is the benchmark's: a top-level package of the repository.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._find import Corpus, write_corpus  # noqa: E402


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
        return bool(data.get("is_error")) or data.get("disposition", "ran") != "ran"
    if type == "agent_end":
        return data.get("ok") is False
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
        [sys.executable, "-m", "bench.find", "--gigabytes", "0.002"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "| failed tool calls | grep -c |" in result.stdout
    assert "| failed tool calls | jq |" in result.stdout


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
