"""Many agent processes recording at once through one daemon, and a standalone call."""

from __future__ import annotations

from flightlog.protocol import (
    Execution,
)
from flightlog.protocol.events import (
    AssistantMessage,
    CallConfig,
    ModelExecEnd,
    ModelExecStart,
    ModelRequest,
    TextPart,
    Usage,
    UserMessage,
)
from flightlog.sdk import CallRef, check, connect, read
from support import DaemonProcess, reaped, run_python

AGENTS = 20
SESSIONS_PER_AGENT = 2
EVENTS_PER_SESSION = 5_000

# One agent process: two sessions, one run each, events interleaved between them.
AGENT = """
import sys
from flightlog.protocol.events import Execution, ToolExecStart
from flightlog.sdk import connect

socket, agent, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with connect(socket, client_name=f"agent-{agent}") as client:
    sessions = [client.create(f"load/agent-{agent}-{n}.jsonl") for n in range(2)]
    runs = [session.begin_run() for session in sessions]
    for i in range(count):
        for n, run in enumerate(runs):
            execution = Execution(id=f"t{i}", kind="tool", turn_index=i // 10)
            run.record(ToolExecStart(execution=execution, tool_call_id=f"c{i}", name="echo",
                                     arguments={"agent": agent, "session": n, "i": i}))
    for run in runs:
        run.close()
    for session in sessions:
        session.close()
print("ok")
"""


def test_twenty_agents_two_sessions_each_every_event_once_in_order(
    daemon: DaemonProcess,
) -> None:
    agents = [
        run_python(AGENT, daemon.socket, str(agent), str(EVENTS_PER_SESSION))
        for agent in range(AGENTS)
    ]
    with reaped(*agents):
        for agent in agents:
            out, err = agent.communicate(timeout=240)
            assert agent.returncode == 0, err.decode()
            assert out == b"ok\n"
    for agent in range(AGENTS):
        for n in range(SESSIONS_PER_AGENT):
            path = daemon.root / "load" / f"agent-{agent}-{n}.jsonl"
            report = check(path)
            assert report.sound, (path, report.error)
            assert report.unfinished_tail is False
            records = list(read(path))
            assert [r.seq for r in records] == list(range(1, EVENTS_PER_SESSION + 4))
            assert [r.type for r in records[:2]] == ["session_start", "run_start"]
            assert records[-1].type == "run_close"
            arguments = [r.decode_data()["arguments"] for r in records[2:-1]]
            # Every event of this session exactly once, in the order it was recorded.
            assert arguments == [
                {"agent": agent, "session": n, "i": i} for i in range(EVENTS_PER_SESSION)
            ]


def test_a_standalone_model_call_with_host_supplied_ids(daemon: DaemonProcess) -> None:
    # No agent loop: the host makes one model call and names it itself, then keeps
    # only the CallRef in its own timeline.
    execution = Execution(id="summarise-42", kind="model")
    with connect(daemon.socket) as client:
        session = client.create("standalone.jsonl", meta={"host": "batch-job"})
        with session.begin_run() as run:
            run.record(
                ModelRequest(
                    execution=execution,
                    messages=[UserMessage(content="Summarise: the sky is blue.")],
                    config=CallConfig(model="m-1", extra={"api_key": "sk-secret", "seed": 7}),
                )
            )
            run.record(ModelExecStart(execution=execution, model="m-1"))
            run.record(
                ModelExecEnd(
                    execution=execution,
                    message=AssistantMessage(content=[TextPart(text="Blue sky.")], model="m-1"),
                    usage=Usage(input_tokens=9, output_tokens=3),
                )
            )
            ref = run.ref(execution)
        session.close()
    assert ref == CallRef(
        session_id=session.session_id, run_id=run.run_id, execution_id="summarise-42", attempt=1
    )
    records = list(read(daemon.root / "standalone.jsonl"))
    call = [r for r in records if r.run_id == ref.run_id and r.type.startswith("model_")]
    assert [r.type for r in call] == ["model_request", "model_exec_start", "model_exec_end"]
    for record in call:
        data = record.decode_data()
        assert data["execution"]["id"] == ref.execution_id
        assert data["execution"]["attempt"] == ref.attempt
    request = call[0].decode_data()
    assert request["config"]["extra"] == {"seed": 7}  # the api_key never reached the file
    assert b"sk-secret" not in (daemon.root / "standalone.jsonl").read_bytes()
