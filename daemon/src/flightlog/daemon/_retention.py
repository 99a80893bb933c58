"""The daemon's retention: size and age limits on the session files of its data root.

Theory of operation
-------------------
Every ``interval`` (and once at start) a sweep runs in a worker thread: it surveys the
session files under the data root (size, owner, last activity read from each file's
end), and, when a limit is set, plans and removes with the very code ``flightlog
vacuum`` runs (:mod:`flightlog.sdk._retention`), so ``flightlog vacuum --dry-run`` with
the same limits lists what the daemon would remove.  Nothing is removed by default: no
limit is set unless the operator sets one.

* A session's owner is the uid its path gives (``uid/UID/``, else the daemon's own), as
  for writing and reading (``_access``).  ``max_use`` and ``max_age`` apply to each
  owner's files alone; ``max_use_total`` and ``keep_free`` are the operator's global
  limits and take the oldest removable files, whoever owns them.  A uid's blobs (those
  of its store) count toward its use: with a limit on use or free space the files of
  every store holding blobs are scanned for references (only what changed since the
  last sweep is read again), and a planned removal frees the blobs no file left refers
  to.
* A session the daemon holds (open for a writer, a run, a tail, or being opened) is
  never removed: the planned set leaves out what the daemon held when the sweep began,
  and just before each removal, under the file's ``flock``, the event loop is asked
  again.  A session active within ``protect`` is never removed either.
* Every removal, and every file kept that was planned to go, is one log line with its
  path, size, age, reason and owner.
* With a limit set, the first sweep, each sweep that removed a session and each that
  found blobs no session refers to then remove the blobs no remaining session refers
  to (``collect_blobs``: race-free against the writers by the store's lock), one
  ``blob_removed`` line each with its path and size; ``retention_sweep`` counts them.

The survey's figures (files and bytes per uid, the filesystem's available bytes) are
what ``status`` shows each uid of its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio
import anyio.from_thread
import anyio.to_thread
import structlog

from flightlog.protocol import FlightlogError, format_time
from flightlog.protocol.wire import UidStorage
from flightlog.sdk.storage import (
    BlobRemoval,
    BlobUse,
    Limits,
    References,
    Removal,
    StoredFile,
    available,
    blob_stores,
    blob_use,
    collect_blobs,
    plan,
    remove,
    stored_blobs,
    survey,
)

__all__ = ["Retention", "RetentionSettings", "archive_problem"]

log = structlog.get_logger("flightlogd")


@dataclass(frozen=True, kw_only=True)
class RetentionSettings:
    """The limits and how often they are applied; no limit by default."""

    limits: Limits = field(default_factory=Limits)
    #: Seconds between sweeps.
    interval: float = 600.0
    #: Move removed files into this directory (same relative path) instead of deleting.
    archive: str | None = None
    #: Or hand each to this command (its path the last argument) before removing it.
    archive_command: tuple[str, ...] | None = None


@dataclass
class _Usage:
    files: int = 0
    bytes: int = 0
    oldest: datetime | None = None
    removed_files: int = 0
    removed_bytes: int = 0
    blobs: int = 0
    blob_bytes: int = 0


class Retention:
    """Sweeps one data root; ``holds(path)`` (called on the event loop) says whether
    the daemon holds a session, ``owner(path)`` whose it is."""

    def __init__(
        self,
        settings: RetentionSettings,
        root: str,
        *,
        holds: Callable[[str], bool],
        owner: Callable[[str], int],
        held: Callable[[], set[str]],
    ) -> None:
        self.settings = settings
        self.root = root
        self._holds = holds
        self._owner = owner
        self._held = held
        self._usage: dict[int, _Usage] = {}
        self._available: int | None = None
        self._surveyed: datetime | None = None
        self._stop = threading.Event()
        #: What each session file refers to, kept between sweeps.
        self._references = References()
        #: Set after each sweep (tests wait on it).
        self.sweeps = 0

    async def run(self) -> None:
        """Sweep now and every ``interval`` until cancelled."""
        try:
            while True:
                held = self._held()
                await anyio.to_thread.run_sync(self.sweep, held, abandon_on_cancel=True)
                await anyio.sleep(self.settings.interval)
        finally:
            self._stop.set()  # a sweep left running in its thread removes no more

    def sweep(self, held: set[str]) -> list[Removal]:
        """Survey the root and apply the limits (in a worker thread)."""
        started = time.monotonic()
        limits = self.settings.limits
        now = datetime.now(UTC)
        files = survey([self.root], owner=self._owner)
        try:
            free: int | None = available(self.root)
        except OSError:
            free = None
        removals: list[Removal] = []
        use = self._blob_use(files) if limits.any else None
        if limits.any:
            removals = plan(
                files, limits, now=now, free=free, protected=lambda f: f.path in held, blobs=use
            )
        gone: set[str] = set()
        removed: dict[int, _Usage] = {}
        for removal in removals:
            if self._stop.is_set():
                break
            remove(
                removal,
                self.settings.archive,
                busy=self._busy,
                command=self.settings.archive_command,
            )
            self._log(removal, now)
            if removal.error is None:
                gone.add(removal.path)
                tally = removed.setdefault(_uid(removal.owner), _Usage())
                tally.removed_files += 1
                tally.removed_bytes += removal.size
                if free is not None:
                    free += removal.freed
        # Blobs are left unreferenced by a removal (or by a store a kill cut short, or a
        # file removed by hand): collected after a sweep removed something, and at start.
        orphans = use is not None and use.orphans > 0
        collect = limits.any and (gone or orphans or self.sweeps == 0) and not self._stop.is_set()
        blobs = self._collect() if collect else []
        usage: dict[int, _Usage] = {}
        for f in files:
            if f.path in gone:
                continue
            mine = usage.setdefault(_uid(f.owner), _Usage())
            mine.files += 1
            mine.bytes += f.size
            if mine.oldest is None or f.last_activity < mine.oldest:
                mine.oldest = f.last_activity
        self._count_blobs(usage)
        for uid, tally in self._usage.items():
            mine = usage.setdefault(uid, _Usage())
            mine.removed_files, mine.removed_bytes = tally.removed_files, tally.removed_bytes
        for uid, tally in removed.items():
            mine = usage.setdefault(uid, _Usage())
            mine.removed_files += tally.removed_files
            mine.removed_bytes += tally.removed_bytes
        self._usage, self._available, self._surveyed = usage, free, now
        self.sweeps += 1
        if removals or blobs:
            log.info(
                "retention_sweep",
                files=len(files),
                removed=len(gone),
                kept=len(removals) - len(gone),
                freed=sum(r.size for r in removals if r.path in gone),
                blobs_removed=sum(b.error is None for b in blobs),
                blob_bytes_freed=sum(b.size for b in blobs if b.error is None),
                seconds=round(time.monotonic() - started, 3),
            )
        return removals

    def _blob_use(self, files: list[StoredFile]) -> BlobUse | None:
        """The blobs' use, for the limits on use and free space (not for age alone)."""
        limits = self.settings.limits
        if (limits.max_use, limits.max_use_total, limits.keep_free) == (None, None, None):
            return None
        self._references.keep_only([f.path for f in files])
        blobs = blob_use(files, references=self._references, owner=self._owner)
        for store, reason in blobs.uncounted.items():
            log.warning("blobs_uncounted", store=store, error=reason)
        return blobs

    def _collect(self) -> list[BlobRemoval]:
        """Remove the blobs no remaining session refers to, each logged."""
        removed: list[BlobRemoval] = []
        for store in blob_stores([self.root]):
            try:
                found = collect_blobs(store)
            except (OSError, FlightlogError) as exc:
                reason = exc.message if isinstance(exc, FlightlogError) else str(exc)
                log.warning("blobs_kept", store=store, error=reason)
                continue
            for blob in found:
                if blob.error is not None:
                    log.warning("blob_kept", path=blob.path, size=blob.size, error=blob.error)
                else:
                    log.info("blob_removed", path=blob.path, size=blob.size, reason="unreferenced")
            removed += found
        return removed

    def _count_blobs(self, usage: dict[int, _Usage]) -> None:
        """Add each uid's blobs (those of the stores under its directory) to ``usage``."""
        for store in blob_stores([self.root]):
            try:
                for _, path, size in stored_blobs(store):
                    mine = usage.setdefault(_uid(self._owner(path)), _Usage())
                    mine.blobs += 1
                    mine.blob_bytes += size
            except OSError:
                continue  # removed meanwhile: counted at the next sweep

    def _busy(self, path: str) -> bool:
        if self._stop.is_set():
            return True
        try:
            return anyio.from_thread.run_sync(self._holds, path)
        except RuntimeError:  # the event loop is gone: the daemon is stopping
            self._stop.set()
            return True

    def _log(self, removal: Removal, now: datetime) -> None:
        fields = {
            "path": removal.path,
            "size": removal.size,
            "age_seconds": round((now - removal.last_activity).total_seconds(), 3),
            "last_activity": format_time(removal.last_activity),
            "reason": removal.reason,
            "uid": _uid(removal.owner),
        }
        if removal.error is not None:
            log.warning("session_kept", error=removal.error, **fields)
        elif removal.archived_to is not None:
            log.info("session_archived", archived_to=removal.archived_to, **fields)
        else:
            log.info("session_removed", **fields)

    def status(self, uids: list[int] | None, own: int) -> list[UidStorage]:
        """The storage of ``own`` (and of every uid surveyed, with ``uids`` None)."""
        limits = self.settings.limits
        wanted = sorted({own, *self._usage}) if uids is None else uids
        return [
            UidStorage(
                uid=uid,
                files=(usage := self._usage.get(uid, _Usage())).files,
                bytes=usage.bytes,
                oldest=format_time(usage.oldest) if usage.oldest else None,
                removed_files=usage.removed_files,
                removed_bytes=usage.removed_bytes,
                blobs=usage.blobs,
                blob_bytes=usage.blob_bytes,
                max_use=limits.max_use,
                max_age=limits.max_age.total_seconds() if limits.max_age else None,
                keep_free=limits.keep_free,
                protect=limits.protect.total_seconds(),
                available=self._available,
                surveyed=format_time(self._surveyed) if self._surveyed else None,
                max_use_total=limits.max_use_total,
            )
            for uid in wanted
        ]


def _uid(owner: int | None) -> int:
    return -1 if owner is None else owner


def archive_problem(archive: str, root: str, limits: Limits) -> str | None:
    """Why ``archive`` cannot take the root's removed files, or None."""
    archive, root = os.path.abspath(archive), os.path.abspath(root)
    if os.path.commonpath([archive, root]) == root:
        return f"--archive {archive} is inside the data root {root}: choose another"
    if limits.keep_free is not None:
        with contextlib.suppress(OSError):
            if os.stat(archive).st_dev == os.stat(root).st_dev:
                return "--keep-free with an --archive on the same filesystem frees nothing"
    return None
