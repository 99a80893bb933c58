"""Refusing numbers that no reader can read back.

JSON puts no bound on numbers, but every reader of session files does: msgspec (the
codec, the SDK's ``read``) refuses a float beyond the double range (``1e400``) and an
integer of more than 4,300 digits (Python's own limit).  A server splices a client's
JSON into the line unparsed, so it must refuse such numbers itself, or it would
acknowledge a record that reads back as an error.

Decoding the data in full says for certain, and :func:`~._json.check_json` does that
for short data.  Longer data goes through :func:`check_numbers`, which never decodes
the data itself: decoding builds every array and object, tens of times the data's size
in memory, in one call that holds the interpreter for seconds on 16 MiB of small ones.

A number can be out of range only with an exponent of three digits or more, or with a
run of at least :data:`_LONG_RUN` digits.  One ``translate`` maps the data to a few
classes of bytes (digits, exponent marks, signs, the rest) and three substring searches
find those (usually nothing): each is a pass of C code, about as fast as copying the
data.  When they find one, the numbers are read: in each piece of the data outside its
strings (:func:`~._structure.outside_strings`), its numbers (and ``true``, ``false``,
``null``) decoded as one flat array.
"""

from __future__ import annotations

from typing import Final

import msgspec

from ._errors import ErrorCode, LocalProtocolError
from ._structure import outside_strings

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
#: Outside strings, what separates numbers and literals becomes a space.
_SEPARATORS: Final = bytes.maketrans(b"[]{}:,\t", b"       ")
_decode = msgspec.json.decode


def check_numbers(data: bytes, what: str) -> None:
    """Raises :class:`LocalProtocolError` (``bad_event``) when the valid JSON ``data``
    holds a number that readers refuse, naming the first one.  ``what`` names the data
    in the error.  Linear in ``data``; what it holds beyond the data is a few times a
    piece of :func:`~._structure.outside_strings`."""
    if not _may_be_out_of_range(data):
        return
    for structure in outside_strings(data):
        if not _may_be_out_of_range(structure):
            continue
        scalars = structure.translate(_SEPARATORS).split()
        try:
            _decode(_flat_array(scalars))
        except msgspec.DecodeError as exc:
            raise _first_unreadable(scalars, what, exc) from None


def _may_be_out_of_range(data: bytes) -> bool:
    classes = data.translate(_CLASSES)
    return _LONG_EXPONENT in classes or _LONG_SIGNED_EXPONENT in classes or _LONG_DIGITS in classes


def _flat_array(scalars: list[bytes]) -> bytes:
    return b"[" + b",".join(scalars) + b"]"


def _first_unreadable(
    scalars: list[bytes], what: str, exc: msgspec.DecodeError
) -> LocalProtocolError:
    """The refusal naming the first of ``scalars`` that does not decode (their flat
    array did not, with ``exc``): found by halving, which decodes them about once more."""
    low, high = 0, len(scalars)
    while high - low > 1:
        middle = (low + high) // 2
        try:
            _decode(_flat_array(scalars[low:middle]))
        except msgspec.DecodeError:
            high = middle
        else:
            low = middle
    number = scalars[low]
    try:
        _decode(number)
    except msgspec.DecodeError as alone:
        exc = alone
    return _unreadable_number(what, number, exc)


def _unreadable_number(what: str, number: bytes, exc: msgspec.DecodeError) -> LocalProtocolError:
    """The refusal of data that holds ``number``, which decoding refused with ``exc``."""
    shown = number.decode("ascii")
    if len(shown) > 40:
        shown = f"{shown[:20]}... ({len(shown):,} characters)"
    return LocalProtocolError(
        f"{what} holds a number no reader can read back, {shown}: {exc}",
        code=ErrorCode.BAD_EVENT,
    )
