"""Every path that reads a session file gives the same verdict on every file and names
the same line: ``check``, ``Reader``, a ``LineReader`` fed in any pieces,
``flightlog.sdk.read`` and ``check``, and a real flightlogd's open and its tail, at rest
and following."""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from flightlog import sdk
from flightlog.protocol import (
    FileFormatError,
    Reader,
    Record,
    check,
)
from flightlog.protocol.format import (
    LineReader,
    ReadState,
)
from flightlog.protocol.wire import (
    Ack,
    CloseSession,
    ErrorReply,
    Open,
    SessionOpened,
    Subscribe,
    Subscribed,
    TailBatch,
    TailEnd,
    Unsubscribe,
)
from support import DaemonProcess, RawClient
from support.damaged_files import FOREIGN, damaged_files, sound_lines


@dataclass(frozen=True)
class Verdict:
    """What a reader made of a file: the seqs it read, and the error that stopped it
    (``FileFormatError.message``: the line and what is wrong), if any."""

    seqs: tuple[int, ...]
    error: str | None


def _iterated(records: Iterable[Record]) -> Verdict:
    seqs: list[int] = []
    try:
        for record in records:
            record.to_builtins()  # what a reader accepts decodes, without msgspec errors
            seqs.append(record.seq)
    except FileFormatError as exc:
        return Verdict(tuple(seqs), exc.message)
    return Verdict(tuple(seqs), None)


def _checked(report: sdk.CheckReport) -> Verdict:
    assert report.last_seq == report.records
    error = None
    if not report.sound:
        assert report.error is not None and report.error_line is not None
        error = FileFormatError(report.error_line, report.error).message
    return Verdict(tuple(range(1, report.records + 1)), error)


def _fed(content: bytes, sizes: list[int], max_line_bytes: int | None = None) -> Iterator[Record]:
    """A LineReader's records, fed ``content`` in pieces of the given sizes."""
    reader = LineReader() if max_line_bytes is None else LineReader(max_line_bytes=max_line_bytes)
    pieces = iter(sizes)
    position = 0
    while True:
        item = reader.next()
        if isinstance(item, Record):
            yield item
        elif item is ReadState.END_OF_FILE:
            return
        elif position < len(content):
            size = next(pieces, len(content))
            reader.feed(content[position : position + size])
            position += size
        else:
            reader.feed_eof()


def protocol_verdicts(content: bytes, path: Path) -> dict[str, Verdict]:
    path.write_bytes(content)
    return {
        "check": _checked(check(io.BytesIO(content))),
        "Reader": _iterated(Reader(io.BytesIO(content))),
        "LineReader": _iterated(_fed(content, [len(content)])),
        "LineReader by bytes": _iterated(_fed(content, [1] * len(content))),
        "sdk.read": _iterated(sdk.read(path)),
        "sdk.check": _checked(sdk.check(path)),
    }


# --- the protocol's readers, on many files ---------------------------------------------


@settings(max_examples=400, deadline=None)
@given(damaged_files(over_long=300), st.lists(st.integers(1, 97), max_size=40))
def test_the_protocol_readers_agree_on_damaged_files(content: bytes, sizes: list[int]) -> None:
    check_verdict = _checked(check(io.BytesIO(content)))
    reader = _iterated(Reader(io.BytesIO(content)))
    assert reader == check_verdict
    assert _iterated(_fed(content, sizes)) == check_verdict
    # Over-long lines, against a limit small enough to test: Reader and LineReader only
    # take one.
    limited = _iterated(Reader(io.BytesIO(content), max_line_bytes=300))
    assert _iterated(_fed(content, sizes, max_line_bytes=300)) == limited
    if limited.error is None or "bytes long" not in limited.error:
        assert limited == check_verdict


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_files())
def test_the_sdk_agrees_with_check(
    tmp_path_factory: pytest.TempPathFactory, content: bytes
) -> None:
    path = tmp_path_factory.mktemp("files") / "s.jsonl"
    verdicts = protocol_verdicts(content, path)
    assert len(set(verdicts.values())) == 1, verdicts


def test_invalid_utf8_in_data_is_damage_for_every_protocol_path(tmp_path: Path) -> None:
    lines = sound_lines("ab" * 16, 2)
    lines[3] = lines[3].replace("\u00e9".encode(), b"\xc3(")
    byte = lines[3].index(b"\xc3(") + 1
    verdicts = protocol_verdicts(b"".join(lines), tmp_path / "s.jsonl")
    error = f"line 4: invalid UTF-8 at byte {byte} of the line"
    assert set(verdicts.values()) == {Verdict((1, 2, 3), error)}


# --- and a real daemon's open and tail ------------------------------------------------


@pytest.fixture(scope="module")
def shared_daemon(module_daemon: DaemonProcess) -> DaemonProcess:
    """One flightlogd for every example: each one reads files of its own."""
    module_daemon.root.mkdir(parents=True, exist_ok=True)
    return module_daemon


_names = itertools.count()


def _tail(client: RawClient, path: str, *, follow: bool, expected: Verdict) -> Verdict:
    subscribed = client.request(Subscribe(id=client.next_id(), path=path, follow=follow))
    assert isinstance(subscribed, Subscribed), subscribed
    seqs: list[int] = []
    unsubscribed = False
    while True:
        if (
            follow
            and expected.error is None
            and not unsubscribed
            and list(seqs) == list(expected.seqs)
        ):
            # A follow of a sound file waits for more: stop it, once it has sent all.
            unsubscribed = True
            client.send(Unsubscribe(id=client.next_id(), subscription=subscribed.subscription))
        message = client.receive()
        if isinstance(message, TailBatch):
            seqs += [msgspec.json.decode(line, type=Record).seq for line in message.lines]
        elif isinstance(message, TailEnd):
            assert message.last_seq == (seqs[-1] if seqs else 0)
            if message.reason == "error":
                assert message.code == "session_corrupt", message
                return Verdict(tuple(seqs), message.message)
            assert message.reason == ("unsubscribed" if follow else "end_of_file"), message
            return Verdict(tuple(seqs), None)
        else:
            assert isinstance(message, Ack), message


def _open(client: RawClient, path: str, expected: Verdict, tail_bytes: int) -> Verdict:
    reply = client.request(Open(id=client.next_id(), path=path))
    if isinstance(reply, ErrorReply):
        assert reply.code == "session_corrupt", reply
        return Verdict(expected.seqs, reply.message)
    assert isinstance(reply, SessionOpened), reply
    assert reply.truncated_bytes == tail_bytes
    closed = client.request(CloseSession(id=client.next_id(), session_id=reply.session_id))
    assert isinstance(closed, Ack), closed
    return Verdict(tuple(range(1, reply.last_seq + 1)), None)


def daemon_verdicts(daemon: DaemonProcess, content: bytes) -> dict[str, Verdict]:
    expected = _checked(check(io.BytesIO(content)))
    tail_bytes = check(io.BytesIO(content)).tail_bytes
    name = f"v{next(_names)}"
    # The open truncates an unfinished tail: it gets a copy of its own.
    (daemon.root / f"{name}-tail.jsonl").write_bytes(content)
    (daemon.root / f"{name}-open.jsonl").write_bytes(content)
    with RawClient(daemon.socket) as client:
        return {
            "tail": _tail(client, f"{name}-tail.jsonl", follow=False, expected=expected),
            "tail follow": _tail(client, f"{name}-tail.jsonl", follow=True, expected=expected),
            "open": _open(client, f"{name}-open.jsonl", expected, tail_bytes),
        }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_files())
def test_the_daemon_agrees_with_check(shared_daemon: DaemonProcess, content: bytes) -> None:
    expected = _checked(check(io.BytesIO(content)))
    verdicts = daemon_verdicts(shared_daemon, content)
    assert verdicts == dict.fromkeys(verdicts, expected), verdicts


def _named(change: str) -> bytes:
    """A sound file of 7 lines with one damage the issue names, at line 4."""
    lines = sound_lines("ab" * 16, 4)
    if change == "invalid UTF-8":
        lines[3] = lines[3].replace("\u00e9".encode(), b"\xe9")
    elif change == "gap":
        del lines[3]
    elif change == "repeat":
        lines[3] = lines[2]
    elif change == "foreign":
        lines[3] = lines[3].replace(b"ab" * 16, FOREIGN.encode())
    elif change == "crlf":
        lines[3] = lines[3][:-1] + b"\r\n"
    elif change == "nul line":
        lines[3] = bytes(len(lines[3]) - 1) + b"\n"
    return b"".join(lines)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ("invalid UTF-8", "line 4: invalid UTF-8 at byte 179 of the line"),
        ("gap", "line 4: seq 5 leaves a gap: expected 4, 1 record(s) missing"),
        ("repeat", "line 4: seq 3 repeats the seq of the line before"),
        ("foreign", f"line 4: session_id {FOREIGN!r} is not the file's session_id {'ab' * 16!r}"),
        ("crlf", "line 4: line ends with \\r\\n: CRLF line endings are not allowed, only \\n"),
        (
            "nul line",
            "line 4: a line of NUL bytes (was the file cut short by a crash before a sync?)",
        ),
    ],
)
def test_named_damage_is_named_alike_everywhere(
    shared_daemon: DaemonProcess, tmp_path: Path, change: str, error: str
) -> None:
    content = _named(change)
    verdicts = protocol_verdicts(content, tmp_path / "s.jsonl")
    verdicts |= daemon_verdicts(shared_daemon, content)
    assert verdicts == dict.fromkeys(verdicts, Verdict((1, 2, 3), error))


def test_a_line_longer_than_a_frame_is_the_tails_own_limit(short_tmp: Path) -> None:
    # The one documented difference: check and open accept the line, the tail cannot
    # send it and says which line it is.
    daemon = DaemonProcess(short_tmp, "--max-frame-size", "65536").start()
    try:
        daemon.root.mkdir(parents=True, exist_ok=True)
        lines = sound_lines("cd" * 16, 2)
        lines[1] = lines[1][:-2] + b" " * 200_000 + b"}\n"
        content = b"".join(lines)
        (daemon.root / "long.jsonl").write_bytes(content)
        assert _checked(check(io.BytesIO(content))) == Verdict((1, 2, 3, 4, 5), None)
        with RawClient(daemon.socket) as client:
            limit = 65536 + 64 * 1024
            error = f"line 2: line is {len(lines[1]) - 1} bytes long, more than {limit}"
            expected = Verdict((1,), error)
            for follow in (False, True):
                assert _tail(client, "long.jsonl", follow=follow, expected=expected) == expected
            opened = _open(client, "long.jsonl", Verdict((1, 2, 3, 4, 5), None), 0)
            assert opened == Verdict((1, 2, 3, 4, 5), None)
    finally:
        daemon.stop()
