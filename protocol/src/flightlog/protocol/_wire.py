"""The messages of the wire protocol, as tagged msgspec Structs.

Every message is one MessagePack map in one frame (see :mod:`._framing`), tagged by
its ``type`` field.  Requests carry an ``id`` (a positive integer the client picks,
unique among its pending requests) that the reply echoes; ``record`` has no id and no
reply.  Pushes (:class:`RecordFailed`, :class:`TailBatch`, :class:`TailEnd`) arrive at
any time between replies.

JSON payloads (a record's ``data``, a checkpoint's snapshot, tailed lines) travel as
MessagePack ``bin`` holding UTF-8 JSON bytes: JSON is their format on disk, and the
daemon validates them, never re-encodes them.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from ._records import Origin

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "PROTOCOL_VERSION",
    "SUPPORTED_VERSIONS",
    "Ack",
    "BeginRun",
    "BlobLoaded",
    "CheckpointLoaded",
    "ClientMessage",
    "CloseRun",
    "CloseSession",
    "Create",
    "ErrorReply",
    "Hello",
    "LoadBlob",
    "LoadCheckpoint",
    "Message",
    "Open",
    "OpenCallInfo",
    "RecordEvent",
    "RecordFailed",
    "Request",
    "RunStarted",
    "SaveCheckpoint",
    "ServerMessage",
    "SessionOpened",
    "SessionStatus",
    "Status",
    "StatusReply",
    "Subscribe",
    "Subscribed",
    "Sync",
    "TailBatch",
    "TailEnd",
    "UidLimits",
    "UidStorage",
    "Unsubscribe",
    "Welcome",
]

PROTOCOL_VERSION: Final = 1
SUPPORTED_VERSIONS: Final = (1,)
#: The daemon's default maximum frame size; it announces its own in :class:`Welcome`.
DEFAULT_MAX_FRAME_SIZE: Final = 16 * 1024 * 1024


class Message(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    """Base of every wire message."""


# ---------------------------------------------------------------------------- requests


class Request(Message, frozen=True):
    """A message that expects exactly one reply with the same ``id``."""

    id: int


class Hello(Request, tag="hello", frozen=True):
    """First message on every connection: the protocol version the client speaks.

    ``ring``: the client would send its frames through a ring of shared memory
    (docs/protocol.md, "The ring"); it then sends nothing more until the Welcome."""

    version: int
    client: str = ""
    pid: int = 0
    ring: bool = False


class Create(Request, tag="create", frozen=True):
    """Create a new session file at ``path`` and become its writer.  Reply: SessionOpened.

    ``origin``, for a fork, names the session and the point it is forked from; it is
    written into ``session_start``."""

    path: str
    meta: dict[str, Any] = {}
    origin: Origin | None = None


class Open(Request, tag="open", frozen=True):
    """Open an existing session file and become its writer.  Reply: SessionOpened."""

    path: str


class BeginRun(Request, tag="begin_run", frozen=True):
    """Start a run in a session this connection writes.  Reply: RunStarted.

    ``run_id`` is the id the client chose for the new run (32 lowercase hex digits;
    the daemon makes one when it is None), so that a client whose connection broke
    before the reply can find the run in the file.  With ``resume``, continue that run
    instead: it must be the session's last run, cut without ``run_close``
    (``SessionOpened.last_run``); the daemon writes ``run_resume``.  With ``resume`` and
    ``repair``, it may be any run the file left without ``run_close`` (a *repair*: the
    ``run_resume`` says ``repair``, and the run's ``run_close`` says ``repaired``).
    """

    session_id: str
    time: str
    client: str = ""
    pid: int = 0
    run_id: str | None = None
    resume: str | None = None
    repair: bool = False


class RecordEvent(Message, tag="record", frozen=True, omit_defaults=True):
    """Append one agent fact to the open run.  No reply; a failure is pushed as RecordFailed.

    ``data`` is one JSON object (UTF-8, no raw newline) and ``event_type`` one of the
    agent fact types; ``time`` is the source's RFC 3339 UTC timestamp.  ``event_id``, the
    caller's id of the event (1 to 256 bytes), makes the record idempotent: a record
    whose id the session already holds is not written again (docs/protocol.md).
    """

    session_id: str
    run_id: str
    event_type: str
    time: str
    data: bytes
    event_id: str | None = None


class SaveCheckpoint(Request, tag="save_checkpoint", frozen=True):
    """Append a checkpoint and sync it.  Reply: Ack once durable."""

    session_id: str
    run_id: str
    time: str
    snapshot: bytes


class CloseRun(Request, tag="close_run", frozen=True):
    """Append ``run_close`` (with the run's sticky error, if any) and sync.  Reply: Ack."""

    session_id: str
    run_id: str
    time: str
    error: str | None = None


class CloseSession(Request, tag="close_session", frozen=True):
    """Sync and release the session.  Reply: Ack, or the session's sticky error."""

    session_id: str


class Sync(Request, tag="sync", frozen=True):
    """Make everything sent so far durable.  Reply: Ack once fsynced.

    With ``durable`` false, the Ack comes once everything sent before it is written (in
    the page cache, where a crash of the daemon cannot lose it), without an fsync.
    """

    session_id: str
    durable: bool = True


class LoadCheckpoint(Request, tag="load_checkpoint", frozen=True):
    """The latest explicit checkpoint of a session.  Reply: CheckpointLoaded; with
    ``calls``, it also lists the session's cut runs and open calls (``resume()``)."""

    session_id: str
    calls: bool = False


class LoadBlob(Request, tag="load_blob", frozen=True):
    """The blob with SHA-256 ``sha256`` (64 lowercase hex digits) from the blob store of
    the session at ``path``, for a reader that may read the session through the daemon
    but not the store itself.  Reply: BlobLoaded; refused as a tail of the session
    would be (``path_refused``, ``permission_denied``), with ``blob_not_found`` when the
    store does not hold it, and ``blob_too_large`` when it would not fit in a frame."""

    path: str
    sha256: str


class Subscribe(Request, tag="subscribe", frozen=True):
    """Tail a session (``path``), or every session written from now on (``path`` None).

    Records with ``seq > after`` are pushed in TailBatch frames, in order, without gaps;
    without ``follow`` the subscription ends (TailEnd) at the current end of the file.
    """

    path: str | None = None
    after: int = 0
    follow: bool = False
    types: list[str] | None = None
    run_id: str | None = None


class Unsubscribe(Request, tag="unsubscribe", frozen=True):
    """End a subscription.  Reply: Ack; a TailEnd may still be in flight before it."""

    subscription: int


class Status(Request, tag="status", frozen=True, omit_defaults=True):
    """What the daemon holds.  Reply: StatusReply; with ``closed``, its ``closed``
    lists the sessions this daemon closed lately as well (left out when false: the
    plain request is the one it always was)."""

    closed: bool = False


ClientMessage = (
    Hello
    | Create
    | Open
    | BeginRun
    | RecordEvent
    | SaveCheckpoint
    | CloseRun
    | CloseSession
    | Sync
    | LoadCheckpoint
    | Subscribe
    | Unsubscribe
    | Status
    | LoadBlob
)

# ----------------------------------------------------------------------------- replies


class Welcome(Message, tag="welcome", frozen=True):
    """Reply to Hello: the version spoken and the largest frame the daemon accepts.

    ``ring``: the size of the data area of the ring passed with this message (a
    memfd, as SCM_RIGHTS), through which the client sends every later frame; 0: no
    ring, the socket carries them."""

    id: int
    version: int
    max_frame_size: int
    daemon_pid: int = 0
    server: str = ""
    ring: int = 0


class SessionOpened(Message, tag="session_opened", frozen=True):
    """Reply to Create and Open.

    ``last_seq`` is the seq of the last record in the file; ``path`` is the resolved
    absolute path; ``interrupted_runs`` lists runs that have no ``run_close``; an
    unfinished tail that opening truncated away is counted in ``truncated_bytes``.
    ``last_run`` is the file's last run when it has no ``run_close`` (the one a
    ``begin_run`` may resume), ``last_run_items`` how many agent facts and checkpoints
    it holds, and ``checkpoint_seq`` the seq of the latest checkpoint.
    """

    id: int
    session_id: str
    path: str
    last_seq: int
    meta: dict[str, Any] = {}
    interrupted_runs: list[str] = []
    truncated_bytes: int = 0
    last_run: str | None = None
    last_run_items: int = 0
    checkpoint_seq: int | None = None


class RunStarted(Message, tag="run_started", frozen=True):
    """Reply to BeginRun: the fresh run id and the seq of its ``run_start``."""

    id: int
    run_id: str
    seq: int


class Ack(Message, tag="ack", frozen=True):
    """Success reply; ``seq`` is the last seq written (and durable, for synced requests)."""

    id: int
    seq: int = 0


class OpenCallInfo(msgspec.Struct, kw_only=True, frozen=True):
    """A model or tool call with a start and no end, as CheckpointLoaded lists it:
    ``execution`` as recorded, ``seq`` its first record's, and the start's
    ``tool_call_id``, ``name`` and ``arguments`` as recorded (any JSON value)."""

    run_id: str
    execution: dict[str, Any]
    seq: int
    tool_call_id: Any = None
    name: Any = None
    arguments: Any = None


class CheckpointLoaded(Message, tag="checkpoint_loaded", frozen=True):
    """Reply to LoadCheckpoint; ``snapshot`` is None when the session has no checkpoint.

    Asked with ``calls``: ``calls_known`` is true, ``cut_runs`` lists the runs without
    ``run_close`` and ``open_calls`` the calls without an end, in file order (a daemon
    that does not know the flag leaves ``calls_known`` false)."""

    id: int
    seq: int | None = None
    run_id: str | None = None
    time: str | None = None
    snapshot: bytes | None = None
    calls_known: bool = False
    cut_runs: list[str] = []
    open_calls: list[OpenCallInfo] = []


class BlobLoaded(Message, tag="blob_loaded", frozen=True):
    """Reply to LoadBlob: the blob's bytes (what its reference stands for, base64
    encoded, in the record)."""

    id: int
    sha256: str
    data: bytes


class Subscribed(Message, tag="subscribed", frozen=True):
    """Reply to Subscribe: the subscription's number, used by later pushes."""

    id: int
    subscription: int
    path: str | None = None


class SessionStatus(msgspec.Struct, kw_only=True, frozen=True):
    """One session, as StatusReply lists it: open, or closed lately (then ``records``
    and ``bytes`` count every line this daemon wrote to it, over all its openings)."""

    path: str
    session_id: str
    writer_pid: int | None = None
    run_id: str | None = None
    last_seq: int = 0
    records: int = 0
    bytes: int = 0
    subscribers: int = 0
    file_open: bool = True
    error: str | None = None
    #: Records dropped because the session held their event id (since this daemon
    #: opened it).
    duplicates: int = 0


class UidLimits(msgspec.Struct, kw_only=True, frozen=True):
    """The asking client's uid as StatusReply shows it: what it uses of the daemon and
    the daemon's per-uid limits (None: this uid has none, the daemon's own)."""

    uid: int
    connections: int = 0
    sessions: int = 0
    max_connections: int | None = None
    max_sessions: int | None = None
    max_bytes_per_second: int | None = None


class UidStorage(msgspec.Struct, kw_only=True, frozen=True):
    """One uid's session files under the data root, as the daemon last surveyed them,
    and the retention limits it applies to them (None: no such limit)."""

    uid: int
    files: int = 0
    bytes: int = 0
    #: The last activity of its least recently active file (RFC 3339), if any.
    oldest: str | None = None
    #: Files (and their bytes) the daemon's limits removed since it started.
    removed_files: int = 0
    removed_bytes: int = 0
    #: The blobs in its blob store (``uid/UID/.flightlog-blobs``, or the root's for the
    #: daemon's own uid) and their bytes, beside ``files`` and ``bytes``.
    blobs: int = 0
    blob_bytes: int = 0
    max_use: int | None = None
    #: Seconds.
    max_age: float | None = None
    #: The operator's global limit: bytes kept available on the data root's filesystem.
    keep_free: int | None = None
    #: Seconds: a session active within this long is never removed.
    protect: float = 0.0
    #: Bytes available on the data root's filesystem at the survey.
    available: int | None = None
    #: When the survey was made (RFC 3339); None before the first.
    surveyed: str | None = None
    #: The operator's global limit: bytes of every uid's files together.
    max_use_total: int | None = None


class StatusReply(Message, tag="status_reply", frozen=True):
    """Reply to Status."""

    id: int
    pid: int
    version: str
    uptime: float
    connections: int
    subscribers: int
    records_written: int
    bytes_written: int
    records_per_second: float = 0.0
    errors: int = 0
    open_files: int = 0
    sessions: list[SessionStatus] = []
    uid_limits: UidLimits | None = None
    #: Asked for with ``Status.closed``: the sessions this daemon closed, the most
    #: recently closed last, at most the last 1024 of them.
    closed: list[SessionStatus] = []
    #: The asking client's uid's session files and retention limits; every uid's for a
    #: client that reads every session.
    storage: list[UidStorage] = []


class ErrorReply(Message, tag="error", frozen=True):
    """A request failed.  ``id`` is 0 when the failure is about no request (bad frame)."""

    id: int
    code: str
    message: str
    session_id: str | None = None


# ------------------------------------------------------------------------------ pushes


class RecordFailed(Message, tag="record_failed", frozen=True):
    """Pushed to a session's writer when a record failed; sticky on the run."""

    session_id: str
    run_id: str | None
    code: str
    message: str


class TailBatch(Message, tag="tail_batch", frozen=True):
    """Pushed to a subscriber: complete JSONL lines (each without its ``\\n``) in seq order."""

    subscription: int
    lines: list[bytes]
    path: str | None = None


class TailEnd(Message, tag="tail_end", frozen=True):
    """Pushed to a subscriber: no more batches will come.

    ``reason`` is ``end_of_file`` (no follow), ``session_closed`` (the writer closed the
    session), ``unsubscribed``, ``shutting_down`` or ``error`` (then ``code`` and
    ``message`` say which).
    """

    subscription: int
    reason: str
    last_seq: int = 0
    code: str | None = None
    message: str | None = None


ServerMessage = (
    Welcome
    | SessionOpened
    | RunStarted
    | Ack
    | CheckpointLoaded
    | BlobLoaded
    | Subscribed
    | StatusReply
    | ErrorReply
    | RecordFailed
    | TailBatch
    | TailEnd
)
