"""Rebuilding what each model call was sent, from a session file, without the daemon.

Theory of operation
-------------------
A ``model_request`` may be written as a continuation: ``continues`` names an earlier
model call, and ``messages`` holds only what was sent after that call's messages
(docs/format.md, "Rebuilding a prompt").  A :class:`Transcript` reads records in file
order and keeps one node per ``model_request``: its own new messages and a link to the
node it continues, taken when the record is read (the latest ``model_request`` before it
with that execution id, in any run of the file).  The nodes form a persistent chain: a
thousand-step run holds each message once, and a prompt is resolved on demand by
walking its chain and joining the pieces, in time and memory linear in the prompt.

A request whose ``continues`` names a call the file does not hold before it (a dropped
record, a file cut at its head) is kept as broken: asking for its prompt, or for that of
any call continuing it, raises :class:`CallNotFound` naming the missing call and the
line that names it, never a partial prompt.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from flightlog.protocol import FlightlogError, Record

from ._files import read

__all__ = [
    "CallNotFound",
    "Conversation",
    "Prompt",
    "Transcript",
    "conversation",
    "prompt",
]

#: The code of :class:`CallNotFound`.
CALL_NOT_FOUND: Final = "call_not_found"


class CallNotFound(FlightlogError, LookupError):
    """A model call the file does not hold.

    ``call`` is the execution id that is missing.  ``line`` is the line (seq) of the
    ``model_request`` whose ``continues`` names it, so that the prompt of that request
    cannot be rebuilt; None when the caller asked for a call the file has no request of.
    """

    def __init__(
        self,
        call: str,
        line: int | None = None,
        *,
        wanted: str | None = None,
        response: bool = False,
        stub: bool = False,
    ) -> None:
        if line is None:
            message = f"no model_request of call {call!r} in the file"
        elif stub:
            message = (
                f"line {line}: the model_request of call {call!r} was too large to record "
                "and is a stub without its messages; its prompt cannot be rebuilt"
            )
        elif response:
            message = (
                f"line {line}: model_request continues call {call!r} with its response, "
                "which no model_exec_end of the file holds before it (a record dropped "
                "or cut); its prompt cannot be rebuilt"
            )
        else:
            message = (
                f"line {line}: model_request continues call {call!r}, which no earlier "
                "model_request of the file holds (a record dropped or cut); its prompt "
                "cannot be rebuilt"
            )
        if line is not None and wanted is not None and wanted != call:
            message += f" (nor that of call {wanted!r}, which continues it)"
        super().__init__(message, code=CALL_NOT_FOUND)
        self.call = call
        self.line = line


class _Request(msgspec.Struct, kw_only=True):
    """``data`` of a ``model_request``, as much as a rebuild reads."""

    execution: dict[str, Any]
    messages: list[Any] = []
    tools: list[Any] = []
    config: Any = None
    system: str | None = None
    headers: dict[str, Any] = {}
    continues: str | None = None
    with_response: bool = False
    #: ``oversized`` when the request is a stub (docs/format.md, section 7).
    marker: str | None = msgspec.field(default=None, name="$flightlog")


class _End(msgspec.Struct):
    """``data`` of a ``model_exec_end``, as much as a rebuild reads."""

    execution: dict[str, Any]
    message: Any = None


_decode_request: Final = msgspec.json.Decoder(_Request).decode
_decode_end: Final = msgspec.json.Decoder(_End).decode


class _Node:
    """One ``model_request`` read: its own messages, and the node it continues."""

    __slots__ = ("answered", "data", "line", "parent", "response", "run_id")

    def __init__(self, data: _Request, line: int, run_id: str | None, parent: _Node | None) -> None:
        self.data = data
        self.line = line
        self.run_id = run_id
        self.parent = parent
        #: Whether its call's ``model_exec_end`` was read, and its message.
        self.answered = False
        self.response: Any = None

    @property
    def call(self) -> str:
        return str(self.data.execution.get("id"))

    @property
    def attempt(self) -> int:
        attempt = self.data.execution.get("attempt", 1)
        return attempt if isinstance(attempt, int) else 1


@dataclass(frozen=True)
class Prompt:
    """Everything one model call was sent, rebuilt.

    ``messages`` is the full message list in the order sent, each message as recorded
    (plain JSON values: ``{"$type": "user", ...}`` for flightlog's own message types).
    ``system`` is the system prompt: the request's own, or, when it continues a call and
    has none, that call's.  ``tools``, ``config`` and ``headers`` are the request's own
    (every request records them whole).  ``call``, ``attempt``, ``agent``, ``run_id``
    and ``line`` (its seq) say which ``model_request`` it is; ``continues`` is that
    record's own field.  Treat the lists as read-only: prompts of one chain share their
    messages.
    """

    call: str
    attempt: int
    run_id: str | None
    line: int
    agent: str | None
    messages: list[Any]
    system: str | None
    tools: list[Any]
    config: Any
    headers: dict[str, Any]
    continues: str | None

    def to_builtins(self) -> dict[str, Any]:
        """The prompt as plain JSON values (what ``flightlog show --prompt --json`` prints)."""
        return {
            "call": self.call,
            "attempt": self.attempt,
            "run_id": self.run_id,
            "line": self.line,
            "agent": self.agent,
            "system": self.system,
            "messages": self.messages,
            "tools": self.tools,
            "config": self.config,
            "headers": self.headers,
        }


@dataclass(frozen=True)
class Conversation:
    """A session's conversation: the prompt of its last top-level model call, and the
    message that call got back (its ``model_exec_end`` message; None when it has none).

    ``messages`` is that prompt's messages followed by the response.  ``prompt`` is None
    when the session has no model call.
    """

    prompt: Prompt | None
    response: Any

    @property
    def messages(self) -> list[Any]:
        if self.prompt is None:
            return []
        tail = [self.response] if self.response is not None else []
        return [*self.prompt.messages, *tail]


class Transcript:
    """The model requests of one session file, each one's prompt rebuilt on demand.

    Feed it records in file order with :meth:`add` (or build it with
    :meth:`from_records` / :meth:`read`); records of other types are skipped, except
    ``model_exec_end``, whose message is kept for :meth:`conversation`.  A
    ``model_request`` whose data does not read as one is skipped: a request continuing it
    is then broken (:class:`CallNotFound`).
    """

    def __init__(self) -> None:
        self._nodes: list[_Node] = []
        #: The latest request of each execution id: what a ``continues`` resolves to.
        self._latest: dict[str, _Node] = {}
        #: The latest top-level request: the conversation's last call.
        self._last_top: _Node | None = None

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> Transcript:
        transcript = cls()
        for record in records:
            transcript.add(record)
        return transcript

    @classmethod
    def read(
        cls, path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
    ) -> Transcript:
        """The transcript of the file at ``path`` (resolved as :func:`flightlog.sdk.read`
        does); raises what ``read()`` raises."""
        return cls.from_records(read(path, root=root))

    def add(self, record: Record) -> bool:
        """Take in the next record of the file; returns whether it was a model request
        (whose prompt :meth:`latest` then resolves).

        Nothing is resolved here: adding a record costs the decoding of its own data.
        """
        if record.type == "model_exec_end":
            self._response(record)
            return False
        if record.type != "model_request":
            return False
        try:
            data = _decode_request(record.data)
        except msgspec.DecodeError:
            return False
        parent = self._latest.get(data.continues) if data.continues is not None else None
        node = _Node(data, record.seq, record.run_id, parent)
        self._nodes.append(node)
        self._latest[node.call] = node
        if data.execution.get("parent_id") is None:
            self._last_top = node
        return True

    def latest(self) -> Prompt:
        """The prompt of the latest model request added; raises :class:`CallNotFound`
        when its chain is broken, :class:`LookupError` when none was added."""
        if not self._nodes:
            raise LookupError("no model_request added")
        return self._resolve(self._nodes[-1])

    def _response(self, record: Record) -> None:
        try:
            data = _decode_end(record.data)
        except msgspec.DecodeError:
            return
        node = self._latest.get(str(data.execution.get("id")))
        if (
            node is not None
            and node.run_id == record.run_id
            and node.attempt == data.execution.get("attempt", 1)
        ):
            node.answered, node.response = True, data.message

    def calls(self) -> Iterator[tuple[str, int, str | None]]:
        """``(call, attempt, run_id)`` of every model request, in file order."""
        for node in self._nodes:
            yield node.call, node.attempt, node.run_id

    def prompts(
        self, call: str | None = None, *, attempt: int | None = None, run: str | None = None
    ) -> Iterator[Prompt]:
        """The prompts of every model request, in file order; ``call`` (an execution
        id), ``attempt`` and ``run`` (a run id or a prefix of one) narrow them down.

        Raises :class:`CallNotFound` at the first request whose chain is broken.
        """
        for node in self._nodes:
            if _matches(node, call, attempt, run):
                yield self._resolve(node)

    def prompt(self, call: str, *, attempt: int | None = None, run: str | None = None) -> Prompt:
        """The prompt of model call ``call`` (an execution id).

        ``attempt`` picks one attempt, ``run`` a run (its id or a prefix of it); without
        them the latest matching request of the file is taken.  Raises
        :class:`CallNotFound` when the file has no such request (``line`` None), or when
        its chain is broken (``line`` names the request that continues a missing call).
        """
        for node in reversed(self._nodes):
            if _matches(node, call, attempt, run):
                return self._resolve(node)
        raise CallNotFound(call)

    def conversation(self) -> Conversation:
        """The session's conversation: the prompt of its last top-level model call (one
        with no ``execution.parent_id``, so not a sub-agent's) and its response."""
        top = self._last_top
        if top is None:
            return Conversation(prompt=None, response=None)
        return Conversation(prompt=self._resolve(top), response=top.response)

    def _resolve(self, node: _Node) -> Prompt:
        chain: list[_Node] = []
        walk: _Node | None = node
        while walk is not None:
            chain.append(walk)
            if walk.data.marker == "oversized":
                raise CallNotFound(walk.call, walk.line, wanted=node.call, stub=True)
            continues = walk.data.continues
            if continues is None:
                break
            if walk.parent is None:
                raise CallNotFound(continues, walk.line, wanted=node.call)
            walk = walk.parent
        messages: list[Any] = []
        system = None
        for link in reversed(chain):
            if link.data.with_response and link.parent is not None:
                if not link.parent.answered:
                    raise CallNotFound(link.parent.call, link.line, wanted=node.call, response=True)
                messages.append(link.parent.response)
            messages.extend(link.data.messages)
            if link.data.system is not None:
                system = link.data.system
        data = node.data
        agent = data.execution.get("agent")
        return Prompt(
            call=node.call,
            attempt=node.attempt,
            run_id=node.run_id,
            line=node.line,
            agent=agent if isinstance(agent, str) else None,
            messages=messages,
            system=system,
            tools=data.tools,
            config=data.config,
            headers=data.headers,
            continues=data.continues,
        )


def _matches(node: _Node, call: str | None, attempt: int | None, run: str | None) -> bool:
    return (
        (call is None or node.call == call)
        and (attempt is None or node.attempt == attempt)
        and (run is None or (node.run_id or "").startswith(run))
    )


def _transcript(source: str | os.PathLike[str] | Iterable[Record]) -> Transcript:
    if isinstance(source, str | os.PathLike):
        return Transcript.read(source)
    return Transcript.from_records(source)


def prompt(
    source: str | os.PathLike[str] | Iterable[Record],
    call: str,
    *,
    attempt: int | None = None,
    run: str | None = None,
) -> Prompt:
    """The full request model call ``call`` was sent: ``source`` is a session file's
    path (resolved as :func:`flightlog.sdk.read` does) or its records in file order.

    See :meth:`Transcript.prompt`; raises :class:`CallNotFound`, and what ``read()``
    raises.
    """
    return _transcript(source).prompt(call, attempt=attempt, run=run)


def conversation(source: str | os.PathLike[str] | Iterable[Record]) -> Conversation:
    """The conversation of a session (see :meth:`Transcript.conversation`); raises
    :class:`CallNotFound` when its last call's chain is broken, and what ``read()``
    raises."""
    return _transcript(source).conversation()
