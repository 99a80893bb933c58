"""The best-effort recorder under the failures an integration meets: a busy session, a
full disk (a real file-size limit on a real daemon) and a value the codec refuses; the
agent's run is never touched."""

from __future__ import annotations

import logging
import resource
import socket
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from flightlog.integrations import Recorder
from flightlog.integrations.pydantic_ai import Flightlog
from flightlog.protocol.events import (
    AgentEnd,
    AgentStart,
    MessageEnd,
)
from flightlog.sdk import connect
from support import DaemonProcess

from .helpers import finish, of_type, records

LIMIT = 64 * 1024


def big_agent(recorder: Recorder, path: str) -> Agent[None, str]:
    agent = Agent(TestModel(), capabilities=[Flightlog(path=path, recorder=recorder)])

    @agent.tool_plain
    def fetch(page: int) -> str:
        return "x" * (2 * LIMIT)

    return agent


@pytest.mark.anyio
async def test_a_busy_session_leaves_the_agent_alone(
    daemon: DaemonProcess, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder(socket=daemon.socket)
    agent = Agent(TestModel(), capabilities=[Flightlog(path="busy.jsonl", recorder=recorder)])
    with connect(daemon.socket) as holder:
        holder.session("busy.jsonl")
        with caplog.at_level(logging.WARNING, logger="flightlog.integrations"):
            result = await agent.run("hello")
            await agent.run("hello")
    assert result.output == (await Agent(TestModel()).run("hello")).output
    assert recorder.stats.by_code == {"session_busy": 2}
    assert "session_busy" in (recorder.stats.last_problem or "")
    assert len(caplog.records) == 1
    # Once the other writer is gone, the next run is recorded.
    await agent.run("again")
    await finish(recorder)
    assert len(of_type(records(daemon.root / "busy.jsonl"), "agent_end")) == 1


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


@pytest.mark.anyio
async def test_a_full_disk_is_counted_and_the_next_session_records(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start(preexec_fn=_limit_file_size)
    try:
        recorder = Recorder(socket=daemon.socket)
        plain = await big_agent(Recorder(socket=str(short_tmp / "none")), "x").run("fetch")
        result = await big_agent(recorder, "full.jsonl").run("fetch")
        assert result.output == plain.output
        assert recorder.stats.by_code.get("write_failed", 0) >= 1
        assert set(recorder.stats.by_code) <= {"write_failed", "daemon_not_running"}
        # The failed session was let go; another one records normally.
        small = Agent(TestModel(), capabilities=[Flightlog(path="next.jsonl", recorder=recorder)])
        await small.run("hi")
        await finish(recorder)
        recs = records(daemon.root / "next.jsonl")
        assert of_type(recs, "run_close")[0]["data"]["error"] is None
        assert daemon.alive()
    finally:
        daemon.stop()


def test_a_value_the_codec_cannot_encode_is_marked_kept_and_named_in_run_close(
    daemon: DaemonProcess, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder(socket=daemon.socket)
    run = recorder.begin("codec.jsonl")
    with caplog.at_level(logging.WARNING, logger="flightlog"), socket.socket() as s:
        run.record(AgentStart())
        run.record(MessageEnd(message={"handle": s}))
        run.record(MessageEnd(message={"handle": s}))
        run.record(AgentEnd())
    run.close()
    recorder.close()
    # Nothing is dropped, so nothing is a problem of the recorder's.
    assert recorder.stats.problems == 0
    assert [r.name for r in caplog.records].count("flightlog.integrations") == 0
    recs = records(daemon.root / "codec.jsonl")
    assert [r["type"] for r in recs][2:] == [
        "agent_start",
        "message_end",
        "message_end",
        "agent_end",
        "run_close",
    ]
    assert recs[3]["data"]["message"]["handle"]["$flightlog"] == "unencodable"
    error = recs[-1]["data"]["error"]
    assert error.startswith("codec_error: 2 events written with $flightlog markers: message_end: ")


def test_a_run_rides_through_a_daemon_restart_and_counts_nothing(
    daemon: DaemonProcess,
) -> None:
    # A grace longer than the default, so that a slow restart on a loaded machine fits.
    recorder = Recorder(socket=daemon.socket, reconnect_grace=30)
    run = recorder.begin("restart.jsonl")
    run.record(AgentStart())
    daemon.kill()
    daemon.start()
    run.record(MessageEnd(message={"text": "after"}))
    run.record(AgentEnd())
    run.close()
    recorder.close()
    assert recorder.stats.problems == 0
    types = [r["type"] for r in records(daemon.root / "restart.jsonl")]
    assert types.count("agent_start") == types.count("agent_end") == 1
    assert types[-3:] == ["message_end", "agent_end", "run_close"]
    assert "run_resume" in types


def test_each_kind_of_problem_is_logged_once_on_one_logger(
    daemon: DaemonProcess, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder(socket=daemon.socket, reconnect_grace=0.1)
    run = recorder.begin("gone.jsonl")
    run.record(AgentStart())
    daemon.kill()
    with caplog.at_level(logging.WARNING, logger="flightlog"):
        for _ in range(3):
            run.record(MessageEnd(message={"text": "lost"}))
        run.close()
        recorder.close()
    assert recorder.stats.by_code.get("daemon_unreachable", 0) >= 1
    # The client logs the first event it dropped; the recorder counts it, and does not
    # log it again on its own logger.
    assert [r.name for r in caplog.records if "unreachable" in r.getMessage()] == ["flightlog.sdk"]
