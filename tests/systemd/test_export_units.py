"""The exporter's units beside the daemon's: systemd verifies them, and they say what
docs/export.md says (same user, data root read-only, cursors in their own state
directory, the standard OTLP variables from an environment file)."""

from __future__ import annotations

import os
from pathlib import Path

from test_units import (
    SYSTEM,
    USER,
    analyze,
    complaints,
    needs_systemd_analyze,
    settings,
    stub_executable,
    user_environment,
)

SYSTEM_EXEC = "/usr/bin/flightlog"
UNIT = "flightlog-export.service"


@needs_systemd_analyze
def test_system_export_unit_verifies(tmp_path: Path) -> None:
    stub = stub_executable(tmp_path / "bin" / "flightlog")
    unit = tmp_path / UNIT
    unit.write_text((SYSTEM / UNIT).read_text().replace(SYSTEM_EXEC, os.fspath(stub)))
    result = analyze("verify", os.fspath(unit))
    assert result.returncode == 0, result.stderr
    assert complaints(result) == []


@needs_systemd_analyze
def test_system_export_unit_does_not_verify_with_a_missing_binary(tmp_path: Path) -> None:
    unit = tmp_path / UNIT
    missing = tmp_path / "nowhere" / "flightlog"
    unit.write_text((SYSTEM / UNIT).read_text().replace(SYSTEM_EXEC, os.fspath(missing)))
    result = analyze("verify", os.fspath(unit))
    assert result.returncode != 0
    assert "not executable" in result.stderr


@needs_systemd_analyze
def test_user_export_unit_verifies_as_written(tmp_path: Path) -> None:
    env = user_environment(tmp_path)
    stub_executable(Path(env["HOME"]) / ".local" / "bin" / "flightlog")
    result = analyze("--user", "verify", os.fspath(USER / UNIT), env=env)
    assert result.returncode == 0, result.stderr
    assert complaints(result) == []


def test_system_export_unit_matches_the_daemon() -> None:
    daemon = settings(SYSTEM / "flightlogd.service")
    export = settings(SYSTEM / UNIT)
    assert export["User"] == daemon["User"] and export["Group"] == daemon["Group"]
    root = daemon["ExecStart"][0].split()[daemon["ExecStart"][0].split().index("--root") + 1]
    exec_start = export["ExecStart"][0].split()
    assert exec_start[:3] == [SYSTEM_EXEC, "export", "--follow"]
    assert exec_start[exec_start.index("--root") + 1] == root
    assert exec_start[exec_start.index("--socket") + 1] == "/run/flightlog/flightlog.sock"
    assert export["ReadOnlyPaths"] == [root]
    assert "ReadWritePaths" not in export
    # Its cursors: $STATE_DIRECTORY, which flightlog export uses by default.
    assert export["StateDirectory"] == ["flightlog-export"]
    assert export["EnvironmentFile"] == ["-/etc/flightlog/export.env"]
    assert "130" in export["SuccessExitStatus"][0].split()
    assert "AF_INET" in export["RestrictAddressFamilies"][0].split()


def test_user_export_unit_matches_the_daemon() -> None:
    daemon = settings(USER / "flightlogd.service")
    export = settings(USER / UNIT)
    root = daemon["ExecStart"][0].split()[daemon["ExecStart"][0].split().index("--root") + 1]
    exec_start = export["ExecStart"][0].split()
    assert exec_start[:3] == ["%h/.local/bin/flightlog", "export", "--follow"]
    assert exec_start[exec_start.index("--root") + 1] == root
    assert "--socket" not in exec_start  # the default socket is flightlogd.socket's
    assert export["StateDirectory"] == ["flightlog-export"]
    assert export["EnvironmentFile"] == ["-%E/flightlog/export.env"]
