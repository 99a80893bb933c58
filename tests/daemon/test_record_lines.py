"""The session actor's path for stretches of records: through LineEncoder, the bytes
msgspec writes for each Record; behind the writer's real server connection, a bad
record amid good ones is refused alone, and records queued behind a failure or sent
by another connection are refused by the actor, once per run."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from flightlog.daemon._access import Access
from flightlog.daemon._actor import Item, SessionActor
from flightlog.daemon._config import Config
from flightlog.daemon._fairness import UidShare
from flightlog.daemon._paths import Roots
from flightlog.daemon._primitives import Disks
from flightlog.daemon._sessions import Sessions
from flightlog.daemon._storage import SessionFile
from flightlog.daemon._tail import Tails
from flightlog.protocol import (
    AGENT_FACT_TYPES,
    ErrorCode,
    FlightlogError,
    Record,
    check,
    new_id,
)
from flightlog.protocol.wire import (
    PROTOCOL_VERSION,
    Hello,
    Message,
    RecordEvent,
    RecordFailed,
    ServerConnection,
    SessionOpened,
    client_decoder,
    encode_frame,
)

pytestmark = pytest.mark.anyio


class _Peer:
    """A connection as an actor sees it, with the real server connection's rules."""

    pid = 1
    uid = 1
    gid = 1
    groups: tuple[int, ...] = ()
    client = "test"
    closed = False
    share = UidShare(uid, None)

    @property
    def refusals(self) -> object:
        return self

    def __init__(self) -> None:
        self.server = ServerConnection()
        self.released = 0
        self._pushed: list[Message] = []
        self._decoder = client_decoder()
        self.events(Hello(id=1, version=PROTOCOL_VERSION))
        assert self.pushed[0].__class__.__name__ == "Welcome"
        self._pushed.clear()

    def events(self, *messages: Message) -> list[object]:
        """What the rules let through of ``messages``."""
        self.server.receive_data(b"".join(map(encode_frame, messages)))
        return list(iter(self.server.next_event, None))

    @property
    def pushed(self) -> list[Message]:
        self._decoder.feed(self.server.data_to_send())
        self._pushed.extend(self._decoder)
        return self._pushed

    async def send(self, message: Message) -> None:
        raise AssertionError(f"no reply expected: {message}")

    def refuse(self, record: RecordEvent, error: FlightlogError) -> None:
        self.server.refuse(record, error)

    def fail(self, session_id: str, error: FlightlogError) -> None:
        self.server.fail(session_id, error)

    def release_bytes(self, count: int) -> None:
        self.released += count


@pytest.fixture
def actors() -> Iterator[list[SessionActor]]:
    made: list[SessionActor] = []
    yield made
    for actor in made:
        actor.file.close()


def _actor(made: list[SessionActor], tmp_path: Path, writer: _Peer) -> tuple[SessionActor, str]:
    roots = Roots(str(tmp_path))
    file = SessionFile.create(
        roots,
        roots.resolve("s.jsonl"),
        session_id=new_id(),
        meta={},
        time="2026-11-29T20:00:00Z",
    )
    config = Config(socket_path=str(tmp_path / "sock"), root=str(tmp_path))
    disks = Disks()
    group = anyio.create_task_group()  # never entered: these tests start no task
    access = Access(roots, daemon_uid=os.geteuid(), readers_gid=None)
    tails = Tails(config, roots, disks, group, access)
    registry = Sessions(config, roots, disks, group, tails, access)
    actor = SessionActor(
        file,
        writer,  # type: ignore[arg-type]
        registry=registry,
        disk=disks(str(tmp_path)),
        config=config,
    )
    opened = SessionOpened(id=2, session_id=actor.session_id, path=actor.path, last_seq=1)
    writer.server.opened(opened, actor.rules)
    writer.server.data_to_send()
    actor.file.ledger.writing = new_id()
    actor.rules.begin_run(actor.run_id)
    made.append(actor)
    return actor, actor.run_id


def _lines(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        return f.read().splitlines(keepends=True)


DATA = [
    b"{}",
    b'{"a":1}',
    b'{"text":"caf\xc3\xa9 \xe2\x9c\x93 \\u00e9 \\"quoted\\" \\\\ /","n":[1,2.5,-3e10,null,true]}',
    b'{ "spaced" : [ { } ] }',
    b'{"deep":' + b"[" * 250 + b"]" * 250 + b"}",
]
TIMES = [
    "2026-11-29T20:00:41Z",
    "2026-11-29T20:00:41.1Z",
    "2026-11-29T20:00:41.123456Z",
    "2026-11-29T20:00:41.123456789Z",
    "2026-11-29T20:00:42.000001Z",
    "0999-01-02T03:04:05.000006Z",
]


async def test_lines_are_byte_for_byte_what_msgspec_writes_for_the_record(
    tmp_path: Path, actors: list[SessionActor]
) -> None:
    writer = _Peer()
    actor, run_id = _actor(actors, tmp_path, writer)
    events = [
        RecordEvent(
            session_id=actor.session_id,
            run_id=run_id,
            event_type=kind,
            time=TIMES[i % len(TIMES)],
            data=DATA[i % len(DATA)],
        )
        for i, kind in enumerate(sorted(AGENT_FACT_TYPES) * 3)
    ]
    # Items of one to five records, as a connection hands them.
    batch: list[Item] = []
    start = 0
    while start < len(events):
        size = 1 + len(batch) % 5
        batch.append((writer, events[start : start + size]))
        start += size
    # Several batches, so that seq carries over and stretches start at any item.
    assert not await actor._process(batch[:1])
    assert not await actor._process(batch[1:7])
    assert not await actor._process(batch[7:])
    expected = bytearray()
    for seq, event in enumerate(events, start=2):
        # msgspec's own encoding of the Record: the oracle the LineEncoder must match.
        record = Record(
            session_id=actor.session_id,
            seq=seq,
            type=event.event_type,
            time=event.time,
            run_id=run_id,
            data=msgspec.Raw(event.data),
        )
        expected += msgspec.json.encode(record) + b"\n"
    assert b"".join(_lines(actor.path)[1:]) == bytes(expected)
    assert writer.pushed == []
    assert writer.released == sum(len(event.data) for event in events)
    assert actor.file.last_seq == len(events) + 1
    assert check(io.BytesIO(b"".join(_lines(actor.path)))).sound


BAD: list[tuple[str, dict[str, Any]]] = [
    ("bad_event", {"time": "2026-11-29T20:00:41.Z"}),
    ("bad_event", {"time": "2026-11-29T20:00:41.1234567890Z"}),
    ("bad_event", {"time": "2026-11-29T20:00:41.\u0663Z"}),
    ("bad_event", {"time": "2026-11-29T20:00:41"}),
    ("bad_event", {"time": "2026-02-30T20:00:41.5Z"}),
    ("bad_event", {"event_type": "run_start"}),
    ("bad_event", {"event_type": "message_update"}),
    ("bad_event", {"data": b"[1]"}),
    ("bad_event", {"data": b'{"a":\n1}'}),
    ("bad_event", {"data": b'{"a":\r1}'}),
    ("bad_event", {"data": b'{"a":"\xff"}'}),
    ("bad_event", {"data": b"{"}),
    ("bad_event", {"data": b'{"a":' + b"[" * 300 + b"]" * 300 + b"}"}),
    ("run_not_open", {"run_id": "0" * 32}),
]


@pytest.mark.parametrize(("code", "change"), BAD)
async def test_a_bad_record_amid_good_ones_is_refused_alone(
    tmp_path: Path, actors: list[SessionActor], code: str, change: dict[str, Any]
) -> None:
    writer, other = _Peer(), _Peer()
    actor, run_id = _actor(actors, tmp_path, writer)
    good = {
        "session_id": actor.session_id,
        "run_id": run_id,
        "event_type": "tool_exec_start",
        "time": "2026-11-29T20:00:41.5Z",  # the second the bad times share
        "data": b'{"n":1}',
    }
    bad = RecordEvent(**{**good, **change})
    ok = RecordEvent(**good)
    # The writer's rules refuse the bad one (once per run), and let the rest through.
    passed = writer.events(ok, bad, bad, ok, ok)
    assert passed == [ok, ok, ok]
    batch: list[Item] = [
        (writer, [ok, ok]),
        (other, [ok]),  # not the writer: refused by the actor
        (other, [ok]),
        (writer, [ok]),
    ]
    assert not await actor._process(batch)
    lines = _lines(actor.path)[1:]
    assert [msgspec.json.decode(line)["seq"] for line in lines] == [2, 3, 4]
    assert all(line.endswith(b',"data":{"n":1}}\n') for line in lines)
    [refusal] = writer.pushed
    assert isinstance(refusal, RecordFailed) and refusal.code == code, refusal
    # Refused as the rules refuse a record of a session the connection does not write.
    assert [(type(m), getattr(m, "code", None)) for m in other.pushed] == [
        (RecordFailed, "not_writer")
    ] * 2
    assert writer.released == 3 * len(ok.data)
    assert other.released == 2 * len(ok.data)


async def test_records_queued_behind_a_failure_are_refused_with_it_once_per_run(
    tmp_path: Path, actors: list[SessionActor]
) -> None:
    writer = _Peer()
    actor, run_id = _actor(actors, tmp_path, writer)
    event = RecordEvent(
        session_id=actor.session_id,
        run_id=run_id,
        event_type="tool_exec_start",
        time="2026-11-29T20:00:41.5Z",
        data=b"{}",
    )
    # Both passed the rules before the write failed.
    assert writer.events(event, event) == [event, event]
    actor.error = FlightlogError("the disk failed", code=ErrorCode.WRITE_FAILED)
    assert not await actor._process([(writer, [event]), (writer, [event])])
    assert len(_lines(actor.path)) == 1
    [pushed] = writer.pushed
    assert isinstance(pushed, RecordFailed) and pushed.message == "the disk failed"
    assert writer.released == 4
