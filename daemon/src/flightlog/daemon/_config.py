"""The daemon's settings and their defaults (the command line is in ``__main__``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from flightlog.protocol.ring import (
    DEFAULT_RING_SIZE,
)
from flightlog.protocol.wire import (
    DEFAULT_MAX_FRAME_SIZE,
    LINE_ENVELOPE,
    default_root,
    default_socket_path,
    line_bound,
)

from ._fairness import PerUidLimits
from ._refusals import WINDOW
from ._retention import RetentionSettings

__all__ = ["LINE_ENVELOPE", "Config"]


@dataclass(frozen=True, kw_only=True)
class Config:
    """Everything :func:`serve` needs to know.

    ``socket_path`` is ignored when listening sockets are handed in (socket activation).
    ``allow`` lists extra roots under which absolute session paths are accepted.
    """

    socket_path: str = field(default_factory=lambda: default_socket_path(os.environ, os.getuid()))
    root: str = field(default_factory=lambda: default_root(os.environ, os.path.expanduser("~")))
    allow: tuple[str, ...] = ()
    socket_mode: int = 0o600
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: Items a session's mailbox holds before the connections feeding it stop reading.
    mailbox_size: int = 1024
    #: Bytes a connection may have handed to actors and not yet written before it
    #: stops reading its socket.
    connection_buffer: int = 8 * 1024 * 1024
    #: Seconds a session with no writer and no subscriber stays open before it closes.
    idle_timeout: float = 5.0
    #: Seconds after a session closed with every run closed (and was not opened
    #: again) before it is compressed in place (0: never).
    compress_after: float = 600.0
    #: Whether base64 payloads of 4,096+ characters are taken out of records and
    #: stored once in the blob store (docs/format.md): off unless asked for, since a
    #: reader without the store sees the reference where the payload was.
    blobs: bool = False
    #: Session files kept open at once; the least recently used idle one is closed.
    max_open_files: int = 512
    #: Seconds a connection that streams records, and has made no request for 40 of
    #: them, is left unread between reads: what it sends meanwhile waits in its socket
    #: buffer and wakes nobody (0: off, every frame read as it arrives).
    read_window: float = 0.0005
    #: Bytes of the data area of the ring of shared memory made for a client that
    #: asks for one (a power of two; 0: no rings, every client uses its socket).
    ring_size: int = DEFAULT_RING_SIZE
    #: Seconds shutdown waits for connections to finish before cancelling them.
    shutdown_grace: float = 10.0
    #: Seconds a reply or push waits for room in a connection's queue of unsent bytes
    #: before the daemon gives up on the client (it reads nothing): the connection's
    #: writes are dropped and its read side shut, so no actor, open or shutdown waits
    #: on it for longer.
    send_timeout: float = 10.0
    #: Seconds a new connection has to send its hello before it is closed.
    hello_timeout: float = 10.0
    #: Seconds of the window in which a client (a connection, or a uid) may have
    #: ``_refusals.BURST`` refusals logged; the rest are counted.
    refusal_window: float = WINDOW
    #: Bytes that every connection together may make the daemon hold (frames being
    #: read, requests waiting for their session); past it only connections holding
    #: less than 1 MiB each are read.  At least four maximum frames.
    max_buffered: int = 256 * 1024 * 1024
    #: Pending pushes a subscriber may have before it falls back to reading the file.
    subscriber_buffer: int = 1024
    #: Client connections served at once; more are refused with ``too_many``.  This and
    #: ``max_open_files`` are lowered at start to fit the descriptor limit.
    max_connections: int = 4096
    #: The group whose members may read every session through the daemon (a gid),
    #: besides each session's owner and root; None: nobody else.
    readers_group: int | None = None
    #: What one uid other than the daemon's may take: connections, sessions written,
    #: bytes per second (``_fairness``).
    per_uid: PerUidLimits = field(default_factory=PerUidLimits)
    #: Size and age limits on the data root's session files (``_retention``); none
    #: by default: the daemon removes nothing unless told to.
    retention: RetentionSettings = field(default_factory=RetentionSettings)

    @property
    def max_line(self) -> int:
        """The longest line the daemon writes, and the longest its tails read: what a
        maximum frame's payload makes with its envelope, and never more than every
        reader of the files reads (``MAX_LINE_BYTES``)."""
        return line_bound(self.max_frame_size)
