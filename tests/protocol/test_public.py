"""flightlog.protocol's public face: a narrow top level, three namespaces for the rest,
and a CLI that uses only the SDK's public names."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import flightlog.protocol as protocol
from flightlog.protocol import events, format, ring, wire

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "sdk" / "src" / "flightlog" / "cli"
SPACES = {"events": events, "wire": wire, "format": format, "ring": ring}


def test_the_top_level_names_what_agents_and_readers_use() -> None:
    names = set(protocol.__all__)
    assert len(names) <= 45
    # Events, records, the codec, the reader, the errors.
    assert {"events", "Event", "Execution", "Record", "RUN_START", "default_codec"} <= names
    assert {"Reader", "read_records", "check", "CheckReport"} <= names
    assert {"FlightlogError", "FileFormatError", "RecordingError", "ErrorCode"} <= names
    # Daemon and wire internals are not at the top level.
    assert not names & {"RecordLines", "FenceLock", "check_run_start", "ServerConnection"}


@pytest.mark.parametrize("space", sorted(SPACES))
def test_every_name_of_a_namespace_is_there_and_lives_in_one_place(space: str) -> None:
    module = SPACES[space]
    for name in module.__all__:
        assert getattr(module, name) is not None
    for other, elsewhere in SPACES.items():
        if other != space:
            shared = set(module.__all__) & set(elsewhere.__all__)
            assert not shared - set(protocol.__all__), (space, other, shared)
    if space != "events":
        assert not set(module.__all__) & set(protocol.__all__)


#: The SDK's public modules: the client (and its async twin), the storage and search
#: namespaces the CLI shares with flightlogd and with the SDK's own readers.
PUBLIC_SDK = ("flightlog.sdk", "flightlog.sdk.aio", "flightlog.sdk.search", "flightlog.sdk.storage")


def test_the_cli_uses_only_public_sdk_names() -> None:
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                module = node.module
                if module.startswith("flightlog.sdk"):
                    assert module in PUBLIC_SDK, (path.name, module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("flightlog.sdk._"), (path.name, alias.name)


#: The namespaces that import their modules when a name is first used (``_lazy``).
LAZY = {"protocol": protocol, "wire": wire, "format": format}


def _typed_imports(module: object) -> dict[str, str]:
    """What ``module`` imports under ``TYPE_CHECKING`` (what mypy sees): each name and
    the module of the package it comes from."""
    tree = ast.parse(Path(str(getattr(module, "__file__", ""))).read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom), ast.unparse(statement)
                for alias in statement.names:
                    # `Name as Name`: the form that re-exports under mypy --strict.
                    assert alias.asname == alias.name, ast.unparse(statement)
                    found[alias.name] = statement.module or alias.name
    return found


@pytest.mark.parametrize("space", sorted(LAZY))
def test_a_lazy_namespace_hands_out_what_type_checkers_see(space: str) -> None:
    module = LAZY[space]
    typed = _typed_imports(module)
    assert sorted(typed) == module.__all__
    for name, source in typed.items():
        loaded = importlib.import_module(f"flightlog.protocol.{source}")
        expected = loaded if source == name else getattr(loaded, name)
        assert getattr(module, name) is expected, (space, name)
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        getattr(module, "no_such_name")  # noqa: B009


def _fresh(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


def test_a_name_imports_only_its_own_modules() -> None:
    # In a fresh interpreter: importing the package imports none of its modules, and a
    # reader of files does not import the codec, the events, the wire's connections or
    # the run ledger.
    code = (
        "import sys\n"
        "def loaded(): return sorted(m for m in sys.modules if m.startswith('flightlog.'))\n"
        "import flightlog.protocol\n"
        "print(loaded())\n"
        "from flightlog.protocol import Reader, Record, FileFormatError\n"
        "from flightlog.protocol.format import parse_line, encode_line\n"
        "from flightlog.protocol.wire import default_root\n"
        "print(loaded())\n"
    )
    package, reader = (line.split("'")[1::2] for line in _fresh(code).splitlines())
    assert package == ["flightlog.protocol", "flightlog.protocol._lazy"]
    heavy = {"_codec", "_events", "_client", "_server", "_ledger", "_check", "_framing"}
    assert not {name.rpartition(".")[2] for name in reader} & heavy, reader
    assert {"flightlog.protocol._reader", "flightlog.protocol._lines"} <= set(reader)


def test_star_import_takes_every_name() -> None:
    code = (
        "import flightlog.protocol as protocol\n"
        "namespace = {}\n"
        "exec('from flightlog.protocol.wire import *', namespace)\n"
        "from flightlog.protocol.wire import __all__ as names\n"
        "print(sorted(set(names) - set(namespace)), len(names))\n"
    )
    missing, count = _fresh(code).rsplit(" ", 1)
    assert missing == "[]"
    assert int(count) > 50
