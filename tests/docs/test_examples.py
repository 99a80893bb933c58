"""Every ```python example of README.md, docs/*.md and the packages' READMEs runs as
written, twice (each run a process of its own, forked once the example's imports are
made: :data:`RUN_TWICE`), against a real daemon in a temporary directory; so do the
cheap shell examples of the CLI.

The examples are read from the Markdown here, never copied.  A block that cannot run
alone is marked in the Markdown itself, with the info string ```python fragment, and
listed in FRAGMENTS below; a fragment missing from the list, or listed but no longer
there, fails the test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from flightlog.cli._main import build_parser
from flightlog.sdk import check
from support import DaemonProcess, communicate, run_python

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *(REPO / package / "README.md" for package in ("protocol", "sdk", "daemon")),
]

#: (document, first line) of every block marked ```python fragment.
FRAGMENTS: set[tuple[str, str]] = set()

_BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Block:
    document: str
    line: int
    language: str
    info: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.document}:{self.line}"


def _blocks(language: str) -> list[Block]:
    found = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in _BLOCK.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start()) + 1
                name = path.relative_to(REPO).as_posix()
                found.append(Block(name, line, language, match.group(2).strip(), match.group(3)))
    return found


PYTHON = [block for block in _blocks("python") if block.info != "fragment"]


def test_the_fragments_are_the_listed_ones() -> None:
    marked = {
        (block.document, block.code.splitlines()[0])
        for block in _blocks("python")
        if block.info == "fragment"
    }
    assert marked == FRAGMENTS
    assert len(PYTHON) >= 10  # README's and docs/sdk.md's examples are found


def _env(daemon: DaemonProcess) -> dict[str, str]:
    return {
        "FLIGHTLOG_SOCKET": daemon.socket,
        "FLIGHTLOG_ROOT": str(daemon.root),
        "NO_COLOR": "1",
    }


#: ``python -c RUN_TWICE CODE ERR1 ERR2``: runs CODE as ``python -c CODE`` would, twice,
#: each run in a process of its own forked once the code's leading imports are made
#: (the frameworks' take 1-2 s of CPU, which two fresh Pythons spent each); each run's
#: stderr goes to its file, its stdout nowhere, and its exit status is printed.
RUN_TWICE = """
import ast, os, sys, traceback, types
code, errs = sys.argv[1], sys.argv[2:]
imports = []
for node in ast.parse(code).body:
    if not isinstance(node, (ast.Import, ast.ImportFrom)):
        break
    imports.append(node)
exec(compile(ast.Module(imports, []), "<imports>", "exec"), {"__name__": "__imports__"})
sys.stdout.flush()
sys.stderr.flush()
for err in errs:
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.argv = ["-c"]
        main = sys.modules["__main__"] = types.ModuleType("__main__")  # as python -c's
        try:
            exec(compile(code, "<string>", "exec"), main.__dict__)
        except SystemExit:
            raise
        except BaseException:
            traceback.print_exc()
            sys.exit(1)
        sys.exit(0)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.mark.parametrize("block", PYTHON, ids=[block.id for block in PYTHON])
def test_a_python_example_runs_twice(block: Block, daemon: DaemonProcess, tmp_path: Path) -> None:
    errs = [tmp_path / f"run{attempt}.err" for attempt in (1, 2)]
    # A session of its own: a timeout kills the runs with their parent.
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_TWICE, block.code, *map(str, errs)],
        env={**os.environ, **_env(daemon)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = communicate(proc, timeout=240)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the run, which outlives its parent
        raise
    assert proc.returncode == 0, f"the imports of {block.id}:\n{err.decode()}"
    codes = out.decode().split()
    assert len(codes) == 2, (out, err)
    for attempt, (code, path) in enumerate(zip(codes, errs, strict=True), start=1):
        run_err = path.read_bytes()
        assert code == "0", f"run {attempt} of {block.id}:\n{run_err.decode()}"
        assert b"Traceback" not in run_err
        # An integration reports a recording problem instead of raising it: none here.
        assert b"flightlog could not record" not in run_err, run_err.decode()
    sessions = list(daemon.root.rglob("*.jsonl"))
    for path in sessions:
        report = check(path)
        assert report.sound, (path, report.error)
    if "client.create(" in block.code or "from flightlog.integrations." in block.code:
        assert sessions, "the example recorded nothing"


def _shell(daemon: DaemonProcess, command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with `flightlog` and `flightlogd` being the workspace's."""
    bin_dir = Path(sys.executable).parent
    return subprocess.run(
        ["sh", "-c", command.replace("uv run ", "")],
        env={**os.environ, **_env(daemon), "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_tour_of_docs_cli_md(daemon: DaemonProcess, tmp_path: Path) -> None:
    (tour,) = (
        b
        for b in _blocks("sh")
        if b.document == "docs/cli.md" and b.code.startswith("flightlog demo")
    )
    for line in tour.code.splitlines():
        command = line.split("#")[0].strip()
        if " -f " in f"{command} ":
            continue  # follows until the writer closes: run in tests/cli
        if command.startswith("flightlog export"):
            continue  # needs an OTLP backend and follows: run in tests/export
        if command == "flightlog demo":
            command = "flightlog demo --fast"
        done = _shell(daemon, command, tmp_path)
        assert done.returncode == 0, (command, done.stderr)
        assert done.stdout, command


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed (.ci/run installs it)")
def test_the_readme_stops_the_daemon_the_demo_started(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    (stop,) = (b for b in _blocks("sh") if b.document == "README.md" and "kill" in b.code)
    done = _shell(daemon, stop.code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert daemon.proc is not None
    assert daemon.proc.wait(timeout=30) == 0


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed (.ci/run installs it)")
def test_the_jq_recipes_of_docs_format_md_skip_an_unfinished_tail(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    path = daemon.root / "jq.jsonl"
    recorded = run_python(
        "from flightlog.sdk import connect\n"
        "with connect() as client:\n"
        "    client.create('jq.jsonl', meta={'app': 'jq'}).close()\n",
        env=_env(daemon),
    )
    _, err = communicate(recorded, timeout=60)
    assert recorded.returncode == 0, err.decode()
    complete = path.read_bytes()
    expected = _shell(daemon, f"jq . {path}", tmp_path).stdout
    (recipes,) = (b for b in _blocks("sh") if b.document == "docs/format.md" and "jq" in b.code)
    lines = [line.split("  #")[0].strip() for line in recipes.code.splitlines()]
    assert len(lines) == 2
    # A crash cut the last line short; or it wrote a whole record but not its newline,
    # which readers must ignore too although it parses.
    cut = complete[: len(complete) // 2]
    whole = complete.rstrip(b"\n").replace(b'"seq":1', b'"seq":2')
    for tail in (cut, whole):
        path.write_bytes(complete + tail)
        plain = _shell(daemon, f"jq . {path}", tmp_path)
        assert plain.returncode != 0 or plain.stdout != expected  # what the recipes are for
        for line in lines:
            done = _shell(daemon, line.replace("FILE", str(path)), tmp_path)
            assert done.returncode == 0, (line, done.stderr)
            assert done.stdout == expected, line


def test_the_help_and_upgrade_examples_name_what_the_demo_records(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    demo = _shell(daemon, "flightlog demo --fast --no-start", tmp_path)
    assert demo.returncode == 0, demo.stderr
    help_text = _shell(daemon, "flightlog show --help", tmp_path).stdout
    examples = [line.strip().split("  ")[0] for line in help_text.splitlines()]
    calls = [command for command in examples if " --call " in command]
    assert len(calls) == 4  # two of one call's records, two of its rebuilt prompt
    operations = (REPO / "docs" / "operations.md").read_text().splitlines()
    (verify,) = (line for line in operations if line.startswith("flightlog check "))
    for command in [*calls, verify.split("#")[0].strip()]:
        done = _shell(daemon, command, tmp_path)
        assert done.returncode == 0, (command, done.stderr)


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every ``flightlog`` command and its parser."""
    (commands,) = (
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return dict(commands.choices)


def test_every_command_has_help_examples_and_a_section_in_docs_cli_md() -> None:
    docs = (REPO / "docs" / "cli.md").read_text()
    for name, parser in _commands().items():
        text = parser.format_help()
        assert "\nexamples:\n" in text, name
        examples = text.split("\nexamples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert any(line.strip().startswith(f"flightlog {name}") for line in examples), name
        assert f"### `flightlog {name}" in docs, name


def _shape(line: str, root: str) -> list[str]:
    """The first two words of an output line, its ids, numbers and root made alike."""
    line = line.replace(root, "~/.local/state/flightlog")
    line = re.sub(r"[0-9a-f]{8,}", "ID", line)
    return re.sub(r"\d", "0", line).split()[:2]


def test_every_command_of_the_tour_runs_on_a_real_session_as_shown(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    (tour,) = (
        b
        for b in _blocks("text")
        if b.document == "docs/cli.md" and b.code.startswith("$ flightlog demo --fast")
    )
    lines = tour.code.splitlines()
    steps = [
        (line[2:], lines[index + 1] if index + 1 < len(lines) else "")
        for index, line in enumerate(lines)
        if line.startswith("$ ")
    ]
    shown = {command.split()[1] for command, _ in steps}
    assert shown == set(_commands()) - {"export"}  # export needs a backend: tests/export
    for command, first in steps:
        done = _shell(daemon, command, tmp_path)
        assert done.returncode == 0, (command, done.stderr)
        out = done.stdout.splitlines()
        assert out, command
        assert _shape(out[0], str(daemon.root)) == _shape(first, str(daemon.root)), command
