"""The daemon: listen, accept, serve; and the orderly shutdown.

``serve`` follows hypercorn's shape: the caller passes a ``shutdown_trigger`` (only
``__main__`` turns signals into it) and learns through ``task_status`` when the daemon
listens.  Shutdown runs in stages, one log line each: stop listening, stop reading
from connections (what was received still lands), wait for them up to the grace
period, cancel the rest, then have every session write, sync and close.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import functools
import os
import resource
import secrets
import socket
import stat
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from importlib.metadata import PackageNotFoundError, version

import anyio
import structlog
from anyio.abc import SocketAttribute, SocketListener, TaskGroup, TaskStatus

from flightlog.protocol import (
    ErrorCode,
    FlightlogError,
)
from flightlog.protocol.wire import (
    ErrorReply,
    StatusReply,
    encode_frame,
    socket_directory_problem,
)

from ._access import Access, Who
from ._budget import MemoryBudget, malloc_trim
from ._config import Config
from ._connection import Connection, peer_credentials
from ._fairness import LOOP_SHARE, Fairness, PerUidLimits, UidShare
from ._paths import Roots
from ._primitives import DISK_THREADS, READER_THREADS, Disks, Poller
from ._refusals import log_dropped_by_uid, log_refusal, set_window, uid_refusals
from ._retention import Retention
from ._sessions import Sessions
from ._systemd import Notifier, watchdog_loop
from ._tail import Tails

__all__ = ["SHUTDOWN_BOUND", "AlreadyRunning", "Daemon", "serve"]

log = structlog.get_logger("flightlogd")

_STATUS_INTERVAL = 5.0

#: Seconds the sessions get, once the connections are gone, to write, sync and close.
FINAL_SYNC_BOUND = 10.0
#: Seconds past ``--shutdown-grace`` after which the process exits whatever is left:
#: the sessions' bound, and the connections' hand-back and the last log lines.
SHUTDOWN_BOUND = FINAL_SYNC_BOUND + 5.0

#: Seconds of the event loop per second that refusing connections at accept may
#: take, over every uid: past it, connects wait in the socket's backlog.  A quarter of
#: a uid's share (``LOOP_SHARE``): a churning uid's refusals are charged to its
#: share as well, so that its setups pay for them.
_REFUSALS_SHARE = LOOP_SHARE / 4

#: accept() errors that pass: out of descriptors or memory for now, or a peer that
#: went away before it was accepted.
_ACCEPT_TRANSIENT = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO}
)


class AlreadyRunning(FlightlogError):
    """Another flightlogd serves the same socket or the same data root."""

    def __init__(self, what: str, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "another process"
        super().__init__(
            f"another flightlogd ({who}) already serves {what}", code="already_running"
        )
        self.pid = pid


def _daemon_version() -> str:
    try:
        return version("flightlogd")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"


class Daemon:
    """The running daemon: its settings, sessions, tails and connections.

    ``serve`` makes its parts first, then the daemon with them, whole."""

    def __init__(
        self,
        config: Config,
        roots: Roots,
        *,
        poller: Poller,
        sessions: Sessions,
        tails: Tails,
        fairness: Fairness,
        socket_paths: list[str],
        retention: Retention | None = None,
    ) -> None:
        self.pid = os.getpid()
        self.version = _daemon_version()
        self.started = time.monotonic()
        self.config = config
        self.roots = roots
        self.poller = poller
        self.sessions = sessions
        self.tails = tails
        self.fairness = fairness
        self.retention = retention
        self.socket_paths = socket_paths
        self.connections: set[Connection] = set()
        #: What every connection together makes the daemon hold.
        self.budget = MemoryBudget(config.max_buffered, trim=malloc_trim)
        self._numbers = 0
        #: What refusing connections at accept (past a uid's or the daemon's most)
        #: may take of the loop, whoever's.
        self._refusing = UidShare(-1, PerUidLimits(), loop_share=_REFUSALS_SHARE)
        #: Connections accepted and not set up yet (``UidShare.arrivals``), and the
        #: shares setting theirs up.
        self._arrivals = 0
        self._setting_up: set[UidShare] = set()
        self._idle = anyio.Event()
        self._idle.set()
        self._accepting: list[anyio.CancelScope] = []
        self.draining = False

    def status(self, request_id: int, viewer: Who, closed: bool = False) -> StatusReply:
        """The daemon's status as ``viewer`` may see it: the sessions it may read (with
        ``closed``, those closed lately too), and the daemon's figures, or, unless it
        reads every session (root, the daemon's user, the readers' group), its own
        uid's: its connections, what its sessions wrote, their subscribers and open
        files.  One uid must not learn the sizes of another's writes."""
        sessions = self.sessions
        visible = sessions.status(viewer)
        share = self.fairness.share(viewer.uid)
        if sessions.access.reads_all(viewer):
            figures = sessions.all
            connections, subscribers = len(self.connections), self.tails.count
            open_files = sessions.open_files
        else:
            figures = sessions.figures(viewer.uid)
            connections = len(share.connections)
            subscribers = sum(session.subscribers for session in visible)
            open_files = sum(session.file_open for session in visible)
        return StatusReply(
            id=request_id,
            pid=self.pid,
            version=self.version,
            uptime=time.monotonic() - self.started,
            connections=connections,
            subscribers=subscribers,
            records_written=figures.records_written,
            bytes_written=figures.bytes_written,
            records_per_second=figures.records_per_second(),
            errors=figures.errors,
            open_files=open_files,
            sessions=visible,
            uid_limits=share.status(),
            closed=sessions.closed(viewer) if closed else [],
            storage=self.retention.status(
                None if sessions.access.reads_all(viewer) else [viewer.uid], viewer.uid
            )
            if self.retention is not None
            else [],
        )

    def status_line(self) -> str:
        sessions = self.sessions
        return (
            f"{len(sessions.by_path)} sessions, {len(self.connections)} connections, "
            f"{sessions.records_per_second():.0f} records/s, {sessions.errors} errors"
        )

    # ---------------------------------------------------------------- serving

    def _arrived(self, sock: socket.socket, began: float, task_group: TaskGroup) -> float:
        """A connection accepted (the accept begun at ``began``, thread time): refused
        at once when its uid, or the daemon, has as many as it may; else queued for
        its uid's next turn (:meth:`_set_up`).  What it took of the loop is its uid's.
        Returns the seconds to wait before refusing another (0 or less: none)."""
        pid, uid, _ = peer_credentials(sock)
        share = self.fairness.share(uid)
        try:
            if len(self.connections) + self._arrivals >= self.config.max_connections:
                raise FlightlogError(
                    f"the daemon serves {len(self.connections)} connections, its maximum; "
                    "try again later",
                    code=ErrorCode.TOO_MANY,
                )
            self.fairness.admit(uid)
        except FlightlogError as exc:
            log_refusal(uid_refusals(uid), log, code=exc.code, reason=exc.message, pid=pid, uid=uid)
            with contextlib.suppress(OSError):
                sock.setblocking(False)
                sock.send(encode_frame(ErrorReply(id=0, code=exc.code, message=exc.message)))
            sock.close()
            seconds = time.thread_time() - began
            share.spent(seconds)
            return self._refusing.spent(seconds)
        else:
            share.arrivals.append(sock)
            self._arrivals += 1
            if share not in self._setting_up:
                self._setting_up.add(share)
                task_group.start_soon(self._set_up, share, task_group)
        share.spent(time.thread_time() - began)
        return 0.0

    async def _set_up(self, share: UidShare, task_group: TaskGroup) -> None:
        """Set up a uid's accepted connections one by one, each in one of its turns
        and once it is within its share: a uid opening connections in a loop waits
        for what the last ones cost (their setup, hello, refusals, close), as its
        other work does, and the accept loop never waits for it."""
        arrivals = share.arrivals
        try:
            while arrivals:
                await share.take_turn()
                await share.within()
                if not arrivals:  # closed by the drain meanwhile
                    break
                began = time.thread_time()
                sock = arrivals.popleft()
                self._arrivals -= 1
                self._start(sock, share, task_group)
                share.spent(time.thread_time() - began)
        finally:
            self._setting_up.discard(share)
            self._close_arrivals(share)

    def _close_arrivals(self, share: UidShare) -> None:
        """Close the uid's connections not set up yet (shutdown): none was answered."""
        while share.arrivals:
            sock = share.arrivals.popleft()
            self._arrivals -= 1
            sock.close()

    def _start(self, sock: socket.socket, share: UidShare, task_group: TaskGroup) -> None:
        self._numbers += 1
        # From here the connection drives the socket itself (see _channel).
        conn = Connection(
            sock,
            self._numbers,
            config=self.config,
            poller=self.poller,
            sessions=self.sessions,
            tails=self.tails,
            server=(self.pid, f"flightlogd {self.version}"),
            status=self.status,
            share=share,
            budget=self.budget,
        )
        self.connections.add(conn)
        self.fairness.join(share, conn)
        if self._idle.is_set():
            # Only a set event is replaced: shutdown may be waiting on the unset one.
            self._idle = anyio.Event()
        conn.begin()
        if self.draining:  # accepted just before the listeners closed
            conn.stop()
        task_group.start_soon(self._serve, conn, share)

    async def _serve(self, conn: Connection, share: UidShare) -> None:
        try:
            await conn.serve()
        except Exception:
            # A bug must cost one connection (whose sessions were released on the way
            # out), never the daemon and everyone else's sessions.
            log.exception("connection_failed", conn=conn.number, pid=conn.pid, uid=conn.uid)
        finally:
            self.connections.discard(conn)
            self.fairness.leave(share, conn)
            if not self.connections:
                self._idle.set()

    async def _accept(self, listener: SocketListener, task_group: TaskGroup) -> None:
        scope = anyio.CancelScope()
        self._accepting.append(scope)
        with scope:
            await self._accept_loop(listener, task_group)

    async def _accept_loop(self, listener: SocketListener, task_group: TaskGroup) -> None:
        """Accept one connection a round of the loop while any waits, in a callback of
        the poller (nothing registered, no task woken per accept): each is cheap (its
        uid's queue, or a refusal), so that a uid connecting in a loop takes little of
        the loop, and others' connects wait little behind its in the listening
        socket's backlog.  Refusals past their share (:data:`_REFUSALS_SHARE`) stop
        the accepting until they are back within.  Returns only by cancellation
        (shutdown), or raises what accept() failed with that does not pass."""
        raw: socket.socket = listener.extra(SocketAttribute.raw_socket)
        fd, poller = raw.fileno(), self.poller
        failed: list[OSError] = []
        failure = anyio.Event()
        watching = True

        def acceptable() -> None:
            began = time.thread_time()
            try:
                sock, _ = raw.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno not in _ACCEPT_TRANSIENT:
                    failed.append(error)
                    failure.set()
                    return
                log.error("accept_failed", reason=str(error), connections=len(self.connections))
                poller.unwatch(fd)
                asyncio.get_running_loop().call_later(0.1, rewatch)
                return
            wait = self._arrived(sock, began, task_group)
            if wait > 0:
                # Refusals took their share of the loop: the next connects wait in
                # the socket's backlog (churning ones in their connect(), not on a
                # CPU) until they are back within it.
                poller.unwatch(fd)
                asyncio.get_running_loop().call_later(wait, rewatch)

        def rewatch() -> None:
            if watching:
                poller.watch(fd, acceptable)

        async with listener:
            poller.watch(fd, acceptable)
            try:
                await failure.wait()
            finally:
                watching = False
                poller.unwatch(fd)
            raise failed[0]

    async def _report_dropped(self) -> None:
        """Each window, say how many refusals of each uid (its refused connections,
        and on a shared daemon every refusal of its own) and how many of its
        connections' lines were not logged: a uid refused thousands a second, or
        connecting thousands of times, must not flood the journal."""
        while True:
            await anyio.sleep(self.config.refusal_window)
            log_dropped_by_uid(log)

    async def _report_status(self, notifier: Notifier) -> None:
        while True:
            await anyio.sleep(_STATUS_INTERVAL)
            notifier.status(self.status_line())

    async def _drain(self, conns_tg: TaskGroup) -> None:
        log.info("shutdown_started", connections=len(self.connections))
        self.draining = True
        for scope in self._accepting:
            scope.cancel()  # closes the listening sockets
        for share in self._setting_up:
            self._close_arrivals(share)
        for path in self.socket_paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
        log.info("stopped_listening")
        self.tails.shutdown()
        for conn in list(self.connections):
            conn.stop()
        if self.connections:
            with anyio.move_on_after(self.config.shutdown_grace):
                await self._idle.wait()
        if self.connections:
            log.warning("connections_cancelled", connections=len(self.connections))
            for conn in list(self.connections):
                conn.abandon()
        else:
            log.info("connections_closed")
        conns_tg.cancel_scope.cancel()


async def serve(
    config: Config,
    *,
    listeners: list[socket.socket] | None = None,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    notifier: Notifier | None = None,
    task_status: TaskStatus[Daemon] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until ``shutdown_trigger`` returns, then shut down in order.

    ``listeners`` are already listening sockets (socket activation); without them the
    daemon binds ``config.socket_path``.  Raises :class:`AlreadyRunning` when another
    daemon serves the same socket or data root.
    """
    roots = Roots(config.root, config.allow)
    config = _fit_descriptors(config, len(roots.allowed))
    set_window(config.refusal_window)
    os.makedirs(roots.root, mode=0o700, exist_ok=True)
    with _root_lock(roots.root):
        socket_paths: list[str] = []
        if not listeners:
            listeners = [_bind(config.socket_path, config.socket_mode)]
            socket_paths.append(config.socket_path)
        for sock in listeners:
            sock.setblocking(False)
        anyio_listeners = [await SocketListener.from_socket(sock) for sock in listeners]
        with Poller() as poller:
            async with anyio.create_task_group() as actors_tg:
                disks = Disks()
                access = Access(roots, daemon_uid=os.geteuid(), readers_gid=config.readers_group)
                tails = Tails(config, roots, disks, actors_tg, access)
                sessions = Sessions(config, roots, disks, actors_tg, tails, access)
                retention = Retention(
                    config.retention,
                    roots.root,
                    holds=sessions.holds,
                    owner=access.owner_uid,
                    held=sessions.held,
                )
                daemon = Daemon(
                    config,
                    roots,
                    poller=poller,
                    sessions=sessions,
                    tails=tails,
                    fairness=Fairness(config.per_uid, daemon_uid=os.geteuid()),
                    socket_paths=socket_paths,
                    retention=retention,
                )
                async with anyio.create_task_group() as conns_tg:
                    for listener in anyio_listeners:
                        conns_tg.start_soon(functools.partial(daemon._accept, listener, conns_tg))
                    actors_tg.start_soon(daemon._report_dropped)
                    actors_tg.start_soon(retention.run)
                    actors_tg.start_soon(sessions.compressor.run)
                    if notifier is not None:
                        actors_tg.start_soon(watchdog_loop, notifier)
                        actors_tg.start_soon(daemon._report_status, notifier)
                        notifier.ready(daemon.status_line())
                    log.info(
                        "listening",
                        sockets=socket_paths or [str(s.getsockname()) for s in listeners],
                        root=roots.root,
                        allow=list(roots.allowed[1:]),
                        pid=daemon.pid,
                        version=daemon.version,
                    )
                    task_status.started(daemon)
                    await (shutdown_trigger or anyio.sleep_forever)()
                    if notifier is not None:
                        notifier.stopping("draining sessions")
                    await daemon._drain(conns_tg)
                log.info("sessions_closing", sessions=len(sessions.by_path))
                with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_SYNC_BOUND):
                    await sessions.shutdown()
                if sessions.by_path:
                    # Their disks hang (or take longer than the bound): say which
                    # sessions may miss what was written since their last sync.
                    log.error(
                        "sessions_not_synced",
                        paths=sorted(sessions.by_path),
                        seconds=FINAL_SYNC_BOUND,
                    )
                actors_tg.cancel_scope.cancel()
        log.info("stopped")


def _fit_descriptors(config: Config, roots: int) -> Config:
    """``config`` with connections and open session files lowered to fit the process's
    descriptor limit (RLIMIT_NOFILE), so that a flood of connections never takes the
    descriptors sessions need to reopen their files (a failed reopen would fail the
    session for good).  What stays beyond both is kept for the listening sockets, the
    event loop, and what worker threads open while they walk a path.  A connection
    with a ring holds three descriptors: its socket, its ring's eventfd, and the copy
    of the ring's memfd that Python's ``mmap`` keeps while it is mapped."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return config
    room = soft - (64 + 3 * (DISK_THREADS + READER_THREADS) * roots)
    files = max(1, min(config.max_open_files, room // 2))
    per_connection = 3 if config.ring_size else 1
    connections = max(1, min(config.max_connections, (room - files) // per_connection))
    if (files, connections) == (config.max_open_files, config.max_connections):
        return config
    log.warning(
        "limits_lowered",
        nofile=soft,
        max_connections=connections,
        max_open_files=files,
        reason="the descriptor limit (RLIMIT_NOFILE) does not hold the configured ones",
    )
    return dataclasses.replace(config, max_open_files=files, max_connections=connections)


@contextlib.contextmanager
def _root_lock(root: str) -> Iterator[None]:
    path = os.path.join(root, ".flightlogd.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            pid = int(text) if text.isdigit() else None
            raise AlreadyRunning(f"data root {root}", pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _bind(path: str, mode: int) -> socket.socket:
    """A socket listening on ``path`` with ``mode``, in a directory the daemon owns.

    The directory is made (mode 0700) when missing, and refused when it is not the
    daemon's own (:func:`_own_directory`).  The socket is bound to a temporary name
    beside ``path``, given its mode, made to listen, and only then renamed to ``path``:
    a client that finds the path can connect at once (never ``ECONNREFUSED``)."""
    parent = os.path.dirname(path) or "."
    _own_directory(parent)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FlightlogError(
                f"{path} exists and is not a socket; refusing to replace it", code="path_refused"
            )
        pid = _live_peer(path)
        if pid is not None:
            raise AlreadyRunning(f"socket {path}", pid or None)
        log.info("stale_socket_removed", socket=path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        temporary = _bind_temporary(sock, parent)
        try:
            os.chmod(temporary, mode)
            sock.listen(1024)
            os.rename(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except BaseException:
        sock.close()
        raise
    return sock


def _bind_temporary(sock: socket.socket, directory: str) -> str:
    """Bind ``sock`` to a fresh hidden name in ``directory`` (mode 0600 until chmod)."""
    old_umask = os.umask(0o177)
    try:
        while True:
            temporary = os.path.join(directory, f".{secrets.token_hex(4)}")
            try:
                sock.bind(temporary)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                continue
            return temporary
    finally:
        os.umask(old_umask)


def _own_directory(directory: str) -> None:
    """Make ``directory`` (mode 0700) if missing; refuse it unless the daemon owns it
    and no one else may write in it (:func:`~flightlog.protocol.socket_directory_problem`).

    Anyone may make ``/tmp/flightlog-$UID`` first: a socket bound there would be theirs
    to replace, and its clients' secrets theirs to read."""
    if not os.path.lexists(directory):
        with contextlib.suppress(FileExistsError):
            os.makedirs(directory, mode=0o700)
    st = os.lstat(directory)
    problem = socket_directory_problem(directory, st.st_mode, st.st_uid, {os.geteuid()})
    if problem is not None:
        raise FlightlogError(
            f"refusing to listen in {problem}: the daemon binds its socket only in a "
            "directory of its own that no one else may write in",
            code="path_refused",
        )


def _live_peer(path: str) -> int | None:
    """The pid of whatever listens on ``path`` (0 when unknown), or None when nothing does."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2)
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return None
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOTSOCK):
            return None
        raise
    else:
        raw = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid: int = struct.unpack("3i", raw)[0]
        return pid
    finally:
        probe.close()
