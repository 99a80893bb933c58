"""``flightlog compress``: session files compressed in place, read by every command as
before and by the stock tools (``zstdcat | jq``); a session a writer holds is left as
it is and its writer goes on."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.protocol import events
from flightlog.sdk import Transcript, check, connect, read, sql
from flightlog.sdk._compression import ZSTD_MAGIC
from support import DaemonProcess


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    daemon = DaemonProcess(base, "--idle-timeout", "0.2", "--compress-after", "0").start()
    try:
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def record_session(daemon: DaemonProcess, path: str, steps: int) -> Path:
    with connect(daemon.socket) as client:
        session = client.create(path, meta={"app": "test"})
        with session.begin_run() as run:
            run.record(events.AgentStart(agent="coder"))
            for i in range(steps):
                model = events.Execution(id=f"m{i}", kind="model", turn_index=i)
                run.record(
                    events.ModelRequest(
                        execution=model,
                        messages=[events.UserMessage(content=[events.TextPart(text="go on")])],
                    )
                )
                run.record(events.ModelExecStart(execution=model))
                run.record(events.ModelExecEnd(execution=model))
                tool = events.Execution(id=f"t{i}", kind="tool", turn_index=i)
                listing = "".join(f"src/pkg/module_{j}.py: ok\n" for j in range(30))
                run.record(
                    events.ToolExecEnd(
                        execution=tool, tool_call_id=f"c{i}", name="test", content=[listing]
                    )
                )
            run.record(events.AgentEnd(agent="coder"))
        session.close()
    return daemon.root / path


def flightlog(daemon: DaemonProcess, *args: str, status: int = 0) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", *args],
        env={**os.environ, "FLIGHTLOG_SOCKET": daemon.socket, "FLIGHTLOG_ROOT": str(daemon.root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == status, result.stderr
    return result.stdout


def compressed(path: Path) -> bool:
    return path.read_bytes()[:4] == ZSTD_MAGIC


def test_every_command_reads_a_compressed_session_as_before(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    original = record_session(daemon, "readers/long.jsonl", 100)
    path = tmp_path / "long.jsonl"
    shutil.copyfile(original, path)
    plain = path.read_bytes()
    views = [
        ("show", str(path)),
        ("inspect", str(path)),
        ("check", str(path)),
        ("tail", str(path)),
        ("find", "--type", "tool_exec_end", str(tmp_path)),
    ]
    before = [flightlog(daemon, *view) for view in views]
    count = "SELECT count(*), sum(length(data::VARCHAR)) FROM records"
    counted = sql(count, [tmp_path]).rows
    transcript = list(Transcript.read(path).prompts())

    out = flightlog(daemon, "compress", str(path))
    assert "compressed" in out and compressed(path)
    assert path.stat().st_size * 10 <= len(plain)
    assert [flightlog(daemon, *view) for view in views] == before
    assert sql(count, [tmp_path]).rows == counted
    assert list(Transcript.read(path).prompts()) == transcript != []
    assert check(path).sound and check(path).last_seq == len(list(read(original)))
    assert [r.data for r in read(path)] == [r.data for r in read(original)]
    if shutil.which("zstdcat") and shutil.which("jq"):
        jq = subprocess.run(
            f"zstdcat {path} | jq -c .seq", shell=True, capture_output=True, text=True, check=True
        )
        assert jq.stdout.split() == [str(n) for n in range(1, check(path).last_seq + 1)]
    # Compressed already: nothing to do, and said so.
    again = json.loads(flightlog(daemon, "compress", "--json", str(path)))
    assert again == {"path": str(path), "compressed": False, "reason": "compressed already"}
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_compress_all_leaves_a_held_session_to_its_writer(daemon: DaemonProcess) -> None:
    done = record_session(daemon, "all/done.jsonl", 20)
    with connect(daemon.socket) as client:
        session = client.create("all/held.jsonl")
        run = session.begin_run()
        run.record(events.AgentStart(agent="a"))
        session.sync()
        out = flightlog(daemon, "compress", "--all", "--json")
        results = {entry["path"]: entry for entry in map(json.loads, out.splitlines())}
        held = daemon.root / "all" / "held.jsonl"
        assert results[str(held)] == {
            "path": str(held),
            "compressed": False,
            "reason": "held by a writer",
        }
        assert results[str(done)]["compressed"] is True
        assert compressed(done) and not compressed(held)
        # The writer goes on as if nothing happened.
        run.record(events.AgentEnd(agent="a"))
        run.close()
        session.close()
    report = check(held)
    assert report.sound and report.records == 5 and not report.open_runs


def test_compress_takes_paths_or_all(daemon: DaemonProcess, tmp_path: Path) -> None:
    flightlog(daemon, "compress", status=2)
    flightlog(daemon, "compress", "--all", str(tmp_path), status=2)
    flightlog(daemon, "compress", str(tmp_path / "missing.jsonl"), status=2)


def test_a_file_that_is_no_session_is_reported_and_kept(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    directory = tmp_path / "dir"
    directory.mkdir()
    fifo = directory / "pipe.jsonl"
    os.mkfifo(fifo)

    def compress(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flightlog.cli", "compress", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    # In a directory it is no session: skipped, and said so.
    listed = compress(directory)
    assert listed.returncode == 0, listed
    assert f"skipped     {fifo}  not a regular file (a FIFO)" in listed.stdout
    # Given by its path it is refused.
    given = compress(fifo)
    assert given.returncode == 5, given
    assert "not a regular file (a FIFO)" in given.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
