"""Compressing the sessions this daemon closed, once they stayed closed for a while.

A session whose actor finished with every run closed is due ``compress_after`` seconds
later (``--compress-after``; 0 turns it off).  When it is due and nobody opened it
meanwhile, it is compressed in place (``flightlog.sdk._compression``: the same path, a
rename over it of a checked copy, under the file's lock), in a thread of its own, one
file at a time, while holding the session's path the way an open does: an open of that
session waits for the compression to end, then gives the file its plain form again.

A tail following the session reads on across the change (the same bytes at the same
offsets, ``_file_tail.FileTail``); a reader holding the file open keeps the plain file it
opened, which nobody writes any more.  A session that ends with a run left open (its
writer went away) is not compressed: it may be resumed soon.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import anyio
import structlog

from flightlog.protocol import FlightlogError
from flightlog.sdk.storage import FileBusy, compress_at

from ._paths import ResolvedPath, Roots

__all__ = ["Compressor"]

log = structlog.get_logger("flightlogd.compress")


class Compressor:
    """The sessions due for compression, and the task that compresses them."""

    def __init__(
        self,
        roots: Roots,
        after: float,
        *,
        is_live: Callable[[str], bool],
        claim: Callable[[str], AbstractAsyncContextManager[None]],
    ) -> None:
        self.roots = roots
        self.after = after
        self._is_live = is_live
        self._claim = claim
        #: Due sessions by path, the soonest first (every one waits as long).
        self._due: OrderedDict[str, tuple[float, ResolvedPath]] = OrderedDict()
        self._wakeup = anyio.Event()
        self._limiter = anyio.CapacityLimiter(1)
        #: Files compressed since start (``status`` and the tests).
        self.compressed = 0

    def session_closed(self, resolved: ResolvedPath, *, run_open: bool) -> None:
        """The session's actor finished: compress it later, unless a run is open."""
        if self.after <= 0 or run_open:
            return
        self._due.pop(resolved.path, None)
        self._due[resolved.path] = (anyio.current_time() + self.after, resolved)
        self._wakeup.set()

    async def run(self) -> None:
        """Compress each session when it is due; runs until cancelled."""
        while True:
            if not self._due:
                await self._wakeup.wait()
                self._wakeup = anyio.Event()
                continue
            due, resolved = next(iter(self._due.values()))
            wait = due - anyio.current_time()
            if wait > 0:
                with anyio.move_on_after(wait):
                    await self._wakeup.wait()
                    self._wakeup = anyio.Event()
                continue
            del self._due[resolved.path]
            await self._compress(resolved)

    async def _compress(self, resolved: ResolvedPath) -> None:
        path = resolved.path
        async with self._claim(path):
            if self._is_live(path):
                return  # opened again: due again when it closes
            try:
                result = await anyio.to_thread.run_sync(
                    self._compress_file, resolved, limiter=self._limiter
                )
            except FileBusy:
                log.info("compress_skipped", path=path, reason="held by another process")
                return
            except (OSError, FlightlogError) as exc:
                log.warning("compress_failed", path=path, error=str(exc))
                return
        if result is not None:
            self.compressed += 1
            before, after = result
            log.info("session_compressed", path=path, before=before, after=after)

    def _compress_file(self, resolved: ResolvedPath) -> tuple[int, int] | None:
        with contextlib.ExitStack() as stack:
            dir_fd = stack.enter_context(self.roots.parent_dir(resolved, create=False))
            result = compress_at(dir_fd, resolved.parts[-1], label=resolved.path)
        return None if result is None else (result.before, result.after)
