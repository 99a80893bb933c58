"""flightlog.protocol is sans-I/O: it imports nothing that touches sockets, files or loops."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "protocol" / "src" / "flightlog" / "protocol"
MODULES = sorted(SOURCE.glob("*.py"))

FORBIDDEN = {
    "socket",
    "os",
    "io",
    "asyncio",
    "anyio",
    "subprocess",
    "threading",
    "selectors",
    "pathlib",
    "shutil",
    "tempfile",
    "fcntl",
    "mmap",
    "signal",
    "multiprocessing",
    "concurrent",
    "trio",
    "importlib",
    "builtins",
}

# The stdlib modules that do no I/O, and msgspec.
ALLOWED = {
    "__future__",
    "abc",
    "base64",
    "binascii",
    "collections",
    "contextlib",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "functools",
    "hashlib",
    "itertools",
    "math",
    "msgspec",
    "operator",
    "re",
    "reprlib",
    "stat",
    "string",
    "struct",
    # Only sys.modules: a framework's module is looked up there, never imported.
    "sys",
    "types",
    "typing",
    "uuid",
    "zlib",
}

# The one module that imports by name: the namespaces' modules, when a name is first
# used (PEP 562); it names modules of the package only (tests/protocol/test_public.py).
IMPORTS_BY_NAME = {"_lazy.py": {"importlib"}}

# Builtins that do I/O or import behind the import statement's back.
FORBIDDEN_CALLS = {"open", "__import__", "exec", "eval", "input", "print", "compile"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_the_protocol_sources_are_found() -> None:
    names = {path.name for path in MODULES}
    assert {"__init__.py", "_codec.py", "_events.py", "_reader.py", "_records.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_imports_nothing_that_does_io(path: Path) -> None:
    for name in imports_of(path) - IMPORTS_BY_NAME.get(path.name, set()):
        top = name.split(".")[0]
        assert top not in FORBIDDEN, f"{path.name} imports {name}"
        assert top in ALLOWED, f"{path.name} imports {name}, which is not known to be pure"


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_calls_no_io_builtins(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in FORBIDDEN_CALLS, f"{path.name} calls {node.func.id}()"


def test_importing_the_protocol_loads_no_io_modules() -> None:
    # In a fresh interpreter: what the test runner itself imported does not count.
    # Every name of every namespace is looked up: each imports its modules then.
    code = (
        "import sys, flightlog.protocol as p\n"
        "for space in (p, p.events, p.format, p.ring, p.wire):\n"
        "    for name in space.__all__: getattr(space, name)\n"
        "bad = {'socket', 'asyncio', 'anyio', 'selectors', 'subprocess', 'trio'}\n"
        "print(sorted(bad & set(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
