"""Length-prefixed MessagePack frames, sans I/O.

A frame is a 4-byte big-endian length followed by that many bytes of one MessagePack
encoded wire message.  :class:`FrameDecoder` is fed bytes as they arrive and hands out
messages; :func:`encode_frame` and :class:`FrameEncoder` turn messages into frames.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, Final, Generic, TypeVar

import msgspec

from ._accel import encode_record
from ._errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from ._wire import DEFAULT_MAX_FRAME_SIZE, ClientMessage, Message, RecordEvent, ServerMessage

__all__ = [
    "HEADER_SIZE",
    "FrameDecoder",
    "FrameEncoder",
    "client_decoder",
    "encode_frame",
    "server_decoder",
]

HEADER_SIZE: Final = 4
_MAX_LENGTH: Final = 2**32 - 1

M = TypeVar("M", bound=Message)

_encoder: Final = msgspec.msgpack.Encoder()
_pack_length: Final = struct.Struct(">I").pack
_unpack_length: Final = struct.Struct(">I").unpack_from
#: Frames up to this size are decoded from a copy, which costs less than the view
#: (and its release) that spares copying a bigger one.
_COPY_UP_TO: Final = 4096


class FrameEncoder:
    """Encodes messages into frames, refusing frames larger than the peer accepts."""

    def __init__(self, max_frame_size: int = _MAX_LENGTH) -> None:
        self.max_frame_size = max_frame_size

    def encode(self, message: Message) -> bytes:
        """One frame for ``message``.

        Raises :class:`LocalProtocolError` (``frame_too_large``) when the encoded
        message is larger than ``max_frame_size``.
        """
        body = _encoder.encode(message)
        if len(body) > self.max_frame_size:
            raise self._too_large(message, len(body))
        return _pack_length(len(body)) + body  # one copy of the body, not three

    def encode_record(
        self, session_id: str, run_id: str, event_type: str, time: str, data: bytes
    ) -> bytes:
        """The frame of ``RecordEvent(session_id=session_id, ...)``: :meth:`encode`'s
        bytes and errors, made in one step by the C accelerator where it is built."""
        if encode_record is not None:
            frame = encode_record(session_id, run_id, event_type, time, data, self.max_frame_size)
            if frame is not None:
                return frame
        return self.encode(
            RecordEvent(
                session_id=session_id, run_id=run_id, event_type=event_type, time=time, data=data
            )
        )

    def encode_into(self, message: Message, buf: bytearray) -> None:
        """Append one frame for ``message`` to ``buf``; see :meth:`encode`."""
        start = len(buf)
        _encoder.encode_into(message, buf, start + HEADER_SIZE)
        length = len(buf) - start - HEADER_SIZE
        if length > self.max_frame_size:
            del buf[start:]
            raise self._too_large(message, length)
        buf[start : start + HEADER_SIZE] = _pack_length(length)

    def _too_large(self, message: Message, length: int) -> LocalProtocolError:
        return LocalProtocolError(
            f"a {type(message).__name__} message is {length} bytes, larger than the "
            f"peer's maximum frame size of {self.max_frame_size} bytes",
            code=ErrorCode.FRAME_TOO_LARGE,
        )


def encode_frame(message: Message) -> bytes:
    """One frame for ``message``, with no size limit."""
    return FrameEncoder().encode(message)


class FrameDecoder(Generic[M]):
    """Turns a byte stream into messages of one union type.

    Feed bytes with :meth:`feed`; take messages with :meth:`next_message` (None when
    more bytes are needed) or by iterating.  A frame announcing more than
    ``max_frame_size`` bytes is a :class:`RemoteProtocolError` with code
    ``frame_too_large``, after which the stream cannot be resynchronised and every
    later call raises it again.  A frame that does not decode to a known message is a
    :class:`RemoteProtocolError` with code ``bad_message``; that frame is skipped and
    the next one can still be read.
    """

    def __init__(self, message_type: Any, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE):
        self.max_frame_size = max_frame_size
        self._decoder: msgspec.msgpack.Decoder[M] = msgspec.msgpack.Decoder(message_type)
        self._buf = bytearray()
        self._pos = 0
        self._broken: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """How many received bytes are not yet handed out as messages."""
        return len(self._buf) - self._pos

    @property
    def missing(self) -> int:
        """How many more bytes the next message needs at least: 0 when one is
        complete, else what its frame lacks (its header's bytes alone while that is
        incomplete)."""
        buffered = len(self._buf) - self._pos
        if buffered < HEADER_SIZE:
            return HEADER_SIZE - buffered
        length: int = _unpack_length(self._buf, self._pos)[0]
        return max(0, HEADER_SIZE + length - buffered)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes."""
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def pending(self) -> tuple[bytearray, int]:
        """The buffer and where its next frame starts, for a reader of frames that
        walks them itself (the C accelerator); it says how far it read with
        :meth:`consumed`.  Raises as :meth:`next_message` does once broken."""
        if self._broken is not None:
            raise self._broken
        return self._buf, self._pos

    def consumed(self, pos: int) -> None:
        """The frames before ``pos`` of the :meth:`pending` buffer were read."""
        self._pos = pos

    def next_message(self) -> M | None:
        """The next complete message, or None when more bytes are needed.

        Raises :class:`RemoteProtocolError` as described on the class.
        """
        if self._broken is not None:
            raise self._broken
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < HEADER_SIZE:
            return None
        (length,) = _unpack_length(buf, pos)
        if length > self.max_frame_size:
            self._broken = RemoteProtocolError(
                f"frame of {length} bytes is larger than the maximum frame size of "
                f"{self.max_frame_size} bytes",
                code=ErrorCode.FRAME_TOO_LARGE,
            )
            raise self._broken
        end = pos + HEADER_SIZE + length
        if len(buf) < end:
            return None
        self._pos = end
        if length <= _COPY_UP_TO:
            try:
                return self._decoder.decode(buf[pos + HEADER_SIZE : end])
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
                raise _bad_message(length, exc) from None
        with memoryview(buf)[pos + HEADER_SIZE : end] as frame:
            # Released on the way out, or the next feed() cannot compact the buffer.
            try:
                return self._decoder.decode(frame)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
                raise _bad_message(length, exc) from None

    def __iter__(self) -> Iterator[M]:
        while (message := self.next_message()) is not None:
            yield message


def _bad_message(length: int, exc: Exception) -> RemoteProtocolError:
    if isinstance(exc, RecursionError):
        reason = "nests too deeply to be a valid message"
    else:
        reason = f"is not a valid message: {exc}"
    return RemoteProtocolError(f"frame of {length} bytes {reason}", code=ErrorCode.BAD_MESSAGE)


def server_decoder(max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> FrameDecoder[Any]:
    """A decoder for what clients send."""
    return FrameDecoder(ClientMessage, max_frame_size=max_frame_size)


def client_decoder(max_frame_size: int = 2**31) -> FrameDecoder[Any]:
    """A decoder for what the daemon sends."""
    return FrameDecoder(ServerMessage, max_frame_size=max_frame_size)
