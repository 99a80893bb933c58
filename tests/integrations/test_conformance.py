"""Transcript conformance: for every model call of a framework's run, the messages
rebuilt from the file equal the framework's own message list at that call.

A matrix of framework x scenario (parallel tools, retries, fallbacks, structured output,
streaming, handoffs, agents as tools, cancellation, conversations of several runs, where
the framework has the feature).  Each scenario runs the real framework offline and takes
what each model call was handed from the framework itself (a pydantic-ai FunctionModel's
messages, a LangChain chat model's, an OpenAI Agents model's input); the run is recorded
through one real daemon per module, and every prompt is rebuilt with
``flightlog.sdk.Transcript``.  Both sides are compared in the normal form of
conformance.py (docs/integrations.md, "Transcript conformance").
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.integrations import Recorder
from flightlog.sdk import Transcript, check
from support import DaemonProcess

from . import conformance_langchain, conformance_openai_agents, conformance_pydantic_ai
from .conformance import from_prompt
from .helpers import finish

FRAMEWORKS = {
    "pydantic_ai": conformance_pydantic_ai.SCENARIOS,
    "langchain": conformance_langchain.SCENARIOS,
    "openai_agents": conformance_openai_agents.SCENARIOS,
}

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MATRIX = [
    pytest.param(framework, scenario, id=f"{framework}-{scenario}")
    for framework, scenarios in FRAMEWORKS.items()
    for scenario in scenarios
]


@pytest.fixture(scope="module")
def shared_daemon() -> Iterator[DaemonProcess]:
    """One daemon for the whole matrix: each row records into a session of its own."""
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    proc = DaemonProcess(base, "--log-format", "json").start()
    try:
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.anyio
@pytest.mark.parametrize(("framework", "scenario"), MATRIX)
async def test_every_prompt_rebuilt_is_what_the_model_was_sent(
    shared_daemon: DaemonProcess, framework: str, scenario: str
) -> None:
    recorder = Recorder(socket=shared_daemon.socket)
    path = f"conformance/{framework}/{scenario}.jsonl"
    try:
        expected = await FRAMEWORKS[framework][scenario](recorder, path)
    finally:
        await finish(recorder)
    file = shared_daemon.root / path
    assert check(file).sound
    assert recorder.stats.problems == 0, recorder.stats
    rebuilt = [from_prompt(prompt) for prompt in Transcript.read(file).prompts()]
    assert expected, "the scenario made no model call"
    assert len(rebuilt) == len(expected)
    for index, (got, want) in enumerate(zip(rebuilt, expected, strict=True)):
        assert got == want, f"model call {index + 1} of {len(expected)}"
