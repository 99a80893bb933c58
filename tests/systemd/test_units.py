"""The unit files in systemd/: systemd itself verifies them and rates their hardening.

``systemd-analyze verify`` refuses a unit whose ExecStart binary does not exist, and
flightlogd is not installed where the units expect it. So the system units are verified
from a temporary copy whose ExecStart points at a stub executable, and the user units
verbatim, with $HOME pointing at a directory that holds ``.local/bin/flightlogd``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "systemd"
SYSTEM = UNITS / "system"
USER = UNITS / "user"
SYSTEM_EXEC = "/usr/bin/flightlogd"
MAX_EXPOSURE = 2.0

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (systemd is not here)"
)


def analyze(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def stub_executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def complaints(result: subprocess.CompletedProcess[str]) -> list[str]:
    # verify exits 0 on warnings such as an unknown key; every line about our units counts.
    output = (result.stdout + result.stderr).splitlines()
    return [line for line in output if "flightlog" in line]


def settings(unit: Path) -> dict[str, list[str]]:
    """``Key=value`` assignments of a unit file, every value of repeated keys in order."""
    found: dict[str, list[str]] = {}
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        found.setdefault(key.strip(), []).append(value.strip())
    return found


def user_environment(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    stub_executable(home / ".local" / "bin" / "flightlogd")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    return dict(os.environ, HOME=os.fspath(home), XDG_RUNTIME_DIR=os.fspath(runtime))


# --------------------------------------------------------------------------- verify


@needs_systemd_analyze
def test_system_units_verify(tmp_path: Path) -> None:
    stub = stub_executable(tmp_path / "bin" / "flightlogd")
    units = tmp_path / "units"
    units.mkdir()
    for name in ("flightlogd.socket", "flightlogd.service"):
        text = (SYSTEM / name).read_text()
        (units / name).write_text(text.replace(SYSTEM_EXEC, os.fspath(stub)))
    result = analyze(
        "verify", os.fspath(units / "flightlogd.socket"), os.fspath(units / "flightlogd.service")
    )
    assert result.returncode == 0, result.stderr
    assert complaints(result) == []


@needs_systemd_analyze
def test_system_units_do_not_verify_with_a_missing_binary(tmp_path: Path) -> None:
    # The check above is not vacuous: verify does look at ExecStart.
    units = tmp_path / "units"
    units.mkdir()
    text = (SYSTEM / "flightlogd.service").read_text()
    missing = tmp_path / "nowhere" / "flightlogd"
    (units / "flightlogd.service").write_text(text.replace(SYSTEM_EXEC, os.fspath(missing)))
    shutil.copy(SYSTEM / "flightlogd.socket", units / "flightlogd.socket")
    result = analyze(
        "verify", os.fspath(units / "flightlogd.socket"), os.fspath(units / "flightlogd.service")
    )
    assert result.returncode != 0
    assert "not executable" in result.stderr


@needs_systemd_analyze
def test_verify_reports_an_unknown_key(tmp_path: Path) -> None:
    # ... and complaints() catches what verify only warns about.
    stub = stub_executable(tmp_path / "bin" / "flightlogd")
    text = (SYSTEM / "flightlogd.service").read_text().replace(SYSTEM_EXEC, os.fspath(stub))
    broken = tmp_path / "flightlogd.service"
    broken.write_text(text.replace("NotifyAccess=main", "NotifyAcess=main"))
    result = analyze("verify", os.fspath(broken))
    assert any("NotifyAcess" in line for line in complaints(result))


@needs_systemd_analyze
def test_user_units_verify_as_written(tmp_path: Path) -> None:
    result = analyze(
        "--user",
        "verify",
        os.fspath(USER / "flightlogd.socket"),
        os.fspath(USER / "flightlogd.service"),
        env=user_environment(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert complaints(result) == []


# --------------------------------------------------------------------------- security


def overall_exposure(output: str) -> float:
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", output)
    assert match is not None, output
    return float(match.group(1))


@needs_systemd_analyze
def test_system_service_exposure_is_at_most_two() -> None:
    result = analyze("security", "--offline=yes", os.fspath(SYSTEM / "flightlogd.service"))
    output = result.stdout + result.stderr
    exposure = overall_exposure(output)
    assert exposure <= MAX_EXPOSURE, output


@needs_systemd_analyze
def test_security_threshold_fails_a_service_without_hardening(tmp_path: Path) -> None:
    # --threshold is how systemd-analyze itself enforces a score: it agrees with our parse.
    bare = tmp_path / "bare.service"
    bare.write_text("[Service]\nType=notify\nExecStart=/bin/true\n")
    result = analyze("security", "--offline=yes", "--threshold=20", os.fspath(bare))
    assert overall_exposure(result.stdout + result.stderr) > MAX_EXPOSURE
    ours = analyze(
        "security",
        "--offline=yes",
        f"--threshold={int(MAX_EXPOSURE * 10)}",
        os.fspath(SYSTEM / "flightlogd.service"),
    )
    assert ours.returncode == 0, ours.stdout + ours.stderr
    assert result.returncode != 0


# --------------------------------------------------------------------------- contract


def test_system_units_match_the_contract() -> None:
    socket_unit = settings(SYSTEM / "flightlogd.socket")
    assert socket_unit["ListenStream"] == ["/run/flightlog/flightlog.sock"]
    assert socket_unit["SocketGroup"] == ["flightlog"]
    assert socket_unit["SocketMode"] == ["0660"]
    service = settings(SYSTEM / "flightlogd.service")
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert service["WatchdogSec"] == ["30"]
    assert service["User"] == ["flightlog"]
    assert service["DynamicUser"] == ["no"]
    assert service["StateDirectory"] == ["flightlog"]
    assert service["RuntimeDirectory"] == ["flightlog"]
    # The socket lives in the runtime directory: it must survive a service restart.
    assert service["RuntimeDirectoryPreserve"] == ["yes"]
    assert service["ReadWritePaths"] == ["/var/lib/flightlog"]
    exec_start = service["ExecStart"][0].split()
    assert exec_start[0] == SYSTEM_EXEC
    assert exec_start[exec_start.index("--root") + 1] == "/var/lib/flightlog"
    assert "--socket" not in exec_start  # activation hands the socket in


def test_user_units_match_the_contract() -> None:
    socket_unit = settings(USER / "flightlogd.socket")
    # The SDK's default: $XDG_RUNTIME_DIR/flightlog/flightlog.sock, only for this user.
    assert socket_unit["ListenStream"] == ["%t/flightlog/flightlog.sock"]
    assert socket_unit["SocketMode"] == ["0600"]
    assert socket_unit["DirectoryMode"] == ["0700"]
    service = settings(USER / "flightlogd.service")
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert service["WatchdogSec"] == ["30"]
    assert service["ExecStart"] == ["%h/.local/bin/flightlogd --root %S/flightlog"]
    assert "User" not in service


@pytest.mark.skipif(
    shutil.which("systemd-sysusers") is None, reason="systemd-sysusers is not installed"
)
def test_sysusers_file_creates_the_flightlog_user_and_group(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    result = subprocess.run(
        ["systemd-sysusers", f"--root={tmp_path}", os.fspath(SYSTEM / "flightlog.sysusers.conf")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    users = {
        line.split(":")[0]: line.split(":")
        for line in (tmp_path / "etc" / "passwd").read_text().splitlines()
    }
    groups = {
        line.split(":")[0]: line.split(":")
        for line in (tmp_path / "etc" / "group").read_text().splitlines()
    }
    assert users["flightlog"][3] == groups["flightlog"][2]  # primary group flightlog
    assert users["flightlog"][5] == "/var/lib/flightlog"
    assert int(users["flightlog"][2]) < 1000  # a system user
