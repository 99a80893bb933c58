"""Live tail subscriptions: catch up from the file, then follow what the actor writes.

Each subscription has a task of its own.  It delivers records with ``seq > after`` in
order: from the file first (read in a disk thread, complete lines only), then from
the chunks the session's actor publishes after each write.  The actor publishes only
what it has already written, so the file always holds everything published; a
subscriber whose bounded live buffer overflows drops it and continues from the file
where it was.  A slow subscriber therefore never slows the writer and never grows the
daemon's memory beyond its buffer; it just reads from disk until it catches up.

What a subscription makes the daemon hold is charged to its connection's memory
budget (:class:`~._budget.ConnectionBudget`, and through it to its uid's share and to
``--max-buffered``): :data:`SUBSCRIPTION_BYTES` for as long as it lives, twice the
bytes of each live chunk it buffers (the chunk, then its lines and their frame) from
the moment it takes the chunk until the socket (or the connection's queue, charged
in turn) took it, twice a batch's bytes for each batch read from the file, room for
which it waits first, and what its reader of the file holds from one batch to the
next.  All of it stays within half the budget beyond the connection's floor.  A
subscription is refused (``too_many``) when its own
cost does not fit, and a chunk that does not fit makes it fall behind, as a full
buffer does: the file has it all.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup

from flightlog.protocol import (
    ErrorCode,
    FlightlogError,
    LocalProtocolError,
)
from flightlog.protocol.wire import (
    MAX_SUBSCRIPTIONS,
    Ack,
    Message,
    Subscribe,
    Subscribed,
    TailBatch,
    TailEnd,
    Unsubscribe,
)

from ._access import Access
from ._actor import SessionActor
from ._budget import ConnectionBudget
from ._config import Config
from ._fairness import UidShare
from ._file_tail import _BATCH_BYTES, FileTail
from ._paths import ResolvedPath, Roots
from ._primitives import Disks

__all__ = ["SUBSCRIPTION_BYTES", "TailPeer", "Tails"]

log = structlog.get_logger("flightlogd.tail")

#: Bytes of live records a subscriber buffers before it falls back to the file (a
#: subscription to every session, which has no file to fall back to, has room for two
#: of the longest lines beyond it).
_LIVE_BYTES = 4 * 1024 * 1024
#: Bytes of live records all the subscriptions of one connection buffer at most.
_CONNECTION_LIVE_BYTES = 16 * 1024 * 1024
#: What a subscription costs the daemon while it lives, whatever it buffers: its task,
#: its objects, its reader of the file (docs/operations.md, ``--max-buffered``).
SUBSCRIPTION_BYTES = 4 * 1024
#: Subscriptions take at most ``1 / _PART`` of the memory budget (and of a uid's share)
#: beyond each connection's floor: what they hold never stops the writers being read.
_PART = 2


class _Head(msgspec.Struct):
    seq: int = 0
    type: str = ""
    run_id: str | None = None


_decode_head = msgspec.json.Decoder(_Head).decode


class TailPeer(Protocol):
    """What the tails need of a connection: its number, its credentials, the memory
    budget its subscriptions are charged to, its uid's share (whose turns its pushes
    take), a way to send."""

    number: int
    uid: int
    gid: int
    groups: tuple[int, ...]
    memory: ConnectionBudget
    share: UidShare

    async def send(self, message: Message) -> None: ...


class _PeerTails:
    """One connection's subscriptions, and what they share: one batch read from a
    file at a time, and one budget of live bytes."""

    def __init__(self) -> None:
        self.subscriptions: dict[int, Subscription] = {}
        self.reading = anyio.Lock()
        self.live_bytes = 0


class Subscription:
    """One subscriber of one session (or of all sessions, with ``resolved`` None)."""

    def __init__(
        self,
        peer: TailPeer,
        shared: _PeerTails,
        number: int,
        request: Subscribe,
        resolved: ResolvedPath | None,
        *,
        config: Config,
        roots: Roots,
        disks: Disks,
        on_end: Callable[[Subscription], None],
        readable: Callable[[str], bool] | None = None,
    ) -> None:
        self.peer = peer
        self._memory = peer.memory
        self.shared = shared
        self.number = number
        self.resolved = resolved
        self.follow = request.follow or resolved is None
        self.types = frozenset(request.types) if request.types else None
        self.run_id = request.run_id
        self.next_seq = request.after + 1
        # Where the file is read on from (0: its start) and the seq of the line there:
        # the line with seq == next_seq, or one before it when the subscriber asked
        # for seqs the file did not hold yet.
        self.offset = 0
        self.offset_seq = 1
        self.live: deque[tuple[bytes, int, int, int, str]] = deque()
        self.live_bytes = 0
        self.overflowed = False
        self.behind = True  # the file holds records the live buffer does not
        self.closed_at: int | None = None  # the writer closed the session at this seq
        self.waiting = False  # following a session that does not exist yet
        self.stopping = False  # the daemon is shutting down
        self.wakeup = anyio.Event()
        self.scope = anyio.CancelScope()
        self.actor: SessionActor | None = None
        self._buffer_items = config.subscriber_buffer
        self._max_line = config.max_line
        # A stalled subscriber of one session holds no more than this: past it, the
        # file has it all.
        self._live_limit = _LIVE_BYTES + (2 * config.max_line if resolved is None else 0)
        self._shared_limit = _CONNECTION_LIVE_BYTES + 2 * config.max_line
        self._roots = roots
        self._disks = disks
        self._on_end = on_end
        #: Of a subscription to every session: which sessions its peer may read
        #: (None: all of them).
        self._readable = readable

    @property
    def path(self) -> str | None:
        return self.resolved.path if self.resolved else None

    # --------------------------------------------------- Subscriber protocol

    def publish(
        self, chunk: bytes, first_seq: int, last_seq: int, end_offset: int, path: str = ""
    ) -> None:
        if self._readable is not None and not self._readable(path):
            return
        # A subscriber with nothing buffered keeps up: it takes a chunk of any size (the
        # actor's one copy, shared by every subscriber, costs nothing more).  Past its
        # buffer, a subscriber of one session reads the file instead; a subscriber of
        # every session has no file to read, so its buffer has room for two of the
        # longest lines beyond its own size: a record as large as a frame, the next one
        # written before the subscriber has sent the first, is not falling behind.
        # Whatever it holds, a chunk must fit the connection's memory budget.
        if (
            self.live
            and (
                len(self.live) >= self._buffer_items
                or self.live_bytes + len(chunk) > self._live_limit
                or self.shared.live_bytes + len(chunk) > self._shared_limit
            )
        ) or (not self.behind and not self._memory.fits(2 * len(chunk), part=_PART)):
            # Fallen behind: forget the buffer, the file has it all.
            self._clear_live()
            self.behind = True
            self.overflowed = True
        elif not self.behind:
            self.live.append((chunk, first_seq, last_seq, end_offset, path))
            self.live_bytes += len(chunk)
            self.shared.live_bytes += len(chunk)
            self._memory.charge(2 * len(chunk))
        self.wakeup.set()

    def _clear_live(self) -> None:
        self.live.clear()
        self.shared.live_bytes -= self.live_bytes
        self._memory.discharge(2 * self.live_bytes)
        self.live_bytes = 0

    def session_closed(self, last_seq: int) -> None:
        self.closed_at = last_seq
        self.wakeup.set()

    # ------------------------------------------------------------------ task

    async def run(self) -> None:
        reason, code, message = "unsubscribed", None, None
        with self.scope:
            try:
                reason = await self._deliver()
            except FlightlogError as exc:
                reason, code, message = "error", exc.code, exc.message
            except OSError as exc:
                reason, code, message = "error", ErrorCode.INTERNAL, f"reading the file: {exc}"
            except Exception:
                # A bug ends this subscription, not the daemon.
                log.exception("subscription_failed", conn=self.peer.number, path=self.path)
                reason, code, message = "error", ErrorCode.INTERNAL, "see flightlogd's log"
        self._on_end(self)
        self._clear_live()
        if self.scope.cancel_called and self.stopping:
            reason = "shutting_down"
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await self.peer.send(
                TailEnd(
                    subscription=self.number,
                    reason=reason,
                    last_seq=self.next_seq - 1,
                    code=code,
                    message=message,
                )
            )

    async def _deliver(self) -> str:
        if self.resolved is None:
            while not self.overflowed:
                await self._send_live()
                await self._wait()
            # Every session's file is not one file to catch up from: say so and stop.
            raise LocalProtocolError(
                "this subscriber fell more than its buffer behind; subscribe again",
                code=ErrorCode.TOO_MANY,
            )
        while True:
            if self.behind:
                self.wakeup = anyio.Event()
                # Anything published from here on is also in the file past our offset.
                self.behind = False
                self._clear_live()
                try:
                    await self._catch_up()
                except FlightlogError as exc:
                    if not (exc.code == ErrorCode.SESSION_NOT_FOUND and self.waiting):
                        raise
                    # Following a session that does not exist yet (tail -F): it is
                    # read from its start once created (Tails.session_started).
                    await self._wait()
                    continue
            await self._send_live()
            if self.closed_at is not None and self.next_seq > self.closed_at:
                return "session_closed"
            if not self.follow:
                return "end_of_file"
            if not self.behind:
                await self._wait()

    async def _wait(self) -> None:
        await self.wakeup.wait()
        self.wakeup = anyio.Event()

    async def _catch_up(self) -> None:
        assert self.resolved is not None
        reader = FileTail(
            self._roots, self.resolved, self.offset, self.offset_seq, self.next_seq, self._max_line
        )
        disk = self._disks.reader(self.resolved.root)
        memory = self._memory
        held = 0  # charged for what the reader holds from one batch to the next
        share = self.peer.share
        try:
            while True:
                # Each batch read and sent is a turn of the uid's (as its connections'
                # and its sessions' are), its reading a disk job of the uid's.
                await share.take_turn()
                # One batch read and sent at a time per connection: a client that tails
                # many sessions and reads slowly holds one batch in the daemon, not one
                # each.  Room for it first: it is charged until it is sent.
                async with self.shared.reading:
                    await memory.reserve(charged := 2 * _BATCH_BYTES, part=_PART)
                    try:
                        lines = await disk.run(reader.read_batch, account=share)
                        if (size := 2 * sum(map(len, lines))) > charged:  # a long line
                            memory.charge(size - charged)
                            charged = size
                        memory.charge(reader.held)
                        memory.discharge(held)
                        held = reader.held
                        self.next_seq = reader.next_seq
                        self.offset, self.offset_seq = reader.offset, reader.offset_seq
                        if lines:
                            began = time.thread_time()
                            await self._send([ln for ln in lines if self._wanted(ln)], None)
                            await share.pace(0, time.thread_time() - began)
                        elif reader.at_end:
                            break
                    finally:
                        memory.discharge(charged)
        finally:
            memory.discharge(held)
            reader.close()

    async def _send_live(self) -> None:
        share = self.peer.share
        while self.live and not self.behind:
            # Each push is a turn of the uid's, and its time the uid's.
            await share.take_turn()
            if not self.live or self.behind:
                break  # fallen behind meanwhile: the file has it
            began = time.thread_time()
            chunk, first_seq, last_seq, end_offset, path = self.live.popleft()
            self.live_bytes -= len(chunk)
            self.shared.live_bytes -= len(chunk)
            try:  # charged until sent
                if self.resolved is not None:
                    if last_seq < self.next_seq:
                        continue
                    skip = self.next_seq - first_seq if self.next_seq > first_seq else 0
                    self.next_seq = self.offset_seq = last_seq + 1
                    self.offset = end_offset
                else:
                    skip = 0
                lines = [line for line in chunk.split(b"\n")[skip:-1] if self._wanted(line)]
                # Its sending too (what waits for room meanwhile is charged to it).
                await self._send(lines, path or None)
                spent = time.thread_time() - began
            finally:
                self._memory.discharge(2 * len(chunk))
            await share.pace(0, spent)

    def _wanted(self, line: bytes) -> bool:
        if self.types is None and self.run_id is None:
            return True
        head = _decode_head(line)
        if self.types is not None and head.type not in self.types:
            return False
        return self.run_id is None or head.run_id == self.run_id

    async def _send(self, lines: list[bytes], path: str | None) -> None:
        if lines:
            await self.peer.send(
                TailBatch(subscription=self.number, lines=lines, path=path or self.path)
            )


class Tails:
    """All subscriptions of the daemon; the sessions' :class:`~._sessions.Watcher`."""

    def __init__(
        self, config: Config, roots: Roots, disks: Disks, task_group: TaskGroup, access: Access
    ) -> None:
        self.config = config
        self.roots = roots
        self.access = access
        self._disks = disks
        self._task_group = task_group
        self._numbers = 0
        self._all: set[Subscription] = set()
        self._by_peer: dict[TailPeer, _PeerTails] = {}
        self._waiting: dict[str, set[Subscription]] = {}
        #: Subscriptions held by each uid (bounded for all but the daemon's own).
        self._per_uid: dict[int, int] = {}

    @property
    def count(self) -> int:
        return sum(len(tails.subscriptions) for tails in self._by_peer.values())

    async def subscribe(
        self, peer: TailPeer, request: Subscribe, live: Callable[[str], SessionActor | None]
    ) -> None:
        """Start a subscription for ``peer``: of the session at ``request.path`` (whose
        actor ``live`` finds while it runs), or of every session that ``peer`` may
        read.  Raises :class:`FlightlogError` (``path_refused``,
        ``permission_denied``).  The connection's rules bound the subscriptions it
        holds."""
        shared = self._by_peer.get(peer)
        access = self.access
        held = self._per_uid.get(peer.uid, 0)
        if peer.uid != access.daemon_uid and held >= MAX_SUBSCRIPTIONS:
            # One connection's bound, for all of a uid's connections together: each
            # subscription holds a task and a buffer.
            raise LocalProtocolError(
                f"uid {peer.uid} holds {held} subscriptions, the most one uid may; end one first",
                code=ErrorCode.TOO_MANY,
            )
        resolved = None
        if request.path is not None:
            resolved = access.resolve(peer, request.path)
            access.check_read(peer, resolved)
        if not peer.memory.fits(SUBSCRIPTION_BYTES, part=_PART):
            raise LocalProtocolError(
                f"the daemon's memory budget for this connection is spent (it holds "
                f"{peer.memory.held} bytes); end a subscription or read what is sent first",
                code=ErrorCode.TOO_MANY,
            )
        if shared is None:
            shared = self._by_peer[peer] = _PeerTails()
        self._numbers += 1
        sub = Subscription(
            peer,
            shared,
            self._numbers,
            request,
            resolved,
            config=self.config,
            roots=self.roots,
            disks=self._disks,
            on_end=self._detach,
            # Every session's lines reach a subscription to all of them: each is
            # checked against what the peer may read.
            readable=None
            if resolved is not None or access.reads_all(peer)
            else lambda path: access.may_read(peer, path),
        )
        shared.subscriptions[sub.number] = sub
        peer.memory.charge(SUBSCRIPTION_BYTES)  # given back in _detach
        self._per_uid[peer.uid] = held + 1
        try:
            await peer.send(Subscribed(id=request.id, subscription=sub.number, path=sub.path))
        except BaseException:
            self._detach(sub)
            raise
        if resolved is None:
            sub.behind = False
            self._all.add(sub)
        elif (actor := live(resolved.path)) is not None:
            self._attach(sub, actor)
        elif sub.follow:
            sub.waiting = True
            self._waiting.setdefault(resolved.path, set()).add(sub)
        log.info("subscribed", conn=peer.number, path=sub.path, after=request.after)
        self._task_group.start_soon(sub.run, name=f"tail {sub.number}")

    async def unsubscribe(self, peer: TailPeer, request: Unsubscribe) -> None:
        """End a subscription of ``peer``.  Raises :class:`FlightlogError`
        (``subscription_not_found``)."""
        shared = self._by_peer.get(peer)
        sub = shared.subscriptions.get(request.subscription) if shared else None
        if sub is None:
            raise LocalProtocolError(
                f"no subscription {request.subscription} on this connection",
                code=ErrorCode.SUBSCRIPTION_NOT_FOUND,
            )
        sub.scope.cancel()
        await peer.send(Ack(id=request.id))

    def _attach(self, sub: Subscription, actor: SessionActor) -> None:
        sub.actor = actor
        actor.attach(sub)

    def _detach(self, sub: Subscription) -> None:
        self._all.discard(sub)
        shared = self._by_peer.get(sub.peer)
        if shared is not None:
            if shared.subscriptions.pop(sub.number, None) is not None:
                sub.peer.memory.discharge(SUBSCRIPTION_BYTES)
                uid = sub.peer.uid
                self._per_uid[uid] -= 1
                if not self._per_uid[uid]:
                    del self._per_uid[uid]
            if not shared.subscriptions:
                del self._by_peer[sub.peer]
        if sub.resolved is not None:
            waiting = self._waiting.get(sub.resolved.path)
            if waiting is not None:
                waiting.discard(sub)
                if not waiting:
                    del self._waiting[sub.resolved.path]
        if sub.actor is not None:
            sub.actor.detach(sub)

    # ------------------------------------------------------ Watcher protocol

    @property
    def tailing_all(self) -> bool:
        return bool(self._all)

    def session_started(self, actor: SessionActor) -> None:
        for sub in self._waiting.pop(actor.path, ()):
            sub.waiting = False
            self._attach(sub, actor)
            sub.behind = True
            sub.wakeup.set()

    def publish_all(
        self, chunk: bytes, first_seq: int, last_seq: int, end_offset: int, path: str
    ) -> None:
        for sub in list(self._all):
            sub.publish(chunk, first_seq, last_seq, end_offset, path)

    # ------------------------------------------------------------- endings

    def drop_peer(self, peer: TailPeer) -> None:
        """End every subscription of a connection that is going away."""
        shared = self._by_peer.get(peer)
        if shared is not None:
            for sub in list(shared.subscriptions.values()):
                sub.scope.cancel()

    def shutdown(self) -> None:
        for shared in list(self._by_peer.values()):
            for sub in list(shared.subscriptions.values()):
                sub.stopping = True
                sub.scope.cancel()
