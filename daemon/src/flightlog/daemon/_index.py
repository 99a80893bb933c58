"""The index kept beside a big session file, so that opening it reads only its end.

Opening a session checks every line of it and gathers what a writer needs (its runs,
its latest checkpoint, its event ids, its cut runs and open calls): about a second per
100 MB.  For a file of :data:`INDEX_FROM` bytes or more, flightlogd keeps what that scan
gathered up to an offset in ``.NAME.flightlog-index`` beside it (docs/format.md,
"The session index"), written after a scan that read the file whole and when the
session closes.  The next open takes it instead of reading the file up to that offset,
then reads on from there to the end exactly as the scan would.

The index only seeds the scan: the run and call ledgers keep their one rule in
``flightlog.protocol`` and go on from the state it holds.  It is taken only when it
holds together and describes this file: its own file is a regular one, owned as the
session's and no larger than it; it decodes whole; it names the same session; the file
is at least as long as the offset it covers; the line that ends there is the one it
saw (its length, BLAKE2b digest and seq); the checkpoint line it names is one; its run
ledger is one that records can leave; and the file is the same inode, not written
since unless appended to, or is compressed (read through its plain bytes; the content
checks alone then).  What the index covers is not read again: a
change made there behind flightlogd's back, keeping the file's inode, size and last
line, or followed by an append, goes unseen until the index is gone.
Anything else (no index, a torn, stale, foreign or hostile one) is ignored and the
file is read whole, as without an index.

An index is written to a temporary name and renamed over the old one, holding the
session's lock: a kill at any point leaves the old index or the new one whole, and a
temporary file that the next index written, or the next change of form of the file,
removes.  It is not synced: losing it costs only a full read.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from typing import Final

import msgspec

from flightlog.protocol import CHECKPOINT, Record
from flightlog.protocol._calls import CallState
from flightlog.protocol.format import LedgerState
from flightlog.sdk.storage import TEMP_SUFFIX, index_name, remove_leftovers

from ._paths import write_then_rename

__all__ = [
    "INDEX_FROM",
    "INDEX_VERSION",
    "REINDEX_AFTER",
    "Pread",
    "SessionIndex",
    "line_digest",
    "load_index",
    "save_index",
]

#: Files shorter than this are read whole at open (no index is kept for them).
INDEX_FROM: Final = 4 * 1024 * 1024
#: Bytes a file grows past its index before a close writes the index again (an open
#: reads what lies past it).
REINDEX_AFTER: Final = 1024 * 1024
#: The index's own format version; another one is ignored.
INDEX_VERSION: Final = 1

#: ``pread(size, offset)``: a file's plain bytes.
Pread = Callable[[int, int], bytes]


class SessionIndex(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """What the open-time scan of a session file gathered up to ``offset``."""

    version: int
    session_id: str
    #: The bytes covered: the file's plain form up to the end of line ``last_seq``.
    offset: int
    last_seq: int
    #: The last line covered (the one ending at ``offset``): its length with the
    #: newline, and its BLAKE2b-128 digest.
    last_line: tuple[int, bytes]
    #: The file's (st_dev, st_ino) and st_mtime_ns when written.
    ident: tuple[int, int]
    mtime_ns: int
    #: The latest checkpoint line: (seq, offset, length), if any.
    checkpoint: tuple[int, int, int] | None
    runs: LedgerState
    calls: CallState
    #: The event ids of the records, ``event_id_key`` each (16 bytes), joined.
    event_ids: bytes


_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(SessionIndex)


def line_digest(line: bytes) -> bytes:
    return hashlib.blake2b(line, digest_size=16).digest()


def save_index(dir_fd: int, name: str, index: SessionIndex, owner: os.stat_result) -> None:
    """Write ``index`` beside the session ``name`` (holding its lock), owned as
    ``owner`` says.  Raises :class:`OSError`."""
    final = index_name(name)
    prefix = f".{name[:200]}."
    remove_leftovers(dir_fd, prefix)
    temp = f"{prefix}{secrets.token_hex(6)}{TEMP_SUFFIX}"
    write_then_rename(dir_fd, temp, final, _encoder.encode(index), sync=False, owner=owner)


def load_index(
    dir_fd: int,
    name: str,
    fd: int,
    *,
    restored: bool,
    pread: Pread | None = None,
    size: int | None = None,
) -> SessionIndex | None:
    """The index of the session ``name`` (open at ``fd`` and locked), or None when there
    is none that can be trusted (see the module docstring).  ``restored``: the file
    changed form since (a new inode, the same bytes).  A compressed file is read through
    ``pread(size, offset)``, its plain bytes, and ``size`` is theirs."""
    read = pread or (lambda length, offset: os.pread(fd, length, offset))
    try:
        file = os.fstat(fd)
        plain = file.st_size if size is None else size
        index_fd = os.open(
            index_name(name),
            os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY,
            dir_fd=dir_fd,
        )
    except OSError:
        return None
    try:
        st = os.fstat(index_fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != file.st_uid
            or st.st_mode & 0o022
            or st.st_size > plain
        ):
            return None
        data = os.pread(index_fd, st.st_size, 0)
    except OSError:
        return None
    finally:
        os.close(index_fd)
    try:
        index = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not _describes(index, read, file, plain, restored=restored):
        return None
    return index


def _describes(
    index: SessionIndex, read: Pread, file: os.stat_result, plain: int, *, restored: bool
) -> bool:
    length, digest = index.last_line
    if (
        index.version != INDEX_VERSION
        or not 0 < length <= index.offset <= plain
        or index.last_seq < 1
        or len(index.event_ids) % 16
    ):
        return False
    if not restored and (
        index.ident != (file.st_dev, file.st_ino)
        or (file.st_size == index.offset and file.st_mtime_ns != index.mtime_ns)
    ):
        return False
    if index.checkpoint is not None:
        seq, offset, size = index.checkpoint
        if not (0 < seq <= index.last_seq and offset >= 0 and 0 < size <= index.offset - offset):
            return False
        found = _line_at(read, offset, size, index.session_id)
        if found is None or (found.seq, found.type) != (seq, CHECKPOINT):
            return False
    found = _line_at(read, index.offset - length, length, index.session_id)
    if found is None or found.seq != index.last_seq:
        return False
    try:
        line = read(length, index.offset - length)
    except OSError:
        return False
    return line_digest(line) == digest


def _line_at(read: Pread, start: int, length: int, session_id: str) -> Record | None:
    """The record of the whole line of ``length`` bytes at ``start`` (a line of the
    session ``session_id``: after a newline, ending with one), or None."""
    try:
        # With the byte before it: the line must start a line, not end another one.
        line = read(length + 1, start - 1) if start else b"\n" + read(length, 0)
    except OSError:
        return None
    if line[:1] != b"\n" or len(line) != length + 1 or not line.endswith(b"\n"):
        return None
    try:
        record = msgspec.json.decode(line[1:], type=Record)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return record if record.session_id == session_id else None
