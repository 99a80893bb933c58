"""Refusing numbers that no reader can read back.

JSON puts no bound on numbers, but every reader of session files does: msgspec (the
codec, the SDK's ``read``) refuses a float beyond the double range (``1e400``) and an
integer of more than 4,300 digits (Python's own limit).  A server splices a client's
JSON into the line unparsed, so it must refuse such numbers itself, or it would
acknowledge a record that reads back as an error.

A number can be out of range only with an exponent of three digits or more, or with a
run of at least :data:`_LONG_RUN` digits.  One ``translate`` maps the data to a few
classes of bytes (digits, exponent marks, signs, the rest) and a substring search or
three find those (usually nothing): each is a pass of C code, about as fast as copying
the data.  Only then is the data decoded in full, which says for certain.
"""

from __future__ import annotations

from typing import Final

import msgspec

from ._errors import ErrorCode, LocalProtocolError

__all__ = ["check_numbers"]

#: The shortest run of digits that can make a float overflow (10**309 > the double
#: range); integers need far more (4,301).
_LONG_RUN: Final = 309

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
_SUSPECTS: Final = (b"e000", b"e+000", b"0" * _LONG_RUN)
_decode = msgspec.json.decode


def check_numbers(data: bytes, what: str) -> None:
    """Raises :class:`LocalProtocolError` (``bad_event``) when the valid JSON ``data``
    holds a number that readers refuse.  ``what`` names it in the error."""
    classes = data.translate(_CLASSES)
    if not any(suspect in classes for suspect in _SUSPECTS):
        return
    try:
        _decode(data)
    except msgspec.DecodeError as exc:
        raise LocalProtocolError(
            f"{what} holds a number no reader can read back: {exc}", code=ErrorCode.BAD_EVENT
        ) from None
