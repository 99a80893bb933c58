"""What storing blobs once saves on a session that sends the same images again and again.

``uv run --frozen --all-groups python -m bench.blobs [--quick]`` records through a real
flightlogd a computer-use style run: each of 50 model requests carries the whole
history so far, in which every step added a screenshot (a 150 KB PNG-like payload as
base64; 20 distinct screenshots, then they repeat), and the tool result of each step
carries the latest screenshot again.  It prints what the lines would hold inline (the
records as ``flightlog.sdk.read`` gives them back), the session file and the blob store
as written, and the time to read every record back with the payloads put back.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import tempfile
import time
from pathlib import Path

from flightlog.protocol import events
from flightlog.protocol._blobs import BLOB_DIR
from flightlog.sdk import connect, read

from ._daemon import Daemon


def _screenshot(i: int) -> str:
    seed = hashlib.sha256(str(i).encode()).digest()
    # Not compressible, like a real PNG's deflated data.
    body = b"".join(hashlib.sha256(seed + n.to_bytes(4, "big")).digest() for n in range(4688))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + body).decode()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.blobs")
    parser.add_argument("--quick", action="store_true", help="10 requests")
    args = parser.parse_args(argv)
    steps = 10 if args.quick else 50
    shots = [_screenshot(i) for i in range(20)]
    with (
        tempfile.TemporaryDirectory(prefix="flb-", dir="/tmp") as base,
        Daemon(Path(base), "--blobs") as d,
    ):
        history: list[events.ChatMessage] = []
        begin = time.perf_counter()
        with connect(d.socket) as client:
            session = client.create("computer-use.jsonl")
            with session.begin_run() as run:
                for step in range(steps):
                    shot = shots[step % len(shots)]
                    history.append(
                        events.UserMessage(
                            content=[
                                events.TextPart(text=f"step {step}"),
                                events.ImagePart(media_type="image/png", data=shot),
                            ]
                        )
                    )
                    execution = events.Execution(id=f"m{step}", kind="model")
                    request = events.ModelRequest(execution=execution, messages=list(history))
                    run.record(request)
                    tool = events.Execution(id=f"t{step}", kind="tool")
                    run.record(
                        events.ToolExecEnd(
                            execution=tool,
                            tool_call_id=f"c{step}",
                            name="screenshot",
                            content=[{"type": "image", "media_type": "image/png", "data": shot}],
                        )
                    )
            session.close()
        record_time = time.perf_counter() - begin
        path = d.root / "computer-use.jsonl"
        begin = time.perf_counter()
        inline = sum(len(r.data) for r in read(path))
        read_time = time.perf_counter() - begin
        store = sum(p.stat().st_size for p in (d.root / BLOB_DIR).rglob("*") if p.is_file())
        written = path.stat().st_size + store
        print(f"{steps} requests, each with the history's screenshots (20 distinct, 150 KB each)")
        print(f"  inline (what the records hold):  {inline / 1e6:10.1f} MB")
        print(f"  session file:                    {path.stat().st_size / 1e6:10.3f} MB")
        print(f"  blob store:                      {store / 1e6:10.1f} MB")
        ratio = inline / written
        print(f"  written in all:                  {written / 1e6:10.1f} MB ({ratio:.0f}x less)")
        print(f"  recording: {record_time:.2f} s; reading every record back: {read_time:.2f} s")


if __name__ == "__main__":
    main()
