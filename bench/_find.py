"""``flightlog find``'s scan rate against ``grep -c`` and ``jq`` over the same files.

``uv run python -m bench.find [--gigabytes 1]`` writes a corpus of realistic sessions
(agent runs with model calls, tool calls of several tools, some of them failing) into a
temporary directory, then answers the same questions with each tool, after one warm-up
pass so that every tool reads from the page cache:

* failed tool calls: ``find --type tool_exec_end --error``, ``grep -c '"is_error":true'``
  (the corpus has no other line with it), ``jq`` selecting on type and ``is_error``;
* one tool's calls: ``find --tool search``, ``grep -c '"name":"search"'`` (which also
  counts the model responses that asked for the tool);
* a 20-second time window (``find --since ... --until ...``): no value to look for, but
  the time is read from each line's bytes and only lines inside the window are decoded;
  ``jq`` compares the time strings (the corpus writes 6 fraction digits).
* a phrase in any content (``find --text 'timed out'``, against ``grep -c``): only the
  failed tool results say it.

Where DuckDB is installed (``flightlog-sdk[sql]``), ``flightlog sql`` answers the first
and the third question too, and one that only SQL answers: tokens by model, an
aggregate over every model call (``jq`` with ``group_by`` for comparison).

It checks that the tools count the same records, and prints MB/s (best of three).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

from flightlog.protocol import (
    Event,
    Execution,
    Record,
    default_codec,
    format_time,
)
from flightlog.protocol.events import (
    AgentEnd,
    AgentStart,
    AssistantMessage,
    CallConfig,
    ModelExecEnd,
    ModelExecStart,
    ModelRequest,
    TextPart,
    ToolCallPart,
    ToolExecEnd,
    ToolExecStart,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
)
from flightlog.protocol.format import (
    append_line,
)

__all__ = ["Corpus", "main", "write_corpus"]

TOOLS = ("read_file", "search", "run_tests", "get_weather")
MODELS = ("claude-x", "gpt-y")
#: The first record's time; each record is 100 ms after the one before, per session.
EPOCH = datetime(2026, 11, 29, tzinfo=UTC)


@dataclass
class Corpus:
    """What was written: the directory, its size, and the counts the questions expect."""

    directory: Path
    bytes: int
    records: int
    failed_tool_calls: int
    search_calls: int


def _run_events(rng: random.Random, turns: int) -> list[Event]:
    """One agent run: per turn, a model call that asks for a tool, and the tool call."""
    question = UserMessage(content=f"Task {rng.randrange(10**6)}: " + "look into it. " * 20)
    events: list[Event] = [AgentStart(agent="bench-agent", messages=[question])]
    history: list[object] = [question]
    for turn in range(turns):
        model = rng.choice(MODELS)
        tool = rng.choice(TOOLS)
        call_id = f"call_{turn}_{rng.randrange(10**6)}"
        m = Execution(id=f"m{turn}", kind="model", turn_index=turn)
        t = Execution(id=f"t{turn}", kind="tool", parent_id=m.id, turn_index=turn)
        reply = AssistantMessage(
            content=[
                TextPart(text="Let me check that. " * 5),
                ToolCallPart(id=call_id, name=tool, arguments={"query": f"q{turn}"}),
            ],
            model=model,
            stop_reason="tool_use",
        )
        failed = rng.random() < 0.05
        events += [
            TurnStart(turn_index=turn),
            ModelRequest(execution=m, messages=history[-4:], config=CallConfig(model=model)),
            ModelExecStart(execution=m, model=model),
            ModelExecEnd(
                execution=m,
                message=reply,
                usage=Usage(input_tokens=rng.randrange(100, 4000), output_tokens=80),
            ),
            ToolExecStart(execution=t, tool_call_id=call_id, name=tool, arguments={"q": turn}),
            ToolExecEnd(
                execution=t,
                tool_call_id=call_id,
                name=tool,
                content=[TextPart(text="timed out" if failed else "result " * 30)],
                is_error=failed,
            ),
            TurnEnd(turn_index=turn, stop_reason="tool_use", message_count=2),
        ]
        history.append(reply)
    events.append(AgentEnd(ok=True, reason="completed", turns=turns))
    return events


class _SessionWriter:
    """The lines of one session file, each record 100 ms after the one before."""

    def __init__(self, session_id: str, index: int) -> None:
        self.session_id = session_id
        self.buf = bytearray()
        self.seq = 0
        self.moment = EPOCH + timedelta(seconds=index)

    def add(self, type: str, run_id: str | None, data: bytes) -> None:
        self.seq += 1
        self.moment += timedelta(milliseconds=100)
        record = Record(
            session_id=self.session_id,
            seq=self.seq,
            type=type,
            time=format_time(self.moment),
            run_id=run_id,
            data=msgspec.Raw(data),
        )
        append_line(self.buf, record)


def write_corpus(directory: Path, total_bytes: int, *, seed: int = 7) -> Corpus:
    """Sessions of about 1 MB (smaller for a small total) until ``total_bytes``."""
    rng = random.Random(seed)
    # Encoding is the slow part: a pool of encoded runs, reused under new ids and seqs.
    pool = []
    for _ in range(24):
        encoded = []
        for event in _run_events(rng, turns=rng.randrange(2, 8)):
            done = default_codec.encode_event(event)
            assert done is not None
            encoded.append((done.type, done.data, event))
        pool.append(encoded)
    session_bytes = min(1 << 20, max(total_bytes // 8, 16 << 10))
    written = records = failed = searches = 0
    index = 0
    encoder = msgspec.json.Encoder()
    while written < total_bytes:
        session = _SessionWriter(uuid.UUID(int=rng.getrandbits(128)).hex, index)
        path = directory / f"team-{index % 8}" / f"session-{index:05d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"team": f"team-{index % 8}", "app": "bench"}
        session.add("session_start", None, encoder.encode({"format_version": 1, "meta": meta}))
        while len(session.buf) < session_bytes:
            run_id = uuid.UUID(int=rng.getrandbits(128)).hex
            session.add("run_start", run_id, b'{"pid":4242,"client":"bench"}')
            for type, data, event in rng.choice(pool):
                session.add(type, run_id, data)
                if isinstance(event, ToolExecEnd):
                    failed += event.is_error
                if isinstance(event, ToolExecStart | ToolExecEnd) and event.name == "search":
                    searches += 1
            session.add("run_close", run_id, b'{"error":null}')
        path.write_bytes(session.buf)
        written += len(session.buf)
        records += session.seq
        index += 1
    return Corpus(directory, written, records, failed, searches)


def _best(command: Sequence[str], runs: int = 3) -> tuple[float, str]:
    """The best wall time of ``command`` over ``runs`` runs (after a warm-up), and its
    output."""
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        best = min(best, time.perf_counter() - start)
    return best, output


def _shell(script: str) -> list[str]:
    return ["sh", "-c", script]


def _rate(corpus: Corpus, seconds: float) -> str:
    return f"{corpus.bytes / seconds / 1e6:,.0f} MB/s ({seconds:.2f} s)"


def _measure_sql(
    measure: Callable[[str, str, list[str], int | None], None],
    root: str,
    corpus: Corpus,
    since: str,
    until: str,
    window: int | None,
    *,
    jq: bool,
) -> None:
    """The same questions through ``flightlog sql``, and tokens by model."""

    def sql(query: str) -> list[str]:
        return [sys.executable, "-m", "flightlog.cli", "sql", "--csv", query, root]

    measure(
        "failed tool calls",
        "flightlog sql",
        sql("SELECT count(*) FROM calls WHERE kind = 'tool' AND status = 'error'"),
        corpus.failed_tool_calls,
    )
    measure(
        "a 20 s time window",
        "flightlog sql",
        sql(f"SELECT count(*) FROM records WHERE time >= '{since}' AND time < '{until}'"),
        window,
    )
    tokens = "tokens by model"
    measure(
        tokens,
        "flightlog sql",
        sql(
            "SELECT count(DISTINCT name) FROM (SELECT name, sum(input_tokens) FROM calls "
            "WHERE kind = 'model' GROUP BY name)"
        ),
        len(MODELS),
    )
    if jq:
        script = (
            "find " + root + " -name '*.jsonl' -print0 | xargs -0 cat | jq -c "
            '\'select(.type == "model_exec_end") | [.data.message.model, '
            ".data.usage.input_tokens]' | jq -s 'group_by(.[0]) | length'"
        )
        measure(tokens, "jq", _shell(script), len(MODELS))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.find", description=__doc__)
    parser.add_argument("--gigabytes", type=float, default=1.0, help="corpus size (default: 1)")
    parser.add_argument("--no-jq", action="store_true", help="skip jq (slow on a big corpus)")
    parser.add_argument(
        "--runs", type=int, default=3, help="timed runs per command, after a warm-up (default: 3)"
    )
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="fl-find-"))
    try:
        start = time.perf_counter()
        corpus = write_corpus(directory, int(args.gigabytes * 1e9))
        print(
            f"corpus: {corpus.bytes / 1e6:,.0f} MB, {corpus.records:,} records in "
            f"{len(list(directory.rglob('*.jsonl'))):,} files, written in "
            f"{time.perf_counter() - start:.0f} s",
            file=sys.stderr,
        )
        flightlog = [sys.executable, "-m", "flightlog.cli", "find", str(directory)]
        root = str(directory)
        count = " | wc -l"
        rows: list[tuple[str, str, str, int]] = []

        def measure(question: str, tool: str, command: list[str], expected: int | None) -> None:
            seconds, output = _best(command, args.runs)
            got = int(output.split()[-1]) if output.split() else 0
            if expected is not None and got != expected:
                raise SystemExit(f"{tool} counted {got} for {question!r}, expected {expected}")
            rows.append((question, tool, _rate(corpus, seconds), got))
            print(f"  {question}: {tool}: {rows[-1][2]}", file=sys.stderr)

        failed = "failed tool calls"
        find_failed = " ".join([*flightlog, "--type", "tool_exec_end", "--error", "--json"])
        measure(failed, "flightlog find", _shell(find_failed + count), corpus.failed_tool_calls)
        grep = f"grep -rhcF '\"is_error\":true' {root} | awk '{{s+=$1}} END {{print s}}'"
        measure(failed, "grep -c", _shell(grep), corpus.failed_tool_calls)
        if not args.no_jq:
            jq = (
                "find " + root + " -name '*.jsonl' -print0 | xargs -0 cat | jq -c "
                "'select(.type == \"tool_exec_end\" and .data.is_error)'" + count
            )
            measure(failed, "jq", _shell(jq), corpus.failed_tool_calls)

        search = "one tool's calls"
        find_search = " ".join([*flightlog, "--tool", "search", "--json"])
        measure(search, "flightlog find", _shell(find_search + count), corpus.search_calls)
        grep = f"grep -rhcF '\"name\":\"search\"' {root} | awk '{{s+=$1}} END {{print s}}'"
        # grep also counts the model calls that asked for the tool: same bytes, more lines.
        measure(search, "grep -c", _shell(grep), None)

        window = "a 20 s time window"
        since = format_time(EPOCH + timedelta(seconds=300))
        until = format_time(EPOCH + timedelta(seconds=320))
        find_window = " ".join([*flightlog, "--since", since, "--until", until, "--json"])
        expected: int | None = None
        if not args.no_jq:
            jq = (
                "find " + root + " -name '*.jsonl' -print0 | xargs -0 cat | jq -c "
                f'\'select(.time >= "{since}" and .time < "{until}")\'' + count
            )
            measure(window, "jq", _shell(jq), None)
            expected = rows[-1][3]
        measure(window, "flightlog find", _shell(find_window + count), expected)

        text = "a phrase in any content"
        find_text = " ".join([*flightlog, "--text", "'timed out'", "--json"])
        measure(text, "flightlog find --text", _shell(find_text + count), corpus.failed_tool_calls)
        grep = f"grep -rhcF 'timed out' {root} | awk '{{s+=$1}} END {{print s}}'"
        measure(text, "grep -c", _shell(grep), corpus.failed_tool_calls)

        if importlib.util.find_spec("duckdb") is not None:
            _measure_sql(measure, root, corpus, since, until, expected, jq=not args.no_jq)

        print("| question | tool | scan rate | matches |")
        print("| --- | --- | --- | --- |")
        for question, tool, rate, matches in rows:
            print(f"| {question} | {tool} | {rate} | {matches:,} |")
        print(
            f"\n{corpus.bytes / 1e6:,.0f} MB in {corpus.records:,} records; "
            f"{os.cpu_count()} CPUs; `uv run python -m bench.find --gigabytes {args.gigabytes:g} "
            f"--runs {args.runs}`"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0
