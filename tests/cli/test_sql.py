"""``flightlog sql`` and ``flightlog.sdk.sql``: DuckDB over real session files.

The sessions are recorded by a real daemon (the demo agent, and an agent killed with
SIGKILL in the middle of a tool call) beside a generated corpus of older sessions; every
answer is checked against the same question answered by reading the files with
``flightlog.sdk.read``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from bench._find import write_corpus
from flightlog.cli import run as cli_run
from flightlog.protocol import parse_time
from flightlog.sdk import MissingExtra, read, sql, sql_connection
from support import DaemonProcess
from support.daemon import as_uid

REPO = Path(__file__).resolve().parents[2]

KILLED_AGENT = """
import os, signal, sys
from flightlog.protocol import events
from flightlog.sdk import connect

with connect(sys.argv[1]) as client:
    session = client.create(sys.argv[2], meta={"app": "killed"})
    run = session.begin_run()
    run.record(events.AgentStart(agent="crasher"))
    m = events.Execution(id="m1", kind="model", turn_index=0)
    run.record(events.ModelRequest(execution=m, messages=[events.UserMessage(content="go\\nnow")]))
    run.record(events.ModelExecStart(execution=m, model="model-k"))
    run.record(events.ModelExecEnd(execution=m, usage=events.Usage(input_tokens=7)))
    t = events.Execution(id="call_k1", kind="tool", parent_id="m1", turn_index=0)
    run.record(events.ToolExecStart(execution=t, tool_call_id="call_k1", name="slow_tool"))
    session.sync()
    os.kill(os.getpid(), signal.SIGKILL)
"""


@dataclass
class Call:
    path: str
    kind: str
    name: str | None = None
    started: datetime | None = None
    first: datetime | None = None
    ended: datetime | None = None
    status: str = "open"
    error: str | None = None
    tokens: Counter[str] = field(default_factory=Counter)
    retried: bool = False

    @property
    def start(self) -> datetime:
        moment = self.started or self.first
        assert moment is not None
        return moment


@dataclass
class Oracle:
    """What the files hold, read with ``flightlog.sdk.read``."""

    records: int = 0
    calls: dict[tuple[str, str, str, int, str], Call] = field(default_factory=dict)
    runs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    agents: dict[str, list[tuple[str, datetime]]] = field(default_factory=dict)

    def add(self, path: str) -> None:
        for record in read(path):
            self.records += 1
            data = record.decode_data()
            moment = parse_time(record.time)
            if record.run_id is not None:
                run = self.runs.setdefault((path, record.run_id), {"closed": False, "retries": 0})
                run["closed"] |= record.type == "run_close"
                run["retries"] += record.type == "retry"
            if record.type == "agent_start":
                self.agents.setdefault(data["agent"], []).append((path, moment))
            execution = data.get("execution") if isinstance(data, dict) else None
            if not execution or record.run_id is None:
                continue
            key = (path, record.run_id, execution["id"], execution["attempt"], execution["kind"])
            call = self.calls.setdefault(key, Call(path, execution["kind"]))
            call.first = call.first or moment
            if record.type.startswith("tool_"):
                call.name = data["name"]
            elif record.type == "model_exec_start":
                call.name = data["model"]
            if record.type in ("model_exec_start", "tool_exec_start"):
                call.started = moment
            call.retried |= record.type == "retry"
            if record.type == "model_exec_end":
                call.ended = moment
                call.status, call.error = (
                    ("error", data["error"]) if data["error"] else ("ok", None)
                )
                call.tokens.update(
                    {k: v for k, v in (data["usage"] or {}).items() if k.endswith("_tokens")}
                )
            if record.type == "tool_exec_end":
                call.ended = moment
                text = "".join(p.get("text", "") for p in data["content"])
                if data["disposition"] not in (None, "ran"):
                    call.status = data["disposition"]
                elif data["is_error"]:
                    call.status, call.error = "error", text
                else:
                    call.status = "ok"

    def duration(self, call: Call) -> float:
        assert call.ended is not None
        return (call.ended - call.start) / timedelta(milliseconds=1)


@pytest.fixture(scope="module")
def corpus(module_daemon: DaemonProcess) -> Iterator[tuple[Path, Oracle]]:
    daemon = module_daemon
    env = {"FLIGHTLOG_SOCKET": daemon.socket, "FLIGHTLOG_ROOT": str(daemon.root)}
    demo = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "demo", "--fast", "--no-start"],
        env={**os.environ, **env},
        capture_output=True,
        check=False,
    )
    assert demo.returncode == 0, demo.stderr
    agent = subprocess.run(
        [sys.executable, "-c", KILLED_AGENT, daemon.socket, "killed/session.jsonl"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    write_corpus(daemon.root / "old", 300_000)
    # A crash's unfinished last line is never read, even when it is valid JSON.
    old = sorted((daemon.root / "old").rglob("*.jsonl"))[0]
    last = json.loads(old.read_text().splitlines()[-1])
    with old.open("a") as fileobj:
        fileobj.write(json.dumps({**last, "seq": last["seq"] + 1, "type": "retry"}))
    daemon.stop()  # every file complete before it is read
    oracle = Oracle()
    for path in sorted(daemon.root.rglob("*.jsonl")):
        oracle.add(str(path))
    yield daemon.root, oracle


def query(root: Path, text: str, *options: str) -> str:
    """``flightlog sql`` in this process, its stdout."""
    out = io.StringIO()
    saved, sys.stdout = sys.stdout, out
    try:
        status = cli_run(["sql", *options, text, str(root)])
    finally:
        sys.stdout = saved
    assert status == 0, out.getvalue()
    return out.getvalue()


def rows(root: Path, text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in query(root, text, "--json").splitlines()]


# ---------------------------------------------------------------- the views


def test_records_are_every_complete_line(corpus: tuple[Path, Oracle]) -> None:
    root, oracle = corpus
    assert sql("SELECT count(*) FROM records", [root]).rows == [(oracle.records,)]
    # The unfinished tail is a retry: no retry of the corpus is read.
    corpus_retries = sql(
        "SELECT count(*) FROM records WHERE type = 'retry' AND path LIKE ?",
        [root],
        parameters=[f"{root}/old/%"],
    )
    assert corpus_retries.rows == [(0,)]


def test_calls_pair_starts_and_ends(corpus: tuple[Path, Oracle]) -> None:
    root, oracle = corpus
    got = {
        (r["path"], r["run_id"], r["execution_id"], r["attempt"], r["kind"]): r
        for r in sql("SELECT * FROM calls", [root]).dicts()
    }
    assert got.keys() == oracle.calls.keys()
    for key, call in oracle.calls.items():
        row = got[key]
        assert (row["name"], row["status"], row["error"]) == (call.name, call.status, call.error)
        assert row["started"] == call.start
        assert row["ended"] == call.ended
        assert row["retried"] == call.retried
        if call.kind == "model":
            assert row["input_tokens"] == call.tokens.get(
                "input_tokens", 0 if call.tokens else None
            )


def test_runs_and_sessions(corpus: tuple[Path, Oracle]) -> None:
    root, oracle = corpus
    runs = {(r["path"], r["run_id"]): r for r in sql("SELECT * FROM runs", [root]).dicts()}
    assert runs.keys() == oracle.runs.keys()
    for key, expected in oracle.runs.items():
        assert (runs[key]["closed"], runs[key]["retries"]) == (
            expected["closed"],
            expected["retries"],
        )
    killed = [r for r in runs.values() if r["path"].endswith("killed/session.jsonl")]
    assert [(r["closed"], r["agent"]) for r in killed] == [(False, "crasher")]
    sessions = sql("SELECT path, runs, meta FROM sessions", [root]).dicts()
    assert len(sessions) == len({path for path, _ in oracle.runs})
    demo = next(s for s in sessions if s["path"].endswith("demo/session.jsonl"))
    assert json.loads(demo["meta"])["app"] == "flightlog-demo"


def test_messages_hold_each_recorded_message(corpus: tuple[Path, Oracle]) -> None:
    root, _ = corpus
    asked = sql(
        "SELECT text FROM messages WHERE source = 'model_request' AND role = 'user' "
        "AND path LIKE '%killed%'",
        [root],
    )
    assert asked.rows == [("go\nnow",)]
    first = sql(
        "SELECT text FROM messages WHERE source = 'agent_start' AND path LIKE '%demo%'", [root]
    )
    assert first.rows == [("Is tomorrow better for a long walk in Paris or in Lisbon?",)]


# ---------------------------------------------------------------- ready queries


def ready_queries() -> list[str]:
    text = (REPO / "docs" / "cli.md").read_text()
    section = text.split("#### Ten ready queries", 1)[1].split("\n### ", 1)[0]
    return [
        re.sub(r"\n\s+", "\n", q).strip() for q in re.findall(r"```sql\n(.*?)```", section, re.S)
    ]


def test_ten_ready_queries_are_documented() -> None:
    assert len(ready_queries()) == 10


def _by(items: list[Call], key: Any) -> dict[Any, list[Call]]:
    grouped: dict[Any, list[Call]] = defaultdict(list)
    for item in items:
        grouped[key(item)].append(item)
    return grouped


@pytest.mark.parametrize("number", range(1, 11))
def test_ready_query(corpus: tuple[Path, Oracle], number: int) -> None:
    root, oracle = corpus
    got = rows(root, ready_queries()[number - 1])
    calls = list(oracle.calls.values())
    tools = [c for c in calls if c.kind == "tool"]
    models = [c for c in calls if c.kind == "model"]
    now = datetime.now(UTC)
    if number == 1:
        failed = [
            c for c in tools if c.status not in ("ok", "open") and c.start > now - timedelta(days=1)
        ]
        assert failed, "the demo's timed-out tool call"
        assert sorted((r["name"], r["error"]) for r in got) == sorted(
            (c.name, c.error) for c in failed
        )
    elif number == 2:
        expected = {
            name: sum(c.tokens["input_tokens"] for c in group)
            for name, group in _by(models, lambda c: c.name).items()
        }
        assert {r["model"]: r["input"] for r in got} == expected
        assert [r["input"] for r in got] == sorted(expected.values(), reverse=True)
    elif number == 3:
        expected3 = Counter()
        for c in models:
            expected3[(c.start.date().isoformat(), c.name)] += (
                c.tokens["input_tokens"] + c.tokens["output_tokens"]
            )
        assert {(r["day"][:10], r["model"]): r["tokens"] for r in got} == dict(expected3)
    elif number == 4:
        durations = sorted((oracle.duration(c) for c in calls if c.ended), reverse=True)[:10]
        assert [r["duration_ms"] for r in got] == pytest.approx(durations, abs=0.002)
    elif number == 5:
        ended = _by([c for c in tools if c.ended], lambda c: c.name)
        assert {r["name"]: (r["calls"], r["p50"]) for r in got} == {
            name: (len(g), pytest.approx(statistics.median(map(oracle.duration, g)), abs=0.002))
            for name, g in ended.items()
        }
    elif number == 6:
        done = _by([c for c in tools if c.status != "open"], lambda c: c.name)
        assert {r["name"]: (r["calls"], r["failed"]) for r in got} == {
            name: (len(g), sum(c.status != "ok" for c in g)) for name, g in done.items()
        }
    elif number == 7:
        assert [(Path(r["path"]).parent.name, r["runs"]) for r in got] == [("demo", 1)]
        assert oracle.agents["trip-planner"][0][0] == got[0]["path"]
    elif number == 8:
        expected8 = {key: run["retries"] for key, run in oracle.runs.items() if run["retries"]}
        assert {(r["path"], r["run_id"]): r["retries"] for r in got} == expected8
    elif number == 9:
        assert [
            (Path(r["path"]).parent.name, r["kind"], r["name"], r["execution_id"]) for r in got
        ] == [("killed", "tool", "slow_tool", "call_k1")]
    else:
        expected10 = Counter(c.error for c in models if c.status == "error")
        assert expected10, "the demo's rate-limited model call"
        assert {r["error"]: r["calls"] for r in got} == dict(expected10)


# ---------------------------------------------------------------- output


def test_csv_parquet_and_table(corpus: tuple[Path, Oracle], tmp_path: Path) -> None:
    root, oracle = corpus
    text = "SELECT kind, count(*) AS n FROM calls GROUP BY kind ORDER BY kind"
    expected = sorted(Counter(c.kind for c in oracle.calls.values()).items())
    assert list(csv.reader(io.StringIO(query(root, text, "--csv")))) == [
        ["kind", "n"],
        *([k, str(n)] for k, n in expected),
    ]
    target = tmp_path / "calls.parquet"
    query(root, text, "--parquet", str(target))
    assert duckdb.sql(f"SELECT * FROM '{target}' ORDER BY kind").fetchall() == expected
    table = query(root, "SELECT text FROM messages WHERE path LIKE '%killed%'")
    assert "go\\nnow" in table and "go\nnow" not in table
    assert "(1 row)" in table


def test_json_embeds_json_columns(corpus: tuple[Path, Oracle]) -> None:
    root, _ = corpus
    [row] = rows(root, "SELECT meta, started FROM sessions WHERE path LIKE '%killed%'")
    assert row["meta"] == {"app": "killed"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", row["started"])


def test_schema_lists_every_view(corpus: tuple[Path, Oracle]) -> None:
    root, _ = corpus
    schema = query(root, "", "--schema")
    for view in ("records", "sessions", "runs", "calls", "messages"):
        assert f"\n{view}\n" in f"\n{schema}"


def test_bad_query_is_a_usage_error(
    corpus: tuple[Path, Oracle], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = corpus
    assert cli_run(["sql", "SELECT nope FROM calls", str(root)]) == 2
    assert "the query failed" in capsys.readouterr().err


# ---------------------------------------------------------------- what is read


def test_damaged_line_skips_only_itself(tmp_path: Path, corpus: tuple[Path, Oracle]) -> None:
    root, _ = corpus
    source = next((root / "demo").glob("*.jsonl"))
    damaged = tmp_path / "damaged.jsonl"
    lines = source.read_text().splitlines(keepends=True)
    damaged.write_text("".join(lines[:3]) + "{not json\n" + "".join(lines[3:]))
    assert sql("SELECT count(*) FROM records", [damaged]).rows == [(len(lines),)]


def test_no_files_is_no_rows(tmp_path: Path) -> None:
    connection, skipped = sql_connection([tmp_path])
    try:
        for view in ("records", "sessions", "runs", "calls", "messages"):
            assert connection.execute(f"SELECT count(*) FROM {view}").fetchall() == [(0,)]
    finally:
        connection.close()
    assert skipped == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another uid")
def test_a_uid_sees_only_what_it_may_read(short_tmp: Path, corpus: tuple[Path, Oracle]) -> None:
    root, _ = corpus
    tmp_path = short_tmp
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    source = next((root / "demo").glob("*.jsonl"))
    shutil.copy(source, mine / "a.jsonl")
    shutil.copy(source, theirs / "b.jsonl")
    os.chmod(tmp_path, 0o755)
    os.chown(mine, 65534, 65534)
    os.chown(mine / "a.jsonl", 65534, 65534)
    os.chmod(theirs / "b.jsonl", 0o600)

    def query() -> tuple[list[str], list[str]]:
        result = sql("SELECT DISTINCT path FROM records", [tmp_path])
        return sorted(path for (path,) in result.rows), sorted(result.skipped)

    seen, skipped = as_uid(65534, query)
    assert seen == [str(mine / "a.jsonl")]
    assert skipped == [str(theirs / "b.jsonl")]


def test_without_duckdb_the_error_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['duckdb'] = None\n"
        "from flightlog.sdk import MissingExtra, sql\n"
        "try:\n    sql('SELECT 1', [sys.argv[1]])\n"
        "except MissingExtra as exc:\n    print(exc.code, exc.extra, str(exc))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert result.stdout.startswith("missing_extra sql ")
    assert "pip install 'flightlog-sdk[sql]'" in result.stdout
    assert issubclass(MissingExtra, Exception)
