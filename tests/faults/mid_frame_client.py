"""A client process that dies by SIGKILL in the middle of a frame, on many connections.

    python -m faults.mid_frame_client SOCKET SEED CONNECTIONS

Each connection creates ``midframe/SEED-I.jsonl`` and begins a run, then sends a seeded
number of whole record frames followed by a seeded prefix of one more (from nothing
of it to all but its last byte, header included).  The process reports one JSON line,
``[{"path", "session_id", "run_id", "complete"}, ...]``, and kills itself.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    BeginRun,
    Create,
    RecordEvent,
    RunStarted,
    SessionOpened,
    encode_frame,
)
from support import RawClient


def main(socket_path: str, seed: int, connections: int) -> None:
    rng = random.Random(f"mid-frame-{seed}")
    clients = []
    sent = []
    for i in range(connections):
        client = RawClient(socket_path, client="mid-frame")
        path = f"midframe/{seed}-{i}.jsonl"
        opened = client.request(Create(id=client.next_id(), path=path))
        assert isinstance(opened, SessionOpened), opened
        run = client.request(
            BeginRun(id=client.next_id(), session_id=opened.session_id, time=now())
        )
        assert isinstance(run, RunStarted), run
        frames = [
            encode_frame(
                RecordEvent(
                    session_id=opened.session_id,
                    run_id=run.run_id,
                    event_type="turn_start",
                    time=now(),
                    data=json.dumps({"n": n, "pad": "m" * rng.choice((0, 50, 5000))}).encode(),
                )
            )
            for n in range(rng.randint(0, 40) + 1)
        ]
        last = frames.pop()
        cut = rng.choice((0, 1, 2, 3, 4, 5, rng.randrange(len(last)), len(last) - 1))
        client.send_bytes(b"".join(frames) + last[:cut])
        clients.append(client)
        sent.append(
            {
                "path": path,
                "session_id": opened.session_id,
                "run_id": run.run_id,
                "complete": len(frames),
            }
        )
    sys.stdout.write(json.dumps(sent) + "\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
