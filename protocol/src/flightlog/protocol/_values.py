"""Values msgspec does not write, lowered as their own libraries write them for JSON.

Theory of operation
-------------------
The codec's walk (:mod:`._codec`) hands this module an object it cannot write itself,
and gets back its JSON form, or :class:`_Unencodable`.  Which conversion applies is
told by the modules of the object's class and its bases, looked up once per class, so
no library is ever imported here: an object of a pydantic, numpy or pandas class can
only exist once its library is loaded, and the library is then taken from
``sys.modules``.

* pydantic (and pydantic-core): whatever pydantic writes in JSON mode, as
  ``pydantic_core.to_jsonable_python`` writes it: a model with its aliases as its
  config asks for them, its computed fields and its custom serializers; secrets masked
  (``"**********"``), URLs as strings.  A model, or a pydantic dataclass, is written as
  an object whose first member ``"$class"`` names its class.  Values pydantic does not
  know (an arbitrary type in a model) come back here through its ``fallback``.
* numpy: arrays as nested lists, scalars as numbers (dates and durations as numpy's
  ISO 8601 text, ``"NaT"`` included).
* pandas: a DataFrame as ``{"$class", "columns", "index", "data"}`` (pandas' ``split``
  orientation: ``data`` holds the rows), a Series as ``{"$class", "name", "index",
  "data"}``, an Index or an array as a list, a Timestamp or a Timedelta like a
  ``datetime`` or a ``timedelta`` (as pandas' ISO 8601 text where it holds
  nanoseconds), a Period or an Interval as its text, ``NaT`` and ``NA`` as ``null``.
* The standard library's values that pydantic writes and msgspec does not, written as
  pydantic writes them: IP addresses, networks and interfaces and fractions as their
  text, a compiled pattern as its pattern, a complex number as ``"1+2j"``.

What none of these can write raises :class:`_Unencodable`; in an event the codec puts
an *unencodable marker* (:func:`unencodable_marker`) in its place.
"""

from __future__ import annotations

import hashlib
import re
import reprlib
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

import msgspec

__all__ = [
    "MARKER_KEY",
    "MAX_NOTES",
    "MAX_REPR",
    "OVERSIZED",
    "UNENCODABLE",
    "oversized_stub",
    "unencodable_marker",
]

#: The key that marks an object flightlog wrote in place of a value (its value names
#: the kind of marker).
MARKER_KEY: Final = "$flightlog"
#: The marker kind of a value that could not be encoded.
UNENCODABLE: Final = "unencodable"
#: The marker kind of an event larger than the daemon accepts.
OVERSIZED: Final = "oversized"
#: An unencodable marker's ``repr`` holds at most this many characters.
MAX_REPR: Final = 200

_CLASS_KEY: Final = "$class"
_json_encoder: Final = msgspec.json.Encoder()

Lower = Callable[[Any], Any]
Converter = Callable[[Any, Lower], Any]


class _Unencodable(Exception):
    """A value the codec cannot write; the reason says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _unencodable(exc: BaseException) -> _Unencodable:
    return _Unencodable(f"{type(exc).__name__}: {exc}")


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# --- markers ----------------------------------------------------------------------------

_repr: Final = reprlib.Repr()
_repr.maxstring = MAX_REPR
_repr.maxother = MAX_REPR
_repr.maxlevel = 3


def bounded_repr(obj: Any) -> str:
    """``repr(obj)``, at most :data:`MAX_REPR` characters, never raising."""
    try:
        text = _repr.repr(obj)
    except Exception as exc:
        text = f"<{_class_name(type(obj))} object; repr() raised {type(exc).__name__}>"
    if len(text) > MAX_REPR:
        text = text[: MAX_REPR - 3] + "..."
    # A repr may hold lone surrogates, which JSON cannot carry.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def unencodable_marker(obj: Any, error: str) -> dict[str, str]:
    """The object written in place of ``obj``, which cannot be encoded because of ``error``."""
    return {
        MARKER_KEY: UNENCODABLE,
        "class": _class_name(type(obj)),
        "repr": bounded_repr(obj),
        "error": error.encode("utf-8", "backslashreplace").decode("utf-8")[:MAX_REPR],
    }


#: An event's ``markers`` name at most this many markers, then say how many more.
MAX_NOTES: Final = 8


class _Walk:
    """One lowering of an event: the ids of the objects being walked (for cycles), and
    what it wrote markers for."""

    __slots__ = ("active", "count", "field", "markers")

    #: Whether an unencodable value is marked (else it is refused whole).
    marking = True

    def __init__(self) -> None:
        self.active: set[int] = set()
        #: How many markers were written; the first :data:`MAX_NOTES` are named.
        self.count = 0
        #: The event's member being lowered.
        self.field = "data"
        self.markers: list[str] = []

    def mark(self, obj: Any, reason: str) -> dict[str, str]:
        marker = unencodable_marker(obj, reason)
        self.count += 1
        if len(self.markers) < MAX_NOTES:
            self.markers.append(f"{self.field}: {marker['class']} ({marker['error']})")
        return marker

    def notes(self) -> tuple[str, ...]:
        more = self.count - len(self.markers)
        return (*self.markers, f"and {more} more") if more else tuple(self.markers)


class _SnapshotWalk(_Walk):
    """One lowering of a snapshot: an unencodable value is refused whole, never marked (a
    checkpoint is restored, and a marker restored in place of a value would be wrong
    silently)."""

    __slots__ = ()
    marking = False


def oversized_stub(
    data: bytes, fields: dict[str, Any], *, required: frozenset[str], limit: int
) -> tuple[dict[str, Any], list[str]]:
    """The data of the stub of an event whose ``data`` (``fields``, decoded) is too large
    for a frame of ``limit`` bytes, and the members it leaves out (see
    :meth:`Codec.oversized`)."""
    bound = max(64, min(4096, limit // 32))
    kept: dict[str, Any] = {}
    omitted: list[str] = []
    for key, value in fields.items():
        if len(_json_encoder.encode(value)) <= bound:
            kept[key] = value
            continue
        omitted.append(key)
        if key in required:
            kept[key] = value[: bound // 2] if isinstance(value, str) else None
    stub = {
        MARKER_KEY: OVERSIZED,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "omitted": omitted,
        **kept,
    }
    return stub, omitted


# --- conversions ------------------------------------------------------------------------


def _pydantic(obj: Any, lower: Lower) -> Any:
    core = sys.modules.get("pydantic_core")
    if core is None:  # its class exists, so pydantic-core was loaded: never here
        raise _Unencodable("pydantic_core is not loaded")
    cls = type(obj)
    # A model's own serializer, as model_dump_json() uses it: aliases as its config asks
    # (to_jsonable_python would write them always).
    serializer = getattr(cls, "__pydantic_serializer__", None)
    try:
        if serializer is not None:
            out = serializer.to_python(obj, mode="json", fallback=lower)
        else:
            out = core.to_jsonable_python(obj, fallback=lower)
    except _Unencodable:
        raise
    except Exception as exc:
        raise _unencodable(exc) from None
    if isinstance(out, dict) and serializer is not None:
        return {_CLASS_KEY: _class_name(cls), **out}
    return out


def _numpy(obj: Any, lower: Lower) -> Any:
    tolist = getattr(obj, "tolist", None)
    dtype = getattr(obj, "dtype", None)
    if tolist is None or dtype is None:
        raise _Unencodable(f"{_class_name(type(obj))} has no JSON form")
    if dtype.kind in "mM":  # datetime64, timedelta64: tolist() gives ints at ns resolution
        return lower(obj.astype(str).tolist())
    return lower(tolist())


def _pandas(obj: Any, lower: Lower) -> Any:
    pd = sys.modules.get("pandas")
    if pd is None:  # never here: see _pydantic
        raise _Unencodable("pandas is not loaded")
    if obj is pd.NaT or obj is pd.NA:
        return None
    if isinstance(obj, pd.DataFrame):
        split = obj.to_dict(orient="split")
        return {
            _CLASS_KEY: _class_name(type(obj)),
            "columns": lower(split["columns"]),
            "index": lower(split["index"]),
            "data": lower(split["data"]),
        }
    if isinstance(obj, pd.Series):
        return {
            _CLASS_KEY: _class_name(type(obj)),
            "name": lower(obj.name),
            "index": lower(obj.index.tolist()),
            "data": lower(obj.tolist()),
        }
    if isinstance(obj, pd.Timestamp):
        return obj.isoformat() if obj.nanosecond else lower(obj.to_pydatetime())
    if isinstance(obj, pd.Timedelta):
        return obj.isoformat() if obj.nanoseconds else lower(obj.to_pytimedelta())
    if isinstance(obj, pd.Period | pd.Interval):
        return str(obj)  # "2026-01", "(0, 1]"
    tolist = getattr(obj, "tolist", None)
    if tolist is not None:  # an Index, a Categorical, an extension array
        return lower(tolist())
    raise _Unencodable(f"{_class_name(type(obj))} has no JSON form")


def _as_text(obj: Any, lower: Lower) -> str:
    return str(obj)


def _pattern(obj: Any, lower: Lower) -> Any:
    if not isinstance(obj, re.Pattern):
        raise _Unencodable(f"{_class_name(type(obj))} has no JSON form")
    return lower(obj.pattern)


def _float_text(x: float) -> str:
    # How pydantic-core (Rust's Display) writes a float: no exponent, no ".0".
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    text = format(Decimal(repr(x)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def complex_text(z: complex) -> str:
    """``z`` as pydantic writes a complex number: ``"1+2j"``, ``"1j"``, ``"1.5-2j"``."""
    text = f"{_float_text(z.imag)}j"
    if z.real != 0.0:
        text = f"{_float_text(z.real)}{'+' if z.imag >= 0.0 else ''}{text}"
    return text


def _complex(obj: Any, lower: Lower) -> str:
    return complex_text(complex(obj))


# By the top-level module of a class or one of its bases.
_BY_MODULE: Final[dict[str, Converter]] = {
    "pydantic": _pydantic,
    "pydantic_core": _pydantic,
    "numpy": _numpy,
    "pandas": _pandas,
    "ipaddress": _as_text,
    "fractions": _as_text,
    "re": _pattern,
}


_CONVERTERS: Final[dict[type, Converter | None]] = {}


def _converter_by_module(cls: type) -> Converter | None:
    # A pydantic dataclass is of its own module only, but carries its serializer.
    try:
        serializer = getattr(cls, "__pydantic_serializer__", None)
    except Exception:  # a metaclass's __getattr__ may raise anything
        serializer = None
    if serializer is not None:
        return _pydantic
    for base in cls.__mro__:
        found = _BY_MODULE.get(str(getattr(base, "__module__", "")).partition(".")[0])
        if found is not None:
            return found
    return _complex if issubclass(cls, complex) else None


def converter_of(cls: type) -> Converter | None:
    """How objects of ``cls`` are lowered, or None when this module does not know."""
    try:
        return _CONVERTERS[cls]
    except KeyError:
        pass
    found = _converter_by_module(cls)
    if len(_CONVERTERS) < 4096:  # classes made on the fly must not grow it without end
        _CONVERTERS[cls] = found
    return found
