"""Meta is written as a reader reads it (issue 16, 13): keys that JSON writes alike
(``1`` and ``"1"``) are refused instead of making a duplicate key, and the create reply
echoes the meta as written, not as sent.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from flightlog.protocol.wire import (
    ErrorReply,
    SessionOpened,
)
from support import DaemonProcess, RawClient, read_lines
from support.daemon import check_file


def _create(client: RawClient, path: str, meta: dict[object, object]) -> object:
    """A create with any meta, int keys too (the SDK would not send them)."""
    body = {"type": "create", "id": client.next_id(), "path": path, "meta": meta}
    frame = msgspec.msgpack.encode(body)
    client.send_bytes(len(frame).to_bytes(4, "big") + frame)
    return client.receive()


def test_meta_keys_that_write_alike_are_refused_and_the_reply_is_what_was_written(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp).start()
    with RawClient(daemon.socket) as client:
        refused = _create(client, "dup.jsonl", {"tags": {1: "int", "1": "str"}})
        assert isinstance(refused, ErrorReply) and refused.code == "bad_message", refused
        assert not (daemon.root / "dup.jsonl").exists()

        opened = _create(client, "ints.jsonl", {"tags": {1: "one", 2: [{3: True}]}})
        assert isinstance(opened, SessionOpened), opened
        written = read_lines(daemon.root / "ints.jsonl")[0]["data"]["meta"]
        assert written == {"tags": {"1": "one", "2": [{"3": True}]}}
        assert opened.meta == written  # what the file holds, not what was sent
    assert check_file(daemon.root / "ints.jsonl").sound
    daemon.stop()
