"""The adversary of ``test_adversarial``: several connections sending valid requests at
every documented limit, for a bounded time, each from a thread of this process.

Usage: adversary.py SOCKET SECONDS MAX_FRAME_SIZE [ATTACK...] (every attack without
names).  Prints one JSON object: what each attack sent.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    BeginRun,
    CloseRun,
    Create,
    Hello,
    RecordEvent,
    SessionOpened,
    Status,
    Sync,
    client_decoder,
    encode_frame,
)

#: What a record's frame adds to its data (its envelope), with room to spare.
ENVELOPE = 1024
#: The deepest nesting the daemon accepts in data.
NESTING = 256


class Client:
    def __init__(self, path: str, name: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(path)
        self.decoder = client_decoder()
        self.ids = 0
        self.request(Hello(id=0, version=PROTOCOL_VERSION, client=name, pid=os.getpid()))

    def next_id(self) -> int:
        self.ids += 1
        return self.ids

    def receive(self) -> object:
        while (message := self.decoder.next_message()) is None:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError
            self.decoder.feed(data)
        return message

    def request(self, message: object) -> object:
        self.sock.sendall(encode_frame(message))  # type: ignore[arg-type]
        wanted = getattr(message, "id", None)
        while True:
            reply = self.receive()
            if getattr(reply, "id", None) in (wanted, 0):
                return reply

    def session(self, path: str) -> tuple[str, str]:
        opened = self.request(Create(id=self.next_id(), path=path))
        assert isinstance(opened, SessionOpened), opened
        run = self.request(BeginRun(id=self.next_id(), session_id=opened.session_id, time=now()))
        return opened.session_id, run.run_id  # type: ignore[attr-defined]


def records(path: str, name: str, data: bytes, until: float) -> int:
    """Records of ``data`` back to back, a sync every four."""
    client = Client(path, name)
    sid, rid = client.session(f"adversary/{name}.jsonl")
    frame = encode_frame(
        RecordEvent(session_id=sid, run_id=rid, event_type="turn_start", time=now(), data=data)
    )
    sent = 0
    while time.monotonic() < until:
        for _ in range(4):
            client.sock.sendall(frame)
        sent += 4
        client.request(Sync(id=client.next_id(), session_id=sid))
    return sent


def escaping(path: str, max_line: int, until: float) -> int:
    """Runs closed with errors of control characters: each makes a line of the most
    the daemon writes."""
    client = Client(path, "escaping")
    sid, rid = client.session("adversary/escaping.jsonl")
    error = "\x01" * ((max_line - 2 * ENVELOPE) // 6)
    sent = 0
    while time.monotonic() < until:
        client.request(
            CloseRun(id=client.next_id(), session_id=sid, run_id=rid, time=now(), error=error)
        )
        run = client.request(BeginRun(id=client.next_id(), session_id=sid, time=now()))
        rid = run.run_id  # type: ignore[attr-defined]
        sent += 1
    return sent


def in_flight(path: str, until: float) -> int:
    """Thousands of requests in one write, then their replies."""
    client = Client(path, "in-flight")
    sent = 0
    while time.monotonic() < until:
        burst = b"".join(encode_frame(Status(id=client.next_id())) for _ in range(2000))
        client.sock.sendall(burst)
        for _ in range(2000):
            client.receive()
        sent += 2000
    return sent


def slow_partials(path: str, max_frame: int, until: float) -> int:
    """Connections that send a maximum frame's header and then a byte at a time, and
    connections that never say hello."""
    slow = [Client(path, f"slow {n}").sock for n in range(16)]
    silent = []
    for _ in range(16):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        silent.append(sock)
    for sock in slow:
        sock.sendall(max_frame.to_bytes(4, "big"))
    sent = 0
    while time.monotonic() < until:
        for sock in slow:
            try:
                sock.send(b"\x00")
                sent += 1
            except OSError:
                pass
        time.sleep(0.05)
    for sock in slow + silent:
        sock.close()
    return sent


def main() -> None:
    path, seconds, max_frame = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    max_line = max_frame + 64 * 1024
    until = time.monotonic() + seconds
    data_size = max_frame - ENVELOPE
    largest = b'{"b":"' + b"x" * (data_size - 8) + b'"}'
    pair = b"[],"
    inner = pair * ((data_size - 2 * NESTING) // len(pair))
    deepest = b'{"d":' + b"[" * (NESTING - 2) + inner[:-1] + b"]" * (NESTING - 2) + b"}"
    item = b'"k%07d":0,'
    widest = b"{" + b"".join(item % n for n in range(data_size // len(item % 0)))[:-1] + b"}"
    attacks: dict[str, Callable[[], int]] = {
        "largest": lambda: records(path, "largest", largest, until),
        "deepest": lambda: records(path, "deepest", deepest, until),
        "widest": lambda: records(path, "widest", widest, until),
        "escaping": lambda: escaping(path, max_line, until),
        "in_flight": lambda: in_flight(path, until),
        "slow_partials": lambda: slow_partials(path, max_frame, until),
    }
    if sys.argv[4:]:
        attacks = {name: attacks[name] for name in sys.argv[4:]}
    done: dict[str, object] = {}

    def run(name: str, attack: Callable[[], int]) -> None:
        try:
            done[name] = attack()
        except Exception as exc:  # reported, not raised: the test reads it
            done[name] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=run, args=item) for item in attacks.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(done))


if __name__ == "__main__":
    main()
