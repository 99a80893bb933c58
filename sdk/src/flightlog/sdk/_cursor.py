"""Every session of a data root: replayed from the files, then followed live.

Theory of operation
-------------------
The files are the source of truth; the daemon is a doorbell with the records attached.

* :class:`SessionFile` feeds one file to the protocol's
  :class:`~flightlog.protocol.LineReader` (every reading rule, line 1 included), from
  its start and then, as the file grows, from where the last read stopped.  It delivers
  each record once, in seq order, and remembers the last seq delivered.
* :class:`AllSessions` keeps one :class:`SessionFile` per path.  :meth:`AllSessions.scan`
  reads what is new in every file under the roots; :meth:`AllSessions.live` takes a record
  the daemon pushed: the next seq of its session is delivered as it is, an older one is
  dropped (already delivered from the file), and a newer one means records in between
  were not seen live: they are read from the file first.  The daemon writes a record
  before it publishes it, so the file always holds what the doorbell rings for.
* :class:`Doorbell` runs the daemon's tail-all subscription in a thread and hands its
  records over through a bounded queue.  When the subscription ends (the daemon was
  restarted, or the consumer fell behind) it says so, and a follower rescans the files:
  nothing written meanwhile is missed.

So a merge of the two sources is by (session, seq): no gap, no duplicate.

A **cursor** is the last seq delivered per session id: ``SESSION_ID:SEQ`` pairs joined
by commas (:func:`format_cursor`, :func:`parse_cursor`).  Keyed by session id, it
survives a session file being moved; a session it does not name is read from its start.

The clients' ``tail_all(after=CURSOR)`` (:class:`CursorTail`, :class:`AsyncCursorTail`)
are this merge without the thread: the client subscribes to every session first, then
replays the files under the data root, then takes the live records one by one.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

from flightlog.protocol import ErrorCode, FileFormatError, Record
from flightlog.protocol._blobs import has_references, references
from flightlog.protocol.format import NEED_DATA, LineReader, is_session_id
from flightlog.protocol.wire import default_root

from ._blobs import resolving
from ._compression import open_session_file, session_files

__all__ = [
    "AllSessions",
    "AsyncCursorTail",
    "CursorTail",
    "Doorbell",
    "Rescan",
    "SessionFile",
    "format_cursor",
    "parse_cursor",
    "session_files",
]

_SUFFIX: Final = ".jsonl"
_CHUNK: Final = 1024 * 1024
#: What a record that still refers to a blob says of it (as a tail's problems say it).
_NOT_PUT_BACK: Final = (
    f"neither a store this process can read nor the daemon holds it ({ErrorCode.BLOB_NOT_FOUND})"
)


def parse_cursor(text: str) -> dict[str, int]:
    """``SESSION_ID:SEQ,...`` as a dict; ``""`` and ``"0"`` are the empty cursor.

    Raises :class:`ValueError` with a sentence saying what is wrong.
    """
    cursor: dict[str, int] = {}
    text = text.strip()
    if text in ("", "0"):
        return cursor
    for item in text.split(","):
        session_id, sep, seq = item.strip().partition(":")
        if not sep or not is_session_id(session_id) or not seq.isdigit():
            raise ValueError(
                f"{item.strip()!r} is not SESSION_ID:SEQ (32 lowercase hex digits, a colon, a seq)"
            )
        cursor[session_id] = max(int(seq), cursor.get(session_id, 0))
    return cursor


def format_cursor(cursor: Mapping[str, int]) -> str:
    """The cursor as ``SESSION_ID:SEQ`` pairs joined by commas, in session id order."""
    return ",".join(f"{sid}:{seq}" for sid, seq in sorted(cursor.items()) if seq > 0)


class SessionFile:
    """One session file, read once from its start and then as it grows.

    ``start_after`` gives, for the file's session id, the seq after which records are
    delivered (earlier ones are read and checked, not delivered).  Attributes:
    ``session_id`` (None until line 1 is read), ``last_seq`` (the last seq delivered or
    skipped), ``error`` (the :class:`FileFormatError` that stopped the file, if any).
    """

    def __init__(self, path: str, start_after: Callable[[str], int]) -> None:
        self.path = path
        self._start_after = start_after
        self.session_id: str | None = None
        self.last_seq = 0
        self.error: FileFormatError | None = None
        self._after = 0
        # Fed every byte read so far; an unfinished last line waits in it for the rest.
        self._lines = LineReader()

    def read(self) -> Iterator[Record]:
        """The records on disk that were not delivered yet, in order.

        Raises :class:`OSError` when the file cannot be read; a line that breaks a
        reading rule stops this file for good (``error``) and raises
        :class:`FileFormatError` once.
        """
        if self.error is not None:
            return
        try:
            yield from resolving(self._read(), self.path)
        except FileFormatError as exc:
            self.error = exc
            raise

    def _read(self) -> Iterator[Record]:
        with open_session_file(self.path) as fileobj:
            lines = self._lines
            # A compressed file (at rest) reads forward only, and its size is not that
            # of the plain bytes: only a plain file's writer can shorten it.
            size = os.fstat(fileobj.fileno()).st_size if fileobj.seekable() else lines.position
            if size < lines.position:
                if size < lines.offset or lines.session_id is None:
                    raise FileFormatError(
                        lines.lines, "the file is shorter than what was read of it: replaced?"
                    )
                # A writer opening the file after a crash cut its unfinished last line.
                lines = self._lines = LineReader.resume(
                    lines.session_id, lines.last_seq, lines.offset
                )
            fileobj.seek(lines.position)
            while True:
                item = lines.next()
                if item is NEED_DATA:
                    chunk = fileobj.read(_CHUNK)
                    if not chunk:
                        return  # for now: the file may grow
                    lines.feed(chunk)
                    continue
                if not isinstance(item, Record):
                    return
                if self.session_id is None:
                    self.session_id = item.session_id
                    self._after = self._start_after(item.session_id)
                if item.seq <= self.last_seq:
                    continue  # delivered live already
                self.last_seq = item.seq
                if item.seq > self._after:
                    yield item

    def accept(self, record: Record) -> bool:
        """Take a record pushed live: True (and it counts as delivered) when it is the
        next seq of this session; False when it is not (older, or records are missing
        in between: :meth:`read` the file)."""
        if self.session_id is None or record.session_id != self.session_id:
            return False
        if record.seq != self.last_seq + 1 or record.seq <= self._after:
            return False
        self.last_seq = record.seq
        return True


class AllSessions:
    """Every session under ``roots``, and any other the daemon pushes, each record once.

    ``cursor`` (session id -> seq) says where each session starts; a session it does not
    name starts at its beginning.  ``on_error(path, exc)`` hears about a file that cannot
    be read or breaks a reading rule (it is skipped, the others go on), and once about
    each ``*.jsonl`` that is not a regular file (a FIFO: never read).  ``problems``
    names, one sentence each, every blob a delivered record still refers to: neither a
    store this process can read nor the daemon put it back, so the reference is kept.
    """

    def __init__(
        self,
        roots: Iterable[str],
        cursor: Mapping[str, int],
        on_error: Callable[[str, Exception], None],
    ) -> None:
        self.roots = [os.path.realpath(root) for root in roots]
        self._start = dict(cursor)
        self._on_error = on_error
        self.files: dict[str, SessionFile] = {}
        self.problems: deque[str] = deque(maxlen=100)
        self._not_regular: set[str] = set()

    def _delivered(self, path: str, record: Record) -> tuple[str, Record]:
        if has_references(record.data):
            for digest in dict.fromkeys(ref.sha256 for ref in references(bytes(record.data))):
                self.problems.append(f"{path}: blob {digest}: {_NOT_PUT_BACK}")
        return path, record

    def cursor(self) -> dict[str, int]:
        """The last seq delivered of every session seen, with the starting cursor's
        entries for the sessions not seen."""
        cursor = dict(self._start)
        for file in self.files.values():
            if file.session_id is not None:
                cursor[file.session_id] = max(file.last_seq, cursor.get(file.session_id, 0))
        return cursor

    def _file(self, path: str) -> SessionFile:
        file = self.files.get(path)
        if file is None:
            file = self.files[path] = SessionFile(path, lambda sid: self._start.get(sid, 0))
        return file

    def _read(self, file: SessionFile) -> Iterator[tuple[str, Record]]:
        try:
            for record in file.read():
                yield self._delivered(file.path, record)
        except (OSError, FileFormatError) as exc:
            self._on_error(file.path, exc)

    def scan(self) -> Iterator[tuple[str, Record]]:
        """What is new in every session file under the roots (and every file seen)."""
        for path in session_files(self.roots, skipped=self._skipped):
            yield from self._read(self._file(os.path.realpath(path)))
        for path, file in list(self.files.items()):
            if not any(path.startswith(root + os.sep) for root in self.roots):
                yield from self._read(file)

    def _skipped(self, path: str, exc: OSError) -> None:
        if path not in self._not_regular:
            self._not_regular.add(path)
            self._on_error(path, exc)

    def live(self, path: str, record: Record) -> Iterator[tuple[str, Record]]:
        """``record``, pushed by the daemon for ``path``, merged with the file."""
        file = self._file(os.path.realpath(path))
        if file.accept(record):
            yield self._delivered(file.path, record)
            return
        if record.seq <= file.last_seq and record.session_id == file.session_id:
            return  # delivered already, from the file
        if file.session_id is not None and record.session_id != file.session_id:
            # Another session at this path: the old file was removed and a new one made.
            file = self.files[file.path] = SessionFile(
                file.path, lambda sid: self._start.get(sid, 0)
            )
        yield from self._read(file)


class Rescan:
    """What :class:`Doorbell` queues when its subscription ended: ``reason`` says why,
    ``final`` whether the daemon is gone for good (it shut down, or no daemon runs)."""

    def __init__(self, reason: str, *, final: bool) -> None:
        self.reason = reason
        self.final = final


@dataclass
class _Subscription:
    close: Callable[[], None]


class Doorbell:
    """The daemon's tail-all subscription, in a thread: ``(path, record)`` items and
    :class:`Rescan` markers in :attr:`items`.

    ``subscribe()`` connects and returns ``(records, close)``; it is called again after
    ``retry`` seconds when the subscription ends, unless ``retry`` is None (then the
    first end is final).  :meth:`started` waits until the first subscription is in place
    (or failed), so a replay of the files that starts afterwards misses nothing.
    """

    def __init__(
        self,
        subscribe: Callable[[], tuple[Iterable[tuple[str, Record]], Callable[[], None]]],
        *,
        retry: float | None,
        maxsize: int = 10_000,
    ) -> None:
        self.items: queue.Queue[tuple[str, Record] | Rescan] = queue.Queue(maxsize)
        self._subscribe = subscribe
        self._retry = retry
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._current: _Subscription | None = None
        self._thread = threading.Thread(target=self._run, name="flightlog-doorbell", daemon=True)

    def start(self) -> Doorbell:
        self._thread.start()
        return self

    def started(self, timeout: float) -> bool:
        """Wait until the first subscription is in place or has failed."""
        return self._ready.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        if self._current is not None:
            self._current.close()

    def _put(self, item: tuple[str, Record] | Rescan) -> bool:
        while not self._stop.is_set():
            try:
                self.items.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            reason = self._follow()
            final = self._retry is None
            self._ready.set()
            if not self._put(Rescan(reason, final=final)) or final:
                return
            self._stop.wait(self._retry)

    def _follow(self) -> str:
        try:
            records, close = self._subscribe()
        except Exception as exc:
            return str(getattr(exc, "message", exc))
        self._current = _Subscription(close)
        try:
            self._ready.set()
            for item in records:
                if not self._put(item):
                    break
            return "the daemon ended the subscription"
        except Exception as exc:
            return str(getattr(exc, "message", exc))
        finally:
            self._current = None
            close()


class _Live(Protocol):
    """The daemon's tail-all subscription of the client (its ``Tail``), not started."""

    end_reason: str | None

    def close(self) -> None: ...

    def __next__(self) -> tuple[str, Record]: ...

    def _start(self) -> int: ...


class _AsyncLive(Protocol):
    end_reason: str | None

    async def aclose(self) -> None: ...

    async def __anext__(self) -> tuple[str, Record]: ...

    async def _start(self) -> int: ...


class _Replay:
    """What the sync and async cursor tails share: the files, the filters, the cursor,
    and the client's subscription to every session (``live``, None without follow)."""

    def __init__(
        self,
        live: Any,
        after: Mapping[str, int] | str,
        *,
        types: Iterable[str] | None = None,
        run_id: str | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        self._live = live
        self._items = self._generate()
        cursor = parse_cursor(after) if isinstance(after, str) else dict(after)
        home = root if root is not None else default_root(os.environ, os.path.expanduser("~"))
        #: The files that could not be read, or broke a reading rule: path -> why.
        self.skipped: dict[str, str] = {}
        self._sessions = AllSessions([os.fspath(home)], cursor, self._skip)
        self._types = None if types is None else frozenset(types)
        self._run_id = run_id

    def _generate(self) -> Any:
        raise NotImplementedError

    @property
    def end_reason(self) -> str | None:
        """Why the daemon ended the subscription, once it has (None without ``follow``)."""
        live = self._live
        return None if live is None else cast(str | None, live.end_reason)

    @property
    def problems(self) -> deque[str]:
        """The blobs a delivered record still refers to, one sentence each, as a tail's
        ``problems``: a record read from its file is put back from the store where this
        process can read it, a live one also from what the daemon sent."""
        return self._sessions.problems

    def _skip(self, path: str, exc: Exception) -> None:
        if isinstance(exc, FileFormatError):
            self.skipped[path] = f"line {exc.line}: {exc.reason}"
        else:
            self.skipped[path] = str(getattr(exc, "strerror", None) or exc)

    @property
    def cursor(self) -> str:
        """Where this tail got to: what ``after`` takes to go on from here (``flightlog
        tail --all --after`` takes it too); ``""`` before any record."""
        return format_cursor(self._sessions.cursor())

    def _wanted(self, items: Iterable[tuple[str, Record]]) -> Iterator[tuple[str, Record]]:
        types, run_id = self._types, self._run_id
        for path, record in items:
            if types is not None and record.type not in types:
                continue
            if run_id is not None and not (record.run_id or "").startswith(run_id):
                continue
            yield path, record

    def scan(self) -> Iterator[tuple[str, Record]]:
        return self._wanted(self._sessions.scan())

    def live(self, path: str, record: Record) -> Iterator[tuple[str, Record]]:
        return self._wanted(self._sessions.live(path, record))


class CursorTail(_Replay):
    """``client.tail_all(after=CURSOR, follow=...)``: ``(path, record)`` of every session
    under the data root the caller may read, each after the cursor's seq for it (a
    session it does not name from its start), then, with ``follow``, what the daemon
    writes from then on, each record once; without ``follow`` it ends at the present.
    :attr:`cursor` says where it got to; :attr:`skipped` names the files it could not
    read."""

    _live: _Live | None
    _items: Iterator[tuple[str, Record]]

    def _generate(self) -> Iterator[tuple[str, Record]]:
        live = self._live
        if live is not None:
            live._start()  # subscribed before the replay: nothing falls in between
        yield from self.scan()
        if live is None:
            return
        while True:
            try:
                path, record = next(live)
            except StopIteration:
                break
            yield from self.live(path, record)
        yield from self.scan()  # what was written after the subscription ended

    def __iter__(self) -> CursorTail:
        return self

    def __next__(self) -> tuple[str, Record]:
        return next(self._items)

    def close(self) -> None:
        """Unsubscribe; safe to call again."""
        if self._live is not None:
            self._live.close()

    def __enter__(self) -> CursorTail:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncCursorTail(_Replay):
    """:class:`CursorTail` for the async client: ``async for path, record in ...``.
    The files are read on the event loop's thread, a megabyte at a time."""

    _live: _AsyncLive | None
    _items: AsyncIterator[tuple[str, Record]]

    async def _generate(self) -> AsyncIterator[tuple[str, Record]]:
        live = self._live
        if live is not None:
            await live._start()
        for item in self.scan():
            yield item
        if live is None:
            return
        while True:
            try:
                path, record = await live.__anext__()
            except StopAsyncIteration:
                break
            for item in self.live(path, record):
                yield item
        for item in self.scan():
            yield item

    def __aiter__(self) -> AsyncCursorTail:
        return self

    async def __anext__(self) -> tuple[str, Record]:
        return await self._items.__anext__()

    async def aclose(self) -> None:
        """Unsubscribe; safe to call again."""
        if self._live is not None:
            await self._live.aclose()

    async def __aenter__(self) -> AsyncCursorTail:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
