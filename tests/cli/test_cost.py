"""Cost everywhere: each model call, turn, run and session priced with genai-prices
(itself the oracle here, on its real data), cache reads and writes included, in
``show``, ``inspect``, ``sessions`` and the export's span attributes; an unknown model
says so instead of costing $0."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import genai_prices
import pytest

from flightlog.cli._spans import Span, SpanBuilder
from flightlog.protocol import events
from flightlog.sdk import Price, Total, connect, read
from support import DaemonProcess

CACHED = {
    "input_tokens": 20_000,
    "output_tokens": 900,
    "cache_read_tokens": 12_000,
    "cache_write_tokens": 3_000,
}
PLAIN = {"input_tokens": 500, "output_tokens": 50}
VERSION = genai_prices.__version__


def expected(model: str, provider: str, usage: dict[str, int]) -> Decimal:
    found = genai_prices.calc_price(
        genai_prices.Usage(**usage), model_ref=model, provider_id=provider
    )
    return Decimal(found.total_price)


def figure(amount: Decimal) -> str:
    return Total.of([Price(amount, "")]).text()


def model_call(
    run: Any, id: str, turn: int, model: str, provider: str | None, usage: dict[str, int]
) -> None:
    execution = events.Execution(id=id, kind="model", turn_index=turn)
    run.record(events.ModelExecStart(execution=execution, model=model, provider=provider))
    run.record(events.ModelExecEnd(execution=execution, usage=events.Usage(**usage)))


@pytest.fixture(scope="module")
def recorded() -> Iterator[tuple[DaemonProcess, Path]]:
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    daemon = DaemonProcess(base).start()
    try:
        with connect(daemon.socket) as client:
            session = client.create("priced.jsonl", meta={"name": "priced"})
            with session.begin_run() as run:
                for turn, (id, model, provider, usage) in enumerate(
                    [
                        ("m1", "claude-sonnet-4-5", "anthropic", CACHED),
                        ("m2", "gpt-4o", "openai", PLAIN),
                    ]
                ):
                    run.record(events.TurnStart(turn_index=turn))
                    model_call(run, id, turn, model, provider, usage)
            with session.begin_run() as run:
                model_call(run, "m3", 0, "house-model-7", None, PLAIN)
            session.close()
        yield daemon, daemon.root / "priced.jsonl"
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def cli(daemon: DaemonProcess, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", *args],
        env={**os.environ, "FLIGHTLOG_SOCKET": daemon.socket, "FLIGHTLOG_ROOT": str(daemon.root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, 3), done.stderr
    return done.stdout


M1 = expected("claude-sonnet-4-5", "anthropic", CACHED)
M2 = expected("gpt-4o", "openai", PLAIN)
M1_SOURCE = f"genai-prices {VERSION}: anthropic/claude-sonnet-4-5"
M2_SOURCE = f"genai-prices {VERSION}: openai/gpt-4o"
UNKNOWN = "unknown model 'house-model-7'"


def test_cache_tokens_count() -> None:
    uncached = {k: v for k, v in CACHED.items() if not k.startswith("cache")}
    without_cache = expected("claude-sonnet-4-5", "anthropic", uncached)
    assert figure(without_cache) != figure(M1)  # the figures shown tell them apart


def test_show_prices_each_call_turn_run_and_the_session(
    recorded: tuple[DaemonProcess, Path],
) -> None:
    daemon, path = recorded
    text = cli(daemon, "show", str(path))
    lines = text.splitlines()
    m1 = next(line for line in lines if "model m1" in line)
    m3 = next(line for line in lines if "model m3" in line)
    assert figure(M1) in m1
    assert "cost unknown" in m3 and "$0" not in m3
    assert any("turn 0" in line and f"cost {figure(M1)}" in line for line in lines)
    assert any("turn 1" in line and f"cost {figure(M2)}" in line for line in lines)
    runs = [line for line in lines if line.startswith("run ")]
    assert f"cost {figure(M1 + M2)}" in runs[0]
    assert "cost unknown" in runs[1]
    assert f"cost ≥ {figure(M1 + M2)} (2 model calls priced, 1 not)" in text
    assert f"prices: {M1_SOURCE} (1 call) · {M2_SOURCE} (1 call) · {UNKNOWN} (1 call)" in text


def test_inspect_prices_each_run_and_the_session(recorded: tuple[DaemonProcess, Path]) -> None:
    daemon, path = recorded
    text = cli(daemon, "inspect", str(path))
    runs = [line for line in text.splitlines() if line.startswith("run ")]
    assert f"cost {figure(M1 + M2)}" in runs[0] and "cost unknown" in runs[1]
    assert f"cost ≥ {figure(M1 + M2)}" in text and M1_SOURCE in text and UNKNOWN in text


def test_sessions_shows_where_its_prices_come_from(recorded: tuple[DaemonProcess, Path]) -> None:
    daemon, path = recorded
    row = json.loads(cli(daemon, "sessions", "--json", str(path)))
    assert row["cost"] == {
        "amount": float(M1 + M2),
        "currency": "USD",
        "priced_calls": 2,
        "unknown_calls": 1,
        "sources": {M1_SOURCE: 1, M2_SOURCE: 1, UNKNOWN: 1},
    }
    text = cli(daemon, "sessions", str(path))
    assert f"≥ {figure(M1 + M2)}" in text and f"prices: {M1_SOURCE} (1 call)" in text


def exported(path: Path) -> tuple[list[Span], dict[str, Span]]:
    """The export's spans of ``path``, and its model calls' by execution id."""
    builder = SpanBuilder()
    spans: list[Span] = [span for record in read(path) for span in builder.add(record)]
    return spans, {
        span.attributes["flightlog.execution.id"]: span for span in spans if "chat" in span.name
    }


def test_the_export_carries_each_price_and_its_source(
    recorded: tuple[DaemonProcess, Path],
) -> None:
    _, path = recorded
    spans, calls = exported(path)
    assert calls["m1"].attributes["flightlog.cost.amount"] == float(M1)
    assert calls["m1"].attributes["flightlog.cost.source"] == M1_SOURCE
    assert calls["m1"].attributes["flightlog.cost.currency"] == "USD"
    # A turn's cost: the sum over the chat spans of that turn.
    by_turn = {
        span.attributes["flightlog.execution.turn_index"]: span.attributes["flightlog.cost.amount"]
        for span in calls.values()
        if "flightlog.cost.amount" in span.attributes
    }
    assert by_turn == {0: float(M1), 1: float(M2)}
    # Each turn's span carries that sum, as a run's span carries the run's.
    turns = {
        span.attributes["flightlog.turn.index"]: span.attributes
        for span in spans
        if span.trace_id == calls["m1"].trace_id and span.name.startswith("turn ")
    }
    assert {index: turn["flightlog.cost.amount"] for index, turn in turns.items()} == by_turn
    assert all(turn["flightlog.cost.priced_calls"] == 1 for turn in turns.values())
    assert calls["m3"].attributes["flightlog.cost.unknown"] is True
    assert calls["m3"].attributes["flightlog.cost.source"] == UNKNOWN
    assert "flightlog.cost.amount" not in calls["m3"].attributes
    runs = [span for span in spans if span.name.startswith("invoke_agent")]
    assert runs[0].attributes["flightlog.cost.amount"] == float(M1 + M2)
    assert runs[0].attributes["flightlog.cost.priced_calls"] == 2
    assert runs[1].attributes["flightlog.cost.unknown_calls"] == 1
    assert "flightlog.cost.amount" not in runs[1].attributes


NO_USAGE = "no usage recorded"


@pytest.fixture(scope="module")
def unmetered() -> Iterator[tuple[DaemonProcess, Path]]:
    """A session whose calls answered without usage: m1 priced, m2 a response with no
    usage, m3 failed with no response and no usage; run 2's only call a response whose
    counts are all zero."""
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    daemon = DaemonProcess(base).start()
    answer = events.AssistantMessage(content=[events.TextPart(text="done")], model="gpt-4o")
    try:
        with connect(daemon.socket) as client:
            session = client.create("unmetered.jsonl", meta={"name": "unmetered"})
            with session.begin_run() as run:
                run.record(events.TurnStart(turn_index=0))
                model_call(run, "m1", 0, "gpt-4o", "openai", PLAIN)
                for id, message, error in [("m2", answer, None), ("m3", None, "overloaded")]:
                    execution = events.Execution(id=id, kind="model", turn_index=0)
                    run.record(events.ModelExecStart(execution=execution, model="gpt-4o"))
                    run.record(
                        events.ModelExecEnd(execution=execution, message=message, error=error)
                    )
            with session.begin_run() as run:
                model_call(run, "m4", 0, "gpt-4o", "openai", {})
            session.close()
            session = client.create("unmetered-first.jsonl")
            with session.begin_run() as run:
                model_call(run, "m1", 0, "gpt-4o", "openai", {})
                model_call(run, "m2", 0, "gpt-4o", "openai", PLAIN)
            session.close()
        yield daemon, daemon.root / "unmetered.jsonl"
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_a_response_without_usage_is_unknown_in_show_and_inspect(
    unmetered: tuple[DaemonProcess, Path],
) -> None:
    daemon, path = unmetered
    text = cli(daemon, "show", str(path))
    lines = text.splitlines()
    m2 = next(line for line in lines if "model m2" in line)
    m3 = next(line for line in lines if "model m3" in line)
    assert "cost unknown" in m2 and "$0" not in m2
    assert "cost" not in m3 and "$" not in m3  # failed, nothing back: not priced
    assert any("turn 0" in line and f"cost ≥ {figure(M2)}" in line for line in lines)
    runs = [line for line in lines if line.startswith("run ")]
    assert f"cost ≥ {figure(M2)}" in runs[0]
    assert "cost unknown" in runs[1] and "$0" not in runs[1]
    header = f"cost ≥ {figure(M2)} (1 model call priced, 2 not)"
    assert header in text and f"{NO_USAGE} (2 calls)" in text
    shown = cli(daemon, "inspect", str(path))
    assert header in shown and f"{NO_USAGE} (2 calls)" in shown
    page = cli(daemon, "show", "--html", str(path))
    assert f"≥ {figure(M2)}" in page and "$0<" not in page


def test_a_response_without_usage_is_unknown_in_sessions(
    unmetered: tuple[DaemonProcess, Path],
) -> None:
    daemon, path = unmetered
    row = json.loads(cli(daemon, "sessions", "--json", str(path)))
    assert row["cost"] == {
        "amount": float(M2),
        "currency": "USD",
        "priced_calls": 1,
        "unknown_calls": 2,  # m2 and m4; m3 (failed, no response) leaves the total alone
        "sources": {M2_SOURCE: 1, NO_USAGE: 2},
    }
    text = cli(daemon, "sessions", str(path))
    assert f"≥ {figure(M2)}" in text and f"{NO_USAGE} (2 calls)" in text


def test_a_response_without_usage_is_unknown_in_the_export(
    unmetered: tuple[DaemonProcess, Path],
) -> None:
    _, path = unmetered
    spans, chats = exported(path)
    calls = {id: span.attributes for id, span in chats.items()}
    for id in ("m2", "m4"):
        assert calls[id]["flightlog.cost.unknown"] is True
        assert calls[id]["flightlog.cost.source"] == NO_USAGE
        assert "flightlog.cost.amount" not in calls[id]
    assert not any(key.startswith("flightlog.cost.") for key in calls["m3"])
    runs = [span.attributes for span in spans if span.name.startswith("invoke_agent")]
    assert runs[0]["flightlog.cost.amount"] == float(M2)
    assert (runs[0]["flightlog.cost.priced_calls"], runs[0]["flightlog.cost.unknown_calls"]) == (
        1,
        1,
    )
    assert runs[1]["flightlog.cost.unknown_calls"] == 1 and "flightlog.cost.amount" not in runs[1]
    [turn] = [span.attributes for span in spans if span.name.startswith("turn ")]
    assert turn["flightlog.cost.unknown_calls"] == 1


def test_sessions_gives_no_figure_for_a_file_with_nothing_priced(
    unmetered: tuple[DaemonProcess, Path],
) -> None:
    daemon, _ = unmetered
    empty, damaged = daemon.root / "empty.jsonl", daemon.root / "damaged.jsonl"
    empty.write_text("")
    damaged.write_text("{not json\n")
    try:
        for path in (empty, damaged):
            assert (
                json.loads(cli(daemon, "sessions", "--json", str(path)))["cost"]["amount"] is None
            )
            [header, line] = cli(daemon, "sessions", str(path)).splitlines()
            end = header.index("COST") + len("COST")  # the column, right-aligned
            assert line[end - 10 : end].strip() == "-" and "$" not in line, line
    finally:
        empty.unlink()
        damaged.unlink()


WITHOUT_GENAI_PRICES = """
import sys
sys.modules["genai_prices"] = None
from flightlog.cli._spans import SpanBuilder
from flightlog.sdk import read
builder = SpanBuilder()
for record in read(sys.argv[1]):
    for span in builder.add(record):
        print(*sorted(key for key in span.attributes if key.startswith("flightlog.cost.")))
"""


def test_without_genai_prices_no_call_has_a_price(unmetered: tuple[DaemonProcess, Path]) -> None:
    """Not even the unknown price of a call without usage, before or after one with it."""
    daemon, _ = unmetered
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_GENAI_PRICES, str(daemon.root / "unmetered-first.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == []
