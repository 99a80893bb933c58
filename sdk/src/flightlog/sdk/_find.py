"""``find``: the records that answer a question, across every session (the SDK's
:func:`find` and ``flightlog find`` are this one search).

Theory of operation
-------------------
A question is a :class:`Query`: record types, a tool name, a model, failed or not, a
time range, session meta and record data ``path=value`` pairs, a run, an agent, a call
and what is nested under it, and a tree of sessions (sub-agents and forks).  Each file
is mapped in place (a compressed one is read in large blocks), and most lines are never
decoded:

1. Line 1 is read with the protocol's :class:`~flightlog.protocol.Reader`: a file that
   is not a session is refused, and a meta filter that does not match skips the whole
   file.
2. **Prefilter, on bytes** (:class:`~._prefilter.Prefilter`).  Each filter says what bytes a
   matching line must hold: the quoted JSON string of a tool, a model, a run prefix or
   a single type (``"get_weather"``); a ``"type"`` member naming a type the question
   allows (``--tool`` allows ``tool_*``, ``--model`` the types that name one, several
   ``--type`` those); for a time range, a ``"time"`` member whose
   value starts with a second inside the range, or is not in the writer's form
   (``2026-11-29T20:00:00.123456Z``); for ``--error``, a member that can report a
   failure with a value other than the one that says "none" (``"is_error"`` not
   followed by ``:false``).  The first of them drives the scan through the block
   (memmem, or a regular expression with a literal prefix, both in C), so most lines
   are never looked at one by one; the others are tested on each line it finds.
3. **Then exactly**, on the decoded record (:func:`~flightlog.protocol.parse_line`, which
   also checks the file's session id): its type, run and time, and of its ``data``
   only the members a filter reads (:class:`~._query._Data`, a typed decode that skips the
   rest; a member of another shape sends the record to a plain decode).

The prefilter may let through a line that does not match, never drop one that does:
a JSON string is spelled the way the writer spells it (msgspec: raw UTF-8, ``\\"``,
``\\\\`` and the five short escapes) unless it holds a ``\\u`` or ``\\/`` escape, so
a line holding one of these skips the byte tests and goes to step 3; keys are
looked for without the colon or with a look-ahead that lets anything unusual through
(whitespace, a duplicate member, a value in another form).  Only complete lines are read
(an unfinished tail is ignored, as every reader does); lines that the prefilter skips
are not checked: ``flightlog check`` verifies whole files.

Filters that need what came before a record in its run (``agent``, ``under``:
:class:`~flightlog.sdk._match.Lineage`) see every line that can change it: with
``agent``, every line naming ``agent_start`` or ``agent_end`` is decoded whatever the
tests say; with ``under``, every line is.  Session trees (``tree``, ``fork_of``) read
line 1 of every file first, then search the files of the tree.
"""

from __future__ import annotations

import io
import mmap
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from flightlog.protocol import FileFormatError, Reader, Record
from flightlog.protocol.format import parse_line
from flightlog.protocol.wire import default_root

from ._blobs import resolving
from ._compression import open_session_file, session_files
from ._files import resolve_path
from ._match import (
    moment,
    value_text,
)
from ._prefilter import Prefilter
from ._query import Query

__all__ = ["Found", "find", "search"]

_BLOCK: Final = 8 * 1024 * 1024
#: Map a file's pages in one call rather than one fault at a time (Linux).
_POPULATE: Final = getattr(mmap, "MAP_POPULATE", 0)
#: The meta members that place a session in a tree: the session that started it as a
#: sub-agent, and the one it was forked from (docs/format.md, section 3).
PARENT_SESSION: Final = "parent_session"
FORKED_FROM: Final = "forked_from"


@dataclass
class Found:
    """What :func:`search` hands out: a matching record and its session file."""

    path: str
    record: Record
    #: With a text: the first text that matched, the match and how many texts match
    #: (None without a text, or where it must be found again: a blob put back).
    match: tuple[str, re.Match[str], int] | None = None


def search(
    query: Query,
    paths: Sequence[str],
    *,
    on_error: Callable[[str, Exception], None] | None = None,
    skipped: Callable[[str, OSError], None] | None = None,
) -> Iterator[Found]:
    """Every record under ``paths`` that ``query`` matches, file by file, in seq order.

    ``on_error(path, exc)`` hears about a file that cannot be read (:class:`OSError`)
    or breaks a reading rule (:class:`FileFormatError`); the search goes on with the
    next file.  Without ``on_error`` the error is raised.  A ``*.jsonl`` of a directory
    that is not a regular file (a FIFO) is never read: ``skipped(path, exc)`` hears of
    it (by default ``on_error``).
    """
    prefilter = Prefilter(query.tests(), query.always())
    files: Iterable[str] = session_files(paths, skipped=skipped or on_error)
    if query.tree is not None or query.fork_of is not None:
        files = _tree_files(query, list(files))
    for path in files:
        try:
            for record in resolving(_search_file(query, prefilter, path), path):
                yield Found(path, record, query.text_match(record))
        except (OSError, FileFormatError) as exc:
            if on_error is None:
                raise
            on_error(path, exc)


def _tree_files(query: Query, files: list[str]) -> list[str]:
    """The files of the sessions in ``query``'s tree: their line 1 read first (a file
    that cannot be read is kept, for the search to report)."""
    from ._transcript import origin_of  # only here: it imports what a search does not need

    sessions: dict[str, tuple[Any, Any]] = {}  # id: (parent_session, forked_from)
    of_file: dict[str, str | None] = {}
    for path in files:
        try:
            with open_session_file(path) as fileobj:
                reader = Reader(fileobj)
                header = reader.read_header()
        except (OSError, FileFormatError):
            of_file[path] = None
            continue
        meta = reader.meta
        origin = origin_of(header)
        fork = origin.session_id if origin is not None else meta.get(FORKED_FROM)
        sessions[header.session_id] = (meta.get(PARENT_SESSION), fork)
        of_file[path] = header.session_id
    wanted = set(sessions)
    if query.tree is not None:
        wanted &= _below(sessions, query.tree, forks_only=False)
    if query.fork_of is not None:
        wanted &= _below(sessions, query.fork_of, forks_only=True)
    return [path for path, id in of_file.items() if id is None or id in wanted]


def _below(sessions: Mapping[str, tuple[Any, Any]], root: str, *, forks_only: bool) -> set[str]:
    """The sessions reached from ``root`` going down by ``parent_session`` and
    ``forked_from`` (forks only: by ``forked_from``); ``root`` too unless ``forks_only``."""
    children: dict[Any, list[str]] = {}
    for id, (parent, fork) in sessions.items():
        for above in (fork,) if forks_only else {parent, fork}:
            if isinstance(above, str):
                children.setdefault(above, []).append(id)
    wanted: set[str] = set() if forks_only else {root}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in wanted and child != root:
                wanted.add(child)
                todo.append(child)
    return wanted


def find(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None = None,
    *,
    type: str | Iterable[str] | None = None,
    tool: str | None = None,
    model: str | None = None,
    error: bool | None = None,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    meta: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    run: str | None = None,
    agent: str | None = None,
    under: str | None = None,
    tree: str | None = None,
    fork_of: str | None = None,
    text: str | re.Pattern[str] | None = None,
    limit: int | None = None,
    on_error: Callable[[str, Exception], None] | None = None,
    root: str | os.PathLike[str] | None = None,
) -> Iterator[Found]:
    """The records of the session files under ``paths`` (files or directories; relative
    ones under the data root, or ``root``, as :func:`read` resolves them; the whole data
    root when None) that every filter given matches, file by file in path order, each
    in seq order: the records ``flightlog find`` prints for the same filters.

    ``since`` and ``until`` take a datetime, an RFC 3339 UTC time or an age (``"2h"``);
    ``meta`` and ``data`` map a member's path (``"app"``, ``"config.model"``,
    ``"arguments.path"``) to its value (compared as text: a value that is not a string
    as its JSON).  ``agent`` is a record's author (docs/cli.md, "find"); ``under`` an
    execution id; ``tree`` and ``fork_of`` session ids.  ``text`` is a regular
    expression over what the records say.

    Files are read directly, with the caller's permissions; a file that cannot be read
    or breaks a reading rule raises :class:`OSError` or
    :class:`~flightlog.protocol.FileFormatError`, unless ``on_error(path, exc)`` is
    given: then it hears of it, and the search goes on.  Raises :class:`ValueError` for
    a time in no known form, a ``limit`` below 1 or an invalid ``text`` pattern.
    """
    if limit is not None and limit < 1:
        raise ValueError("limit takes a number of records, 1 or more")
    if paths is None:
        paths = [root if root is not None else default_root(os.environ, os.path.expanduser("~"))]
    elif isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    now = datetime.now(UTC)
    types = [type] if isinstance(type, str) else list(type or ())
    query = Query(
        types=frozenset(types) if types else None,
        tool=tool,
        model=model,
        error=error,
        since=_time(since, "since", now),
        until=_time(until, "until", now),
        meta=_texts(meta),
        data=_texts(data),
        run=run,
        text=re.compile(text) if isinstance(text, str) else text,
        agent=agent,
        under=under,
        tree=tree,
        fork_of=fork_of,
    )
    found = search(query, [resolve_path(path, root) for path in paths], on_error=on_error)
    for count, item in enumerate(found, 1):
        yield item
        if limit is not None and count >= limit:
            return


def _time(value: datetime | str | None, name: str, now: datetime) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    try:
        return moment(value, now)
    except ValueError as exc:
        raise ValueError(f"{name} takes {exc}") from None


def _texts(wanted: Mapping[str, Any] | None) -> dict[str, str | None]:
    """Filter values as the text they are compared as (:func:`value_text`; None: the
    member is missing or null)."""
    return {key: value_text(value) for key, value in (wanted or {}).items()}


def _search_file(query: Query, prefilter: Prefilter, path: str) -> Iterator[Record]:
    with open_session_file(path) as fileobj:
        mapped = _mapped(fileobj) if fileobj.seekable() else None
        if mapped is not None:
            # The whole file in place: no copy, and no line waits for a next block.
            with mapped:
                yield from _search_mapped(query, prefilter, mapped, fileobj)
            return
        reader = Reader(fileobj)
        header = reader.read_header()
        if not query.matches_meta(reader.meta):
            return
        query.begin_file()
        if query.matches(header):
            yield header
        offset = reader.offset
        if fileobj.seekable():
            fileobj.seek(offset)
            yield from _scan(query, prefilter, fileobj, header)
            return
    # A compressed file reads forward only: from its start again, to the same offset.
    with open_session_file(path) as fileobj:
        fileobj.seek(offset)
        yield from _scan(query, prefilter, fileobj, header)


def _mapped(fileobj: Any) -> mmap.mmap | None:
    """The plain file ``fileobj`` mapped for reading; None when it cannot be (empty)."""
    try:
        fd = fileobj.fileno()
        if os.fstat(fd).st_size == 0:
            return None
        return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    except (OSError, ValueError, AttributeError):
        return None


def _search_mapped(
    query: Query, prefilter: Prefilter, mapped: mmap.mmap, fileobj: Any
) -> Iterator[Record]:
    # Line 1 alone to the reader: it would read (and copy) a large chunk of the file.
    first = mapped.find(b"\n") + 1
    reader = Reader(io.BytesIO(mapped[: first or len(mapped)]))
    header = reader.read_header()
    if not query.matches_meta(reader.meta):
        return
    query.begin_file()
    if query.matches(header):
        yield header
    end = mapped.rfind(b"\n") + 1  # complete lines only
    yield from _records(query, prefilter, mapped, reader.offset, end, 0, fileobj, header)


def _scan(query: Query, prefilter: Prefilter, fileobj: Any, header: Record) -> Iterator[Record]:
    offset = fileobj.tell()  # of the current block in the file
    rest = b""
    while block := fileobj.read(_BLOCK):
        block = rest + block
        end = block.rfind(b"\n") + 1  # only complete lines; the rest waits for more
        rest = block[end:]
        yield from _records(query, prefilter, block, 0, end, offset, fileobj, header)
        offset += end


def _records(
    query: Query,
    prefilter: Prefilter,
    block: bytes | mmap.mmap,
    begin: int,
    end: int,
    base: int,
    fileobj: Any,
    header: Record,
) -> Iterator[Record]:
    """The records of the lines of ``block[begin:end]`` (at ``base`` in the file) that
    ``query`` matches."""
    session_id = header.session_id
    for start, stop in prefilter.lines(block, end):
        if start < begin:
            continue  # the lines before (line 1) were read already
        line = block[start:stop]
        try:
            record = parse_line(line, lineno=0, session_id=session_id, expected_seq=None)
        except FileFormatError as exc:
            # Lines are not counted while scanning: only an error needs its number.
            raise FileFormatError(_line_number(fileobj, base + start), exc.reason) from None
        if query.matches(record):
            yield record


def _line_number(fileobj: Any, position: int) -> int:
    """The number of the line that starts at byte ``position`` of the file (0 where
    the file reads forward only: a compressed one)."""
    if not fileobj.seekable():
        return 0
    fileobj.seek(0)
    lines = 1
    while position > 0 and (chunk := fileobj.read(min(_BLOCK, position))):
        lines += chunk.count(b"\n")
        position -= len(chunk)
    return lines
