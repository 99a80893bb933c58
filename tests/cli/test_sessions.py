"""``flightlog sessions`` and ``flightlog.sdk.price``: sessions a real daemon recorded,
listed with their state, tokens and cost (priced by genai-prices itself as the oracle)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import genai_prices
import pytest

from flightlog.protocol import events
from flightlog.sdk import MissingExtra, Price, Total, connect, price
from support import DaemonProcess

KILLED = """
import os, signal, sys
from flightlog.protocol import events
from flightlog.sdk import connect
with connect(sys.argv[1]) as client:
    session = client.create("b/killed.jsonl", meta={"name": "crash test"})
    run = session.begin_run()
    run.record(events.AgentStart(agent="crasher"))
    session.sync()
    os.kill(os.getpid(), signal.SIGKILL)
"""

USAGE = {"input_tokens": 12_000, "output_tokens": 800, "cache_read_tokens": 4_000}


def model_call(run: Any, id: str, model: str, provider: str | None, usage: dict[str, int]) -> None:
    execution = events.Execution(id=id, kind="model")
    run.record(events.ModelExecStart(execution=execution, model=model, provider=provider))
    run.record(events.ModelExecEnd(execution=execution, usage=events.Usage(**usage)))


@pytest.fixture(scope="module")
def daemon(module_daemon: DaemonProcess) -> Iterator[DaemonProcess]:
    """The module's flightlogd, and the sessions its tests list."""
    daemon = module_daemon
    with connect(daemon.socket) as client:
        session = client.create("a/priced.jsonl", meta={"name": "priced", "app": "t"})
        with session.begin_run() as run:
            run.record(events.AgentStart(agent="planner"))
            model_call(run, "m1", "claude-sonnet-4-5", "anthropic", USAGE)
            model_call(run, "m2", "gpt-4o", "openai", {"input_tokens": 500, "output_tokens": 50})
        with session.begin_run() as run:
            run.record(events.AgentStart(agent="writer"))
        session.close()
        session = client.create("c/unknown.jsonl", meta={"app": "t"})
        with session.begin_run() as run:
            model_call(run, "m1", "house-model-7", None, {"input_tokens": 10, "output_tokens": 1})
            model_call(run, "m2", "gpt-4o", "openai", {"input_tokens": 500, "output_tokens": 50})
        session.close()
    killed = subprocess.run(
        [sys.executable, "-c", KILLED, daemon.socket],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    damaged = daemon.root / "d" / "damaged.jsonl"
    damaged.parent.mkdir()
    lines = (daemon.root / "a" / "priced.jsonl").read_text().splitlines(keepends=True)
    damaged.write_text("".join(lines[:3]) + "{not json\n" + "".join(lines[3:]))
    yield daemon


def sessions(daemon: DaemonProcess, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "sessions", "--json", *args],
        env={**os.environ, "FLIGHTLOG_SOCKET": daemon.socket, "FLIGHTLOG_ROOT": str(daemon.root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in result.stdout.splitlines()]


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {Path(row["path"]).name: row for row in rows}


def expected(model: str, provider: str, usage: dict[str, int]) -> Decimal:
    found = genai_prices.calc_price(
        genai_prices.Usage(**usage), model_ref=model, provider_id=provider
    )
    return Decimal(found.total_price)


def test_states_tokens_and_cost(daemon: DaemonProcess) -> None:
    with connect(daemon.socket) as client:  # a writer holding a run open
        live = client.create("e/live.jsonl", meta={"name": "live"})
        run = live.begin_run()
        run.record(events.AgentStart(agent="live-agent"))
        live.sync()
        rows = by_name(sessions(daemon))
        run.close()
        live.close()
    assert {name: row["state"] for name, row in rows.items()} == {
        "priced.jsonl": "complete",
        "unknown.jsonl": "complete",
        "killed.jsonl": "interrupted",
        "live.jsonl": "open",
        "damaged.jsonl": "damaged",
    }
    priced = rows["priced.jsonl"]
    assert priced["name"] == "priced" and priced["runs"] == 2
    assert priced["agents"] == ["planner", "writer"]
    assert priced["tokens"] == {
        "input_tokens": 12_500,
        "output_tokens": 850,
        "cache_read_tokens": 4_000,
        "cache_write_tokens": 0,
    }
    cost = expected("claude-sonnet-4-5", "anthropic", USAGE) + expected(
        "gpt-4o", "openai", {"input_tokens": 500, "output_tokens": 50}
    )
    assert priced["cost"] == {
        "amount": float(cost),
        "currency": "USD",
        "priced_calls": 2,
        "unknown_calls": 0,
        "sources": {
            f"genai-prices {genai_prices.__version__}: anthropic/claude-sonnet-4-5": 1,
            f"genai-prices {genai_prices.__version__}: openai/gpt-4o": 1,
        },
    }
    unknown = rows["unknown.jsonl"]["cost"]
    assert (unknown["priced_calls"], unknown["unknown_calls"]) == (1, 1)
    assert rows["killed.jsonl"]["interrupted_runs"] and rows["killed.jsonl"]["name"] == "crash test"
    assert rows["damaged.jsonl"]["error"].startswith("line 4: ")
    assert rows["live.jsonl"]["interrupted_runs"] == []


def test_newest_first_and_filters(daemon: DaemonProcess) -> None:
    rows = sessions(daemon)
    times = [row["last_activity"] for row in rows]
    assert times == sorted(times, reverse=True)
    # The damaged copy is read up to its corrupt line 4: the writer's run is past it.
    assert list(by_name(sessions(daemon, "--agent", "writer"))) == ["priced.jsonl"]
    assert sorted(by_name(sessions(daemon, "--agent", "planner"))) == [
        "damaged.jsonl",
        "priced.jsonl",
    ]
    assert list(by_name(sessions(daemon, "--state", "interrupted"))) == ["killed.jsonl"]
    assert sorted(by_name(sessions(daemon, "--meta", "name=priced"))) == [
        "damaged.jsonl",
        "priced.jsonl",
    ]
    assert len(sessions(daemon, "-n", "2")) == 2
    assert sessions(daemon, "--since", "2999-01-01T00:00:00Z") == []
    assert sessions(daemon, "--until", "2000-01-01T00:00:00Z") == []


def test_table_says_unknown_and_lower_bound(daemon: DaemonProcess) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "sessions", str(daemon.root / "c")],
        env={**os.environ, "FLIGHTLOG_SOCKET": daemon.socket},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [header, line, prices] = result.stdout.splitlines()
    assert header.split()[:3] == ["LAST", "ACTIVITY", "STATE"]
    assert "complete" in line and "≥ $0.00" in line and "unknown.jsonl" in line
    assert prices.startswith("prices: ") and "unknown model 'house-model-7' (1 call)" in prices


def test_price_never_reads_an_unknown_model_as_free() -> None:
    unknown = price({"input_tokens": 10}, "house-model-7")
    assert unknown is not None and unknown.amount is None and not unknown.known
    assert unknown.source == "unknown model 'house-model-7'"
    known = price(USAGE, "claude-sonnet-4-5", "anthropic")
    assert known is not None and known.amount == expected("claude-sonnet-4-5", "anthropic", USAGE)
    assert known.source.endswith("anthropic/claude-sonnet-4-5")
    # No usage: unknown when the call responded, nothing to price when it did not.
    assert price(None, "gpt-4o") == Price(None, "no usage recorded")
    assert price({"input_tokens": 0}, "gpt-4o") == Price(None, "no usage recorded")
    assert price(None, "gpt-4o", response=False) is None
    assert price({"input_tokens": 5}, None) == price({"input_tokens": 5}, "")
    assert Total.of([unknown]).text() == "unknown"
    assert Total.of([known, unknown]).text().startswith("≥ $")


def test_without_genai_prices(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['genai_prices'] = None\n"
        "from flightlog.sdk import MissingExtra, price\n"
        "try:\n    price({'input_tokens': 1}, 'gpt-4o')\n"
        "except MissingExtra as exc:\n    print(exc.code, exc.extra)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["missing_extra", "cost"]
    assert issubclass(MissingExtra, Exception)
