"""Sound session files and the damage a disk, a crash or a hand can do to them, as
hypothesis strategies, for the tests that every reader agrees on every file."""

from __future__ import annotations

import hypothesis.strategies as st
import msgspec

from flightlog.protocol import (
    Record,
)
from flightlog.protocol.format import (
    encode_line,
)

TIME = "2026-11-29T20:00:00.000000Z"
RUN = "fedcba9876543210fedcba9876543210"
FOREIGN = "0000000000000000000000000000f0f0"

# Bytes that break a line in the ways the format names: invalid UTF-8 (a stray
# continuation byte, a cut sequence, an encoded surrogate, an overlong form), raw
# carriage returns, NUL runs, and line ends where none belong.
BAD_BYTES = [
    b"\xff",
    b"\x80",
    b"\xc3",
    b"\xe2\x9c",
    b"\xed\xa0\x80",
    b"\xc0\xaf",
    b"\r",
    b"\r\n",
    b"\x00",
    b"\x00" * 64,
    b"\n",
    b'"',
    b"}",
]


def sound_lines(session_id: str, facts: int) -> list[bytes]:
    """The lines of a sound file: session_start, run_start, ``facts`` facts, run_close."""

    def line(seq: int, type_: str, data: bytes, run_id: str | None = RUN) -> bytes:
        return encode_line(
            Record(
                session_id=session_id,
                seq=seq,
                type=type_,
                time=TIME,
                run_id=run_id,
                data=msgspec.Raw(data),
            )
        )

    lines = [
        line(1, "session_start", b'{"format_version":1,"meta":{"app":"t"}}', None),
        line(2, "run_start", b'{"pid":7,"client":"t"}'),
    ]
    for seq in range(3, facts + 3):
        text = f"caf\u00e9 \u2713 \u2028 {seq}"
        lines.append(line(seq, "message_end", msgspec.json.encode({"text": text})))
    lines.append(line(facts + 3, "run_close", b'{"error":null}'))
    return lines


def _split(content: bytes | bytearray) -> list[bytes]:
    """Lines with their ``\\n``, split at ``\\n`` only; the last may lack it."""
    pieces = bytes(content).split(b"\n")
    return [piece + b"\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])


def _retag(line: bytes, seq: int | None = None, session_id: str | None = None) -> bytes:
    try:
        record = msgspec.json.decode(line, type=Record)
    except msgspec.DecodeError:
        return line  # already damaged
    return encode_line(
        msgspec.structs.replace(
            record,
            seq=record.seq if seq is None else seq,
            session_id=record.session_id if session_id is None else session_id,
        )
    )


@st.composite
def damaged_files(draw: st.DrawFn, *, over_long: int | None = None) -> bytes:
    """A sound file with one to three kinds of damage, or none.

    With ``over_long``, a line may also be padded past that many bytes.
    """
    session_id = draw(st.binary(min_size=16, max_size=16)).hex()
    lines = sound_lines(session_id, draw(st.integers(0, 4)))
    kinds = [
        "drop",
        "repeat",
        "swap",
        "reseq",
        "foreign",
        "flip",
        "insert",
        "truncate",
        "nul_run",
        "nul_tail",
    ]
    if over_long is not None:
        kinds.append("over_long")
    for kind in draw(st.lists(st.sampled_from(kinds), max_size=3)):
        if not lines:
            break
        index = draw(st.integers(0, len(lines) - 1))
        if kind == "drop":
            del lines[index]
        elif kind == "repeat":
            lines.insert(index, lines[index])
        elif kind == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            lines[index], lines[other] = lines[other], lines[index]
        elif kind == "reseq" and lines[index].endswith(b"\n"):
            lines[index] = _retag(lines[index], seq=draw(st.integers(0, 9)))
        elif kind == "foreign" and lines[index].endswith(b"\n"):
            lines[index] = _retag(lines[index], session_id=FOREIGN)
        elif kind == "over_long" and over_long is not None and lines[index].endswith(b"\n"):
            # Padding inside the data object keeps the record valid but too long.
            padding = b" " * (over_long - len(lines[index]) + draw(st.integers(2, 4)))
            lines[index] = lines[index][:-2] + padding + b"}\n"
        else:
            content = bytearray(b"".join(lines))
            position = draw(st.integers(0, len(content)))
            if kind == "flip" and position < len(content):
                content[position] ^= draw(st.integers(1, 255))
            elif kind == "insert":
                content[position:position] = draw(st.sampled_from(BAD_BYTES))
            elif kind == "truncate":
                del content[position:]
            elif kind == "nul_run":
                size = draw(st.integers(1, 80))
                content[position : position + size] = bytes(min(size, len(content) - position))
            elif kind == "nul_tail":
                content += bytes(draw(st.integers(1, 300)))
            lines = _split(content)
    return b"".join(lines)
