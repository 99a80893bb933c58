"""The registry of open sessions: one actor per session, one writer per actor.

It hands sessions to connections (create, open), refuses a second writer with the
holder's pid, and keeps the number of open session files bounded: a session whose
file has seen no write for a while, or the least recently used one when too many are
open, has its descriptor closed until its next write.  It is each actor's
:class:`~._peers.Registry`, and tells the live tails (a :class:`Watcher`) of every
session that starts and every line it writes.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup

from flightlog.protocol import ErrorCode, FlightlogError, LocalProtocolError, Origin, new_id, now
from flightlog.protocol.wire import SessionStatus

from ._access import Access, Who
from ._actor import SessionActor
from ._blobstore import BlobStore
from ._compressor import Compressor
from ._config import LINE_ENVELOPE, Config
from ._owners import Figures, Owner, Owners
from ._paths import ResolvedPath, Roots
from ._peers import Peer, Shutdown
from ._primitives import DISK_THREADS, Disks
from ._storage import SessionFile

__all__ = ["DISK_THREADS", "Sessions", "Watcher"]

log = structlog.get_logger("flightlogd.sessions")

_encode_json = msgspec.json.Encoder().encode

#: Seconds an open waits for the session's previous writer to be done with it (its
#: close written, synced and answered) before it is refused with ``session_busy``.
PREVIOUS_WRITER_WAIT = 30.0


class Watcher(Protocol):
    """Who follows every session: the live tails."""

    @property
    def tailing_all(self) -> bool: ...

    def publish_all(
        self, chunk: bytes, first_seq: int, last_seq: int, end_offset: int, path: str
    ) -> None: ...

    def session_started(self, actor: SessionActor) -> None: ...


class Sessions:
    """All sessions the daemon holds open."""

    def __init__(
        self,
        config: Config,
        roots: Roots,
        disks: Disks,
        task_group: TaskGroup,
        watcher: Watcher,
        access: Access,
    ) -> None:
        self.config = config
        self.roots = roots
        self.access = access
        self._disks = disks
        self._task_group = task_group
        self._watcher = watcher
        self.by_path: dict[str, SessionActor] = {}
        self.by_id: dict[str, SessionActor] = {}
        self._opening: dict[str, anyio.Event] = {}
        self._open_files: OrderedDict[SessionActor, None] = OrderedDict()
        self.started = time.monotonic()
        #: What every session wrote.
        self.all = Figures(self.started)
        #: Each uid's sessions, open and closed lately, and what they wrote: a uid's
        #: ``status`` shows only its own.
        self.owners: Owners[SessionActor] = Owners(access.owner_uid, self.started)
        self._blob_store = BlobStore(roots) if config.blobs else None
        #: Compresses the sessions closed here, a while later (its task: ``run``).
        self.compressor = Compressor(
            roots,
            config.compress_after,
            is_live=self.by_path.__contains__,
            claim=self._claiming,
        )

    def live(self, path: str) -> SessionActor | None:
        """The actor of the session at ``path``, unless there is none or it is closing."""
        actor = self.by_path.get(path)
        return None if actor is None or actor.closing else actor

    def holds(self, path: str) -> bool:
        """Whether a session at the resolved ``path`` is open or being opened."""
        return path in self.by_path or path in self._opening

    def held(self) -> set[str]:
        """The resolved paths of the sessions open or being opened."""
        return {*self.by_path, *self._opening}

    def written_elsewhere(self, session_id: str, who: Who) -> bool:
        """Whether a connection other than ``who`` writes ``session_id`` and ``who``
        could write it: to another uid a session it does not own is as unknown as one
        that does not exist, and so is one nobody writes (its writer hung up or closed
        it, and its actor has not stopped yet: a big one writes its index first), as
        ``MemoryDaemon`` says."""
        actor = self.by_id.get(session_id)
        if actor is None or actor.writer is None or actor.writer is who:
            return False
        try:
            self.access.check_write(who, actor.file.resolved)
        except FlightlogError:
            return False
        return True

    # ------------------------------------------------------- create and open

    async def create(
        self, peer: Peer, path: str, meta: dict[str, Any], origin: Origin | None = None
    ) -> SessionActor:
        """Create a new session file and make ``peer`` its writer (``origin``: a fork's).

        Raises :class:`FlightlogError` with ``path_refused``, ``permission_denied``,
        ``session_exists`` or ``write_failed``.
        """
        resolved = self._writable(peer, path)
        try:
            size = len(_encode_json(meta))
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError):
            size = 0  # not JSON at all: the file's own check refuses it, naming why
        if size > self.config.max_line - LINE_ENVELOPE:
            raise LocalProtocolError(
                f"meta of {size} bytes (as JSON) is more than the "
                f"{self.config.max_line - LINE_ENVELOPE} that fit in a line readers of "
                "session files read",
                code=ErrorCode.BAD_MESSAGE,
            )
        async with self._claiming(resolved.path):
            if resolved.path in self.by_path:
                raise _exists(resolved.path)
            try:
                file = await self._disks(resolved.root).run(
                    lambda: SessionFile.create(
                        self.roots,
                        resolved,
                        session_id=new_id(),
                        meta=meta,
                        time=now(),
                        origin=origin,
                    ),
                    account=peer.share,
                )
            except FileExistsError:
                raise _exists(resolved.path) from None
            except OSError as exc:
                raise FlightlogError(
                    f"cannot create {resolved.path}: {exc.strerror or exc}",
                    code=ErrorCode.WRITE_FAILED,
                ) from None
            actor = self._start(file, peer)
            if self._watcher.tailing_all:
                self._watcher.publish_all(file.created_line, 1, 1, file.size, file.path)
            return actor

    async def open(self, peer: Peer, path: str) -> SessionActor:
        """Open an existing session and make ``peer`` its writer.

        Raises :class:`FlightlogError` with ``path_refused``, ``permission_denied``,
        ``session_not_found``, ``session_busy`` (naming the holder's pid) or
        ``session_corrupt`` (the reader's error, naming the line).
        """
        resolved = self._writable(peer, path)
        deadline = anyio.current_time() + PREVIOUS_WRITER_WAIT
        async with self._claiming(resolved.path):
            while (actor := self.by_path.get(resolved.path)) is not None:
                writer = actor.writer
                if not actor.closing:
                    if writer is None:
                        actor.claim(peer)
                        self._log_claim(actor, peer)
                        return actor
                    if not writer.closed:
                        raise _busy(resolved.path, writer)
                # The writer closed the session or went away; its actor is still
                # writing what it sent (its replies wait at most --send-timeout).
                done = actor.finished if actor.closing else actor.released
                with anyio.move_on_after(deadline - anyio.current_time()):
                    await done.wait()
                if not done.is_set():
                    raise _busy(resolved.path, writer)
            try:
                file = await self._disks(resolved.root).run(
                    SessionFile.open, self.roots, resolved, account=peer.share
                )
            except FileNotFoundError:
                raise FlightlogError(
                    f"{resolved.path} does not exist; create it first",
                    code=ErrorCode.SESSION_NOT_FOUND,
                ) from None
            except OSError as exc:
                raise FlightlogError(
                    f"cannot open {resolved.path}: {exc.strerror or exc}",
                    code=ErrorCode.WRITE_FAILED,
                ) from None
            if file.session_id in self.by_id:
                file.close()
                raise _busy(resolved.path, self.by_id[file.session_id].writer)
            return self._start(file, peer)

    def _writable(self, peer: Peer, path: str) -> ResolvedPath:
        resolved = self.access.resolve(peer, path)
        self.access.check_write(peer, resolved)
        return resolved

    def must_wait(self, peer: Peer, path: str) -> bool:
        """Whether a create or open of ``path`` would wait for another connection: for
        the previous writer's actor to finish, or for another create or open of it."""
        try:
            resolved = self.access.resolve(peer, path)
        except FlightlogError:
            return False
        actor = self.by_path.get(resolved.path)
        return resolved.path in self._opening or (
            actor is not None
            and (actor.closing or (actor.writer is not None and actor.writer.closed))
        )

    def _claiming(self, path: str) -> _PathClaim:
        return _PathClaim(self._opening, path)

    def _start(self, file: SessionFile, peer: Peer) -> SessionActor:
        actor = SessionActor(
            file,
            peer,
            registry=self,
            disk=self._disks(file.resolved.root),
            config=self.config,
            blobs=self._blob_store,
        )
        self.by_path[file.path] = actor
        self.by_id[file.session_id] = actor
        self.owners.opened(file.path, actor)
        self.file_used(actor, actor.records_written, actor.bytes_written)
        self._task_group.start_soon(actor.run, name=f"session {file.session_id}")
        self._watcher.session_started(actor)
        self._log_claim(actor, peer)
        return actor

    def _log_claim(self, actor: SessionActor, peer: Peer) -> None:
        log.info(
            "session_opened",
            session_id=actor.session_id,
            path=actor.path,
            last_seq=actor.file.last_seq,
            pid=peer.pid,
            uid=peer.uid,
        )

    # ------------------------------------------------ what actors tell it

    @property
    def tailing_all(self) -> bool:
        return self._watcher.tailing_all

    def publish_all(
        self, chunk: bytes, first_seq: int, last_seq: int, end_offset: int, path: str
    ) -> None:
        self._watcher.publish_all(chunk, first_seq, last_seq, end_offset, path)

    def file_used(self, actor: SessionActor, records: int, nbytes: int) -> None:
        """An actor wrote (or opened) its file: it is now the most recently used."""
        self.all.records_written += records
        self.all.bytes_written += nbytes
        figures = self.owners.of(actor.path).figures
        figures.records_written += records
        figures.bytes_written += nbytes
        self._open_files[actor] = None
        self._open_files.move_to_end(actor)
        if len(self._open_files) > self.config.max_open_files:
            for other in list(self._open_files):
                if len(self._open_files) <= self.config.max_open_files:
                    break
                if other is not actor and not other.busy:
                    self.file_idle(other)

    def file_idle(self, actor: SessionActor) -> None:
        """Close an idle actor's descriptor; its next write reopens it."""
        if actor.file.fd is not None and not actor.busy:
            actor.file.close()
        self._open_files.pop(actor, None)

    def session_failed(self, actor: SessionActor) -> None:
        self.all.errors += 1
        self.owners.of(actor.path).figures.errors += 1

    def session_finished(self, actor: SessionActor) -> None:
        """The actor closed its file and stopped: forget it, but for what ``status``
        tells of the sessions closed lately."""
        self._open_files.pop(actor, None)
        if self.by_path.get(actor.path) is actor:
            del self.by_path[actor.path]
            owner = self.owners.finished(actor.path)
        else:
            owner = self.owners.of(actor.path)
        if self.by_id.get(actor.session_id) is actor:
            del self.by_id[actor.session_id]
        self._remember_closed(owner, actor)
        if actor.error is None:
            self.compressor.session_closed(
                actor.file.resolved, run_open=actor.file.ledger.last_run is not None
            )

    def _remember_closed(self, owner: Owner[SessionActor], actor: SessionActor) -> None:
        records, nbytes = actor.records_written, actor.bytes_written
        _, before = owner.closed.get(actor.path, (0, None))
        if before is not None and before.session_id == actor.session_id:
            # Closed before by this daemon: what it wrote then counts too.
            records += before.records
            nbytes += before.bytes
        status = SessionStatus(
            path=actor.path,
            session_id=actor.session_id,
            last_seq=actor.file.last_seq,
            records=records,
            bytes=nbytes,
            file_open=False,
            error=actor.error.message if actor.error else None,
            duplicates=actor.duplicates,
        )
        self.owners.remember_closed(owner, status)

    # -------------------------------------------------------------- status

    @property
    def open_files(self) -> int:
        return len(self._open_files)

    def figures(self, uid: int) -> Figures:
        """What the sessions of ``uid`` wrote (nothing yet: zeros)."""
        owner = self.owners.get(uid)
        return owner.figures if owner is not None else Figures(self.started)

    @property
    def records_written(self) -> int:
        return self.all.records_written

    @property
    def bytes_written(self) -> int:
        return self.all.bytes_written

    @property
    def errors(self) -> int:
        return self.all.errors

    def records_per_second(self) -> float:
        return self.all.records_per_second()

    def status(self, viewer: Who) -> list[SessionStatus]:
        """The sessions ``viewer`` may read: every one, or its own uid's (taken from
        its own entry, whatever the others hold)."""
        if self.access.reads_all(viewer):
            actors: Iterable[SessionActor] = self.by_path.values()
        else:
            owner = self.owners.get(viewer.uid)
            actors = owner.sessions.values() if owner is not None else ()
        return [
            SessionStatus(
                path=actor.path,
                session_id=actor.session_id,
                writer_pid=actor.writer.pid if actor.writer else None,
                run_id=actor.run_id,
                last_seq=actor.file.last_seq,
                records=actor.records_written,
                bytes=actor.bytes_written,
                subscribers=actor.subscribers,
                file_open=actor.file.fd is not None,
                error=actor.error.message if actor.error else None,
                duplicates=actor.duplicates,
            )
            for actor in actors
        ]

    def closed(self, viewer: Who) -> list[SessionStatus]:
        """The sessions closed lately that ``viewer`` may read, the latest last."""
        return self.owners.closed(None if self.access.reads_all(viewer) else [viewer.uid])

    # --------------------------------------------------------------- shutdown

    async def shutdown(self) -> None:
        """Tell every actor to write, sync and close, and wait for them."""
        async with anyio.create_task_group() as task_group:
            for actor in list(self.by_path.values()):
                # Each on its own: one actor stuck on its disk, its mailbox full, must
                # not keep the others from being told.
                task_group.start_soon(_shut_down, actor)


async def _shut_down(actor: SessionActor) -> None:
    with contextlib.suppress(FlightlogError):
        await actor.put(None, Shutdown())
    await actor.finished.wait()


class _PathClaim:
    """Serialises create and open of one path, so two of them never race on the file."""

    def __init__(self, opening: dict[str, anyio.Event], path: str) -> None:
        self._opening = opening
        self._path = path
        self._event = anyio.Event()

    async def __aenter__(self) -> None:
        while (other := self._opening.get(self._path)) is not None:
            await other.wait()
        self._opening[self._path] = self._event

    async def __aexit__(self, *exc_info: object) -> None:
        del self._opening[self._path]
        self._event.set()


def _exists(path: str) -> FlightlogError:
    return FlightlogError(
        f"{path} already exists; open it to append, or choose a new path",
        code=ErrorCode.SESSION_EXISTS,
    )


def _busy(path: str, writer: Peer | None) -> FlightlogError:
    holder = f"pid {writer.pid}" if writer is not None else "another connection"
    client = f" ({writer.client})" if writer is not None and writer.client else ""
    return LocalProtocolError(
        f"{path} is being written by {holder}{client}; a session has one writer at a time",
        code=ErrorCode.SESSION_BUSY,
    )
