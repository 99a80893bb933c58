"""What ``find`` looks for (:class:`Query`): its filters, the tests on a line's bytes
that a matching line passes (step 2 of the theory of operation in :mod:`._find`) and
the exact match on a decoded record (step 3), reading of its ``data`` only the members
a filter reads (:class:`_Data`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import msgspec

from flightlog.protocol import Record, format_time, parse_time

from ._match import (
    FAILURE_PATTERNS,
    NAMES_MODEL,
    Lineage,
    between,
    failed,
    instant_text,
    meta_matches,
    models,
    record_data,
)
from ._prefilter import ESCAPE
from ._text import JOINED_PARTS, byte_test, first_match

__all__ = ["Query"]

#: A line that names ``agent_start`` or ``agent_end``: decoded for ``agent`` whatever
#: the tests say, so that :class:`Lineage` sees every agent begin and end.
_AGENT_BOUNDS: Final = re.compile(rb'"agent_(?:start|end)"')
#: A time in the writer's form, as the rest of a ``"time"`` member.  Its digits are
#: not checked (quicker): a time with other characters there is no time at all.
_WRITER_TIME: Final = rb':".{10}T.{8}(?:\.\d{1,9})?Z"'
#: The same, as a string: its seconds and its fraction.
_WRITER_TIME_TEXT: Final = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z", re.ASCII
)
#: No line holds it: the test of a question no record can answer.
_NOTHING: Final = re.compile(rb"(?!)")


class _HasModel(msgspec.Struct):
    model: Any = None


class _Execution(msgspec.Struct):
    id: Any = None
    parent_id: Any = None
    agent: Any = None


class _Data(msgspec.Struct):
    """The members of a record's ``data`` that the filters read, each with the value
    ``dict.get`` gives when it is missing (or the one that means the same): decoding
    only these skips the rest of ``data`` without building it."""

    name: Any = None
    model: Any = None
    config: _HasModel | None = None
    message: _HasModel | None = None
    error: Any = None
    is_error: Any = None
    disposition: Any = "ran"
    ok: Any = True
    execution: _Execution | None = None
    agent: Any = None
    parent_id: Any = None

    def plain(self) -> dict[str, Any]:
        """As the plain JSON values :meth:`Query.matches` reads."""
        config, message, execution = self.config, self.message, self.execution
        return {
            "name": self.name,
            "model": self.model,
            "config": None if config is None else {"model": config.model},
            "message": None if message is None else {"model": message.model},
            "error": self.error,
            "is_error": self.is_error,
            "disposition": self.disposition,
            "ok": self.ok,
            "execution": None
            if execution is None
            else {"id": execution.id, "parent_id": execution.parent_id, "agent": execution.agent},
            "agent": self.agent,
            "parent_id": self.parent_id,
        }


_data_decoder: Final = msgspec.json.Decoder(_Data)


@dataclass
class Query:
    """What ``find`` looks for; every filter that is set must match.

    ``meta`` and ``data`` map a member's path (``key`` or ``key.sub.0``) to the text its
    value must have (a string as it is, another value as its JSON); ``agent`` is the
    author of a record, ``under`` a call's execution id (the call and all nested in it,
    in each run); ``tree`` a session id (that session and the sessions below it: its
    sub-agents' by ``parent_session`` in their meta, its forks by the ``origin`` of
    their ``session_start`` or ``forked_from`` in their meta), ``fork_of`` one whose
    forks (and theirs) are wanted.
    """

    types: frozenset[str] | None = None
    tool: str | None = None
    model: str | None = None
    error: bool | None = None
    since: datetime | None = None
    until: datetime | None = None
    meta: dict[str, str | None] = field(default_factory=dict)
    run: str | None = None
    text: re.Pattern[str] | None = None
    agent: str | None = None
    under: str | None = None
    data: dict[str, str | None] = field(default_factory=dict)
    tree: str | None = None
    fork_of: str | None = None

    def __post_init__(self) -> None:
        self._since = None if self.since is None else instant_text(format_time(self.since))
        self._until = None if self.until is None else instant_text(format_time(self.until))
        self._second = ""  # the seconds of the last record time known to be valid
        self._lineage: Lineage | None = None
        self._follows = self.agent is not None or self.under is not None
        # The last record the text matched, and its match (:meth:`text_match`).
        self._matched: tuple[Record, tuple[str, re.Match[str], int]] | None = None

    def tests(self) -> list[bytes | re.Pattern[bytes]]:
        """What every matching line holds, unless it has a ``\\u`` or ``\\/`` escape: a
        string (its bytes), or a match of a pattern; the most selective first."""
        if self.under is not None:
            return []  # every line can put a call under it (theory of operation)
        tests: list[bytes | re.Pattern[bytes]] = []
        if self.text is not None and (literal := byte_test(self.text)) is not None:
            tests.append(literal)
        for value in (self.tool, self.model):
            if value is not None:
                tests.append(msgspec.json.encode(value))
        if self.run is not None:
            tests.append(msgspec.json.encode(self.run)[:-1])  # without the closing quote
        if self.types is not None and len(self.types) == 1:
            # The type itself: quicker to look for, and rarely anywhere else.
            tests.append(msgspec.json.encode(next(iter(self.types))))
        elif (types := self._type_pattern()) is not None:
            tests.append(types)
        if self.since is not None or self.until is not None:
            tests.append(self._time_pattern())
        if self.error:
            tests.append(self._failure_pattern())
        for path, value in self.data.items():
            key = path.rpartition(".")[2]
            if value is not None and not key.isdigit():
                # The end of the member's key as written (of a nested key, or of a key
                # that holds the dots), without its opening quote.
                tests.append(msgspec.json.encode(key)[1:])
        return tests

    def always(self) -> tuple[re.Pattern[bytes], ...]:
        """Lines decoded whatever :meth:`tests` says (theory of operation)."""
        always = [ESCAPE]
        if self.text is not None:
            always.append(JOINED_PARTS)
        if self.agent is not None:
            always.append(_AGENT_BOUNDS)
        return tuple(always)

    def _type_pattern(self) -> re.Pattern[bytes] | None:
        """A ``"type"`` member whose value is a type that can match, or is spelled so
        that another pattern would not tell (whitespace); None when every type can."""
        if self.types is not None:
            allowed = sorted(type for type in self.types if self.type_can_match(type))
        elif self.model is not None or self.error:
            possible = NAMES_MODEL if self.model is not None else FAILURE_PATTERNS.keys()
            allowed = sorted(type for type in possible if self.type_can_match(type))
        elif self.tool is not None:
            return re.compile(rb'"type"(?!:"(?!tool_))')
        else:
            return None
        if not allowed:
            return _NOTHING
        values = b"|".join(re.escape(msgspec.json.encode(type)[1:]) for type in allowed)
        return re.compile(b'"type"(?!:"(?!(?:' + values + b")))")

    def _time_pattern(self) -> re.Pattern[bytes]:
        """A ``"time"`` member whose value is, by its second, inside [since, until], or
        is not in the writer's form (any other, or whitespace, lets the line through)."""

        def second(moment: datetime | None) -> str | None:
            return None if moment is None else format_time(moment)[:19]

        inside = between(second(self.since), second(self.until)).encode()
        return re.compile(b'"time"(?::"(?:' + inside + b")|(?!" + _WRITER_TIME + b"))")

    def _failure_pattern(self) -> re.Pattern[bytes]:
        """What a line that reports a failure holds, for ``--error``."""
        wanted = sorted(self.types if self.types is not None else FAILURE_PATTERNS)
        found: list[bytes] = []
        for type in wanted:
            for pattern in FAILURE_PATTERNS.get(type, ()):
                if pattern not in found:
                    found.append(pattern)
        return re.compile(b"|".join(found)) if found else _NOTHING

    def matches_meta(self, meta: dict[str, Any]) -> bool:
        return meta_matches(meta, self.meta)

    def begin_file(self) -> None:
        """Forget what the last file's runs said (:class:`Lineage`)."""
        self._lineage = Lineage(self.under) if self._follows else None

    def matches(self, record: Record) -> bool:
        """The exact test, on a decoded record (fed in file order)."""
        if not self._matches(record):
            return False
        if self.text is None:
            return True
        found = first_match(self.text, record_data(record))
        self._matched = None if found is None else (record, found)
        return found is not None

    def text_match(self, record: Record) -> tuple[str, re.Match[str], int] | None:
        """The text's first match in ``record`` and how many texts match, when ``record``
        is the last one :meth:`matches` accepted (so it is not decoded twice); else None."""
        matched = self._matched
        return matched[1] if matched is not None and matched[0] is record else None

    def _matches(self, record: Record) -> bool:
        if (
            self.tool is None
            and self.model is None
            and self.error is None
            and not self.data
            and not self._follows
        ):
            return self._accepts(record.type, record.time, record.run_id, {})
        data = record_data(record) if self.data else self._data(record)
        if self._lineage is not None:
            agent, under = self._lineage.follow(record.type, record.run_id, data)
            if self.agent is not None and agent != self.agent:
                return False
            if self.under is not None and not under:
                return False
        if self.data and not meta_matches(data, self.data):
            return False
        return self._accepts(record.type, record.time, record.run_id, data)

    @staticmethod
    def _data(record: Record) -> dict[str, Any]:
        try:
            return _data_decoder.decode(record.data).plain()
        except (msgspec.DecodeError, UnicodeDecodeError, ValueError, RecursionError):
            return record_data(record)  # a member of another shape: as plain JSON

    def _accepts(self, type: str, time: str, run_id: str | None, data: dict[str, Any]) -> bool:
        if not self.type_can_match(type):
            return False
        if self.run is not None and not (run_id or "").startswith(self.run):
            return False
        if (self.since is not None or self.until is not None) and not self._in_time(time):
            return False
        if self.tool is not None and data.get("name") != self.tool:
            return False
        if self.model is not None and self.model not in models(data):
            return False
        return self.error is None or failed(type, data) == self.error

    def type_can_match(self, type: str) -> bool:
        """Whether a record of ``type`` can match, before its data is looked at."""
        if self.types is not None and type not in self.types:
            return False
        if self.tool is not None and not type.startswith("tool_"):
            return False
        if self.model is not None and type not in NAMES_MODEL:
            return False
        return not self.error or type in FAILURE_PATTERNS

    def _in_time(self, time: str) -> bool:
        instant = self._instant(time)
        if instant is None:
            try:
                instant = instant_text(format_time(parse_time(time)))
            except ValueError:
                return False
        if self._since is not None and instant < self._since:
            return False
        return self._until is None or instant < self._until

    def _instant(self, time: str) -> str | None:
        """A time in the writer's form as text that sorts as the moment
        :func:`~flightlog.protocol.parse_time` reads (its seconds, then the first six
        digits of its fraction); None for another form, or seconds that are no date."""
        match = _WRITER_TIME_TEXT.fullmatch(time)
        if match is None:
            return None
        second, fraction = match.groups()
        if second != self._second:
            try:
                datetime.fromisoformat(second)
            except ValueError:
                return None
            self._second = second
        return second + ((fraction or "") + "000000")[:6]
