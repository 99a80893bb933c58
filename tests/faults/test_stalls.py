"""One client must not stall the daemon for anyone else (issue 16): a client that reads
none of its replies is cut off after ``--send-timeout``, an open that waits for such a
client's session waits with a bound and without holding the opener's other sessions,
shutdown always ends, and signals other than SIGTERM and SIGINT do not kill the daemon.
"""

from __future__ import annotations

import select
import signal
import socket
from pathlib import Path

from flightlog.daemon._server import SHUTDOWN_BOUND
from flightlog.protocol import (
    now,
)
from flightlog.protocol.wire import (
    Ack,
    CloseSession,
    LoadCheckpoint,
    Open,
    SaveCheckpoint,
    SessionOpened,
    Status,
    StatusReply,
    Sync,
    encode_frame,
)
from support import DaemonProcess, RawClient, wait_for
from support.daemon import (
    assert_serving,
    begin,
    check_file,
    checkpoint,
    create,
    fact,
    log_events,
    wait_for_log,
)

#: A checkpoint whose every load is a large reply: a few hundred of them fill a
#: connection's queue of unsent replies (8 MiB) and its socket buffers.
SNAPSHOT = b'{"blob":"' + b"x" * (64 * 1024) + b'"}'


def _writer_with_a_checkpoint(client: RawClient, path: str, records: int) -> tuple[str, str]:
    opened = create(client, path)
    run = begin(client, opened.session_id)
    ack = client.request(
        SaveCheckpoint(
            id=client.next_id(),
            session_id=opened.session_id,
            run_id=run.run_id,
            time=now(),
            snapshot=SNAPSHOT,
        )
    )
    assert isinstance(ack, Ack), ack
    for n in range(records):
        client.send(fact(opened.session_id, run.run_id, n))
    return opened.session_id, run.run_id


def _load_until_refused(client: RawClient, session_id: str) -> int:
    """Send checkpoint loads and read no reply, until the daemon stops reading this
    socket: its queue of replies is full, the session's actor waits to send, its
    mailbox is full, and the connection waits for room in it."""
    client.sock.setblocking(False)
    sent = 0
    pending = b""
    while True:
        if not pending:
            pending = encode_frame(LoadCheckpoint(id=client.next_id(), session_id=session_id))
        try:
            pending = pending[client.sock.send(pending) :]
        except BlockingIOError:
            # Full: done once the daemon has read nothing for 2 s.
            if not select.select([], [client.sock], [], 2.0)[1]:
                return sent
            continue
        sent += not pending


def _writer_pid(client: RawClient, path: str) -> int | None:
    reply = client.request(Status(id=client.next_id()))
    assert isinstance(reply, StatusReply), reply
    (session,) = [s for s in reply.sessions if s.path.endswith(path)]
    return session.writer_pid


def test_sigterm_ends_within_the_grace_period_plus_its_bound_with_a_client_that_never_reads(
    short_tmp: Path,
) -> None:
    # The send timeout is far away: only shutdown's own bound may end the wait.
    grace = 0.5
    daemon = DaemonProcess(
        short_tmp, "--shutdown-grace", str(grace), "--send-timeout", "600"
    ).start()
    with RawClient(daemon.socket) as writer:
        session_id, _ = _writer_with_a_checkpoint(writer, "stuck.jsonl", records=100)
        assert _load_until_refused(writer, session_id) > 0
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        # Before the fix the drain waited for ever: the connection's release waited for
        # room in the mailbox of an actor that waited for the client to read.
        assert daemon.proc.wait(timeout=grace + SHUTDOWN_BOUND + 15) == 0, daemon.log
    events = [event["event"] for event in log_events(daemon)]
    assert "connections_cancelled" in events, daemon.log
    assert events[-1] == "stopped", events
    assert not Path(daemon.socket).exists()
    # What the client sent before it stopped reading is written and synced.
    report = check_file(daemon.root / "stuck.jsonl")
    assert report.sound and not report.unfinished_tail, report
    assert report.last_seq == 103, report


#: A checkpoint two loads of which fill a connection's queue of unsent replies
#: (8 MiB): the third waits for room, whatever the socket buffers hold.
LARGE_SNAPSHOT = b'{"blob":"' + b"x" * (4 << 20) + b'"}'


def test_opening_a_session_a_non_reading_writer_closed_waits_boundedly_and_blocks_nothing_else(
    short_tmp: Path,
) -> None:
    """The writer loads the session's checkpoint three times and closes it in one send,
    and reads nothing: the session answers the loads and the close together once its
    close is written, and waits for room for the third reply.  An open of it waits
    (until --send-timeout cuts the writer off) without holding the opener's other
    session.

    Three loads and a close are within a connection's requests per turn, so the
    session takes them in one batch: no reply waits before the close is taken.  (200
    small loads, as before, reach the session over several turns, so in several
    batches, and an earlier batch's replies could wait out --send-timeout before the
    close was taken: then the session was gone by the time of the open.)  The open is
    sent within --send-timeout of the close being taken: 5 s, under load."""
    daemon = DaemonProcess(short_tmp, "--send-timeout", "5").start()
    with RawClient(daemon.socket, client="stuck") as stuck, RawClient(daemon.socket) as opener:
        opened = create(stuck, "closed.jsonl")
        session_id, run_id = opened.session_id, begin(stuck, opened.session_id).run_id
        checkpoint(stuck, session_id, run_id, LARGE_SNAPSHOT)
        for n in range(10):
            stuck.send(fact(session_id, run_id, n))
        other = create(opener, "other.jsonl")
        frames = [
            encode_frame(LoadCheckpoint(id=stuck.next_id(), session_id=session_id))
            for _ in range(3)
        ]
        frames.append(encode_frame(CloseSession(id=stuck.next_id(), session_id=session_id)))
        stuck.send_bytes(b"".join(frames))
        # Released by its writer, and still there: closing, its replies not all sent.
        wait_for(lambda: _writer_pid(opener, "closed.jsonl") is None)

        open_id = opener.next_id()
        opener.send(Open(id=open_id, path="closed.jsonl"))
        # The open waits for the closing session; the opener's other session does not.
        synced = opener.request(Sync(id=opener.next_id(), session_id=other.session_id))
        assert isinstance(synced, Ack), synced
        assert not any(getattr(m, "id", None) == open_id for m in opener.pending)
        # The stuck client is cut off after --send-timeout; then the open is answered.
        reopened = opener.receive(timeout=30)
        assert isinstance(reopened, SessionOpened), reopened
        assert reopened.id == open_id and reopened.session_id == session_id
        # session_start, run_start, the checkpoint and the 10 records, all synced.
        assert reopened.last_seq == 13 and reopened.interrupted_runs == [run_id], reopened
    wait_for_log(daemon, event="client_not_reading")
    assert_serving(daemon)
    daemon.stop()


def test_sighup_and_sigusr_are_logged_and_the_daemon_goes_on(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp).start()
    assert daemon.proc is not None
    for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        daemon.proc.send_signal(signum)
        wait_for_log(daemon, event="signal_received", signal=signum.name)
    status = [
        event
        for event in log_events(daemon)
        if event.get("signal") == "SIGUSR1" and event["event"] == "signal_received"
    ]
    assert status and "connections" in status[0]["status"], status
    assert_serving(daemon)
    assert daemon.terminate() == 0, daemon.log
    assert not Path(daemon.socket).exists()
    # No socket is left listening where the file was.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        assert probe.connect_ex(daemon.socket) != 0
