"""A session file replaced, truncated or removed under an active session (issue 16, 6):
the daemon notices at its next write or sync, fails the session with ``write_failed``
and acknowledges nothing that did not reach the file at the session's path.
"""

from __future__ import annotations

import os
from pathlib import Path

from flightlog.protocol import now
from flightlog.protocol.wire import Ack, ErrorReply, LoadCheckpoint, SaveCheckpoint, Sync
from support import DaemonProcess, RawClient
from support.daemon import assert_serving, begin, create, fact


def _checkpoint(client: RawClient, session_id: str, run_id: str) -> object:
    return client.request(
        SaveCheckpoint(
            id=client.next_id(),
            session_id=session_id,
            run_id=run_id,
            time=now(),
            snapshot=b'{"step":1}',
        )
    )


def _refused(reply: object) -> None:
    assert isinstance(reply, ErrorReply), reply
    assert reply.code == "write_failed", reply


def test_a_file_changed_under_an_active_session_fails_it_with_write_failed(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp).start()
    root = daemon.root
    with RawClient(daemon.socket) as client:
        sessions = {}
        for name in ("replaced", "truncated", "removed"):
            opened = create(client, f"{name}.jsonl")
            run = begin(client, opened.session_id)
            for n in range(5):
                client.send(fact(opened.session_id, run.run_id, n))
            assert isinstance(_checkpoint(client, opened.session_id, run.run_id), Ack)
            sessions[name] = (opened.session_id, run.run_id)

        other = root / "elsewhere.jsonl"
        other.write_bytes(b"not a session\n")
        os.replace(other, root / "replaced.jsonl")
        os.truncate(root / "truncated.jsonl", 0)
        os.unlink(root / "removed.jsonl")

        for session_id, run_id in sessions.values():
            # Records written into the old file are never acknowledged.
            client.send(fact(session_id, run_id, 99))
            _refused(_checkpoint(client, session_id, run_id))
            # Sticky: every later request gets the same error.
            _refused(client.request(Sync(id=client.next_id(), session_id=session_id)))
            _refused(client.request(LoadCheckpoint(id=client.next_id(), session_id=session_id)))
            while client.pending:  # the record_failed push of each session
                assert getattr(client.pending.pop(), "code", None) == "write_failed"

    assert (root / "replaced.jsonl").read_bytes() == b"not a session\n"
    assert (root / "truncated.jsonl").stat().st_size == 0
    assert not (root / "removed.jsonl").exists()
    assert_serving(daemon)
    daemon.stop()


def test_loading_a_checkpoint_from_a_truncated_file_says_write_failed(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    with RawClient(daemon.socket) as client:
        opened = create(client, "cut.jsonl")
        run = begin(client, opened.session_id)
        assert isinstance(_checkpoint(client, opened.session_id, run.run_id), Ack)
        os.truncate(daemon.root / "cut.jsonl", 10)
        reply = client.request(LoadCheckpoint(id=client.next_id(), session_id=opened.session_id))
        _refused(reply)  # it said internal before
    assert_serving(daemon)
    daemon.stop()
