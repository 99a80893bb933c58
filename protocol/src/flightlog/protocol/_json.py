"""Checking the JSON that clients hand in, before any of it becomes part of a line.

The daemon never re-encodes a record's data or a checkpoint's snapshot: it splices
the client's bytes into the line.  So it must know that those bytes keep the line one
a reader accepts: valid JSON, UTF-8, no raw newline, not nested too deeply, and no
number a reader refuses (:mod:`._numbers`).  The server connection and every server
built on it apply this one check.

Nesting needs a fixed bound.  msgspec refuses JSON nested deeper than the Python
recursion limit allows *from where it is called*, so whether a reader can parse a
deep line depends on how deep the reader's own stack already is: a line the daemon
could parse in a worker thread may be refused by ``flightlog check`` called from deep
inside an application.  :data:`MAX_NESTING` is far below that limit and above anything
the codec writes (it nests at most ``MAX_DEPTH``, 200, levels).

The check takes one of two ways, with the same verdicts.  Data of at most
:data:`DECODE_IN_FULL` bytes (nearly every record) is decoded in full: one call checks
the syntax, the UTF-8 of strings and the range of numbers, the cheapest check there is
for it (docs/benchmarks.md).  But decoding builds every value, and data made of small
arrays and objects costs tens of times its size in memory and time that grows faster
than its size.  So longer data is checked in passes over its bytes instead:
a validation that skips values (``msgspec.Raw``), the UTF-8 of all of it, the nesting,
then :func:`~._numbers.check_numbers`, which reads numbers only where one may be out of
range, a piece at a time.

Before either, the C accelerator (:mod:`._accel`), when built, reads the data once
without building anything and says whether it is certainly accepted; when it is not
sure, the two ways above decide, and they alone refuse.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Final

import msgspec

from ._accel import fast_check_json
from ._errors import ErrorCode, LocalProtocolError
from ._numbers import check_numbers
from ._structure import outside_strings

__all__ = ["MAX_NESTING", "check_json", "nested_deeper_than"]

#: The deepest nesting of arrays and objects accepted in meta, data and snapshots.
MAX_NESTING: Final = 256
#: The longest data :func:`check_json` decodes in full; longer data is checked in
#: passes over its bytes.
DECODE_IN_FULL: Final = 64 * 1024

_decode = msgspec.json.decode
_validate = msgspec.json.Decoder(msgspec.Raw).decode
_NOT_BRACKETS: Final = bytes(sorted(set(range(256)) - set(b"[]{}")))
# An opening bracket becomes 1 and a closing one -1, read as signed bytes.
_STEPS: Final = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")


def nested_deeper_than(data: bytes, limit: int) -> bool:
    """Whether the valid JSON ``data`` nests arrays and objects more than ``limit`` deep.

    Linear in ``data`` whatever its depth (this runs for every record the daemon takes
    in): a fixed number of passes of C code over bytes, then one running sum over the
    brackets outside strings (:func:`~._structure.outside_strings`); no regular
    expression, no Python loop over characters.
    """
    # Each level takes two bytes, its opening and its closing bracket.
    if len(data) <= 2 * limit:
        return False
    # Brackets inside strings too: an upper bound, enough for most data.
    brackets = data.translate(None, _NOT_BRACKETS)
    if brackets.count(b"[") + brackets.count(b"{") <= limit:
        return False
    # The depth after each bracket of the structure is the running sum of the steps.
    depth = 0
    for structure in outside_strings(data):
        steps = structure.translate(_STEPS, _NOT_BRACKETS)
        if max(accumulate(memoryview(steps).cast("b"), initial=depth)) > limit:
            return True
        depth += steps.count(1) - steps.count(255)
    return False


def check_json(data: bytes, what: str, *, limit: int = MAX_NESTING) -> None:
    """Raises :class:`LocalProtocolError` (``bad_event``) unless ``data`` is one JSON
    value a reader reads back: UTF-8, on one line, nested at most ``limit`` deep, with
    numbers in range.  ``what`` names it in the error."""
    if fast_check_json is not None and fast_check_json(data, limit):
        return
    if 10 in data or 13 in data:  # b"\n", b"\r": an int is one memchr, bytes a search
        # Valid JSON may hold a raw newline as whitespace; it would split the line.
        raise LocalProtocolError(f"{what} must be JSON on one line", code=ErrorCode.BAD_EVENT)
    if len(data) > DECODE_IN_FULL:
        _check_in_passes(data, what, limit)
        return
    try:
        _decode(data)
    except msgspec.DecodeError as exc:
        # The passes say what is wrong; they let through nothing a full decode refuses.
        _check_in_passes(data, what, limit)
        raise LocalProtocolError(
            f"{what} is not JSON a reader reads back: {exc}", code=ErrorCode.BAD_EVENT
        ) from None
    except RecursionError:
        raise _too_deep(what, limit) from None
    if len(data) > 2 * limit and nested_deeper_than(data, limit):
        raise _too_deep(what, limit)


def _check_in_passes(data: bytes, what: str, limit: int) -> None:
    try:
        _validate(data)
        if not data.isascii():
            # Decoding to Raw skips over strings without checking their UTF-8.
            data.decode("utf-8")
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise LocalProtocolError(
            f"{what} is not valid UTF-8 JSON: {exc}", code=ErrorCode.BAD_EVENT
        ) from None
    except RecursionError:
        raise _too_deep(what, limit) from None
    if len(data) > 2 * limit and nested_deeper_than(data, limit):
        raise _too_deep(what, limit)
    check_numbers(data, what)  # it decodes flat arrays of numbers only: no recursion


def _too_deep(what: str, limit: int) -> LocalProtocolError:
    return LocalProtocolError(
        f"{what} nests arrays and objects more than {limit} levels deep",
        code=ErrorCode.BAD_EVENT,
    )
