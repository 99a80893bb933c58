"""Reading session files directly, without the daemon."""

from __future__ import annotations

import os
from collections.abc import Iterator

from flightlog.protocol import (
    CheckReport,
    Reader,
    Record,
)
from flightlog.protocol import check as check_file
from flightlog.protocol.wire import (
    default_root,
)

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
    last complete line.  The file is opened at the first iteration.  Raises
    :class:`FileFormatError` at the first line that breaks a reading rule (bytes that
    are not UTF-8 included: no other decoding error escapes), and :class:`OSError` when
    the file cannot be opened or read.
    """
    with open(resolve_path(path, root), "rb") as fileobj:
        yield from Reader(fileobj)


def check(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> CheckReport:
    """Verify the session file at ``path``; ``report.sound`` says whether it is sound.

    ``path`` resolves as in :func:`read`.  A broken line is reported (``error``,
    ``error_line``), never raised; an unfinished tail does not make a file unsound.
    Raises :class:`OSError` when the file cannot be opened.
    """
    with open(resolve_path(path, root), "rb") as fileobj:
        return check_file(fileobj)
