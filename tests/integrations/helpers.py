"""What the integration tests share: reading a recorded file back and checking its calls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread

from flightlog.cli._inspect import SessionSummary, summarize_records
from flightlog.integrations import Recorder
from flightlog.sdk import check, read


async def finish(recorder: Recorder) -> None:
    """Close the recorder off the event loop, so that it waits until its files are synced."""
    await anyio.to_thread.run_sync(recorder.close)


def records(path: Path) -> list[dict[str, Any]]:
    """Every record of a sound file, as plain JSON values."""
    assert check(path).sound, check(path)
    return [record.to_builtins() for record in read(path)]


def summary(path: Path) -> SessionSummary:
    return summarize_records(read(path))


def gaps(path: Path) -> dict[str | None, list[str]]:
    """What ``flightlog inspect`` reports as missing, per run."""
    return summary(path).gaps()


def of_type(recs: list[dict[str, Any]], *types: str) -> list[dict[str, Any]]:
    return [r for r in recs if r["type"] in types]


def calls(recs: list[dict[str, Any]], kind: str) -> dict[str, list[dict[str, Any]]]:
    """The records of each call of ``kind``, by execution id and attempt."""
    found: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        execution = r["data"].get("execution")
        if isinstance(execution, dict) and execution["kind"] == kind:
            key = f"{execution['id']}#{execution['attempt']}"
            found.setdefault(key, []).append(r)
    return found


def assert_every_call_ended(recs: list[dict[str, Any]]) -> None:
    """Each model call has its request, start and end; each tool call its start and end."""
    for key, parts in calls(recs, "model").items():
        types = [r["type"] for r in parts]
        assert types[:3] == ["model_request", "model_exec_start", "model_exec_end"], (key, types)
    for key, parts in calls(recs, "tool").items():
        types = [r["type"] for r in parts]
        assert types[0] == "tool_exec_start" and types[-1] == "tool_exec_end", (key, types)


def texts(content: list[Any]) -> Iterator[str]:
    for part in content:
        if isinstance(part, dict) and part.get("$type") == "text":
            yield part["text"]


def sent(recs: list[dict[str, Any]]) -> list[list[Any]]:
    """What each model request sent, in file order: its messages after those of the
    request it continues (``model_request.continues``), recursively, and that call's
    response between them when ``with_response`` says so (docs/format.md 4.6)."""
    by_id: dict[str, list[Any]] = {}
    answers: dict[str, Any] = {}
    found = []
    for r in of_type(recs, "model_request", "model_exec_end"):
        data = r["data"]
        if r["type"] == "model_exec_end":
            answers[data["execution"]["id"]] = data["message"]
            continue
        continues = data["continues"]
        before = by_id[continues] if continues is not None else []
        answer = [answers[continues]] if data.get("with_response") else []
        messages = [*before, *answer, *data["messages"]]
        by_id[data["execution"]["id"]] = messages
        found.append(messages)
    return found


def assert_every_turn_ended(recs: list[dict[str, Any]]) -> None:
    """Each ``turn_start`` of a run has its ``turn_end``, before the run's ``agent_end``."""
    open_turns: dict[tuple[str, int], int] = {}
    for r in recs:
        key = (r.get("run_id"), r["data"].get("turn_index"))
        if r["type"] == "turn_start":
            open_turns[key] = r["seq"]
        elif r["type"] == "turn_end":
            assert open_turns.pop(key, None) is not None, r
        elif r["type"] == "agent_end" and r["data"].get("parent_id") is None:
            assert not [k for k in open_turns if k[0] == r.get("run_id")], (open_turns, r)
    assert open_turns == {}


def assert_cancelled(end: dict[str, Any]) -> None:
    """``end`` is the end of a call its run was cancelled in."""
    data = end["data"]
    assert data["disposition"] == "cancelled", end
    if end["type"] == "tool_exec_end":
        assert data["is_error"] is True
        assert list(texts(data["content"])) == ["cancelled: the run ended before this call did"]
    else:
        assert data["error"] == "cancelled: the run ended before this call did"
