"""What the daemon's check of a record's data costs, in this one process.

``uv run python -m bench.check`` times, in CPU µs per call (best of three):

* ``check_json`` (what every record's data and every snapshot get) on the data of
  the bench's small and 64 KiB events, the way it takes at that size (a full decode
  up to ``DECODE_IN_FULL``), and the passes it takes on longer data;
* the same check on longer data (the 64 KiB event's shape at 256 KiB and 1 MiB) and on
  hostile data (arrays nested 254 deep, side by side; at 16 MiB with a string that
  looks like a number out of range): what a connection would spend on its event loop
  if it checked that size itself;
* a hop to a worker thread and back (``anyio.to_thread.run_sync`` on the daemon's
  asyncio with uvloop), what a connection pays to check a payload over
  ``LARGE_PAYLOAD`` off its event loop.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import anyio
import anyio.to_thread

from flightlog.protocol import (
    default_codec,
)
from flightlog.protocol._json import DECODE_IN_FULL, _check_in_passes
from flightlog.protocol.format import (
    MAX_NESTING,
    check_json,
)

from ._events import large_event, small_event
from ._report import markdown_table
from .steps import _per_event

__all__ = ["main"]


def _hostile(size: int) -> bytes:
    nest = b"[" * 254 + b"]" * 254
    return b"[" + b",".join([nest] * (size // (len(nest) + 1) - 1)) + b"]"


def _thread_hop(count: int) -> float:
    async def hops() -> float:
        best = float("inf")
        for _ in range(5):
            begin = time.process_time()
            for _ in range(count):
                await anyio.to_thread.run_sync(_nothing)
            best = min(best, time.process_time() - begin)
        return best * 1e6 / count

    result: float = anyio.run(hops, backend="asyncio", backend_options={"use_uvloop": True})
    return result


def _nothing() -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.check", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a hundredth of the calls")
    scale = 100 if parser.parse_args().quick else 1
    small = default_codec.encode_event(small_event()).data
    large = default_codec.encode_event(large_event()).data
    rows = [["data", "bytes", "check_json (µs)", "in passes (µs)"]]
    cases = [
        ("small event", small, 100_000),
        ("64 KiB event", large, 2_000),
        ("256 KiB event", default_codec.encode_event(large_event(256 * 1024)).data, 500),
        ("1 MiB event", default_codec.encode_event(large_event(1024 * 1024)).data, 100),
        ("nested 254 deep, 64 KiB", _hostile(DECODE_IN_FULL), 200),
        ("nested 254 deep, 1 MiB", _hostile(1024 * 1024), 20),
        ('the same, 16 MiB, and a string "e000"', b'["e000",' + _hostile(16 << 20)[1:], 1),
    ]
    for title, data, count in cases:
        calls = max(count // scale, 1)
        check = _per_event(partial(check_json, data, "data"), calls)
        in_passes = _per_event(partial(_check_in_passes, data, "data", MAX_NESTING), calls)
        rows.append([title, f"{len(data):,}", f"{check:.2f}", f"{in_passes:.2f}"])
    print(markdown_table(rows))
    print()
    print(f"a worker thread's hop (anyio.to_thread.run_sync): {_thread_hop(2_000 // scale):.1f} µs")


if __name__ == "__main__":
    main()
