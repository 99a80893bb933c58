"""Blobs through the daemon: a reader that may read a session through the daemon but
not the blob store (a uid's store under a shared daemon is the daemon's alone) gets the
session's payloads with ``load_blob``; a uid that may not read the session is refused,
and a blob the store does not hold leaves its reference in the record."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightlog.cli._main import run
from flightlog.protocol import ErrorCode, events
from flightlog.protocol._blobs import BLOB_DIR, has_references
from flightlog.protocol.wire import DEFAULT_MAX_FRAME_SIZE, BlobLoaded, ErrorReply, LoadBlob
from flightlog.sdk import connect
from support import DaemonProcess, RawClient
from support.daemon import as_uid, needs_root, shared_daemon

SCREENSHOT = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(b"loaded").digest() * 700
SCREENSHOT64 = base64.b64encode(SCREENSHOT).decode()
DIGEST = hashlib.sha256(SCREENSHOT).hexdigest()
OWNER = 42031
OTHER = 42032

pytestmark = needs_root


@pytest.fixture(scope="module")
def shared() -> Iterator[DaemonProcess]:
    """A shared daemon with ``--blobs``; ``OWNER`` has recorded one screenshot."""
    with shared_daemon("--blobs") as daemon:
        as_uid(OWNER, lambda: _record(daemon.socket, "shots.jsonl"))
        yield daemon


def _record(socket: str, path: str) -> None:
    with connect(socket) as client:
        session = client.create(path)
        with session.begin_run() as run:
            run.record(
                events.ModelRequest(
                    execution=events.Execution(id="m0", kind="model"),
                    messages=[
                        events.UserMessage(
                            content=[
                                events.TextPart(text="what is on screen?"),
                                events.ImagePart(media_type="image/png", data=SCREENSHOT64),
                            ]
                        )
                    ],
                )
            )
        session.close()


def _tail(socket: str, path: str) -> tuple[list[bytes], list[str], bool]:
    """As the caller's uid: the model requests' data a tail yields, its problems, and
    whether the caller can read the store (it must not, for the test to mean much)."""
    store = Path(path).parent / BLOB_DIR
    with connect(socket) as client:
        tail = client.tail(path)
        with tail:
            data = [bytes(record.data) for record in tail if record.type == "model_request"]
        return data, list(tail.problems), os.access(store, os.R_OK)


def _tail_all(socket: str) -> tuple[bytes, list[str]]:
    """As the caller's uid: the data of the model request a follow of every session
    yields for a session recorded once it is subscribed, and its problems."""
    with connect(socket) as client:
        tail = client.tail_all(follow=True)
        with tail:
            _record(socket, "later.jsonl")
            for _, record in tail:
                if record.type == "model_request":
                    return bytes(record.data), list(tail.problems)
    raise AssertionError("the follow ended without the model request")


def _load(socket: str, path: str, digest: str) -> BlobLoaded | ErrorReply:
    with RawClient(socket) as raw:
        reply = raw.request(LoadBlob(id=raw.next_id(), path=path, sha256=digest))
        assert isinstance(reply, BlobLoaded | ErrorReply), reply
        return reply


def test_a_tail_puts_back_blobs_its_uid_cannot_read_in_the_store(shared: DaemonProcess) -> None:
    path = str(shared.root / "uid" / str(OWNER) / "shots.jsonl")
    raw = (shared.root / "uid" / str(OWNER) / "shots.jsonl").read_bytes()
    assert DIGEST.encode() in raw and SCREENSHOT64.encode() not in raw

    data, problems, readable = as_uid(OWNER, lambda: _tail(shared.socket, path))

    assert not readable
    assert problems == []
    [line] = data
    assert SCREENSHOT64.encode() in line and not has_references(line)
    line, problems = as_uid(OWNER, lambda: _tail_all(shared.socket))
    assert SCREENSHOT64.encode() in line and problems == []


def test_load_blob_answers_the_bytes_to_a_uid_that_may_read_the_session(
    shared: DaemonProcess,
) -> None:
    reply = as_uid(OWNER, lambda: _load(shared.socket, "shots.jsonl", DIGEST))

    assert isinstance(reply, BlobLoaded)
    assert reply.sha256 == DIGEST and reply.data == SCREENSHOT


def test_a_uid_that_may_not_read_the_session_is_refused(shared: DaemonProcess) -> None:
    path = str(shared.root / "uid" / str(OWNER) / "shots.jsonl")

    reply = as_uid(OTHER, lambda: _load(shared.socket, path, DIGEST))

    assert isinstance(reply, ErrorReply)
    assert reply.code == ErrorCode.PERMISSION_DENIED
    # Its own session names its own store: the other uid's blob is not there.
    as_uid(OTHER, lambda: _record(shared.socket, "own.jsonl"))
    reply = as_uid(OTHER, lambda: _load(shared.socket, "own.jsonl", DIGEST[::-1]))
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.BLOB_NOT_FOUND


def test_a_digest_that_is_not_one_is_refused(shared: DaemonProcess) -> None:
    reply = as_uid(OWNER, lambda: _load(shared.socket, "shots.jsonl", "../../x"))

    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.BAD_MESSAGE


def test_a_missing_blob_leaves_the_reference_and_says_so(shared: DaemonProcess) -> None:
    as_uid(OWNER, lambda: _record(shared.socket, "gone.jsonl"))
    own = shared.root / "uid" / str(OWNER)
    blob = own / BLOB_DIR / "sha256" / DIGEST[:2] / DIGEST
    kept = blob.read_bytes()
    blob.unlink()
    try:
        data, problems, _ = as_uid(OWNER, lambda: _tail(shared.socket, str(own / "gone.jsonl")))
        reply = as_uid(OWNER, lambda: _load(shared.socket, "gone.jsonl", DIGEST))
    finally:
        blob.write_bytes(kept)

    [line] = data
    assert has_references(line) and DIGEST.encode() in line
    assert len(problems) == 1 and DIGEST in problems[0] and "blob_not_found" in problems[0]
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.BLOB_NOT_FOUND


def _show(daemon: DaemonProcess, path: str) -> tuple[int, str]:
    """``flightlog show PATH`` in this process (a uid that may not run the venv's
    python, nor import what the parent did not): its exit code and what it said on
    stderr."""
    os.environ["FLIGHTLOG_SOCKET"] = daemon.socket
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = run(["show", path])
    return code, err.getvalue()


def test_show_through_the_daemon_says_which_blob_it_could_not_put_back(
    shared: DaemonProcess,
) -> None:
    as_uid(OWNER, lambda: _record(shared.socket, "shown.jsonl"))
    own = shared.root / "uid" / str(OWNER)
    path = str(own / "shown.jsonl")
    # Read from the file (root may): what show imports on the way is then imported.
    assert _show(shared, path) == (0, "")
    whole = as_uid(OWNER, lambda: _show(shared, path))
    blob = own / BLOB_DIR / "sha256" / DIGEST[:2] / DIGEST
    kept = blob.read_bytes()
    blob.unlink()
    try:
        cut = as_uid(OWNER, lambda: _show(shared, path))
    finally:
        blob.write_bytes(kept)

    assert whole == (0, "")
    code, said = cut
    assert code == 0, said
    assert DIGEST in said and "blob_not_found" in said and "the reference is kept" in said


def test_a_blob_larger_than_a_frame_is_refused_naming_its_size(shared: DaemonProcess) -> None:
    big = os.urandom(1024) * (DEFAULT_MAX_FRAME_SIZE // 1024 + 1)
    digest = hashlib.sha256(big).hexdigest()
    where = shared.root / "uid" / str(OWNER) / BLOB_DIR / "sha256" / digest[:2]
    where.mkdir(mode=0o700, exist_ok=True)
    (where / digest).write_bytes(big)
    try:
        reply = as_uid(OWNER, lambda: _load(shared.socket, "shots.jsonl", digest))
    finally:
        (where / digest).unlink()

    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.BLOB_TOO_LARGE
    assert str(len(big)) in reply.message
