"""Reading session files directly, without the daemon."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import msgspec

# The protocol's check is looked up when it is used: its module imports the run ledger,
# which a reader of files (find, read) does not need.
import flightlog.protocol as protocol
from flightlog.protocol import BinaryReadable, Reader, Record
from flightlog.protocol._blobs import BLOB_MARK, has_references
from flightlog.protocol.wire import default_root

from ._blobs import blob_problems, resolving
from ._compression import open_session_file

if TYPE_CHECKING:
    from flightlog.protocol import CheckReport

__all__ = ["check", "read", "resolve_path"]


def resolve_path(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> str:
    """Where the session file ``path`` is: an absolute path as it is, a relative one
    under ``root``.

    ``root`` defaults to the data root the daemon uses by default: ``$FLIGHTLOG_ROOT``,
    else ``$XDG_STATE_HOME/flightlog``, else ``~/.local/state/flightlog``; so
    ``read("demo/hello.jsonl")`` reads the file ``create("demo/hello.jsonl")`` made.
    """
    path = os.fspath(path)
    if os.path.isabs(path):
        return path
    if root is None:
        root = default_root(os.environ, os.path.expanduser("~"))
    return os.path.join(os.fspath(root), path)


def read(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> Iterator[Record]:
    """Stream the records of the session file at ``path``, ``session_start`` first.

    A relative ``path`` resolves under the data root, as :meth:`Client.create` and the
    ``flightlog`` command resolve it: ``$FLIGHTLOG_ROOT``, else
    ``$XDG_STATE_HOME/flightlog``, else ``~/.local/state/flightlog`` (``root`` overrides
    it); an absolute one is used as it is.  Each :class:`Record` keeps its payload as
    raw JSON: ``record.decode_data()`` decodes it into plain values,
    ``default_codec.decode_event(record)`` into the event class that was recorded.

    A piece of the file and one line are held at a time, so a file of any size reads in
    constant memory; a file still being written (or left by a crash) reads up to its
    last complete line.  A compressed file (``flightlog compress``) reads the same.
    The file is opened at the first iteration.  Raises
    :class:`FileFormatError` at the first line that breaks a reading rule (bytes that
    are not UTF-8 included: no other decoding error escapes), and :class:`OSError` when
    the file cannot be opened or read.
    """
    local = resolve_path(path, root)
    with open_session_file(local) as fileobj:
        yield from resolving(Reader(fileobj), local)


def check(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> CheckReport:
    """Verify the session file at ``path``; ``report.sound`` says whether it is sound.

    ``path`` resolves as in :func:`read`.  A broken line is reported (``error``,
    ``error_line``), never raised; an unfinished tail does not make a file unsound.
    The blobs the file refers to are verified: one missing, of another size, or whose
    bytes do not have its SHA-256 makes the file unsound (each one is in ``warnings``;
    no blob store at all is a warning only: the lines read without it).
    Raises :class:`OSError` when the file cannot be opened.
    """
    local = resolve_path(path, root)
    with open_session_file(local) as fileobj:
        marked = _Marked(fileobj)
        report = protocol.check(marked)
    if not marked.seen:
        return report
    with open_session_file(local) as fileobj:
        problems, _ = blob_problems(Reader(fileobj), local)
    if not problems:
        return report
    if problems[0].startswith("line "):
        line = int(problems[0].split()[1].rstrip(":"))
        error = report.error or problems[0]
        return msgspec.structs.replace(
            report,
            sound=False,
            error=error,
            error_line=report.error_line or line,
            warnings=[*report.warnings, *problems],
        )
    return msgspec.structs.replace(report, warnings=[*report.warnings, *problems])


class _Marked:
    """A file object that notes whether a blob reference went through it."""

    def __init__(self, fileobj: BinaryReadable) -> None:
        self._file = fileobj
        self._last = b""
        self.seen = False

    def read(self, size: int = -1, /) -> bytes:
        data = self._file.read(size)
        if not self.seen and data:
            self.seen = has_references(self._last + data[: len(BLOB_MARK)]) or has_references(data)
            self._last = data[-len(BLOB_MARK) :]
        return data
