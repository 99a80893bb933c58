"""kill -9 of the daemon while agents record: after a restart every file passes check,
reopens with its seq continuing, and holds every checkpoint and run close that was
acknowledged before the crash.

A SIGKILL keeps the page cache, so this shows that acknowledgements never run ahead
of the writes; that they never run ahead of fsync would take a power cut.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from flightlog.protocol.wire import ErrorReply, Open, SessionOpened
from support import DaemonProcess, RawClient, read_lines
from support.daemon import agent_report, begin, check_file, spawn_agent

AGENTS = 4


def _reports_until_run_closed(agent: subprocess.Popen[str], closes: int) -> list[dict[str, Any]]:
    reports = []
    while sum(1 for r in reports if r.get("ack") == "run_close") < closes:
        reports.append(agent_report(agent))
    return reports


def test_kill_9_of_the_daemon_mid_load(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    agents = [spawn_agent("load", daemon.socket, f"load/agent-{i}.jsonl") for i in range(AGENTS)]
    try:
        reports = [_reports_until_run_closed(agent, 2) for agent in agents]
        daemon.kill()
        for agent, seen in zip(agents, reports, strict=True):
            out, err = agent.communicate(timeout=30)
            seen.extend(json.loads(line) for line in out.splitlines())
            assert seen[-1] == {"gone": True}, err
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.communicate()

    restarted = DaemonProcess(short_tmp).start()
    try:
        assert "stale_socket_removed" in restarted.log
        with RawClient(restarted.socket) as client:
            for i, seen in enumerate(reports):
                path = restarted.root / "load" / f"agent-{i}.jsonl"
                session_id = seen[0]["session_id"]
                report = check_file(path)
                assert report.sound, (path, report)  # an unfinished tail is allowed
                assert report.session_id == session_id
                lines = {line["seq"]: line for line in read_lines(path)}
                acks = [r for r in seen if "ack" in r]
                assert acks, seen
                for ack in acks:
                    line = lines.get(ack["seq"])
                    assert line is not None, (path, ack, report)
                    assert line["type"] == ack["ack"], (line, ack)
                    if ack["ack"] == "checkpoint":
                        assert line["data"] == {"snapshot": {"n": ack["n"]}}

                reopened = client.request(Open(id=client.next_id(), path=str(path)))
                assert isinstance(reopened, SessionOpened), reopened
                assert reopened.last_seq == report.last_seq
                assert reopened.truncated_bytes == report.tail_bytes
                assert reopened.interrupted_runs == report.open_runs
                assert begin(client, session_id).seq == report.last_seq + 1
                assert check_file(path).sound
            again = client.request(Open(id=client.next_id(), path="load/agent-0.jsonl"))
            assert isinstance(again, ErrorReply) and again.code == "session_busy"
    finally:
        restarted.stop()
