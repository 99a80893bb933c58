"""``find(text=REGEX)``: a regular expression over what the records say.

Theory of operation
-------------------
A record's *texts* are the string values, as a reader decodes them (escapes undone), at
any depth of the members of its ``data`` that hold what was said (:data:`CONTENT`:
messages, a tool's arguments and result, an error, an output, a summary, a checkpoint's
snapshot), but for ``$type`` tags; and the ``text`` (or ``thinking``) parts of one
content list are joined into one text, in order, as a person reads the message, so a
match that a framework split across two parts is found.  The pattern is matched in each
text (:func:`texts`); a record matches when it matches in one of them.

Decoding every line would cost far more than grep, so the byte prefilter of ``find``
(its theory of operation) does most of the work.  From the pattern, :func:`byte_test`
takes a *literal* every match must contain (the longest run of plain characters at the
top level of the pattern) and spells it as the writer spells a JSON string (msgspec:
raw UTF-8, ``\\"``, ``\\\\``, ``\\n`` and the other short escapes, ``\\u00XX`` for other
control characters).  A line that holds no such bytes cannot match, unless:

* it has a ``\\u`` or ``\\/`` escape (another writer's spelling): ``find`` always
  decodes those lines;
* it joins parts: a literal may run from one text part into the next, so every line
  where a text or thinking part follows another part (:data:`JOINED_PARTS`) is decoded.

A pattern with no literal at its top level (``\\d+``, ``a|b``) has no byte test: every
line is decoded, which is correct and slower.  With ``re.IGNORECASE`` the literal is
tested without case when it is ASCII, and not at all otherwise (bytes patterns fold
ASCII only); its ``i``, ``k`` and ``s`` also match, as a Unicode pattern's do, the
UTF-8 of U+0130 and U+0131 (dotted and dotless i), U+212A (Kelvin) and U+017F (long
s) (:data:`_UNICODE_FOLDS`).
"""

from __future__ import annotations

import re
import re._constants as sre_constants  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
from typing import Any, Final

import msgspec

__all__ = ["CONTENT", "JOINED_PARTS", "byte_test", "first_match", "snippet", "texts"]

#: A text or thinking part that follows another part of a content list, as written.
JOINED_PARTS: Final = re.compile(rb'\},\s*\{\s*"\$type"\s*:\s*"(?:text|thinking)"')
#: The members of a record's ``data`` that are searched.
CONTENT: Final = (
    "messages",
    "message",
    "system",
    "content",
    "arguments",
    "details",
    "output",
    "summary",
    "error",
    "reason",
    "snapshot",
)
#: The members that hold a part's text, by the part's ``$type``.
_PART_TEXT: Final = {"text": "text", "thinking": "thinking"}
_CONTEXT: Final = 40
#: The characters outside ASCII that an ASCII letter matches without case in a Unicode
#: pattern (none but these: tests/cli/test_find_text.py checks every code point).
_UNICODE_FOLDS: Final = {"i": "\u0130\u0131", "k": "\u212a", "s": "\u017f"}


def _literal(pattern: re.Pattern[str]) -> str:
    """The longest run of plain characters at the top level of ``pattern``."""
    best = run = ""
    for op, value in sre_parse.parse(pattern.pattern, pattern.flags):
        if op is sre_constants.LITERAL:
            run += chr(value)
            continue
        best = max(best, run, key=len)
        run = ""
    return max(best, run, key=len)


def byte_test(pattern: re.Pattern[str]) -> bytes | re.Pattern[bytes] | None:
    """What every line that can match ``pattern`` holds (bar the exceptions of the
    theory of operation): the bytes of its literal as written, a pattern of them without
    case, or None when it has no literal to look for."""
    literal = _literal(pattern)
    if not literal:
        return None
    written = msgspec.json.encode(literal)[1:-1]
    if not pattern.flags & re.IGNORECASE:
        return written
    if not literal.isascii():
        return None
    if pattern.flags & re.ASCII:
        return re.compile(re.escape(written), re.IGNORECASE)
    pieces = []
    for char in literal:
        piece = re.escape(msgspec.json.encode(char)[1:-1])
        folds = _UNICODE_FOLDS.get(char.lower(), "")
        if folds:
            piece = b"(?:" + b"|".join([piece, *(re.escape(f.encode()) for f in folds)]) + b")"
        pieces.append(piece)
    return re.compile(b"".join(pieces), re.IGNORECASE)


def texts(data: Any) -> list[str]:
    """The texts of a record's decoded ``data``, as the theory of operation says, in
    order (a list: gathered in one walk, without a generator per level)."""
    found: list[str] = []
    if isinstance(data, dict):
        for member in CONTENT:
            if member in data:
                _gather(data[member], found)
    return found


def _gather(value: Any, found: list[str]) -> None:
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key != "$type":
                _gather(item, found)
    elif isinstance(value, list):
        joined: list[str] = []
        for item in value:
            kind = item.get("$type") if isinstance(item, dict) else None
            member = _PART_TEXT.get(kind) if isinstance(kind, str) else None
            text = item.get(member) if member is not None else None
            if isinstance(text, str):
                joined.append(text)
                for key, rest in item.items():
                    if key not in (member, "$type"):
                        _gather(rest, found)
            else:
                _gather(item, found)
        if joined:
            found.append("".join(joined))


def first_match(pattern: re.Pattern[str], data: Any) -> tuple[str, re.Match[str], int] | None:
    """The first text of ``data`` that ``pattern`` matches, the match, and how many
    texts match in all; None when none does."""
    first: tuple[str, re.Match[str]] | None = None
    count = 0
    for text in texts(data):
        match = pattern.search(text)
        if match is not None:
            count += 1
            if first is None:
                first = (text, match)
    return None if first is None else (first[0], first[1], count)


def snippet(text: str, match: re.Match[str]) -> str:
    """The match with up to 40 characters on each side, on one line (control characters
    escaped), ``…`` where the text goes on."""
    start, end = max(0, match.start() - _CONTEXT), min(len(text), match.end() + _CONTEXT)
    piece = text[start:end]
    escaped = (
        piece
        if piece.isprintable()
        else "".join(
            ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in piece
        )
    )
    return ("…" if start else "") + escaped + ("…" if end < len(text) else "")
