"""flightlog.protocol's public face: a narrow top level, three namespaces for the rest,
and a CLI that uses only the SDK's public names."""

from __future__ import annotations

import ast
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
