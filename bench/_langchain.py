"""Scenario 9: the LangChain handler's CPU per step, at 50 and at 1,000 steps.

One LangGraph ReAct agent (``create_react_agent`` over a scripted fake chat model that
asks for one tool call per step, then answers), run unrecorded and recorded through
flightlogd by ``FlightlogCallbackHandler``, the two taking turns run by run.  A
measurement is the agent process's CPU time the recording adds, divided by the steps:
what one step costs the handler.  It must not grow with the steps (the handler once
converted the graph's whole state at every node, 17.6 ms added per step at 1,000
steps): the 1,000-step row is held to at most twice the 50-step one.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent

from flightlog.integrations import Recorder
from flightlog.integrations.langchain import FlightlogCallbackHandler

from ._context import Context
from ._report import Row, Target

__all__ = ["handler_per_step"]

STEPS = (50, 1000)


class _Scripted(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


@tool
def lookup(step: int) -> str:
    """Look a step up."""
    return f"result {step}: sunny, 21 degrees"


def _graph(steps: int) -> Any:
    script = [
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"step": n}, "id": f"call_{n}"}])
        for n in range(steps)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # create_react_agent
        return create_react_agent(
            _Scripted(messages=iter([*script, AIMessage("done")])), [lookup], name="bench"
        )


def _cpu(steps: int, handler: FlightlogCallbackHandler | None) -> float:
    graph = _graph(steps)
    config: dict[str, Any] = {"recursion_limit": 3 * steps + 10}
    if handler is not None:
        config["callbacks"] = [handler]
    started = time.process_time()
    out = graph.invoke({"messages": [("user", "go")]}, config)
    elapsed = time.process_time() - started
    assert out["messages"][-1].content == "done"
    return elapsed


def handler_per_step(ctx: Context) -> list[Row]:
    directory = ctx.scratch("langchain")
    sizes = (10, 200) if ctx.quick else STEPS
    rows = {
        steps: Row(
            "9" if steps == sizes[0] else "9b",
            f"LangGraph run, {steps} tool steps",
            "agent process CPU time the handler adds per step",
            "ms",
            fmt="{:,.3f}",
            note="time.process_time() of the agent's process, recorded minus unrecorded, "
            "over the steps",
        )
        for steps in sizes
    }
    growth = Row(
        "9c",
        f"LangGraph runs, {sizes[1]} and {sizes[0]} tool steps",
        f"handler CPU per step at {sizes[1]} steps / at {sizes[0]}",
        "x",
        fmt="{:,.2f}",
        targets=[Target("<=", 2.0)],
        note="flat in the steps: about 1",
    )
    with ctx.daemon(directory) as daemon:
        recorder = Recorder(socket=daemon.socket)
        _cpu(5, FlightlogCallbackHandler(path="b/warm.jsonl", recorder=recorder))
        for run in range(ctx.runs):
            per_step: dict[int, float] = {}
            for steps in sizes:
                handler = FlightlogCallbackHandler(path=f"b/{steps}-{run}.jsonl", recorder=recorder)
                order = [handler, None] if run % 2 else [None, handler]
                cpu = {h is not None: _cpu(steps, h) for h in order}
                per_step[steps] = 1000 * (cpu[True] - cpu[False]) / steps
                rows[steps].add("flightlog", per_step[steps])
            small, large = (per_step[s] for s in sizes)
            if small > 0:
                growth.add("flightlog", large / small)
            ctx.say(
                f"scenario 9 run {run + 1}: handler CPU per step {small:.3f} ms at {sizes[0]} "
                f"steps, {large:.3f} ms at {sizes[1]} ({large / small if small > 0 else 0:.2f}x)"
            )
        recorder.close()
    return [*rows.values(), growth]
