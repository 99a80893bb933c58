"""Refusing numbers that no reader can read back.

JSON puts no bound on numbers, but every reader of session files does: msgspec (the
codec, the SDK's ``read``) refuses a float beyond the double range (``1e400``) and an
integer of more than 4,300 digits (Python's own limit).  A server splices a client's
JSON into the line unparsed, so it must refuse such numbers itself, or it would
acknowledge a record that reads back as an error.

Decoding the data in full says for certain, and :func:`~._json.check_json` does that
for payloads up to :data:`~._json.DECODE_IN_FULL` bytes.  Longer ones go through
:func:`check_numbers`, which decodes only data that may hold such a number.  A number
can be out of range only with an exponent of three digits or more, or with a run of at
least :data:`_LONG_RUN` digits.  One ``translate`` maps the data to a few classes of
bytes (digits, exponent marks, signs, the rest) and three substring searches find
those (usually nothing): each is a pass of C code, about as fast as copying the data.
"""

from __future__ import annotations

from typing import Final

import msgspec

from ._errors import ErrorCode, LocalProtocolError

__all__ = ["check_numbers"]

#: The shortest run of digits before a number's point that can make a float with an
#: exponent of at most two digits overflow: 10**209 * 10**99 is within the double
#: range (1.8e308), 10**210 * 10**99 is not.  Integers need far more (4,301).
_LONG_RUN: Final = 210

#: Digits become ``0``, exponent marks ``e``, signs ``+``, every other byte a space.
_CLASSES: Final = bytes(
    ord("0")
    if chr(b).isdigit() and b < 128
    else ord("e")
    if b in b"eE"
    else ord("+")
    if b in b"+-"
    else ord(" ")
    for b in range(256)
)
_LONG_EXPONENT: Final = b"e000"
_LONG_SIGNED_EXPONENT: Final = b"e+000"
_LONG_DIGITS: Final = b"0" * _LONG_RUN
_decode = msgspec.json.decode


def check_numbers(data: bytes, what: str) -> None:
    """Raises :class:`LocalProtocolError` (``bad_event``) when the valid JSON ``data``
    holds a number that readers refuse.  ``what`` names it in the error."""
    classes = data.translate(_CLASSES)
    if (
        _LONG_EXPONENT not in classes
        and _LONG_SIGNED_EXPONENT not in classes
        and _LONG_DIGITS not in classes
    ):
        return
    try:
        _decode(data)
    except msgspec.DecodeError as exc:
        raise unreadable_number(what, exc) from None


def unreadable_number(what: str, exc: msgspec.DecodeError) -> LocalProtocolError:
    """The refusal of data whose full decoding failed with ``exc`` on a number."""
    return LocalProtocolError(
        f"{what} holds a number no reader can read back: {exc}", code=ErrorCode.BAD_EVENT
    )
