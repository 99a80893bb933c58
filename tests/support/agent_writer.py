"""An agent process for the daemon's tests: records through a real socket and reports,
one JSON line per fact on stdout, what it sent and which acknowledgements it got.

    python -m support.agent_writer hold SOCKET PATH RECORDS
        create PATH, begin a run, send RECORDS records (no reply awaited), report
        {"session_id", "run_id", "sent"}, then wait to be killed.

    python -m support.agent_writer load SOCKET PATH
        create PATH and record until the daemon goes away: runs of records with a
        checkpoint every few records and a run_close at the end of each run; every
        acknowledgement is reported as {"ack": "checkpoint"|"run_close", "seq"} the
        moment it arrives.

    python -m support.agent_writer flood SOCKET PATH MEGABYTES
        create PATH, begin a run, report {"flooding": true}, send MEGABYTES of 64 KiB
        records as fast as the socket takes them, then sync and report {"synced": seq}.
"""

from __future__ import annotations

import json
import sys
import threading

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    BeginRun,
    CloseRun,
    Create,
    Message,
    RecordEvent,
    RunStarted,
    SaveCheckpoint,
    SessionOpened,
    Sync,
    encode_frame,
)
from support import RawClient


def report(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def record(session_id: str, run_id: str, n: int) -> RecordEvent:
    return RecordEvent(
        session_id=session_id,
        run_id=run_id,
        event_type="turn_start",
        time=now(),
        data=b'{"turn_index":%d,"pad":"%s"}' % (n, b"x" * (n % 200)),
    )


def hold(socket_path: str, path: str, count: int) -> None:
    client = RawClient(socket_path, client="agent-hold")
    opened = client.request(Create(id=client.next_id(), path=path))
    assert isinstance(opened, SessionOpened), opened
    run = client.request(BeginRun(id=client.next_id(), session_id=opened.session_id, time=now()))
    assert isinstance(run, RunStarted), run
    client.send_bytes(
        b"".join(encode_frame(record(opened.session_id, run.run_id, n)) for n in range(count))
    )
    report(session_id=opened.session_id, run_id=run.run_id, sent=count)
    sys.stdin.read()  # until killed


def load(socket_path: str, path: str) -> None:
    client = RawClient(socket_path, client="agent-load")
    opened = client.request(Create(id=client.next_id(), path=path))
    assert isinstance(opened, SessionOpened), opened
    session_id = opened.session_id
    report(session_id=session_id)
    n = 0
    try:
        while True:
            run = client.request(BeginRun(id=client.next_id(), session_id=session_id, time=now()))
            assert isinstance(run, RunStarted), run
            for _ in range(5):
                for _ in range(40):
                    client.send(record(session_id, run.run_id, n))
                    n += 1
                ack = client.request(
                    SaveCheckpoint(
                        id=client.next_id(),
                        session_id=session_id,
                        run_id=run.run_id,
                        time=now(),
                        snapshot=b'{"n":%d}' % n,
                    )
                )
                assert isinstance(ack, Ack), ack
                report(ack="checkpoint", seq=ack.seq, n=n)
            ack = client.request(
                CloseRun(id=client.next_id(), session_id=session_id, run_id=run.run_id, time=now())
            )
            assert isinstance(ack, Ack), ack
            report(ack="run_close", seq=ack.seq)
    except (EOFError, OSError):
        report(gone=True)


def flood(socket_path: str, path: str, megabytes: int) -> None:
    client = RawClient(socket_path, client="agent-flood")
    opened = client.request(Create(id=client.next_id(), path=path))
    assert isinstance(opened, SessionOpened), opened
    session_id = opened.session_id
    run = client.request(BeginRun(id=client.next_id(), session_id=session_id, time=now()))
    assert isinstance(run, RunStarted), run
    frame = encode_frame(
        RecordEvent(
            session_id=session_id,
            run_id=run.run_id,
            event_type="model_request",
            time=now(),
            data=b'{"pad":"%s"}' % (b"f" * (64 * 1024 - 10)),
        )
    )
    # Each MiB ends with a sync, so the daemon's writes wait for the disk; replies are
    # read on another thread, so only the daemon's reading can hold the sender back.
    first_sync = client.next_id()
    acks: list[Message] = []
    reader = threading.Thread(
        target=lambda: acks.extend(client.receive(120) for _ in range(megabytes))
    )
    reader.start()
    report(flooding=True, records=megabytes * 16)
    for mb in range(megabytes):
        client.send_bytes(
            frame * 16 + encode_frame(Sync(id=first_sync + mb, session_id=session_id))
        )
    reader.join()
    assert all(isinstance(ack, Ack) for ack in acks), acks[-1]
    report(synced=acks[-1].seq)  # type: ignore[attr-defined]


if __name__ == "__main__":
    mode, socket_path, path, *rest = sys.argv[1:]
    if mode == "hold":
        hold(socket_path, path, int(rest[0]))
    elif mode == "flood":
        flood(socket_path, path, int(rest[0]))
    else:
        load(socket_path, path)
