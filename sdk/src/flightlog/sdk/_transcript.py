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

A fork's ``session_start`` names its origin (docs/format.md, "Forks"): read from a
path, a transcript first takes in the origin's lines 1 to ``origin.seq`` (the origin's
own origin first, and so on), then the fork's, so that a fork's requests continue its
origin's calls.  An origin that cannot be read, or is another session, raises
:class:`OriginNotFound`.

After its last top-level model call's response, the tool results recorded for the
calls it asked for (``tool_exec_end``, genuine or written by a repair) complete the
conversation; :attr:`Conversation.unpaired` names the tool calls still without one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from flightlog.protocol import SESSION_START, FlightlogError, Origin, Record

from ._files import read

__all__ = [
    "CallNotFound",
    "Conversation",
    "OriginNotFound",
    "Prompt",
    "Transcript",
    "conversation",
    "origin_of",
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


#: The code of :class:`OriginNotFound`.
ORIGIN_NOT_FOUND: Final = "origin_not_found"
#: How many forks deep a transcript follows origins: a chain longer is a loop.
_MAX_FORKS: Final = 64


class OriginNotFound(FlightlogError, LookupError):
    """A fork's origin cannot be read: its file is gone or unreadable, it is another
    session, or it holds fewer lines than the fork names.  ``origin`` is the link."""

    def __init__(self, origin: Origin, reason: str) -> None:
        super().__init__(
            f"the origin of this fork, {origin.path} (session {origin.session_id}, up to "
            f"line {origin.seq}), {reason}",
            code=ORIGIN_NOT_FOUND,
        )
        self.origin = origin


class _Start(msgspec.Struct):
    """``data`` of ``session_start``, as much as a rebuild reads."""

    origin: Origin | None = None


_decode_start: Final = msgspec.json.Decoder(_Start).decode


def origin_of(record: Record) -> Origin | None:
    """The :class:`Origin` a ``session_start`` record names, or None (not a fork, or
    not a ``session_start``, or an origin that does not read as one)."""
    if record.type != SESSION_START:
        return None
    try:
        return _decode_start(record.data).origin
    except msgspec.DecodeError:
        return None


class _ToolEnd(msgspec.Struct):
    """``data`` of a ``tool_exec_end``, or of a tool call's start, as much as a
    conversation reads."""

    execution: dict[str, Any]
    tool_call_id: str = ""
    name: str = ""
    content: Any = None
    is_error: bool = False


_decode_tool: Final = msgspec.json.Decoder(_ToolEnd).decode
_TOOL_STARTS: Final = frozenset({"tool_queued", "tool_exec_start"})


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

    ``results`` are the ``tool_result`` messages (docs/format.md, section 4.2) made of
    the ``tool_exec_end`` records that answer that response's tool calls, in the order
    it asked for them.  ``messages`` is the prompt's messages, the response, then the
    results.  ``prompt`` is None when the session has no model call.
    """

    prompt: Prompt | None
    response: Any
    results: list[Any] = field(default_factory=list)
    #: Tool calls started after the response (``(tool_call_id, name)``), for those the
    #: response does not name in flightlog's own ``tool_call`` parts.
    started: list[tuple[str, str]] = field(default_factory=list)

    @property
    def messages(self) -> list[Any]:
        if self.prompt is None:
            return []
        tail = [self.response] if self.response is not None else []
        return [*self.prompt.messages, *tail, *self.results]

    @property
    def unpaired(self) -> list[tuple[str, str]]:
        """``(tool_call_id, name)`` of each tool call of :attr:`messages` with no
        ``tool_result`` after it, in order: a history a provider refuses.  Tool calls
        are read from flightlog's own ``assistant`` messages and from the tool calls
        started after the response; messages of other shapes are not looked into."""
        calls: dict[str, str] = {}
        answered: set[str] = set()
        for message in self.messages:
            if not isinstance(message, dict):
                continue
            if message.get("$type") == "tool_result":
                answered.add(str(message.get("tool_call_id")))
            elif message.get("$type") == "assistant" and isinstance(message.get("content"), list):
                for part in message["content"]:
                    if isinstance(part, dict) and part.get("$type") == "tool_call":
                        calls.setdefault(str(part.get("id")), str(part.get("name")))
        for call_id, name in self.started:
            calls.setdefault(call_id, name)
        return [(call_id, name) for call_id, name in calls.items() if call_id not in answered]


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
        #: Tool calls started and ended since it, by tool call id (its results).
        self._started: dict[str, str] = {}
        self._results: dict[str, Any] = {}
        #: How :meth:`read` reads a session (an origin too): ``read()``, or the caller's.
        self._opener: Callable[[str], Iterable[Record]] = read

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> Transcript:
        transcript = cls()
        for record in records:
            transcript.add(record)
        return transcript

    @classmethod
    def read(
        cls,
        path: str | os.PathLike[str],
        *,
        root: str | os.PathLike[str] | None = None,
        opener: Callable[[str], Iterable[Record]] | None = None,
    ) -> Transcript:
        """The transcript of the file at ``path`` (resolved as :func:`flightlog.sdk.read`
        does), its origin's lines first when it is a fork; raises what ``read()``
        raises, and :class:`OriginNotFound`.  ``opener(path)``, when given, gives the
        records of a session instead of ``read()`` (``flightlog resume`` reads through
        the daemon a file it may not read); it raises :class:`OSError` when it cannot."""
        transcript = cls()
        if opener is not None:
            transcript._opener = opener
            records = opener(os.fspath(path))
        else:
            records = read(path, root=root)
        transcript._read(records, os.fspath(path), None, 0)
        return transcript

    def _read(
        self, records: Iterable[Record], path: str, origin: Origin | None, depth: int
    ) -> None:
        """Take in ``records``; up to ``origin.seq`` when they are an origin's."""
        last = 0
        for record in records:
            if origin is not None:
                if record.seq == 1 and record.session_id != origin.session_id:
                    raise OriginNotFound(origin, f"is session {record.session_id}")
                if record.seq > origin.seq:
                    return
            last = record.seq
            link = origin_of(record)
            if link is not None:
                self._follow(link, path, depth)
            self.add(record)
        if origin is not None and last < origin.seq:
            raise OriginNotFound(origin, f"holds only {last} lines")

    def _follow(self, origin: Origin, path: str, depth: int) -> None:
        if depth >= _MAX_FORKS:
            raise OriginNotFound(origin, f"is more than {_MAX_FORKS} forks away (a loop?)")
        where = os.path.join(os.path.dirname(os.path.abspath(path)), origin.path)
        try:
            self._read(self._opener(where), where, origin, depth + 1)
        except OSError as exc:
            raise OriginNotFound(origin, f"cannot be read: {exc.strerror or exc}") from None

    def add(self, record: Record) -> bool:
        """Take in the next record of the file; returns whether it was a model request
        (whose prompt :meth:`latest` then resolves).

        Nothing is resolved here: adding a record costs the decoding of its own data.
        """
        if record.type == "model_exec_end":
            self._response(record)
            return False
        if record.type == "tool_exec_end" or record.type in _TOOL_STARTS:
            self._tool(record)
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
            self._started, self._results = {}, {}
        return True

    def _tool(self, record: Record) -> None:
        try:
            data = _decode_tool(record.data)
        except msgspec.DecodeError:
            return
        top = self._last_top
        if not data.tool_call_id or top is None:
            return  # a call no provider id names: no message answers it
        if data.execution.get("parent_id") != top.call and data.tool_call_id not in _asked(
            top.response
        ):
            return  # a sub-agent's, or an earlier call's: not this conversation's
        if record.type != "tool_exec_end":
            self._started.setdefault(data.tool_call_id, data.name)
            return
        self._results.setdefault(
            data.tool_call_id,
            {
                "$type": "tool_result",
                "tool_call_id": data.tool_call_id,
                "name": data.name,
                "content": data.content if data.content is not None else [],
                "is_error": data.is_error,
            },
        )

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
        asked = _asked(top.response)
        order = {call_id: index for index, call_id in enumerate(asked)}
        results = sorted(
            self._results.values(), key=lambda result: order.get(result["tool_call_id"], len(asked))
        )
        return Conversation(
            prompt=self._resolve(top),
            response=top.response,
            results=results,
            started=list(self._started.items()),
        )

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


def _asked(message: Any) -> list[str]:
    """The tool call ids of a response in flightlog's own ``assistant`` shape."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return []
    return [
        str(part.get("id"))
        for part in message["content"]
        if isinstance(part, dict) and part.get("$type") == "tool_call"
    ]


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
