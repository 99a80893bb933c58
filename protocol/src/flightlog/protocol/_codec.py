"""The codec: events and snapshots to the JSON of a record's ``data``, and back.

Theory of operation
-------------------
Encoding walks the value and lowers it to plain JSON values before msgspec writes it.
The walk is needed because msgspec encodes any Struct or dataclass natively, and an
application's own message types must never be silently lowered to plain dicts: a typed
object is written as a JSON object carrying its registered tag under ``"$type"``, so that
decoding with the same registry gives back the same type.  The rules, in order:

* ``str``, ``int``, ``float``, ``bool`` and ``None`` pass as they are (NaN and the
  infinities become ``null``, as msgspec writes them); dicts, lists, tuples and sets are
  walked.
* An object of a registered class becomes ``{"$type": tag, <its fields>}``.  The
  protocol's own messages and parts are registered in every codec.
* The protocol's value types (:class:`Execution`, :class:`Usage`, :class:`CallConfig`,
  :class:`ToolDeclaration`) are written as plain objects, without ``"$type"``, in the
  fields whose declared type says what they are (``execution``, ``usage``, ``config``,
  ``tools``); anywhere else they carry their tag like any other registered type.
* An object of an unregistered class with fields (a dataclass, an attrs class, a msgspec
  Struct: what the model providers' SDKs and the agent frameworks hand out) becomes
  ``{"$class": "<module>.<qualname>", <its fields>}``, each field lowered by these same
  rules.  It reads back as that plain object; register the class to have it restored as
  itself.
* pydantic, numpy and pandas values, and the standard library's values msgspec does not
  write (IP addresses, patterns, fractions, complex numbers), are written as their own
  libraries write them for JSON (:mod:`._values`; a pydantic model with ``"$class"``
  first); none of these libraries is imported for a value that is not theirs.
* Any other value msgspec can write (``datetime``, ``timedelta``, ``UUID``, ``Decimal``,
  enums, bytes as base64) is written as msgspec writes it and reads back as the plain
  JSON value; paths become strings, exceptions ``{"$class", "message"}``, and other
  iterables (a deque, a dict view) lists.
* A value that cannot be written at all (an open socket, a function, a lone surrogate, a
  reference cycle, a value nested too deeply) is replaced, in an event, by an
  unencodable marker (``{"$flightlog": "unencodable", "class", "repr", "error"}``) and
  the event is kept; :attr:`EncodedEvent.markers` names each, so that the SDK names them
  in the run's ``run_close``.  A snapshot is restored later, so there it raises
  :class:`RecordingError` instead.
* An event too large to send is replaced by its stub (:meth:`Codec.oversized`).
* Credentials never reach a record: keys such as ``api_key``, ``authorization`` or
  ``x-api-key`` are removed, at any depth, from ``CallConfig.extra`` and from
  ``ModelRequest.headers``.

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

import dataclasses
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, TypeVar

import msgspec

from ._credentials import _scrub, is_credential_key
from ._errors import ErrorCode, LocalProtocolError, RecordingError, RemoteProtocolError
from ._events import EVENT_CLASSES, Event, ModelResponse
from ._records import NEVER_WRITTEN_TYPES, STRUCTURAL_TYPES, Record, utc_time
from ._shapes import (
    _BUILTIN_SHAPES,
    _EVENT_SHAPES,
    _VALUE_TYPES,
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
    Converter,
    _SnapshotWalk,
    _Unencodable,
    _unencodable,
    _Walk,
    converter_of,
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

#: The key that names the class of an object written without a registered tag.
CLASS_KEY: Final = "$class"
#: The key of the diagnostic that older writers put in place of a value they could not
#: encode; files written before flightlog raised an error instead may hold it.
SNAPSHOT_ERROR_KEY: Final = "snapshot_error"
#: Deeper values cannot be encoded.
MAX_DEPTH: Final = 200


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


def _foreign_fields(obj: Any) -> Iterator[tuple[str, Any]] | None:
    """The fields of an object of an unregistered class with fields, or None."""
    cls = type(obj)
    pydantic_fields = getattr(cls, "__pydantic_fields__", None)
    if isinstance(pydantic_fields, dict) and hasattr(obj, "model_dump"):
        extra = getattr(obj, "__pydantic_extra__", None)
        return _chain_fields(
            ((name, getattr(obj, name)) for name in pydantic_fields),
            extra.items() if isinstance(extra, dict) else (),
        )
    if isinstance(obj, msgspec.Struct):
        return (
            (key, getattr(obj, name))
            for name, key in zip(cls.__struct_fields__, cls.__struct_encode_fields__, strict=True)
        )
    if dataclasses.is_dataclass(obj):
        return ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
    attrs_fields = getattr(cls, "__attrs_attrs__", None)
    if isinstance(attrs_fields, tuple):
        return ((a.name, getattr(obj, a.name)) for a in attrs_fields)
    return None


def _chain_fields(*parts: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    for part in parts:
        yield from part


def _encodes(value: Any) -> bool:
    try:
        _json_encoder.encode(value)
    except _ENCODE_ERRORS:
        return False
    return True


_json_encoder: Final = msgspec.json.Encoder()
_json_decoder: Final = msgspec.json.Decoder()

# What msgspec raises for a value it cannot write.
_ENCODE_ERRORS: Final = (msgspec.EncodeError, TypeError, ValueError, OverflowError)


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
        data = self._encode_careful(event, shape, walk)
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
            raise self._invalid(shape, exc) from None
        return encoded

    def _encode_careful(self, event: Event, shape: _Shape, walk: _Walk) -> bytes:
        data = self._lower_object(event, shape, depth=0, walk=walk, tagged=False)
        self._validate(data, shape)
        try:
            return _json_encoder.encode(data)
        except _ENCODE_ERRORS:
            pass
        # What msgspec refuses after the walk: a lone surrogate, an integer too long to
        # write.  Marked where it is; in a field declared as text, kept as escaped text.
        count, named = walk.count, len(walk.markers)
        repaired = {key: self._repair(item, walk, key, text=False) for key, item in data.items()}
        try:
            msgspec.convert(repaired, shape.cls)
        except msgspec.ValidationError:
            walk.count = count
            del walk.markers[named:]
            repaired = {key: self._repair(item, walk, key, text=True) for key, item in data.items()}
        self._validate(repaired, shape)
        try:
            return _json_encoder.encode(repaired)
        except _ENCODE_ERRORS as exc:  # never: every leaf was tried alone
            raise RecordingError(
                f"cannot record {shape.cls.__name__}: {_unencodable(exc).reason}",
                code=ErrorCode.CODEC_ERROR,
            ) from None

    def _repair(self, value: Any, walk: _Walk, field: str, *, text: bool) -> Any:
        walk.field = field
        if type(value) is dict:
            for key in value:
                if not _encodes(key):
                    return walk.mark(value, "a key that cannot be encoded")
            return {key: self._repair(item, walk, field, text=text) for key, item in value.items()}
        if type(value) is list:
            return [self._repair(item, walk, field, text=text) for item in value]
        try:
            _json_encoder.encode(value)
        except _ENCODE_ERRORS as exc:
            if text and isinstance(value, str):
                walk.mark(value, "a lone surrogate")
                return value.encode("utf-8", "backslashreplace").decode("utf-8")
            return walk.mark(value, _unencodable(exc).reason)
        return value

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
            lowered = self._lower(obj, 0, _SnapshotWalk())
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

    def _lower(self, obj: Any, depth: int, walk: _Walk) -> Any:
        cls = type(obj)
        if cls is str or cls is int or cls is float or cls is bool or obj is None:
            return obj
        try:
            if depth >= MAX_DEPTH:
                raise _Unencodable(f"nested deeper than {MAX_DEPTH} levels")
            shape = self._by_class.get(cls)
            if shape is not None:
                return self._lower_object(obj, shape, depth=depth, walk=walk, tagged=True)
            if isinstance(obj, Mapping):
                return self._lower_mapping(obj, depth, walk)
            if isinstance(obj, list | tuple | set | frozenset):
                return self._lower_items(obj, depth, walk)
            convert = converter_of(cls)
            if convert is not None and not isinstance(obj, BaseException):
                return self._convert(obj, convert, depth, walk)
            if isinstance(obj, str | int | float):  # subclasses: str and int enums
                return obj
            if isinstance(obj, Event):
                raise _Unencodable(
                    f"{cls.__name__} is an event: record events with run.record(), never as a value"
                )
            if isinstance(obj, msgspec.Raw):
                raise _Unencodable("msgspec.Raw cannot be recorded; pass decoded values")
            fields = _foreign_fields(obj)
            if fields is not None:
                return self._lower_foreign(obj, fields, depth, walk)
            if isinstance(obj, BaseException):
                return {CLASS_KEY: _class_name(cls), "message": str(obj)}
            fspath = getattr(obj, "__fspath__", None)
            if fspath is not None:
                path = fspath()
                return path if isinstance(path, str) else self._lower(path, depth, walk)
            try:
                return msgspec.to_builtins(obj)
            except _ENCODE_ERRORS as exc:
                if isinstance(obj, Iterable) and not isinstance(obj, Iterator):
                    return self._lower_items(obj, depth, walk)
                raise _unencodable(exc) from None
        except _Unencodable as exc:
            if not walk.marking:
                raise
            return walk.mark(obj, exc.reason)

    def _convert(self, obj: Any, convert: Converter, depth: int, walk: _Walk) -> Any:
        # Apart from _lower: a closure there would make its every local a cell.
        return convert(obj, lambda value: self._lower(value, depth + 1, walk))

    def _lower_items(self, obj: Iterable[Any], depth: int, walk: _Walk) -> list[Any]:
        marker, active = id(obj), walk.active
        if marker in active:
            raise _Unencodable("a reference cycle")
        active.add(marker)
        try:
            return [self._lower(item, depth + 1, walk) for item in obj]
        finally:
            active.discard(marker)

    def _lower_foreign(
        self, obj: Any, fields: Iterator[tuple[str, Any]], depth: int, walk: _Walk
    ) -> dict[str, Any]:
        marker, active = id(obj), walk.active
        if marker in active:
            raise _Unencodable("a reference cycle")
        active.add(marker)
        try:
            out: dict[str, Any] = {CLASS_KEY: _class_name(type(obj))}
            for key, value in fields:
                out[key] = self._lower(value, depth + 1, walk)
            return out
        finally:
            active.discard(marker)

    def _lower_mapping(self, obj: Mapping[Any, Any], depth: int, walk: _Walk) -> Any:
        marker, active = id(obj), walk.active
        if marker in active:
            raise _Unencodable("a reference cycle")
        active.add(marker)
        try:
            out: dict[Any, Any] = {}
            for key, value in obj.items():
                if not isinstance(key, str) and (
                    isinstance(key, bool) or not isinstance(key, int | float)
                ):
                    raise _Unencodable(
                        f"dict keys must be strings or numbers, not {type(key).__name__}"
                    )
                out[key] = self._lower(value, depth + 1, walk)
            return out
        finally:
            active.discard(marker)

    def _lower_object(
        self, obj: Any, shape: _Shape, *, depth: int, walk: _Walk, tagged: bool
    ) -> dict[str, Any]:
        marker, active = id(obj), walk.active
        if marker in active:
            raise _Unencodable("a reference cycle")
        active.add(marker)
        try:
            out: dict[str, Any] = {}
            if tagged:
                out[TYPE_KEY] = shape.tag
            if shape.own_tag is not None:
                out[shape.own_tag[0]] = shape.own_tag[1]
            for attr, key, plain in shape.fields:
                value = getattr(obj, attr)
                if depth == 0:
                    walk.field = key
                if plain:
                    value = self._lower_plain(value, depth + 1, walk)
                else:
                    value = self._lower(value, depth + 1, walk)
                if attr in shape.scrubbed:
                    value = _scrub(value)
                out[key] = value
            return out
        finally:
            active.discard(marker)

    def _lower_plain(self, obj: Any, depth: int, walk: _Walk) -> Any:
        # A field declared as a protocol value type: its objects are written untagged.
        shape = _BUILTIN_SHAPES.get(type(obj))
        if shape is not None and shape.cls in _VALUE_TYPES:
            return self._lower_object(obj, shape, depth=depth, walk=walk, tagged=False)
        if isinstance(obj, list | tuple) and depth < MAX_DEPTH:
            return [self._lower_plain(item, depth + 1, walk) for item in obj]
        return self._lower(obj, depth, walk)

    def _validate(self, data: dict[str, Any], shape: _Shape) -> None:
        try:
            msgspec.convert(data, shape.cls)
        except msgspec.ValidationError as exc:
            raise self._invalid(shape, exc) from None

    @staticmethod
    def _invalid(shape: _Shape, exc: msgspec.ValidationError) -> RecordingError:
        return RecordingError(
            f"cannot record {shape.cls.__name__}: {exc}", code=ErrorCode.BAD_EVENT
        )

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
