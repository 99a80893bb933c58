"""Record the agents of the common Python frameworks in one line.

* pydantic-ai: ``Agent(..., capabilities=[Flightlog()])`` from
  :mod:`flightlog.integrations.pydantic_ai` (extra ``flightlog-sdk[pydantic-ai]``);
* the OpenAI Agents SDK: ``add_trace_processor(FlightlogProcessor())`` from
  :mod:`flightlog.integrations.openai_agents` (extra ``[openai-agents]``);
* LangChain and LangGraph: ``config={"callbacks": [FlightlogCallbackHandler()]}`` from
  :mod:`flightlog.integrations.langchain` (extra ``[langchain]``).

Each imports its framework, so import the one you use.  They share the best-effort
:class:`Recorder`: recording never breaks the agent, and its problems are counted in
``Recorder.stats``.
"""

from __future__ import annotations

from ._recorder import RecordedRun, Recorder, RecorderStats, default_recorder

__all__ = ["RecordedRun", "Recorder", "RecorderStats", "default_recorder"]
