"""Scenario 8: what recording costs a real agent loop.

One pydantic-ai agent run of 50 steps (a scripted ``FunctionModel`` asks for one tool
call per step, then answers), in three variants: unrecorded; recorded through flightlogd
with the ``Flightlog`` capability; and instrumented with pydantic-ai's own OpenTelemetry
instrumentation (the ``Instrumentation`` capability) into an in-memory span exporter.
A measurement is the mean wall time of a batch of agent runs per variant, the variants
taking turns run by run (their order rotated from measurement to measurement), so drift
on a shared machine falls on all three alike.

Rows: the wall time each instrumentation adds, as a percentage of the unrecorded run
(targets: flightlog at most 5%, and less than OpenTelemetry), the wall time per run, and
the agent process's CPU time each adds (the work in the agent's own process, which the
other load on a shared machine disturbs far less than wall time).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability, Instrumentation
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.usage import UsageLimits

from flightlog.integrations import Recorder
from flightlog.integrations.pydantic_ai import Flightlog

from ._context import Context
from ._report import Row, Target

__all__ = ["STEPS", "agent_overhead", "build_agent"]

STEPS = 50
VARIANTS = ("unrecorded", "flightlog", "otel")


def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    step = sum(isinstance(m, ModelResponse) for m in messages)
    if step < STEPS:
        return ModelResponse(parts=[ToolCallPart("lookup", {"step": step, "query": "weather"})])
    return ModelResponse(parts=[TextPart(f"done after {step} steps")])


def build_agent(capabilities: list[AbstractCapability[Any]]) -> Agent[None, str]:
    """The benchmark's agent: 50 tool steps, then an answer."""
    agent = Agent(FunctionModel(_script), name="bench", capabilities=capabilities)

    @agent.tool_plain
    def lookup(step: int, query: str) -> str:
        return f"result {step} for {query}: " + "sunny, 21 degrees. " * 4

    return agent


def _variants(socket: str) -> dict[str, Callable[[int], Agent[None, str]]]:
    recorder = Recorder(socket=socket)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = InstrumentationSettings(tracer_provider=provider)

    def otel(run: int) -> Agent[None, str]:
        exporter.clear()
        return build_agent([Instrumentation(settings=settings)])

    return {
        "unrecorded": lambda run: build_agent([]),
        "flightlog": lambda run: build_agent([Flightlog(path=f"b/{run}.jsonl", recorder=recorder)]),
        "otel": otel,
    }


async def _interleaved(
    agents: dict[str, Agent[None, str]], order: list[str], runs: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Wall and CPU seconds per agent run of each variant, the variants taking turns run
    by run."""
    wall = dict.fromkeys(agents, 0.0)
    cpu = dict.fromkeys(agents, 0.0)
    limits = UsageLimits(request_limit=STEPS + 1)
    for _ in range(runs):
        for name in order:
            started, cpu_started = time.perf_counter(), time.process_time()
            result = await agents[name].run("go", usage_limits=limits)
            wall[name] += time.perf_counter() - started
            cpu[name] += time.process_time() - cpu_started
            assert result.output == f"done after {STEPS} steps"
    return (
        {name: seconds / runs for name, seconds in wall.items()},
        {name: seconds / runs for name, seconds in cpu.items()},
    )


def agent_overhead(ctx: Context) -> list[Row]:
    directory = ctx.scratch("frameworks")
    batch = 3 if ctx.quick else 20
    scenario = f"pydantic-ai run, {STEPS} tool steps"
    overhead = Row(
        "8",
        scenario,
        "wall time added by recording (% of the unrecorded run)",
        "%",
        targets=[Target("<=", 5.0)],
        note="flightlogd column: the Flightlog capability; OpenTelemetry: pydantic-ai's "
        "Instrumentation capability into an in-memory exporter",
    )
    per_run = Row(
        "8b",
        scenario,
        "wall time per run, recorded",
        "ms",
        targets=[Target("<", 1.0, baseline="otel")],
        note="also measured: unrecorded, and with OpenTelemetry (the JSON report has them)",
    )
    cpu_overhead = Row(
        "8c",
        scenario,
        "agent process CPU time added by recording (% of the unrecorded run's)",
        "%",
        targets=[Target("<=", 5.0)],
        note="time.process_time() of the agent's process (the daemon's own CPU time is not in it)",
    )
    with ctx.daemon(directory) as daemon:
        variants = _variants(daemon.socket)
        warm = {name: make(-1) for name, make in variants.items()}
        asyncio.run(_interleaved(warm, list(VARIANTS), 1))  # imports, the first connection
        for run in range(ctx.runs):
            shift = run % len(VARIANTS)
            order = list(VARIANTS[shift:] + VARIANTS[:shift])
            agents = {name: make(run) for name, make in variants.items()}
            times, cpu = asyncio.run(_interleaved(agents, order, batch))
            base, cpu_base = times["unrecorded"], cpu["unrecorded"]
            for name in ("flightlog", "otel"):
                overhead.add(name, 100 * (times[name] - base) / base)
                cpu_overhead.add(name, 100 * (cpu[name] - cpu_base) / cpu_base)
            for name, seconds in times.items():
                per_run.add(name, 1000 * seconds)
            ctx.say(
                f"scenario 8 run {run + 1}: "
                + ", ".join(
                    f"{name} {1000 * seconds:.1f} ms (CPU {1000 * cpu[name]:.1f} ms)"
                    for name, seconds in times.items()
                )
            )
    return [overhead, per_run, cpu_overhead]
