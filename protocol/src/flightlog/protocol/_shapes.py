"""How the codec lowers one class: its shape, and the fast path's plain-value checks.

A shape lists a registrable class's fields (attribute, JSON key, whether the field is
declared as a protocol value type), the tag the class writes, and, for events that may
take the codec's fast path, the fields to check and the decoder that validates the
result (see the theory of operation in :mod:`._codec`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from ._errors import ErrorCode, LocalProtocolError
from ._events import (
    EVENT_CLASSES,
    AssistantMessage,
    CallConfig,
    Event,
    Execution,
    FilePart,
    ImagePart,
    ModelRequest,
    ModelResponse,
    SystemMessage,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolDeclaration,
    ToolResultMessage,
    Usage,
    UserMessage,
)

#: The key that carries a typed object's registered tag.
TYPE_KEY: Final = "$type"


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# --- shapes: how one class is lowered ---------------------------------------------------

_VALUE_TYPES: Final[tuple[type, ...]] = (Execution, Usage, CallConfig, ToolDeclaration)

# Fields whose lowered value has credentials removed.
_SCRUBBED_FIELDS: Final[Mapping[type, frozenset[str]]] = {
    CallConfig: frozenset({"extra"}),
    ModelRequest: frozenset({"headers"}),
}

# Fields of an event never written ("time" goes into the envelope).
_OMITTED_FIELDS: Final[Mapping[type, frozenset[str]]] = {
    ModelResponse: frozenset({"time", "message"}),
}
_ALWAYS_OMITTED: Final = frozenset({"time"})


def _holds_value_types(tp: Any) -> bool:
    """Whether every object a field of type ``tp`` holds is a protocol value type."""
    if isinstance(tp, type):
        return tp in _VALUE_TYPES
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is list:
        return len(args) == 1 and _holds_value_types(args[0])
    if origin is typing.Union or origin is types.UnionType:
        members = [arg for arg in args if arg is not type(None)]
        return bool(members) and all(_holds_value_types(arg) for arg in members)
    return False


class _Shape:
    """How objects of one class are lowered, and restored from a dict."""

    __slots__ = (
        "cls",
        "fast_fields",
        "fields",
        "keeps_type_key",
        "own_tag",
        "scrubbed",
        "tag",
        "validate_data",
    )

    def __init__(
        self,
        *,
        cls: type,
        tag: str,
        fields: tuple[tuple[str, str, bool], ...],
        own_tag: tuple[str, str | int] | None,
        keeps_type_key: bool,
    ) -> None:
        self.cls = cls
        self.tag = tag
        # (attribute, JSON key, declared as a protocol value type)
        self.fields = fields
        self.own_tag = own_tag
        self.keeps_type_key = keeps_type_key
        self.scrubbed = _SCRUBBED_FIELDS.get(cls, frozenset())
        # Set for events that may take the fast path (see the module docstring).
        self.fast_fields: tuple[tuple[str, str, bool], ...] | None = None
        self.validate_data: Any = None


def _shape_of(
    cls: type, tag: str, *, omit: frozenset[str] = frozenset(), own_tag_written: bool = True
) -> _Shape:
    """The shape of a registrable class; raises LocalProtocolError for any other class."""
    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        config = cls.__struct_config__
        if config.array_like:
            raise LocalProtocolError(
                f"cannot register {_class_name(cls)}: array_like Structs are not supported",
                code=ErrorCode.CODEC_ERROR,
            )
        if config.tag_field == TYPE_KEY and config.tag != tag:
            raise LocalProtocolError(
                f"cannot register {_class_name(cls)} as {tag!r}: "
                f"it already tags itself with $type {config.tag!r}",
                code=ErrorCode.CODEC_ERROR,
            )
        try:
            infos = [(f.name, f.encode_name, f.type) for f in msgspec.structs.fields(cls)]
        except Exception:  # unresolvable annotations: lower every field generically
            infos = [
                (name, key, Any)
                for name, key in zip(
                    cls.__struct_fields__, cls.__struct_encode_fields__, strict=True
                )
            ]
        own_tag: tuple[str, str | int] | None = None
        if own_tag_written and config.tag_field is not None and config.tag_field != TYPE_KEY:
            assert config.tag is not None
            own_tag = (config.tag_field, config.tag)
        keeps = config.tag_field == TYPE_KEY
    elif isinstance(cls, type) and dataclasses.is_dataclass(cls):
        try:
            hints = typing.get_type_hints(cls)
        except Exception:
            hints = {}
        infos = [
            (f.name, f.name, hints.get(f.name, Any)) for f in dataclasses.fields(cls) if f.init
        ]
        own_tag = None
        keeps = False
    else:
        raise LocalProtocolError(
            f"cannot register {cls!r}: only msgspec Structs and dataclasses can be registered",
            code=ErrorCode.CODEC_ERROR,
        )
    fields = tuple(
        (name, key, _holds_value_types(tp)) for name, key, tp in infos if name not in omit
    )
    return _Shape(cls=cls, tag=tag, fields=fields, own_tag=own_tag, keeps_type_key=keeps)


_BUILTIN_TYPES: Final[tuple[tuple[str, type], ...]] = (
    ("user", UserMessage),
    ("assistant", AssistantMessage),
    ("tool_result", ToolResultMessage),
    ("system", SystemMessage),
    ("text", TextPart),
    ("thinking", ThinkingPart),
    ("tool_call", ToolCallPart),
    ("image", ImagePart),
    ("file", FilePart),
    ("execution", Execution),
    ("usage", Usage),
    ("call_config", CallConfig),
    ("tool_declaration", ToolDeclaration),
)
_BUILTIN_SHAPES: Final = {cls: _shape_of(cls, tag) for tag, cls in _BUILTIN_TYPES}

_EVENT_SHAPES: Final = {
    # An event's tag is the record type, written in the envelope, not in its data.
    cls: _shape_of(cls, tag, omit=_OMITTED_FIELDS.get(cls, _ALWAYS_OMITTED), own_tag_written=False)
    for tag, cls in EVENT_CLASSES.items()
}

# Value types that msgspec writes exactly as the walk does: no free-form fields inside.
_NATIVE_VALUE_TYPES: Final = (Execution, Usage)
# Plain values nested deeper than this take the careful way (which bounds the depth).
_FAST_DEPTH: Final = 32


def _data_mirror(cls: type[Event], omit: frozenset[str]) -> Any:
    """A Struct with the event's fields less ``omit``: what a record's data decodes to."""
    fields: list[Any] = []
    for info in msgspec.structs.fields(cls):
        if info.name in omit:
            continue
        if info.required:
            fields.append((info.name, info.type))
        elif info.default is not msgspec.NODEFAULT:
            fields.append((info.name, info.type, info.default))
        else:
            fields.append(
                (info.name, info.type, msgspec.field(default_factory=info.default_factory))
            )
    mirror = msgspec.defstruct(f"{cls.__name__}Data", fields, kw_only=True, module=__name__)
    return msgspec.json.Decoder(mirror).decode


def _prepare_fast_paths() -> None:
    for cls, shape in _EVENT_SHAPES.items():
        omit = _OMITTED_FIELDS.get(cls, _ALWAYS_OMITTED)
        renamed = any(f.name != f.encode_name for f in msgspec.structs.fields(cls))
        if shape.scrubbed or cls in _OMITTED_FIELDS or renamed:
            continue
        shape.fast_fields = shape.fields
        shape.validate_data = _data_mirror(cls, omit)


_prepare_fast_paths()


def _is_plain(value: Any, depth: int) -> bool:
    """Whether ``value`` is made of str, int, float, bool, None, lists and str-keyed dicts."""
    cls = type(value)
    if cls is str or cls is int or cls is float or cls is bool or value is None:
        return True
    if depth >= _FAST_DEPTH:
        return False
    if cls is dict:
        for key, item in value.items():
            if type(key) is not str or not _is_plain(item, depth + 1):
                return False
        return True
    if cls is list:
        return all(_is_plain(item, depth + 1) for item in value)
    return False


def _is_native_value(value: Any) -> bool:
    """Whether a field declared as a value type holds what msgspec writes like the walk."""
    if value is None or type(value) in _NATIVE_VALUE_TYPES:
        return True
    return type(value) is list and all(type(v) in _NATIVE_VALUE_TYPES for v in value)
