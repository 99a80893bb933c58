"""The codec: events and snapshots to the JSON of a record's ``data``, and back.

Theory of operation
-------------------
Encoding lowers the value to plain JSON values before msgspec writes it, by the rules of
the walk (:mod:`._lowering`): a typed object carries its registered tag under
``"$type"``, an object of an unregistered class with fields its ``"$class"``, a value
that cannot be written at all is replaced, in an event, by an unencodable marker
(:attr:`EncodedEvent.markers` names each) and raises in a snapshot, an event too large
to send is replaced by its stub (:meth:`Codec.oversized`), and credentials never reach
a record.

An event is then validated against its own class, so a field of the wrong type fails in
the caller's process, at ``record()``, and never later in a reader.

Most events an agent records are small and hold only plain JSON values besides their
declared fields (a tool call's arguments, a turn's summary).  For those the walk would
rebuild the same values, so :meth:`Codec.encode_event` takes a fast path: it checks
that every free-form field holds plain JSON values only, lets msgspec write the fields
directly, and validates the result against a mirror of the event's class that lacks the
envelope's ``time``.  Anything else (typed objects, credentials to remove, values msgspec
refuses, deep nesting) goes the careful way; both ways write the same bytes.  So the
conversions and the markers cost an ordinary event nothing: they run only where the
fast path gives up.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import msgspec

from ._credentials import is_credential_key
from ._errors import ErrorCode, LocalProtocolError, RecordingError, RemoteProtocolError
from ._events import EVENT_CLASSES, Event, ModelResponse
from ._lowering import _ENCODE_ERRORS, CLASS_KEY, MAX_DEPTH, Lowering, _json_encoder, invalid_event
from ._records import NEVER_WRITTEN_TYPES, STRUCTURAL_TYPES, Record, utc_time
from ._shapes import (
    _BUILTIN_SHAPES,
    _EVENT_SHAPES,
    TYPE_KEY,
    _class_name,
    _is_native_value,
    _is_plain,
    _Shape,
    _shape_of,
)
from ._values import (
    MARKER_KEY,
    OVERSIZED,
    UNENCODABLE,
    _SnapshotWalk,
    _Unencodable,
    _unencodable,
    _Walk,
    oversized_stub,
)

__all__ = [
    "CLASS_KEY",
    "MARKER_KEY",
    "MAX_DEPTH",
    "OVERSIZED",
    "SNAPSHOT_ERROR_KEY",
    "TYPE_KEY",
    "UNENCODABLE",
    "Codec",
    "EncodedEvent",
    "decode_event",
    "decode_value",
    "default_codec",
    "encode_event",
    "encode_value",
    "is_credential_key",
]

T = TypeVar("T")

#: The key of the diagnostic that older writers put in place of a value they could not
#: encode; files written before flightlog raised an error instead may hold it.
SNAPSHOT_ERROR_KEY: Final = "snapshot_error"


class EncodedEvent(msgspec.Struct, kw_only=True, frozen=True):
    """An event ready to be written: its record ``type``, ``data`` and source ``time``.

    ``data`` is one JSON object (UTF-8 bytes) holding the event's fields, without the
    type tag and without ``time``, which go into the record envelope.  ``markers`` says
    what the codec wrote in place of values it could not encode (one line each:
    ``"<field>: <class> (<reason>)"``, at most :data:`MAX_NOTES`, then how many more),
    or that ``data`` is the stub of an event larger than the daemon accepts.
    """

    type: str
    data: bytes
    time: str
    markers: tuple[str, ...] = ()


_json_decoder: Final = msgspec.json.Decoder()


class Codec:
    """Encodes events and snapshots for records, and decodes them back.

    An application registers its own message and artifact types (msgspec Structs or
    dataclasses) under stable tags with :meth:`register`; the protocol's messages and
    parts are registered already.  Encoding raises :class:`RecordingError`; decoding
    raises :class:`RemoteProtocolError` (the record does not hold what it claims) or
    :class:`LocalProtocolError` (a structural record is not an event).
    """

    def __init__(self) -> None:
        self._by_class: dict[type, _Shape] = dict(_BUILTIN_SHAPES)
        self._lowering = Lowering(self._by_class)
        self._by_tag: dict[str, _Shape] = {shape.tag: shape for shape in _BUILTIN_SHAPES.values()}

    # --- registry -----------------------------------------------------------------------

    def register(self, tag: str, cls: type[T]) -> type[T]:
        """Register ``cls`` under ``tag``; returns ``cls``.

        The tag is written into every record that holds such an object: keep it stable
        across renames of the class.  Registering the same pair again does nothing.
        Raises :class:`LocalProtocolError` when the tag or the class is taken by another
        registration, or the class is neither a msgspec Struct nor a dataclass.
        """
        if not isinstance(tag, str) or not tag:
            raise LocalProtocolError(
                "a codec tag must be a non-empty string", code=ErrorCode.CODEC_ERROR
            )
        taken = self._by_tag.get(tag)
        if taken is not None:
            if taken.cls is cls:
                return cls
            raise LocalProtocolError(
                f"tag {tag!r} is already registered for {_class_name(taken.cls)}",
                code=ErrorCode.CODEC_ERROR,
            )
        known = self._by_class.get(cls)
        if known is not None:
            raise LocalProtocolError(
                f"{_class_name(cls)} is already registered as {known.tag!r}",
                code=ErrorCode.CODEC_ERROR,
            )
        shape = _shape_of(cls, tag)
        self._by_class[cls] = shape
        self._by_tag[tag] = shape
        return cls

    @property
    def tags(self) -> Mapping[str, type]:
        """Every registered tag and its class, built-in ones included."""
        return types.MappingProxyType({tag: shape.cls for tag, shape in self._by_tag.items()})

    def tag_of(self, cls: type) -> str | None:
        """The tag ``cls`` is registered under, or None."""
        shape = self._by_class.get(cls)
        return None if shape is None else shape.tag

    # --- events -------------------------------------------------------------------------

    def encode_event(self, event: Event) -> EncodedEvent | None:
        """The record type, data and time of ``event``, or None when it is never written.

        Never written: ``message_start``, ``message_update``, ``model_stream``,
        ``tool_exec_update``, and a ``model_response`` without a length-recovery
        decision (with one it is written without its message).

        Raises :class:`RecordingError` (code ``codec_error``) for an object of an
        unregistered class, and (code ``bad_event``) for something that is not an event
        or a field of the wrong type.
        """
        shape = _EVENT_SHAPES.get(type(event))
        if shape is None:
            raise RecordingError(
                f"cannot record {type(event).__qualname__}: not a flightlog event",
                code=ErrorCode.BAD_EVENT,
            )
        if shape.tag in NEVER_WRITTEN_TYPES:
            return None
        if isinstance(event, ModelResponse) and event.length_recovery is None:
            return None
        time = utc_time(event.time) if isinstance(event.time, str) else None
        if time is None:
            raise RecordingError(
                f"{shape.cls.__name__}.time must be an RFC 3339 time "
                f"(like 2026-11-29T20:00:00.000000Z), not {event.time!r}",
                code=ErrorCode.BAD_EVENT,
            )
        encoded = self._encode_fast(event, shape)
        if encoded is not None:
            return EncodedEvent(type=shape.tag, data=encoded, time=time)
        walk = _Walk()
        data = self._lowering.encode_careful(event, shape, walk)
        if walk.count:
            return EncodedEvent(type=shape.tag, data=data, time=time, markers=walk.notes())
        return EncodedEvent(type=shape.tag, data=data, time=time)

    def _encode_fast(self, event: Event, shape: _Shape) -> bytes | None:
        """The event's data when it holds plain values only, else None."""
        if shape.fast_fields is None:
            return None
        data: dict[str, Any] = {}
        for attr, key, declared_value_type in shape.fast_fields:
            value = getattr(event, attr)
            if not (_is_native_value(value) if declared_value_type else _is_plain(value, 0)):
                return None
            data[key] = value
        try:
            encoded = _json_encoder.encode(data)
        except _ENCODE_ERRORS:
            return None  # the careful way marks the value msgspec refuses
        try:
            shape.validate_data(encoded)
        except msgspec.ValidationError as exc:
            raise invalid_event(shape, exc) from None
        return encoded

    def oversized(self, encoded: EncodedEvent, *, limit: int) -> EncodedEvent:
        """The stub written in place of ``encoded`` when its data is too large to send.

        The stub has the event's record type and time; its data keeps each member of
        at most ``limit // 32`` bytes (at most 4 KiB) and starts with the oversized
        marker: ``{"$flightlog": "oversized", "size": <bytes of the data>, "sha256":
        <its hex digest>, "omitted": [<members left out>], <members kept>}``.  A
        required member left out is cut (text) or null.  Raises :class:`RecordingError`
        (``codec_error``) when no stub fits the event's class.
        """
        cls = EVENT_CLASSES[encoded.type]
        required = frozenset(f.encode_name for f in msgspec.structs.fields(cls) if f.required)
        stub, omitted = oversized_stub(
            encoded.data, self._decode_json(encoded.data), required=required, limit=limit
        )
        data = _json_encoder.encode(stub)
        try:
            self.decode_event_data(encoded.type, data, time=encoded.time)
        except RemoteProtocolError as exc:
            raise RecordingError(
                f"cannot record {cls.__name__} of {len(encoded.data)} bytes, not even as a "
                f"stub: {exc.message}",
                code=ErrorCode.CODEC_ERROR,
            ) from None
        note = (
            f"{OVERSIZED}: {len(encoded.data)} bytes, more than the maximum frame size of "
            f"{limit} bytes; written as a stub without {', '.join(omitted) or 'nothing'}"
        )
        return EncodedEvent(
            type=encoded.type, data=data, time=encoded.time, markers=(*encoded.markers, note)
        )

    def decode_event(self, record: Record) -> Event:
        """The typed event a record holds, registered application types restored.

        Raises :class:`LocalProtocolError` for a structural record (``session_start``,
        ``run_start``, ``checkpoint``, ``run_close``: use ``record.decode_data``), and
        :class:`RemoteProtocolError` for an unknown record type or data that does not
        fit its event class.
        """
        return self.decode_event_data(record.type, record.data, time=record.time)

    def decode_event_data(self, type: str, data: bytes | msgspec.Raw, *, time: str) -> Event:
        """Like :meth:`decode_event`, from a record's parts."""
        cls = EVENT_CLASSES.get(type)
        if cls is None:
            if type in STRUCTURAL_TYPES:
                raise LocalProtocolError(
                    f"{type} is a structural record, not an event: use record.decode_data()",
                    code=ErrorCode.BAD_EVENT,
                )
            raise RemoteProtocolError(
                f"unknown record type {type!r} (written by a newer flightlog?)",
                code=ErrorCode.BAD_EVENT,
            )
        fields = self._decode_json(data)
        if not isinstance(fields, dict):
            raise RemoteProtocolError(
                f"the data of a {type} record must be a JSON object", code=ErrorCode.BAD_EVENT
            )
        fields.pop("type", None)
        fields["time"] = time
        try:
            raised = {key: self._raise(value, 0) for key, value in fields.items()}
            event: Event = msgspec.convert(raised, cls)
        except msgspec.ValidationError as exc:
            raise RemoteProtocolError(
                f"the data of a {type} record does not fit {cls.__name__}: {exc}",
                code=ErrorCode.BAD_EVENT,
            ) from None
        except RecursionError:
            raise RemoteProtocolError(
                f"the data of a {type} record is nested too deeply", code=ErrorCode.BAD_EVENT
            ) from None
        return event

    # --- snapshots ----------------------------------------------------------------------

    def encode_value(self, obj: Any) -> bytes:
        """JSON for a checkpoint snapshot (or any value), with the typed-message rules.

        Raises :class:`RecordingError` (code ``codec_error``) for a value that cannot be
        encoded (a socket, a function, a lone surrogate, a reference cycle), and for an
        event, which is recorded, never a value.
        """
        try:
            lowered = self._lowering.lower(obj, 0, _SnapshotWalk())
            return _json_encoder.encode(lowered)
        except _Unencodable as exc:
            reason = exc.reason
        except _ENCODE_ERRORS as exc:
            reason = _unencodable(exc).reason
        raise RecordingError(
            f"cannot encode the value: {reason}", code=ErrorCode.CODEC_ERROR
        ) from None

    def decode_value(self, data: bytes | msgspec.Raw) -> Any:
        """The value :meth:`encode_value` wrote, registered types restored.

        Raises :class:`RemoteProtocolError` for bad JSON or a typed object that does not
        fit its registered class.
        """
        value = self._decode_json(data)
        try:
            return self._raise(value, 0)
        except msgspec.ValidationError as exc:
            raise RemoteProtocolError(
                f"snapshot does not fit its types: {exc}", code=ErrorCode.CODEC_ERROR
            ) from None
        except RecursionError:
            raise RemoteProtocolError(
                "snapshot is nested too deeply", code=ErrorCode.CODEC_ERROR
            ) from None

    # --- lowering -----------------------------------------------------------------------

    # --- raising ------------------------------------------------------------------------

    def _decode_json(self, data: bytes | msgspec.Raw) -> Any:
        try:
            return _json_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise RemoteProtocolError(
                f"not valid JSON: {exc}", code=ErrorCode.CODEC_ERROR
            ) from None
        except RecursionError:
            raise RemoteProtocolError(
                "JSON nested too deeply", code=ErrorCode.CODEC_ERROR
            ) from None

    def _raise(self, value: Any, depth: int) -> Any:
        if type(value) is dict:
            out = {key: self._raise(item, depth + 1) for key, item in value.items()}
            tag = out.get(TYPE_KEY)
            if type(tag) is str:
                shape = self._by_tag.get(tag)
                if shape is not None:
                    return self._restore(out, shape)
            return out
        if type(value) is list:
            return [self._raise(item, depth + 1) for item in value]
        return value

    def _restore(self, fields: dict[str, Any], shape: _Shape) -> Any:
        if not shape.keeps_type_key:
            del fields[TYPE_KEY]
        try:
            return msgspec.convert(fields, shape.cls)
        except msgspec.ValidationError as exc:
            raise RemoteProtocolError(
                f"$type {shape.tag!r} does not fit {_class_name(shape.cls)}: {exc}",
                code=ErrorCode.CODEC_ERROR,
            ) from None


#: The codec the SDK uses unless it is given another.
default_codec: Final = Codec()


def encode_event(event: Event) -> EncodedEvent | None:
    """:meth:`Codec.encode_event` of :data:`default_codec`."""
    return default_codec.encode_event(event)


def decode_event(record: Record) -> Event:
    """:meth:`Codec.decode_event` of :data:`default_codec`."""
    return default_codec.decode_event(record)


def encode_value(obj: Any) -> bytes:
    """:meth:`Codec.encode_value` of :data:`default_codec`."""
    return default_codec.encode_value(obj)


def decode_value(data: bytes | msgspec.Raw) -> Any:
    """:meth:`Codec.decode_value` of :data:`default_codec`."""
    return default_codec.decode_value(data)
