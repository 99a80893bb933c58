"""Values pydantic and pandas hand out, recorded from a real pydantic-ai run through a real
daemon: no event is dropped for its content, and each value is written as its library
writes it for JSON."""

from __future__ import annotations

import ipaddress
import json
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pandas as pd
import pydantic
import pytest
from pydantic_ai import Agent, ToolReturn
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from flightlog.integrations import Recorder
from flightlog.integrations.pydantic_ai import Flightlog
from support import DaemonProcess

from .helpers import assert_every_call_ended, finish, gaps, of_type, records


class Host(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(serialize_by_alias=True)

    ip: ipaddress.IPv4Address
    network: ipaddress.IPv4Network
    display_name: str = pydantic.Field(serialization_alias="displayName")
    password: pydantic.SecretStr
    url: pydantic.HttpUrl

    @pydantic.computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        return f"{self.display_name}@{self.ip}"


HOST = Host(
    ip="192.0.2.1",
    network="192.0.2.0/24",
    display_name="db",
    password="hunter2",
    url="https://db.example.com",
)
FRAME = pd.DataFrame(
    {
        "city": ["Oslo", "Lima"],
        "temp": [-3.5, float("nan")],
        "seen": [pd.Timestamp("2026-12-03T09:00:00"), pd.NaT],
    }
)


def host_json(model: Host) -> dict[str, Any]:
    return {"$class": f"{__name__}.Host", **json.loads(model.model_dump_json())}


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Both tools at once, then the output, a Host itself."""
    returned = [
        part
        for message in messages
        for part in getattr(message, "parts", ())
        if isinstance(part, ToolReturnPart)
    ]
    if not returned:
        return ModelResponse(
            parts=[
                ToolCallPart(tool_name="lookup_host", args={}, tool_call_id="call_host"),
                ToolCallPart(tool_name="weather_table", args={}, tool_call_id="call_table"),
            ]
        )
    output = info.output_tools[0].name
    args = {
        "ip": "198.51.100.7",
        "network": "198.51.100.0/24",
        "display_name": "answer",
        "password": "s3cret",
        "url": "https://answer.example.com",
    }
    return ModelResponse(parts=[ToolCallPart(tool_name=output, args=args, tool_call_id="out")])


def agent(*capabilities: Any) -> Agent[None, Host]:
    agent = Agent(FunctionModel(script), output_type=Host, capabilities=list(capabilities))

    @agent.tool_plain
    def lookup_host() -> Host:
        return HOST

    @agent.tool_plain
    def weather_table() -> ToolReturn:
        # pydantic-ai sends a tool's return value to the model, and cannot serialize a
        # DataFrame: the frame rides along as the result's metadata.
        return ToolReturn(return_value="2 rows", metadata=FRAME)

    return agent


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    yield recorder
    recorder.close()


@pytest.mark.anyio
async def test_a_run_whose_tools_return_pydantic_and_pandas_values_is_recorded_whole(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    plain = await agent().run("which host?")
    result = await agent(Flightlog(path="values.jsonl", recorder=recorder)).run("which host?")
    assert result.output == plain.output
    await finish(recorder)
    path = daemon.root / "values.jsonl"
    recs = records(path)
    assert recorder.stats.problems == 0
    assert_every_call_ended(recs)
    assert gaps(path) == {}
    ends = {r["data"]["tool_call_id"]: r["data"] for r in of_type(recs, "tool_exec_end")}
    assert set(ends) == {"call_host", "call_table"}
    # The model as pydantic dumps it for JSON: the IP and the network as text, the alias,
    # the computed field, the secret masked.
    assert ends["call_host"]["content"] == [host_json(HOST)]
    assert ends["call_host"]["content"][0]["password"] == "**********"
    assert ends["call_host"]["content"][0]["displayName"] == "db"
    assert ends["call_host"]["content"][0]["label"] == "db@192.0.2.1"
    # The frame with its data: columns, index and rows.
    (table,) = ends["call_table"]["content"]
    assert table["$class"] == "pydantic_ai.messages.ToolReturn"
    assert table["return_value"] == "2 rows"
    assert table["metadata"] == {
        "$class": f"{type(FRAME).__module__}.DataFrame",
        "columns": ["city", "temp", "seen"],
        "index": [0, 1],
        "data": [["Oslo", -3.5, "2026-12-03T09:00:00"], ["Lima", None, None]],
    }
    (agent_end,) = of_type(recs, "agent_end")
    assert agent_end["data"]["ok"] is True
    assert agent_end["data"]["output"] == host_json(result.output)
    (run_close,) = of_type(recs, "run_close")
    assert run_close["data"]["error"] is None
    # flightlog inspect: the loop finished, nothing is missing.
    with anyio.fail_after(60):
        inspected = await anyio.run_process(
            [sys.executable, "-m", "flightlog.cli", "inspect", str(path)], check=False
        )
    out = inspected.stdout.decode()
    assert inspected.returncode == 0, out + inspected.stderr.decode()
    assert "gaps     none" in out
    assert "completed" in out
