"""The distributions as a user gets them: built with ``uv build``, installed with the
commands docs/operations.md and docs/sdk.md give, into environments outside the
workspace, and run from there: the installed ``flightlogd``, an agent recording through
the installed SDK, the installed ``flightlog tail``, ``show`` and ``check``.  And the
README's quick start, ``uv run flightlog demo``, into a fresh environment of the
workspace: it installs what running flightlog needs and nothing the tests need.

The third-party dependencies come from PyPI (or uv's cache); flightlog's own come only
from the wheels built here.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

from flightlog.sdk import check
from support import DaemonProcess, wait_for

WORKSPACE = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = ("flightlog-protocol", "flightlog-sdk", "flightlogd")

AGENT = """\
import sys
from flightlog.protocol import events
from flightlog.sdk import connect

with connect() as client:
    session = client.create("installed/agent.jsonl", meta={"app": "install-test"})
    with session.begin_run() as run:
        run.record(events.AgentStart(agent="installed"))
        run.save_checkpoint({"step": 1})
        run.record(events.AgentEnd(ok=True, reason="completed"))
    session.close()
print(sys.modules["flightlog.sdk"].__file__)
print("\\n".join(sys.path))
"""


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is needed to build and install (the README says how to get it)"
    return uv


class Outside:
    """A directory outside the workspace, and an environment that knows nothing of it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("VIRTUAL_ENV", "UV_", "PYTHON", "FLIGHTLOG_"))
        }
        self.env["UV_TOOL_DIR"] = str(base / "tools")
        self.env["UV_TOOL_BIN_DIR"] = str(base / "bin")
        self.env["PATH"] = f"{base / 'bin'}:{self.env.get('PATH', '/usr/bin:/bin')}"
        self.env["NO_COLOR"] = "1"

    def run(self, *command: str | Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(part) for part in command],
            cwd=self.base,
            env={**self.env, **extra_env},
            capture_output=True,
            text=True,
            timeout=300,
        )


@pytest.fixture(scope="module")
def outside() -> Iterator[Outside]:
    base = Path(tempfile.mkdtemp(prefix="fl-install-", dir="/tmp"))
    assert not base.is_relative_to(WORKSPACE)
    try:
        yield Outside(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


class Built:
    """A distribution's wheel and sdist."""

    def __init__(self, out: Path, name: str) -> None:
        stem = name.replace("-", "_")
        (self.wheel,) = out.glob(f"{stem}-*.whl")
        (self.sdist,) = out.glob(f"{stem}-*.tar.gz")


@pytest.fixture(scope="module")
def dist(outside: Outside) -> dict[str, Built]:
    """Every distribution's wheel and sdist, built as docs/operations.md says."""
    out = outside.base / "dist"
    built = subprocess.run(
        [_uv(), "build", "--all-packages", "--out-dir", str(out)],
        cwd=WORKSPACE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    return {name: Built(out, name) for name in DISTRIBUTIONS}


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_each_distribution_has_complete_metadata(dist: dict[str, Built], name: str) -> None:
    with zipfile.ZipFile(dist[name].wheel) as wheel:
        (metadata_name,) = (n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
        licenses = [n for n in wheel.namelist() if "/licenses/" in n]
    assert metadata["Name"] == name
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["License-Expression"] == "MIT"
    assert metadata["License-File"] == "LICENSE" and licenses
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().startswith(f"# {name}\n")
    assert metadata["Summary"] and metadata["Keywords"]
    classifiers = metadata.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers
    with tarfile.open(dist[name].sdist) as sdist:
        # Every member is under one top directory, NAME-VERSION/.
        members = {member.partition("/")[2] for member in sdist.getnames()}
    assert {"LICENSE", "README.md", "pyproject.toml", "PKG-INFO"} <= members
    assert any(member.endswith("/py.typed") for member in members)


def test_an_operator_and_an_agent_install_and_use_flightlog(
    dist: dict[str, Built], outside: Outside
) -> None:
    uv = _uv()
    # The operator: the daemon and the `flightlog` command, as a uv tool, from the wheels.
    tool = outside.run(
        uv,
        "tool",
        "install",
        dist["flightlogd"].wheel,
        "--with",
        dist["flightlog-sdk"].wheel,
        "--with",
        dist["flightlog-protocol"].wheel,
        "--with-executables-from",
        "flightlog-sdk",
    )
    assert tool.returncode == 0, tool.stderr
    bin_dir = outside.base / "bin"
    assert {"flightlog", "flightlogd"} <= {path.name for path in bin_dir.iterdir()}
    for program, distribution in (("flightlogd", "flightlogd"), ("flightlog", "flightlog-sdk")):
        shown = outside.run(bin_dir / program, "--version")
        assert shown.stdout == f"{program} 0.1.0\n", (distribution, shown.stderr)

    # The agent: the SDK alone, in its own virtual environment.
    venv = outside.base / "agent"
    made = outside.run(uv, "venv", "--python", sys.executable, venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = outside.run(
        uv,
        "pip",
        "install",
        "--python",
        python,
        dist["flightlog-sdk"].wheel,
        dist["flightlog-protocol"].wheel,
    )
    assert installed.returncode == 0, installed.stderr
    listed = outside.run(uv, "pip", "list", "--python", python)
    assert "flightlog-sdk" in listed.stdout
    assert not {"flightlogd", "uvloop", "structlog"} & set(listed.stdout.split())

    # Without a daemon installed, the demo says how to install one, as operations.md does.
    no_daemon = outside.run(
        venv / "bin" / "flightlog",
        "demo",
        "--fast",
        FLIGHTLOG_SOCKET=str(outside.base / "none.sock"),
        PATH="/usr/bin:/bin",
    )
    assert no_daemon.returncode == 4
    assert f"`{_checkout_install_command()}`" in no_daemon.stderr

    daemon = DaemonProcess(
        outside.base / "d", "--log-format", "json", program=[str(bin_dir / "flightlogd")]
    )
    daemon.env = outside.env  # not the workspace's
    daemon.start()
    try:
        env = {"FLIGHTLOG_SOCKET": daemon.socket, "FLIGHTLOG_ROOT": str(daemon.root)}
        agent = outside.run(python, "-c", AGENT, **env)
        assert agent.returncode == 0, agent.stderr
        module, *search_path = agent.stdout.splitlines()
        assert Path(module).is_relative_to(venv)
        assert not any(
            entry and Path(entry).resolve().is_relative_to(WORKSPACE) for entry in search_path
        )

        path = "installed/agent.jsonl"
        tail = outside.run(bin_dir / "flightlog", "tail", path, **env)
        assert tail.returncode == 0, tail.stderr
        types = [line.split()[2] for line in tail.stdout.splitlines() if not line.startswith("--")]
        assert types == [
            "session_start",
            "run_start",
            "agent_start",
            "checkpoint",
            "agent_end",
            "run_close",
        ]
        show = outside.run(bin_dir / "flightlog", "show", path, **env)
        assert show.returncode == 0, show.stderr
        assert "installed" in show.stdout
        check = outside.run(bin_dir / "flightlog", "check", path, **env)
        assert check.returncode == 0, check.stderr
        assert "sound, 6 records (last seq 6), 1 run, 1 checkpoint" in check.stdout
        status = outside.run(bin_dir / "flightlog", "status", **env)
        assert status.returncode == 0, status.stderr
        assert f"pid {daemon.pid}" in status.stdout
    finally:
        daemon.stop()


def _checkout_install_command() -> str:
    """The per-user install from a checkout, as docs/operations.md gives it."""
    text = (WORKSPACE / "docs" / "operations.md").read_text()
    (line,) = (line for line in text.splitlines() if line.startswith("uv tool install ./"))
    return line.split("#")[0].strip()


def test_the_documented_install_from_a_checkout(outside: Outside) -> None:
    command = shlex.split(_checkout_install_command())
    tools = outside.base / "checkout-tools"
    installed = subprocess.run(
        [_uv(), *command[1:]],
        cwd=WORKSPACE,
        env={**outside.env, "UV_TOOL_DIR": str(tools), "UV_TOOL_BIN_DIR": str(tools / "bin")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    for program in ("flightlogd", "flightlog"):
        shown = outside.run(tools / "bin" / program, "--version")
        assert shown.stdout == f"{program} 0.1.0\n", shown.stderr


#: At most this many distributions for the quick start (the three of flightlog included).
FIRST_RUN_PACKAGES = 30
#: Test-only tools and test backends that the quick start must not install.
TEST_ONLY = {"pytest", "hypothesis", "mypy", "ruff", "arize-phoenix", "pydantic-ai", "langchain"}


def _readme_demo_command() -> list[str]:
    """The README's quick start command, after its `pip install uv &&`."""
    text = (WORKSPACE / "README.md").read_text()
    (line,) = (line for line in text.splitlines() if line.endswith(" flightlog demo"))
    command = shlex.split(line.split("&&")[-1])
    assert command[:2] == ["uv", "run"], line
    return command


def test_the_quick_start_installs_only_what_running_flightlog_needs(outside: Outside) -> None:
    uv, _, *rest = _readme_demo_command()
    base = outside.base / "first-run"
    env = {
        "UV_PROJECT_ENVIRONMENT": str(base / "venv"),  # a fresh environment, not .venv
        "FLIGHTLOG_SOCKET": str(base / "run" / "flightlog.sock"),
        "FLIGHTLOG_ROOT": str(base / "root"),
    }
    # The README's command as written (--frozen: the lock is the checkout's, untouched).
    demo = subprocess.run(
        [_uv(), "run", "--frozen", *rest, "--fast"],
        cwd=WORKSPACE,
        env={**outside.env, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert demo.returncode == 0, demo.stderr
        assert "started flightlogd" in demo.stderr
        listed = outside.run(uv, "pip", "list", "--python", base / "venv" / "bin" / "python")
        assert listed.returncode == 0, listed.stderr
        names = {line.split()[0] for line in listed.stdout.splitlines()[2:]}
        assert {"flightlog-protocol", "flightlog-sdk", "flightlogd"} <= names
        assert len(names) <= FIRST_RUN_PACKAGES, sorted(names)
        assert not names & TEST_ONLY
        report = check(base / "root" / "demo" / "session.jsonl")
        assert report.sound, report.error
    finally:
        _stop_the_demos_daemon(base / "venv" / "bin" / "flightlog", env)


def _stop_the_demos_daemon(flightlog: Path, env: dict[str, str]) -> None:
    """SIGTERM the daemon the demo left running (as the README says), and wait for it."""
    status = subprocess.run(
        [str(flightlog), "status", "--json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if status.returncode != 0:
        return  # none running
    pid = json.loads(status.stdout)["pid"]
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: _exited(pid), timeout=30)


def _exited(pid: int) -> bool:
    """Whether ``pid`` is gone, or a zombie its new parent has yet to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"
