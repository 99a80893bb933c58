"""What the client keeps to ride through a daemon restart: :class:`ReplayLog`, sans I/O.

Theory of operation
-------------------

Each session the client writes has a :class:`_Writer`: its path, its open run, and the
frames of that run's records the daemon has not acknowledged yet, numbered from 1 with
the run's checkpoints (the run's *items*).  :meth:`ReplayLog.keep` numbers a record as
it is sent (:meth:`~ReplayLog.keep_all` several sent at once); the replies to ``sync``,
``save_checkpoint`` and ``close_run`` acknowledge every item sent before them
(:meth:`~ReplayLog.sending` notes which, :meth:`~ReplayLog.answered` takes the reply).
Once the kept frames pass half of ``max_unacked`` bytes, a ``sync`` that does not fsync
(``durable`` false) goes out behind the record to acknowledge them
(:meth:`~ReplayLog.keep`), unless an acknowledgement is on its way already.  The caller
that sent a record waits while the kept frames pass ``max_unacked``
(:meth:`~ReplayLog.full`), until the connection fails.

The invariant that makes every such wait end: *while a session's kept frames pass
``max_unacked``, a request on the connection asks the daemon to acknowledge every item
sent.*  The frames only pass the bound in :meth:`~ReplayLog.keep`, after which
:meth:`~ReplayLog.keep` sends a ``sync`` behind them unless a request already covers the
last item; each later record kept while they are past it does the same; and after a
reconnect :meth:`~ReplayLog.replay` sends one behind the frames it sends again.  So
however large one record is, however many were held back and sent together, and
whatever acknowledgement was on its way when they crossed the bound, the reply that
brings the kept frames back under it is coming.

After a reconnect (:meth:`~ReplayLog.reset`), each session is opened again and
:meth:`~ReplayLog.reopened` reads the answer: the file says how many of the run's items
it holds (``SessionOpened.last_run_items``), so only the frames after them are sent
again (:meth:`~ReplayLog.replay`), and each item is in the file exactly once.  A request
that was waiting for its reply is looked at by :meth:`~ReplayLog.done` and
:meth:`~ReplayLog.resumes` before it is sent again: what the file shows done is not done
again.

The log builds no request but its own ``sync``: it gets request ids and the encoder
from the connection that owns it (``next_id``, ``encode``), and its failure, and knows
nothing else of it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from ._errors import ConnectionLost, ErrorCode, FlightlogError
from ._pending import Pending
from ._wire import Message, SessionOpened, Sync

__all__ = ["DEFAULT_MAX_UNACKED", "ReplayLog"]

#: Bytes of records a session keeps until the daemon acknowledges them.
DEFAULT_MAX_UNACKED: Final = 8 * 1024 * 1024


class _Writer:
    """What a reconnect needs of a session this client writes (see the module docstring)."""

    __slots__ = (
        "acked",
        "asked",
        "checkpoint_seq",
        "frames",
        "last_run",
        "path",
        "resumed_items",
        "run_id",
        "sent",
        "size",
    )

    def __init__(self, path: str) -> None:
        self.path = path
        #: The run whose items are numbered, until its run_close is acknowledged.
        self.run_id: str | None = None
        #: (item, frame) of the records sent and not acknowledged, in order.
        self.frames: deque[tuple[int, bytes]] = deque()
        #: The last item sent; the last item a request on this connection asks the
        #: daemon to acknowledge; the last item it acknowledged.  ``asked > acked``:
        #: an acknowledgement is on its way.
        self.sent = self.asked = self.acked = 0
        self.size = 0
        #: What the last opening found in the file.
        self.last_run: str | None = None
        self.resumed_items = 0
        self.checkpoint_seq: int | None = None

    def start(self, run_id: str | None, items: int = 0) -> None:
        """Number the items of ``run_id`` after ``items`` the file holds already."""
        self.run_id = run_id
        self.frames.clear()
        self.sent = self.asked = self.acked = items
        self.size = 0

    def acknowledged(self, item: int) -> None:
        if item > self.acked:
            self.acked = item
        frames = self.frames
        while frames and frames[0][0] <= item:
            self.size -= len(frames.popleft()[1])


class ReplayLog:
    """The frames of each written session's run the daemon has not acknowledged.

    ``max_unacked`` bounds their bytes per session; ``next_id`` gives a fresh request
    id and ``encode`` frames a message, for the ``sync`` it asks acknowledgements with;
    ``failure`` is the connection's failure, or None while it is sound.
    """

    def __init__(
        self,
        *,
        max_unacked: int,
        next_id: Callable[[], int],
        encode: Callable[[Message], bytes],
        failure: Callable[[], FlightlogError | None],
    ) -> None:
        self.max_unacked = max_unacked
        self._failure = failure
        self._next_id = next_id
        self._encode = encode
        self._writers: dict[str, _Writer] = {}
        #: Request id -> (session, item, background): the items its reply acknowledges.
        self._marks: dict[int, tuple[str, int, bool]] = {}
        #: Records sent and never written: dropped when the daemon stayed out of reach.
        self.lost = 0
        #: The sessions whose kept frames may pass ``max_unacked`` (:meth:`full` says
        #: which do): while it is empty, a sender need not ask.
        self.filled: set[str] = set()

    # ------------------------------------------------------------ sessions and runs

    def opened(self, reply: SessionOpened) -> None:
        """A session is created or opened: its runs' items are kept from now on."""
        writer = self._writers[reply.session_id] = _Writer(reply.path)
        writer.last_run, writer.resumed_items = reply.last_run, reply.last_run_items

    def started(self, session_id: str, run_id: str, *, continued: bool = False) -> None:
        """``run_id`` began (``continued``: the file's cut last run goes on after the
        items it holds)."""
        writer = self._writers.get(session_id)
        if writer is not None:
            writer.start(run_id, writer.resumed_items if continued else 0)

    def run_closed(self, session_id: str, run_id: str) -> None:
        """The daemon wrote ``run_close`` of ``run_id``: nothing of it is kept any more."""
        writer = self._writers.get(session_id)
        if writer is not None and writer.run_id == run_id:
            writer.start(None)

    def session_closed(self, session_id: str) -> None:
        """The daemon closed the session."""
        self._writers.pop(session_id, None)

    def forget(self, session_id: str) -> None:
        """The session cannot be opened again: its kept frames go."""
        writer = self._writers.pop(session_id, None)
        if writer is not None:
            writer.frames.clear()

    def writing(self) -> list[str]:
        """The sessions to open again after a reconnect, in the order they were opened."""
        return list(self._writers)

    def path(self, session_id: str) -> str:
        """The path of a session this client writes."""
        return self._writers[session_id].path

    # ------------------------------------------------------------ delivery

    def keep(self, session_id: str, data: bytes) -> bytes:
        """Number the record frame ``data`` as sent and keep it until acknowledged.

        Returns the frames to send: ``data``, followed by a ``sync`` that does not
        fsync when one is due (:meth:`_ask`).  The caller then waits while :meth:`full`.
        The connection raises its failure once the frame is kept (a reconnect sends it):
        the log does not ask for it on this path, every record's.
        """
        writer = self._writers.get(session_id)
        if writer is None:
            return data
        writer.sent += 1
        writer.frames.append((writer.sent, data))
        writer.size += len(data)
        if writer.size * 2 < self.max_unacked:
            return data
        return data + self._ask(session_id, writer)

    def keep_all(self, session_id: str, frames: Sequence[bytes]) -> bytes:
        """:meth:`keep` for several record frames sent at once: one ``sync`` at most,
        behind the last of them."""
        writer = self._writers.get(session_id)
        if writer is None:
            return b"".join(frames)
        for frame in frames:
            writer.sent += 1
            writer.frames.append((writer.sent, frame))
            writer.size += len(frame)
        data = b"".join(frames)
        if writer.size * 2 < self.max_unacked:
            return data
        return data + self._ask(session_id, writer)

    def _ask(self, session_id: str, writer: _Writer) -> bytes:
        """The ``sync`` (no fsync) asking the daemon to acknowledge every item sent, or
        ``b""`` when none is due.

        Past half of ``max_unacked``, one is asked for unless one is on its way.  Past
        all of it the caller is about to wait (:meth:`full`), so one is asked for
        unless one on its way covers every item sent: a wait always has the
        acknowledgement it waits for coming (the invariant of the module docstring),
        whatever the size of the frames and however many were held back and sent at
        once.
        """
        if writer.size > self.max_unacked:
            self.filled.add(session_id)
        if writer.asked >= writer.sent or (
            writer.asked > writer.acked and writer.size <= self.max_unacked
        ):
            return b""
        writer.asked = writer.sent
        request_id = self._next_id()
        self._marks[request_id] = (session_id, writer.sent, True)
        return self._encode(Sync(id=request_id, session_id=session_id, durable=False))

    def sending(self, request: Pending[Any]) -> None:
        """``request`` goes out now: note the items its reply will acknowledge."""
        writer = self._writers.get(request.session_id or "")
        if not request.acks or writer is None:
            return
        if request.kind == "checkpoint" and not request.item:  # an item of the run
            writer.sent += 1
            request.item = writer.sent
        writer.asked = writer.sent
        self._marks[request.id] = (request.session_id or "", writer.sent, False)

    @property
    def asking(self) -> bool:
        """Whether a reply on its way acknowledges items (:meth:`answered` wants it)."""
        return bool(self._marks)

    def answered(self, request_id: int) -> bool:
        """Take in the reply to ``request_id``: the items it acknowledges are dropped.
        True when nobody waits for it (a ``sync`` of :meth:`ask`'s)."""
        mark = self._marks.pop(request_id, None)
        if mark is None:
            return False
        writer = self._writers.get(mark[0])
        if writer is not None:
            writer.acknowledged(mark[1])
        return mark[2]

    def full(self, session_id: str) -> bool:
        """Whether the session's unacknowledged records pass ``max_unacked``: the
        caller that sent them waits until they do not (an acknowledgement of them is
        on its way), or the connection fails."""
        writer = self._writers.get(session_id)
        if writer is None or writer.size <= self.max_unacked:
            self.filled.discard(session_id)
            return False
        return self._failure() is None

    def unacknowledged_bytes(self) -> dict[str, int]:
        """The bytes of records sent and not acknowledged, per session path."""
        return {w.path: w.size for w in self._writers.values() if w.frames}

    def unreachable(self, path: str, grace: float, last: FlightlogError | None) -> ConnectionLost:
        """The error of a client that could not reach the daemon at ``path`` again
        within ``grace`` seconds (``last``: the last attempt's), naming what is kept."""
        lost = [
            f"{len(w.frames)} records of run {w.run_id} in {w.path}"
            for w in self._writers.values()
            if w.frames
        ]
        why = f" (last: {last.message})" if last is not None else ""
        return ConnectionLost(
            f"the daemon at {path} could not be reached again within {grace:g} s{why}; "
            + (
                "sent but never acknowledged, so the file may lack them: " + "; ".join(lost)
                if lost
                else "every record sent was acknowledged"
            ),
            code=ErrorCode.DAEMON_UNREACHABLE,
        )

    def drop(self) -> None:
        """The daemon stayed out of reach: what is kept is lost (:attr:`lost` counts it;
        the file holds a prefix of it, perhaps none)."""
        for writer in self._writers.values():
            self.lost += len(writer.frames)
            writer.frames.clear()
            writer.size = 0

    # ------------------------------------------------------------ a new connection

    def reset(self) -> None:
        """A new connection: the requests on their way went with the old one."""
        self._marks.clear()
        for writer in self._writers.values():
            writer.asked = writer.acked

    def run_of(self, session_id: str) -> str | None:
        """The run whose items the session keeps, or None."""
        return self._writers[session_id].run_id

    def reopened(self, session_id: str, opened: SessionOpened) -> bool:
        """The session is open again on a new connection: whether its run goes on.

        Drops the kept frames the file holds already; :meth:`replay` gives the rest.
        A run the file does not end with (it was closed meanwhile, or cut for good) is
        over: nothing of it is kept any more.
        """
        writer = self._writers[session_id]
        writer.last_run = opened.last_run
        writer.resumed_items = opened.last_run_items
        writer.checkpoint_seq = opened.checkpoint_seq
        if writer.run_id is None:
            return False
        if opened.last_run != writer.run_id:
            writer.start(None)
            return False
        writer.acknowledged(opened.last_run_items)
        return True

    def replay(self, session_id: str) -> bytes:
        """The kept frames of the session's run the file does not hold, to send again,
        followed by a ``sync`` (no fsync) that acknowledges them: a caller that waited
        for them on the old connection waits for it."""
        writer = self._writers[session_id]
        if not writer.frames:
            return b""
        data = b"".join(frame for _, frame in writer.frames)
        writer.asked = writer.acked  # nothing on its way yet on this connection
        return data + self._ask(session_id, writer)

    def done(self, request: Pending[Any]) -> tuple[Any] | None:
        """What a request waiting for its reply when the connection broke is found to
        have done already, after :meth:`reopened`: a checkpoint the file holds (its
        seq), a run the file closed (None); else None (it is to be sent again)."""
        writer = self._writers.get(request.session_id or "")
        if writer is None:
            return None
        if (
            request.kind == "checkpoint"
            and request.item <= writer.resumed_items
            and writer.checkpoint_seq is not None
        ):
            return (writer.checkpoint_seq,)
        if request.kind == "close" and writer.last_run != request.run_id:
            return (None,)
        return None

    def resumes(self, request: Pending[Any]) -> bool:
        """Whether a ``begin_run`` whose reply was lost started the run the file ends
        with: it is continued, not started again."""
        writer = self._writers.get(request.session_id or "")
        return (
            writer is not None
            and request.kind == "begin"
            and request.run_id is not None
            and writer.last_run == request.run_id
        )
