"""The codec's walk, sans I/O: a value lowered to plain JSON values before msgspec writes it.

Theory of operation
-------------------
The codec (:mod:`._codec`) encodes every snapshot, and an event where its fast path
gives up, with this walk: it lowers the value to plain JSON values before msgspec writes
it.  The walk is needed because msgspec encodes any Struct or dataclass natively, and an
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
  the event is kept; :attr:`~._codec.EncodedEvent.markers` names each, so that the SDK
  names them in the run's ``run_close``.  A snapshot is restored later, so there it raises
  :class:`RecordingError` instead.
* An event too large to send is replaced by its stub (:meth:`~._codec.Codec.oversized`).
* Credentials never reach a record: keys such as ``api_key``, ``authorization`` or
  ``x-api-key`` are removed, at any depth, from ``CallConfig.extra`` and from
  ``ModelRequest.headers``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

import msgspec

from ._credentials import _scrub
from ._errors import ErrorCode, RecordingError
from ._events import Event
from ._shapes import _BUILTIN_SHAPES, _VALUE_TYPES, TYPE_KEY, _class_name, _Shape
from ._values import Converter, _Unencodable, _unencodable, _Walk, converter_of

__all__ = ["CLASS_KEY", "MAX_DEPTH", "Lowering", "invalid_event"]

#: The key that names the class of an object written without a registered tag.
CLASS_KEY: Final = "$class"
#: Deeper values cannot be encoded.
MAX_DEPTH: Final = 200


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


# Built once, for the codec too.
_json_encoder: Final = msgspec.json.Encoder()

# What msgspec raises for a value it cannot write.
_ENCODE_ERRORS: Final = (msgspec.EncodeError, TypeError, ValueError, OverflowError)


class Lowering:
    """The walk of one codec: ``by_class`` is the codec's registry, by class (the same
    mapping, so that a class registered later is lowered with its tag)."""

    def __init__(self, by_class: Mapping[type, _Shape]) -> None:
        self._by_class = by_class

    def encode_careful(self, event: Event, shape: _Shape, walk: _Walk) -> bytes:
        """The data of ``event`` (of class ``shape``), lowered and validated; ``walk``
        collects the markers.  Raises :class:`RecordingError`."""
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

    def lower(self, obj: Any, depth: int, walk: _Walk) -> Any:
        """``obj`` as plain JSON values; raises :class:`~._values._Unencodable` for what
        cannot be written when ``walk`` marks nothing (a snapshot's)."""
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
                return path if isinstance(path, str) else self.lower(path, depth, walk)
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
        return convert(obj, lambda value: self.lower(value, depth + 1, walk))

    def _lower_items(self, obj: Iterable[Any], depth: int, walk: _Walk) -> list[Any]:
        marker, active = id(obj), walk.active
        if marker in active:
            raise _Unencodable("a reference cycle")
        active.add(marker)
        try:
            return [self.lower(item, depth + 1, walk) for item in obj]
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
                out[key] = self.lower(value, depth + 1, walk)
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
                out[key] = self.lower(value, depth + 1, walk)
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
                    value = self.lower(value, depth + 1, walk)
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
        return self.lower(obj, depth, walk)

    def _validate(self, data: dict[str, Any], shape: _Shape) -> None:
        try:
            msgspec.convert(data, shape.cls)
        except msgspec.ValidationError as exc:
            raise invalid_event(shape, exc) from None


def invalid_event(shape: _Shape, exc: msgspec.ValidationError) -> RecordingError:
    """The error of an event whose fields do not fit its class."""
    return RecordingError(f"cannot record {shape.cls.__name__}: {exc}", code=ErrorCode.BAD_EVENT)
