"""Bad input, one kind per test: each gets its typed error, is logged with the peer's
pid and uid, writes no line, and leaves the daemon serving."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from flightlog.protocol import (
    Record,
    new_id,
    now,
)
from flightlog.protocol.format import (
    encode_line,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    BeginRun,
    CloseSession,
    Create,
    ErrorReply,
    Hello,
    Open,
    SaveCheckpoint,
    SessionOpened,
    Status,
    StatusReply,
    Welcome,
)
from support import DaemonProcess, RawClient, read_lines, wait_for
from support.daemon import (
    assert_refusal_logged,
    assert_serving,
    begin,
    check_file,
    create,
    expect_record_failed,
    fact,
    log_events,
    open_when_released,
    synced_seq,
)

_msgpack = msgspec.msgpack.Encoder()


class _SharedDaemon(DaemonProcess):
    """One daemon for the whole module (starting one per test would cost most of the
    module's time); each test sees only its own part of the log, and each checks that
    the daemon still serves after what it did to it."""

    mark = 0

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[self.mark :]

    def next_test(self) -> None:
        self.mark = len(self.log_path.read_text(errors="replace"))


@pytest.fixture(scope="module")
def shared_daemon() -> Iterator[_SharedDaemon]:
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    daemon = _SharedDaemon(base, "--log-format", "json").start()
    try:
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def daemon(shared_daemon: _SharedDaemon) -> _SharedDaemon:
    assert shared_daemon.alive(), shared_daemon.log
    shared_daemon.next_test()
    return shared_daemon


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def _raw_message(**fields: object) -> bytes:
    return _frame(_msgpack.encode(fields))


def _assert_refused_and_hung_up(client: RawClient, code: str) -> ErrorReply:
    reply = client.receive()
    assert isinstance(reply, ErrorReply), reply
    assert reply.code == code, reply
    assert reply.message
    assert client.closed_by_daemon()
    return reply


# ---------------------------------------------------------------- the wire


def test_garbage_that_reads_as_a_huge_frame_before_hello(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket, hello=False) as client:
        client.send_bytes(b"GET / HTTP/1.1\r\nHost: flightlog\r\n\r\n")
        _assert_refused_and_hung_up(client, "frame_too_large")
    assert_refusal_logged(daemon, "frame_too_large")
    assert_serving(daemon)


def test_garbage_that_reads_as_a_small_frame_before_hello(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket, hello=False) as client:
        client.send_bytes(_frame(b"\xc1not msgpack at all"))
        _assert_refused_and_hung_up(client, "bad_message")
    assert_refusal_logged(daemon, "bad_message")
    assert_serving(daemon)


def test_frame_over_the_limit_is_refused_and_the_connection_closed(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp, "--max-frame-size", "4096").start()
    try:
        with RawClient(daemon.socket) as client:
            assert isinstance(client.welcome, Welcome)
            assert client.welcome.max_frame_size == 4096
            client.send_bytes(_raw_message(type="create", id=2, path="big", meta={"x": "y" * 5000}))
            _assert_refused_and_hung_up(client, "frame_too_large")
        assert not (daemon.root / "big").exists()
        assert_refusal_logged(daemon, "frame_too_large")
        assert_serving(daemon)
    finally:
        daemon.stop()


def test_a_frame_just_under_the_limit_is_accepted(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp, "--max-frame-size", "4096").start()
    try:
        with RawClient(daemon.socket) as client:
            opened = create(client, "just-fits.jsonl", x="y" * 3900)
            assert opened.meta == {"x": "y" * 3900}
        assert_serving(daemon)
    finally:
        daemon.stop()


def test_wrong_protocol_version_names_the_supported_versions(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket, hello=False) as client:
        client.send(Hello(id=1, version=PROTOCOL_VERSION + 41, client="future"))
        reply = _assert_refused_and_hung_up(client, "unsupported_version")
    assert reply.id == 1
    assert str(PROTOCOL_VERSION + 41) in reply.message
    assert f"version {PROTOCOL_VERSION}" in reply.message
    assert_refusal_logged(daemon, "unsupported_version")
    assert_serving(daemon)


def test_unknown_message_type_is_refused_and_the_connection_keeps_working(
    daemon: DaemonProcess,
) -> None:
    with RawClient(daemon.socket) as client:
        client.send_bytes(_raw_message(type="frobnicate", id=7, path="x"))
        reply = client.receive()
        assert isinstance(reply, ErrorReply), reply
        assert reply.code == "bad_message"
        assert isinstance(client.request(Status(id=client.next_id())), StatusReply)
        opened = create(client, "after-unknown.jsonl")
        assert opened.last_seq == 1
    assert_refusal_logged(daemon, "bad_message")
    assert_serving(daemon)


def test_message_that_is_not_a_map_is_refused_and_the_connection_keeps_working(
    daemon: DaemonProcess,
) -> None:
    with RawClient(daemon.socket) as client:
        client.send_bytes(_frame(_msgpack.encode([1, 2, 3])))
        reply = client.receive()
        assert isinstance(reply, ErrorReply) and reply.code == "bad_message", reply
        assert isinstance(client.request(Status(id=client.next_id())), StatusReply)
    assert_serving(daemon)


def test_absurdly_nested_message_is_refused_and_the_connection_keeps_working(
    daemon: DaemonProcess,
) -> None:
    deep = b"\x81\xa1a" * 100_000 + b"\xc0"  # {"a": {"a": ... nil}}, 100,000 deep
    payload = b"\x84\xa4type\xa6create\xa2id\x02\xa4path\xa4deep\xa4meta" + deep
    with RawClient(daemon.socket) as client:
        client.send_bytes(_frame(payload))
        reply = client.receive()
        assert isinstance(reply, ErrorReply) and reply.code == "bad_message", reply
        assert isinstance(client.request(Status(id=client.next_id())), StatusReply)
    assert not (daemon.root / "deep").exists()
    assert_refusal_logged(daemon, "bad_message")
    assert_serving(daemon)


def test_meta_that_cannot_be_json_is_refused_and_no_file_is_left(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        client.send_bytes(
            _raw_message(
                type="create", id=2, path="ext.jsonl", meta={"x": msgspec.msgpack.Ext(5, b"?")}
            )
        )
        reply = client.receive()
        assert isinstance(reply, ErrorReply) and reply.code == "bad_message", reply
        assert reply.id == 2
        assert isinstance(client.request(Status(id=client.next_id())), StatusReply)
    assert not (daemon.root / "ext.jsonl").exists()
    assert_refusal_logged(daemon, "bad_message")
    assert_serving(daemon)


def _nested_meta_create(depth: int, path: str) -> bytes:
    deep = b"\x81\xa1a" * depth + b"\xc0"  # {"a": {"a": ... nil}}
    return _frame(
        b"\x84\xa4type\xa6create\xa2id\x02\xa4path" + _msgpack.encode(path) + b"\xa4meta" + deep
    )


def test_meta_nested_too_deeply_for_every_reader_is_refused(daemon: DaemonProcess) -> None:
    # Near msgspec's depth limit a meta may decode from MessagePack and encode as
    # JSON, and still make a line that a reader with a deeper stack refuses.
    with RawClient(daemon.socket) as client:
        for depth in (300, 990):
            client.send_bytes(_nested_meta_create(depth, f"deep-{depth}.jsonl"))
            reply = client.receive()
            assert isinstance(reply, ErrorReply) and reply.code == "bad_message", reply
            # Refused by create (id 2) or, deeper, already by the frame decoder (id 0).
            assert reply.id == 2 or depth > 900, reply
            assert not (daemon.root / f"deep-{depth}.jsonl").exists()
    assert_refusal_logged(daemon, "bad_message")
    assert_serving(daemon)


def test_meta_nested_as_deep_as_the_codec_goes_is_written(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        client.send_bytes(_nested_meta_create(200, "deep.jsonl"))
        reply = client.receive()
        assert isinstance(reply, SessionOpened), reply
    report = check_file(daemon.root / "deep.jsonl")
    assert report.sound and report.records == 1, report


def test_first_message_other_than_hello_is_refused(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket, hello=False) as client:
        client.send(Status(id=1))
        reply = _assert_refused_and_hung_up(client, "hello_required")
    assert reply.id == 1
    assert_refusal_logged(daemon, "hello_required")
    assert_serving(daemon)


def test_second_hello_is_a_bad_message(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        reply = client.request(Hello(id=client.next_id(), version=PROTOCOL_VERSION))
        assert isinstance(reply, ErrorReply) and reply.code == "bad_message", reply
        assert isinstance(client.request(Status(id=client.next_id())), StatusReply)
    assert_serving(daemon)


def test_client_hanging_up_mid_frame(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        opened = create(client, "mid-frame.jsonl")
        run = begin(client, opened.session_id)
        client.send(fact(opened.session_id, run.run_id, 1))
        frame = _raw_message(
            type="record",
            session_id=opened.session_id,
            run_id=run.run_id,
            event_type="turn_start",
            time="2026-11-29T20:00:00.000000Z",
            data=b'{"turn_index":2}',
        )
        client.send_bytes(frame[: len(frame) // 2])
    assert_serving(daemon)
    with RawClient(daemon.socket) as again:
        reopened = open_when_released(again, "mid-frame.jsonl")
        assert reopened.last_seq == 3
    report = check_file(daemon.root / "mid-frame.jsonl")
    assert report.sound and report.records == 3 and report.open_runs == [run.run_id]


# ------------------------------------------------------------------- records


class _Run:
    """A session with an open run, on its own connection."""

    def __init__(self, daemon: DaemonProcess, path: str) -> None:
        self.daemon = daemon
        self.path = daemon.root / path
        self.client = RawClient(daemon.socket)
        opened = create(self.client, path)
        self.session_id = opened.session_id
        self.run_id = begin(self.client, self.session_id).run_id

    def assert_nothing_written(self) -> None:
        """Only session_start and run_start are in the file, and it reads."""
        assert synced_seq(self.client, self.session_id) == 2
        report = check_file(self.path)
        assert report.sound and report.records == 2 and not report.unfinished_tail, report
        assert [line["type"] for line in read_lines(self.path)] == ["session_start", "run_start"]

    def assert_still_records(self) -> None:
        self.client.send(fact(self.session_id, self.run_id, 99))
        assert synced_seq(self.client, self.session_id) == 3
        assert read_lines(self.path)[-1]["data"] == {"turn_index": 99}


@pytest.fixture
def run(daemon: DaemonProcess, request: pytest.FixtureRequest) -> Iterator[_Run]:
    session = _Run(daemon, f"records/{request.node.name}.jsonl")
    try:
        yield session
    finally:
        session.client.close()


def _refused_record(run: _Run, code: str, **kwargs: object) -> None:
    run.client.send(fact(run.session_id, run.run_id, **kwargs))  # type: ignore[arg-type]
    expect_record_failed(run.client, code, run.session_id)
    run.assert_nothing_written()
    assert_refusal_logged(run.daemon, code)
    run.assert_still_records()
    assert_serving(run.daemon)


def test_record_data_that_is_not_json(run: _Run) -> None:
    _refused_record(run, "bad_event", data=b'{"a": tru')


def test_record_data_that_is_a_json_array(run: _Run) -> None:
    _refused_record(run, "bad_event", data=b"[1, 2, 3]")


def test_record_data_that_is_a_json_string(run: _Run) -> None:
    _refused_record(run, "bad_event", data=b'"{}"')


def test_record_data_that_is_empty(run: _Run) -> None:
    _refused_record(run, "bad_event", data=b"")


def test_record_data_holding_a_raw_newline(run: _Run) -> None:
    # Valid JSON: a newline between tokens is whitespace.  It would split the line.
    _refused_record(run, "bad_event", data=b'{"a":\n1}')


def test_record_data_holding_a_raw_carriage_return(run: _Run) -> None:
    _refused_record(run, "bad_event", data=b'{"a":\r1}')


def test_record_data_with_trailing_garbage(run: _Run) -> None:
    _refused_record(run, "bad_event", data=b'{"a":1} {"b":2}')


def test_record_data_that_is_not_utf8(run: _Run) -> None:
    _refused_record(run, "bad_event", data=b'{"a":"\xff\xfe"}')


def test_record_data_with_a_lone_surrogate_escape(run: _Run) -> None:
    _refused_record(run, "bad_event", data=b'{"a":"\\ud800"}')


def test_record_data_nested_too_deeply(run: _Run) -> None:
    _refused_record(run, "bad_event", data=b'{"a":' + b"[" * 300 + b"]" * 300 + b"}")


def test_record_data_with_many_brackets_in_strings_is_not_too_deep(run: _Run) -> None:
    data = b'{"a":"' + b"[{" * 1000 + b'\\"' + b"[" * 1000 + b'","b":[[[1]]]}'
    run.client.send(fact(run.session_id, run.run_id, data=data))
    assert synced_seq(run.client, run.session_id) == 3
    report = check_file(run.path)
    assert report.sound and report.records == 3, report


def test_record_of_an_unknown_event_type(run: _Run) -> None:
    _refused_record(run, "bad_event", event_type="telepathy")


def test_record_of_a_never_written_type(run: _Run) -> None:
    _refused_record(run, "bad_event", event_type="message_update")


def test_record_of_a_structural_type(run: _Run) -> None:
    _refused_record(run, "bad_event", event_type="run_start")


def test_record_with_a_time_that_is_not_rfc3339(run: _Run) -> None:
    _refused_record(run, "bad_event", time="yesterday at noon")


def test_record_with_a_local_time(run: _Run) -> None:
    _refused_record(run, "bad_event", time="2026-11-29T20:00:00+01:00")


def test_record_with_an_impossible_date(run: _Run) -> None:
    _refused_record(run, "bad_event", time="2026-13-45T25:61:61.000000Z")


def test_record_in_the_year_zero(run: _Run) -> None:
    """Accepted before issue 27, and then every reader failed on the line."""
    _refused_record(run, "bad_event", time="0000-01-01T00:00:00.000000Z")


def test_record_with_non_ascii_digits_in_the_time(run: _Run) -> None:
    _refused_record(run, "bad_event", time="\uff12\uff10\uff12\uff16-11-29T20:00:00.000000Z")


def test_record_for_a_run_that_is_not_open(run: _Run) -> None:
    run.client.send(fact(run.session_id, new_id(), 1))
    expect_record_failed(run.client, "run_not_open", run.session_id)
    run.assert_nothing_written()
    assert_refusal_logged(run.daemon, "run_not_open")
    run.assert_still_records()
    assert_serving(run.daemon)


def test_record_before_any_run(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        opened = create(client, "no-run.jsonl")
        client.send(fact(opened.session_id, new_id(), 1))
        expect_record_failed(client, "run_not_open", opened.session_id)
        assert synced_seq(client, opened.session_id) == 1
    assert check_file(daemon.root / "no-run.jsonl").records == 1
    assert_refusal_logged(daemon, "run_not_open")
    assert_serving(daemon)


def test_record_for_a_session_owned_by_another_connection(run: _Run) -> None:
    with RawClient(run.daemon.socket) as intruder:
        intruder.send(fact(run.session_id, run.run_id, 1))
        expect_record_failed(intruder, "not_writer", run.session_id)
        # The intruder cannot sync, close or begin a run either.
        reply = intruder.request(Open(id=intruder.next_id(), path=str(run.path)))
        assert isinstance(reply, ErrorReply) and reply.code == "session_busy", reply
    run.assert_nothing_written()
    assert_refusal_logged(run.daemon, "not_writer")
    run.assert_still_records()
    assert_serving(run.daemon)


def test_record_for_a_session_nobody_opened(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        session_id = new_id()
        client.send(fact(session_id, new_id(), 1))
        expect_record_failed(client, "session_not_found", session_id)
        assert isinstance(client.request(Status(id=client.next_id())), StatusReply)
    assert_refusal_logged(daemon, "session_not_found")
    assert_serving(daemon)


def test_only_the_first_refused_record_of_a_run_is_pushed(run: _Run) -> None:
    for _ in range(50):
        run.client.send(fact(run.session_id, run.run_id, data=b"[]"))
    expect_record_failed(run.client, "bad_event", run.session_id)
    run.assert_nothing_written()
    assert not run.client.pending


def test_begin_run_twice_is_refused(run: _Run) -> None:

    reply = run.client.request(
        BeginRun(id=run.client.next_id(), session_id=run.session_id, time=now())
    )
    assert isinstance(reply, ErrorReply) and reply.code == "run_open", reply
    assert reply.session_id == run.session_id
    run.assert_nothing_written()
    assert_refusal_logged(run.daemon, "run_open")
    run.assert_still_records()
    assert_serving(run.daemon)


def test_checkpoint_snapshot_nested_too_deeply(run: _Run) -> None:

    reply = run.client.request(
        SaveCheckpoint(
            id=run.client.next_id(),
            session_id=run.session_id,
            run_id=run.run_id,
            time=now(),
            snapshot=b"[" * 257 + b"]" * 257,
        )
    )
    assert isinstance(reply, ErrorReply) and reply.code == "bad_event", reply
    run.assert_nothing_written()
    run.assert_still_records()


def test_checkpoint_snapshot_that_is_not_utf8(run: _Run) -> None:

    reply = run.client.request(
        SaveCheckpoint(
            id=run.client.next_id(),
            session_id=run.session_id,
            run_id=run.run_id,
            time=now(),
            snapshot=b'{"a":"\xff"}',
        )
    )
    assert isinstance(reply, ErrorReply) and reply.code == "bad_event", reply
    run.assert_nothing_written()
    assert_refusal_logged(run.daemon, "bad_event")
    run.assert_still_records()


# --------------------------------------------------------------------- paths


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory under no root, holding a valid session file."""
    base = Path(tempfile.mkdtemp(prefix="fl-out-", dir="/tmp"))
    line = encode_line(
        Record(
            session_id=new_id(),
            seq=1,
            type="session_start",
            time="2026-11-29T20:00:00.000000Z",
            data=msgspec.Raw(b'{"format_version":1,"meta":{}}'),
        )
    )
    (base / "target.jsonl").write_bytes(line)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _refused_path(
    daemon: DaemonProcess, path: str, *, ops: tuple[str, ...] = ("open", "create")
) -> None:
    with RawClient(daemon.socket) as client:
        for op in ops:
            if op == "open":
                reply = client.request(Open(id=client.next_id(), path=path))
            else:
                reply = client.request(Create(id=client.next_id(), path=path))
            assert isinstance(reply, ErrorReply), (op, reply)
            assert reply.code == "path_refused", (op, reply)
            assert reply.message
    assert_refusal_logged(daemon, "path_refused")
    assert_serving(daemon)


def test_dotdot_escaping_the_root(daemon: DaemonProcess) -> None:
    _refused_path(daemon, "../escape.jsonl")
    assert not (daemon.root.parent / "escape.jsonl").exists()


def test_dotdot_inside_a_path(daemon: DaemonProcess) -> None:
    _refused_path(daemon, "a/../../escape.jsonl")


def test_absolute_path_outside_the_roots(daemon: DaemonProcess, outside: Path) -> None:
    _refused_path(daemon, str(outside / "new.jsonl"))
    _refused_path(daemon, str(outside / "target.jsonl"), ops=("open",))
    assert not (outside / "new.jsonl").exists()


def test_absolute_path_that_only_shares_a_prefix_with_the_root(daemon: DaemonProcess) -> None:
    _refused_path(daemon, str(daemon.root) + "-evil/x.jsonl")


def test_empty_path_and_nul_byte(daemon: DaemonProcess) -> None:
    _refused_path(daemon, "")
    _refused_path(daemon, "a\x00b.jsonl")


def test_path_naming_the_root_itself(daemon: DaemonProcess) -> None:
    _refused_path(daemon, str(daemon.root))


def test_name_too_long(daemon: DaemonProcess) -> None:
    _refused_path(daemon, "x" * 300 + ".jsonl")


def test_path_deeper_than_path_max(daemon: DaemonProcess) -> None:
    _refused_path(daemon, "d/" * 3000 + "s.jsonl")
    assert not (daemon.root / "d").exists()


def test_absolute_path_inside_an_allowed_root(short_tmp: Path, outside: Path) -> None:
    daemon = DaemonProcess(short_tmp, "--allow", str(outside)).start()
    try:
        with RawClient(daemon.socket) as client:
            opened = create(client, str(outside / "sub" / "allowed.jsonl"), app="t")
            assert opened.path == str(outside / "sub" / "allowed.jsonl")
            reopened = client.request(Open(id=client.next_id(), path=str(outside / "target.jsonl")))
            assert isinstance(reopened, SessionOpened), reopened
        assert check_file(outside / "sub" / "allowed.jsonl").sound
        _refused_path(daemon, str(outside) + "/../escape.jsonl")
    finally:
        daemon.stop()


def test_symlink_as_the_file_pointing_out_of_the_root(daemon: DaemonProcess, outside: Path) -> None:
    before = (outside / "target.jsonl").read_bytes()
    (daemon.root / "link.jsonl").symlink_to(outside / "target.jsonl")
    _refused_path(daemon, "link.jsonl")
    _refused_path(daemon, str(daemon.root / "link.jsonl"))
    assert (outside / "target.jsonl").read_bytes() == before


def test_dangling_symlink_as_the_file(daemon: DaemonProcess, outside: Path) -> None:
    (daemon.root / "dangling.jsonl").symlink_to(outside / "not-yet.jsonl")
    _refused_path(daemon, "dangling.jsonl")
    assert not (outside / "not-yet.jsonl").exists()


def test_symlink_as_an_intermediate_directory(daemon: DaemonProcess, outside: Path) -> None:
    (daemon.root / "linkdir").symlink_to(outside)
    _refused_path(daemon, "linkdir/target.jsonl")
    _refused_path(daemon, "linkdir/new.jsonl")
    _refused_path(daemon, "linkdir/deeper/new.jsonl")
    assert sorted(p.name for p in outside.iterdir()) == ["target.jsonl"]


def test_fifo_in_place_of_the_session_file(daemon: DaemonProcess) -> None:
    os.mkfifo(daemon.root / "fifo.jsonl")
    _refused_path(daemon, "fifo.jsonl")


def test_directory_in_place_of_the_session_file(daemon: DaemonProcess) -> None:
    (daemon.root / "dir.jsonl").mkdir()
    _refused_path(daemon, "dir.jsonl")


def test_file_in_place_of_a_directory(daemon: DaemonProcess) -> None:
    (daemon.root / "plain").write_text("not a directory")
    _refused_path(daemon, "plain/s.jsonl")


# ---------------------------------------------------------- session refusals


def test_create_of_an_existing_file(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        first = create(client, "exists.jsonl")

        client.request(CloseSession(id=client.next_id(), session_id=first.session_id))
        reply = client.request(Create(id=client.next_id(), path="exists.jsonl"))
        assert isinstance(reply, ErrorReply) and reply.code == "session_exists", reply
    report = check_file(daemon.root / "exists.jsonl")
    assert report.sound and report.session_id == first.session_id and report.records == 1
    assert_refusal_logged(daemon, "session_exists")
    assert_serving(daemon)


def test_create_of_a_path_held_open(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client, RawClient(daemon.socket) as other:
        create(client, "held.jsonl")

        reply = other.request(Create(id=other.next_id(), path="held.jsonl"))
        assert isinstance(reply, ErrorReply) and reply.code == "session_exists", reply
    assert_serving(daemon)


def test_open_of_a_missing_file(daemon: DaemonProcess) -> None:
    with RawClient(daemon.socket) as client:
        reply = client.request(Open(id=client.next_id(), path="missing/nothing.jsonl"))
        assert isinstance(reply, ErrorReply) and reply.code == "session_not_found", reply
    assert not (daemon.root / "missing").exists()
    assert_refusal_logged(daemon, "session_not_found")
    assert_serving(daemon)


def _corrupt_file(path: Path) -> bytes:
    session_id = new_id()

    def line(seq: int, type: str, data: bytes) -> bytes:
        return encode_line(
            Record(
                session_id=session_id,
                seq=seq,
                type=type,
                time="2026-11-29T20:00:00.000000Z",
                data=msgspec.Raw(data),
            )
        )

    content = (
        line(1, "session_start", b'{"format_version":1,"meta":{}}')
        + line(2, "turn_start", b"{}")
        + b'{"session_id": "broken\n'
        + line(4, "turn_start", b"{}")
    )
    path.write_bytes(content)
    return content


def test_open_of_a_corrupt_file_names_the_line(daemon: DaemonProcess) -> None:
    content = _corrupt_file(daemon.root / "corrupt.jsonl")
    with RawClient(daemon.socket) as client:
        reply = client.request(Open(id=client.next_id(), path="corrupt.jsonl"))
        assert isinstance(reply, ErrorReply) and reply.code == "session_corrupt", reply
        assert "line 3" in reply.message
    assert (daemon.root / "corrupt.jsonl").read_bytes() == content
    assert_refusal_logged(daemon, "session_corrupt")
    assert_serving(daemon)


def test_open_of_a_file_that_is_not_a_session(daemon: DaemonProcess) -> None:
    (daemon.root / "empty.jsonl").write_bytes(b"")
    (daemon.root / "other.jsonl").write_bytes(b'{"hello": "world"}\n')
    (daemon.root / "binary.jsonl").write_bytes(os.urandom(4096) + b"\n")
    with RawClient(daemon.socket) as client:
        for name in ("empty.jsonl", "other.jsonl", "binary.jsonl"):
            reply = client.request(Open(id=client.next_id(), path=name))
            assert isinstance(reply, ErrorReply) and reply.code == "session_corrupt", reply
    assert (daemon.root / "empty.jsonl").read_bytes() == b""
    assert_serving(daemon)


# ------------------------------------------------------------------- the log


def test_every_refusal_is_logged_with_the_peers_pid_and_uid(
    daemon: DaemonProcess, outside: Path
) -> None:

    with RawClient(daemon.socket) as client, RawClient(daemon.socket) as other:
        opened = create(client, "log.jsonl")
        run = begin(client, opened.session_id)
        client.send(fact(opened.session_id, run.run_id, data=b"[]"))  # bad_event
        client.request(BeginRun(id=client.next_id(), session_id=opened.session_id, time=now()))
        client.request(Create(id=client.next_id(), path=str(outside / "x.jsonl")))
        client.request(Open(id=client.next_id(), path="missing.jsonl"))
        other.request(Open(id=other.next_id(), path="log.jsonl"))  # session_busy
        other.send(fact(opened.session_id, run.run_id))  # not_writer
        other.send_bytes(_raw_message(type="frobnicate", id=9))
        received = [other.receive(), other.receive()]
        assert {type(m).__name__ for m in received} == {"RecordFailed", "ErrorReply"}, received
        assert synced_seq(client, opened.session_id) == 2
    with RawClient(daemon.socket, hello=False) as stranger:
        stranger.send(Hello(id=1, version=99))
        assert stranger.closed_by_daemon()
    wanted = {
        "bad_event",
        "run_open",
        "path_refused",
        "session_not_found",
        "session_busy",
        "not_writer",
        "bad_message",
        "unsupported_version",
    }

    def refusals() -> list[dict[str, object]]:
        return [e for e in log_events(daemon) if e.get("event") == "refused"]

    wait_for(lambda: {e["code"] for e in refusals()} >= wanted)
    for event in refusals():
        assert (event["pid"], event["uid"]) == (os.getpid(), os.getuid()), event
        assert event["level"] == "warning"
        assert event["reason"]
