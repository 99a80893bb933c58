"""What a session actor is sent, and the parts it talks to as it sees them.

A connection is a :class:`Peer` to the actors it writes, a live tail a
:class:`Subscriber`, the registry of sessions a :class:`Registry`; the actor holds
them through these Protocols only.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import msgspec

from flightlog.protocol import (
    FlightlogError,
)
from flightlog.protocol.wire import (
    CloseRun,
    Message,
    RecordEvent,
    RecordLines,
    SaveCheckpoint,
    StartRun,
)

from ._channel import ThreadWrite
from ._fairness import UidShare

__all__ = [
    "LARGE_PAYLOAD",
    "Item",
    "Peer",
    "Records",
    "Registry",
    "Release",
    "Shutdown",
    "Subscriber",
    "payload_size",
]

Actor = TypeVar("Actor", contravariant=True)


class Peer(Protocol):
    """What an actor needs of a connection."""

    pid: int
    uid: int
    gid: int
    #: Supplementary groups of the peer (``SO_PEERGROUPS``), for read access.
    groups: tuple[int, ...]
    client: str
    closed: bool
    #: Its uid's share: the session's batches and disk jobs take its turns.
    share: UidShare

    @property
    def refusals(self) -> object:
        """What its refusals are counted and logged under (``_refusals``)."""
        ...

    async def send(self, message: Message) -> None: ...

    def refuse(self, record: RecordEvent | RecordLines, error: FlightlogError) -> None:
        """``record`` (or those records) was not written: its refusal goes to the
        client (once per run)."""
        ...

    def run_not_opened(self, start: StartRun) -> None:
        """The session refused ``start`` (its reply says so): the run is not open."""
        ...

    def fail(self, session_id: str, error: FlightlogError) -> None:
        """The session's file failed: its rules refuse every later write with
        ``error``, and the client hears of it (once)."""
        ...

    def release_bytes(self, count: int) -> None: ...

    def fits(self, count: int) -> bool:
        """Whether :meth:`reserve` would charge ``count`` bytes without waiting."""
        ...

    async def reserve(self, count: int) -> None:
        """Charge ``count`` bytes the session is about to hold for the client (a
        checkpoint it loads) to its memory budget, once they fit there; they are
        handed back with :meth:`release_bytes`."""
        ...

    def thread_write(self, messages: list[Message]) -> ThreadWrite | None:
        """``messages``, to be written by a disk thread right after a sync; None when
        they must go through :meth:`send`."""
        ...


class Subscriber(Protocol):
    """A live tail of this session, fed after every successful write."""

    def publish(
        self, chunk: bytes, first_seq: int, last_seq: int, end_offset: int, path: str = ""
    ) -> None: ...

    def session_closed(self, last_seq: int) -> None: ...


class Registry(Protocol[Actor]):
    """What an actor tells the registry that started it."""

    @property
    def tailing_all(self) -> bool:
        """Whether anyone tails every session (then :meth:`publish_all` wants lines)."""
        ...

    def publish_all(
        self, chunk: bytes, first_seq: int, last_seq: int, end_offset: int, path: str
    ) -> None: ...

    def file_used(self, actor: Actor, records: int, nbytes: int) -> None: ...

    def file_idle(self, actor: Actor) -> None: ...

    def session_failed(self, actor: Actor) -> None: ...

    def session_finished(self, actor: Actor) -> None: ...


class Release(msgspec.Struct, frozen=True):
    """The writer's connection went away: write what it sent, sync, release."""


class Shutdown(msgspec.Struct, frozen=True):
    """The daemon is stopping: write, sync and close."""


#: Records a connection hands to an actor as one item: those of one session it
#: took in a row from one read (docs/architecture.md), one by one or, those the C
#: accelerator took, as stretches of lines.
Records = list[RecordEvent | RecordLines]

Item = tuple["Peer | None", Message | StartRun | Release | Shutdown | Records]


#: Payloads (record data, checkpoint snapshots) longer than this are checked by the
#: connection in a worker thread (the server connection checks only the shorter
#: ones): checking megabytes on the event loop would stall every client.
LARGE_PAYLOAD = 64 * 1024

#: What a request handed to an actor is counted as, beyond its long fields.
REQUEST_SIZE = 256


def payload_size(message: object) -> int:
    """Bytes a message handed to an actor is counted as until it is written: what a
    connection's buffer and the daemon's memory budget count.  A record counts its
    JSON payload; a request its long fields and :data:`REQUEST_SIZE`; what the
    daemon tells an actor itself (release, shutdown) nothing."""
    if isinstance(message, list):
        return sum(
            record.size if type(record) is RecordLines else len(record.data) for record in message
        )
    if isinstance(message, RecordEvent):
        return len(message.data)
    if isinstance(message, SaveCheckpoint):
        return REQUEST_SIZE + len(message.snapshot)
    if isinstance(message, CloseRun):
        return REQUEST_SIZE + len(message.error or "")
    if isinstance(message, StartRun):
        return REQUEST_SIZE + len(message.request.client)
    if isinstance(message, (Release, Shutdown)):
        return 0
    return REQUEST_SIZE
