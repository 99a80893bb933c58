"""The names a namespace of :mod:`flightlog.protocol` hands out, each module imported
when one of its names is first used (PEP 562): a program that reads a file does not
pay for the wire's modules, nor one that writes for the reader's.

A namespace (``__init__``, ``wire``, ``format``) maps each of its modules to the names
it takes from it, and binds what :func:`lazy` returns::

    __all__, __getattr__, __dir__ = lazy(__name__, globals(), {"_codec": ("Codec",)})

``from flightlog.protocol import Codec``, ``protocol.Codec`` and ``dir(protocol)`` work
as with plain imports; a name is looked up once, then kept in the namespace.  Type
checkers do not run ``__getattr__``: each namespace repeats its imports under
``TYPE_CHECKING`` (``Name as Name``, which re-exports it), and
``tests/protocol/test_public.py`` holds the two equal.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy"]


def lazy(
    namespace: str,
    scope: dict[str, Any],
    names: Mapping[str, tuple[str, ...]],
    submodules: tuple[str, ...] = (),
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` of the module ``namespace`` (whose
    globals are ``scope``): ``names`` maps a module of this package (``"_codec"``) to
    the names the namespace takes from it; ``submodules`` are modules of the package
    it hands out themselves (``"wire"``)."""
    package = __name__.rpartition(".")[0]
    where = {name: module for module, taken in names.items() for name in taken}
    where.update((module, module) for module in submodules)

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {namespace!r} has no attribute {name!r}")
        loaded = importlib.import_module(f"{package}.{module}")
        value = loaded if name in submodules else getattr(loaded, name)
        scope[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(scope) | set(where))

    return sorted(where), __getattr__, __dir__
