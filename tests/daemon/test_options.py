"""flightlogd's command line: every value is checked (a usage error, status 2), --help
names every default, --version says which flightlogd this is."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version

import pytest

from flightlog.daemon.__main__ import parse_args


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-connections", "-3"),
        ("--max-connections", "0"),
        ("--max-connections", "many"),
        ("--max-open-files", "0"),
        ("--max-open-files", "-1"),
        ("--max-open-files", "1.5"),
        ("--max-frame-size", "10"),
        ("--max-frame-size", "4095"),
        ("--max-frame-size", str((1 << 30) + 1)),
        ("--max-frame-size", "16M"),
    ],
)
def test_an_integer_option_out_of_its_range_is_a_usage_error(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _usage_error([option, value], capsys)
    assert f"argument {option}: {value!r} is not a whole number" in err


@pytest.mark.parametrize("value", ["999", "8", "-1", "1000", "rw"])
def test_a_socket_mode_that_is_no_octal_mode_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _usage_error(["--socket-mode", value], capsys)
    assert f"argument --socket-mode: {value!r} is not an octal file mode" in err


def test_values_at_the_ends_of_each_range_are_taken() -> None:
    args = parse_args(
        ["--max-connections", "1", "--max-open-files", "1", "--max-frame-size", "4096"]
    )
    assert (args.max_connections, args.max_open_files, args.max_frame_size) == (1, 1, 4096)
    assert parse_args(["--max-frame-size", str(1 << 30), "--socket-mode", "0777"]).max_frame_size
    assert parse_args(["--socket-mode", "0660"]).socket_mode == 0o660
    assert parse_args(["--socket-mode", "0"]).socket_mode == 0


def test_help_names_the_default_of_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    options = text.split("options:", 1)[1].split("examples:", 1)[0]
    entries = re.split(r" (?=--[a-z])", options)
    named = [entry.split()[0] for entry in entries if entry.startswith("--")]
    assert {"--socket", "--root", "--max-frame-size", "--shutdown-grace", "--log-level"} <= set(
        named
    )
    for entry in entries:
        if entry.startswith("--") and not entry.startswith(("--help", "--version")):
            assert "(default: " in entry, entry


def test_version_names_the_installed_distribution() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flightlog.daemon", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"flightlogd {version('flightlogd')}\n"
