"""How much compressing a closed session saves, and what it costs.

``uv run --frozen --all-groups python -m bench.compression [--quick]`` records, through a
real flightlogd, the long sessions issue 29 names, then compresses each with
``flightlog.sdk._compression.compress_path`` (what ``flightlog compress`` and the daemon
run) and reads it back with ``flightlog.sdk.read``:

* a 1,000-step run (``bench.transcript``'s: each model call continues the previous);
* a 100-run pydantic-ai chat (``bench.transcript``'s, with a tool call per run);
* a session full of tool output: 1,000 steps, each a model call and a tool result that
  is a file of this repository (agents read the same files again and again) or a test
  run's output.

For each: the plain and compressed sizes, the ratio, the CPU seconds to compress
(compress, sync, read back and compare) and to read every record back from each form.
The last table compares zstd settings on the tool-output session (the level the code
uses, with long-distance matching, against plain levels).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time
from pathlib import Path

import zstandard

from flightlog.integrations import Recorder
from flightlog.protocol import events
from flightlog.sdk import read
from flightlog.sdk._compression import LEVEL, WINDOW_LOG, compress_path

from ._daemon import Daemon
from .transcript import CHATS, _chat, _steps

ROOT = Path(__file__).resolve().parent.parent


def _tool_output(recorder: Recorder, path: str, steps: int) -> None:
    sources = sorted(ROOT.glob("*/src/flightlog/**/*.py"))
    chooser = random.Random(29)
    run = recorder.begin(path)
    for step in range(steps):
        model = events.Execution(id=f"m{step}", kind="model", turn_index=step)
        run.record(
            events.ModelRequest(
                execution=model,
                messages=[events.UserMessage(content=f"step {step}: read on")],
                config=events.CallConfig(model="m"),
            )
        )
        tool = events.Execution(id=f"t{step}", kind="tool", turn_index=step)
        if step % 4 == 3:
            output = "".join(
                f"tests/test_{chooser.randrange(80)}.py::test_{j} PASSED [{j}%]\n"
                for j in range(chooser.randrange(20, 120))
            )
        else:
            output = chooser.choice(sources).read_text()
        run.record(
            events.ToolExecEnd(
                execution=tool, tool_call_id=f"c{step}", name="read", content=[output]
            )
        )
    run.close()


def _cpu(action: object) -> float:
    begin = time.process_time()
    action()  # type: ignore[operator]
    return time.process_time() - begin


def _measure(path: Path) -> str:
    plain = path.stat().st_size
    copy = path.with_suffix(".plain")
    shutil.copyfile(path, copy)
    read_plain = _cpu(lambda: sum(1 for _ in read(copy)))
    compress = _cpu(lambda: compress_path(path))
    size = path.stat().st_size
    read_compressed = _cpu(lambda: sum(1 for _ in read(path)))
    return (
        f"{plain / 1e6:>8.2f} MB {size / 1e6:>7.3f} MB {plain / size:>6.1f}x  "
        f"compress {compress:>5.2f} s ({plain / 1e6 / compress:>5.0f} MB/s)  "
        f"read {read_plain:>5.2f} s plain, {read_compressed:>5.2f} s compressed"
    )


def _settings(path: Path) -> None:
    data = path.with_suffix(".plain").read_bytes()
    print(f"zstd settings on {path.name} ({len(data) / 1e6:.2f} MB)")
    for level, ldm in ((3, False), (9, False), (LEVEL, True), (19, False), (19, True)):
        params = zstandard.ZstdCompressionParameters.from_level(
            level, source_size=len(data), window_log=WINDOW_LOG, enable_ldm=ldm
        )
        begin = time.process_time()
        size = len(zstandard.ZstdCompressor(compression_params=params).compress(data))
        cpu = time.process_time() - begin
        print(
            f"  level {level:>2}{' + long' if ldm else '       '}  {len(data) / size:>6.1f}x  "
            f"{cpu:>5.2f} s CPU"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compression")
    parser.add_argument("--quick", action="store_true", help="a tenth of each workload")
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    with tempfile.TemporaryDirectory(prefix="flc-", dir="/tmp") as base, Daemon(Path(base)) as d:
        recorder = Recorder(socket=d.socket)
        sessions = {
            f"{1000 // scale}-step run": "steps.jsonl",
            f"{100 // scale}-run chat": "chat.jsonl",
            f"{1000 // scale} steps of tool output": "tools.jsonl",
        }
        _steps(recorder, "steps.jsonl", 1000 // scale)
        recorder.close()
        asyncio.run(
            _chat(recorder, "chat.jsonl", 100 // scale, CHATS["tool call, 3-sentence answer"])
        )
        recorder.close()
        _tool_output(recorder, "tools.jsonl", 1000 // scale)
        recorder.close()
        print(f"closed sessions, compressed (zstd level {LEVEL}, long-distance matching)")
        for name, file in sessions.items():
            print(f"  {name:26} {_measure(d.root / file)}")
        _settings(d.root / "tools.jsonl")


if __name__ == "__main__":
    main()
