"""The structure of valid JSON: its bytes outside strings, read a piece at a time.

The checks of long data (nesting, numbers) look at what lies between strings.  Taking
the strings out of all of the data at once would split it at every quote, and data of
short strings holds a Python object for every few bytes: fifteen times its size.  So
:func:`outside_strings` cuts the data into pieces of at least :data:`_PIECE` bytes,
right after a quote or a comma, where no number and no escape is cut in two.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

__all__ = ["outside_strings"]

#: Bytes of data read at once, at least (until the next quote or comma).
_PIECE: Final = 1024 * 1024


def outside_strings(data: bytes) -> Iterator[bytes]:
    """The valid JSON ``data`` without its strings (each becomes a space), in pieces.

    Linear in ``data``: a few passes of C code over each piece, and a search for the
    next quote and the next comma that never goes over the same bytes twice.
    """
    size = len(data)
    start, in_string, quote, comma = 0, False, -1, -1
    while start < size:
        at = start + _PIECE
        if quote < at:
            quote = _next(data, b'"', at)
        if comma < at:
            comma = _next(data, b",", at)
        end = min(quote, comma, size - 1) + 1
        piece = data[start:end]
        if b"\\" in piece:
            # Escaped backslashes, then escaped quotes: the quotes left delimit strings.
            piece = piece.replace(b"\\\\", b"").replace(b'\\"', b"")
        parts = piece.split(b'"')
        yield b" ".join(parts[in_string::2])
        in_string ^= len(parts) % 2 == 0
        start = end


def _next(data: bytes, byte: bytes, at: int) -> int:
    found = data.find(byte, at)
    return len(data) if found < 0 else found
