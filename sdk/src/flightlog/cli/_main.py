"""``flightlog``: follow, read, verify and understand session files from the shell.

This module is the command line itself: the parser with its help and examples, and
:func:`run`, the one place where the commands' failures become a message on stderr and
an exit status (:data:`EXIT_CODES`).  The commands are in :mod:`._commands`.

The command uses only the standard library, the SDK and the protocol: it installs with
``flightlog-sdk`` alone.  ``flightlog demo`` is the exception that proves it: it starts
``flightlogd`` as a separate program when one is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn

from flightlog.protocol import FileFormatError, FlightlogError
from flightlog.sdk import (
    ConnectError,
    ConnectionLost,
    DaemonError,
    ErrorCode,
)

from ._exits import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_NO_DAEMON,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNSOUND,
    EXIT_USAGE,
    CommandError,
    installed_version,
)
from ._render import Style, TerminalText, say

__all__ = ["EXIT_CODES", "CommandError", "build_parser", "main", "run"]


def _err(text: str) -> None:
    say(text, sys.stderr)


def _show(args: argparse.Namespace, style: Style) -> int:
    if args.html:
        from ._html import cmd_show_html

        return cmd_show_html(args)
    from ._commands import cmd_show

    return cmd_show(args, style)


_EXIT_HELP: Final = "exit status:\n" + "\n".join(
    f"  {code:<4} {text}" for code, text in EXIT_CODES.items()
)

# -------------------------------------------------------------------------- parser

_DESCRIPTION: Final = """\
Follow, read, verify and understand flightlog session files.

Records come from the daemon's socket (tail, status) or straight from the file
(check; show and inspect when the file is readable, else through the daemon).
A relative PATH is looked up in the current directory, then under the data root.
"""

_MAIN_EPILOG: Final = f"""\
examples:
  flightlog demo                               record a simulated agent session and show it
  flightlog tail -f demo/session.jsonl         follow a session live, like journalctl -f
  flightlog show demo/session.jsonl            its timeline: runs, turns, model and tool calls
  flightlog check ~/.local/state/flightlog/demo/session.jsonl
  flightlog inspect demo/session.jsonl         runs and their gaps
  flightlog status                             what the daemon holds

socket: --socket, else $FLIGHTLOG_SOCKET, else $XDG_RUNTIME_DIR/flightlog/flightlog.sock,
else /tmp/flightlog-$UID/flightlog.sock.  Colour only on a terminal, never with NO_COLOR.
See `flightlog COMMAND --help` for each command.

{_EXIT_HELP}
"""

_TAIL_EPILOG: Final = f"""\
examples:
  flightlog tail demo/session.jsonl                    everything in the file, then exit
  flightlog tail -f demo/session.jsonl                 ... and keep following until the
                                                       writer closes the session (Ctrl-C stops)
  flightlog tail -f --after 120 demo/session.jsonl     from seq 121 on
  flightlog tail --type model_exec_end --type tool_exec_end demo/session.jsonl
  flightlog tail --run 3f2a9c1e demo/session.jsonl     one run (an id or a prefix of one)
  flightlog tail --json demo/session.jsonl | jq .data  raw JSONL, exactly as in the file
  flightlog tail --all                                 every session the daemon writes from now on
  flightlog tail --all --after start --json            every session from its start, then live
  flightlog tail --all --after 5f0c...015:18,9a1b...77e:4   resume where a consumer stopped

Each line: time (UTC), seq, type, [call: kind id#attempt], a short summary.
Without -f the file is read directly when this user may read it, else through the
daemon.  A follow rides through a daemon restart: it goes on where it was once the
daemon is back.  One that stays away longer than --reconnect-grace exits 4: follow
again once it is back.  --run matching no record exits 2.

{_EXIT_HELP}
"""

_SHOW_EPILOG: Final = f"""\
examples:
  flightlog show demo/session.jsonl                        every run
  flightlog show demo/session.jsonl --run 3f2a9c1e         one run (an id or a prefix of one)
  flightlog show demo/session.jsonl --call call_lisbon     every attempt of one call, in full
  flightlog show demo/session.jsonl --call call_lisbon:2   its second attempt only
  flightlog show demo/session.jsonl --call m1 --prompt     the whole prompt model call m1 was sent
  flightlog show demo/session.jsonl --call m1 --prompt --json   that prompt as JSON
  flightlog show --html demo/session.jsonl > run.html      a page to open in a browser

A call with no end record is shown as NO END, never as a success.

{_EXIT_HELP}
"""

_CHECK_EPILOG: Final = f"""\
examples:
  flightlog check session.jsonl
  flightlog check ~/.local/state/flightlog/**/*.jsonl && echo all sound

Verifies every reading rule: line 1 is session_start with a supported format_version,
every complete line parses, has the file's session_id and seq = previous + 1.  An
unfinished last line (no newline) is reported but is not an error: readers ignore it.
Reads the file directly, without the daemon.

{_EXIT_HELP}
"""

_INSPECT_EPILOG: Final = f"""\
examples:
  flightlog inspect demo/session.jsonl
  flightlog inspect crashed.jsonl || echo "something is missing"

For each run: its status (from agent_end, or its model calls), whether it has a
run_close, failed calls and their retries, checkpoints, and its gaps: no run_close,
no agent_end, a tool call with no tool_exec_end, a model call with no model_exec_end.
Starts and ends pair by run, execution id, attempt and kind; a missing end is a gap,
never a success.

{_EXIT_HELP}
"""

_DEMO_EPILOG: Final = f"""\
examples:
  flightlog demo                                   record demo/session.jsonl, then show it
  flightlog tail -f demo/session.jsonl             in a second terminal, while it records
  flightlog demo --fast --path demo/other.jsonl

Starts flightlogd on the default socket and data root when none is running (detached,
its log in <data root>/flightlogd.log).  Each demo adds one run to the session.

{_EXIT_HELP}
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--socket",
        metavar="PATH",
        default=default,
        help="the daemon's socket (default: $FLIGHTLOG_SOCKET or the default socket)",
    )
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default=argparse.SUPPRESS if suppress else "auto",
        help="colour the output: auto (on a terminal, unless NO_COLOR is set), always, never",
    )


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(f"{parser.prog} {installed_version('unknown (not installed)')}\n")
        parser.exit()


def _tail(args: argparse.Namespace, style: Style) -> int:
    from ._commands import cmd_tail
    from ._tail_all import tail_all_after

    if not args.reconnect_grace >= 0:
        raise CommandError("--reconnect-grace takes a number of seconds, 0 or more", EXIT_USAGE)
    # A cursor for --after (SESSION_ID:SEQ pairs) replays every session from it.
    if isinstance(args.after, dict):
        return tail_all_after(args, style, args.after)
    return cmd_tail(args, style)


def _tail_arguments(parser: argparse.ArgumentParser) -> None:
    from flightlog.sdk import DEFAULT_RECONNECT_GRACE

    from ._tail_all import after_value

    parser.add_argument("path", metavar="PATH", nargs="?", help="the session file")
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep following until the session closes"
    )
    parser.add_argument(
        "--after",
        type=after_value,
        default=0,
        metavar="SEQ",
        help="start after this seq (default: 0); with --all, after a CURSOR (docs/cli.md)",
    )
    parser.add_argument(
        "--type",
        action="append",
        metavar="T",
        help="only records of type T (repeatable, or comma-separated)",
    )
    parser.add_argument("--run", metavar="RUN", help="only records of this run (id or prefix)")
    parser.add_argument("--json", action="store_true", help="print raw JSONL lines (for jq)")
    parser.add_argument(
        "--all", action="store_true", help="follow every session the daemon writes from now on"
    )
    parser.add_argument(
        "--reconnect-grace",
        type=float,
        default=DEFAULT_RECONNECT_GRACE,
        metavar="SECONDS",
        help="with -f or --all, how long to wait for a daemon that went away (default: "
        "%(default)g; 0: stop at once)",
    )


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="the session file")
    parser.add_argument("--run", metavar="RUN", help="only this run (id or prefix)")
    parser.add_argument(
        "--call",
        metavar="ID[:ATTEMPT]",
        help="one call's full request and result (every attempt unless ATTEMPT is given)",
    )
    parser.add_argument(
        "--prompt",
        action="store_true",
        help="with --call: the full prompt the model was sent, rebuilt across continues",
    )
    parser.add_argument(
        "--json", action="store_true", help="with --prompt: the prompt as JSON, one per line"
    )
    parser.add_argument(
        "--html", action="store_true", help="one self-contained HTML page: a waterfall of the calls"
    )


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="PATH", nargs="+", help="session files")


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="the session file")


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--path",
        default="demo/session.jsonl",
        help="the session to record into (default: %(default)s, under the data root)",
    )
    parser.add_argument(
        "--fast", action="store_true", help="no pauses (the recorded durations stay realistic)"
    )
    parser.add_argument(
        "--no-start", action="store_true", help="do not start a daemon when none is running"
    )


_Handler = Callable[[argparse.Namespace, Style], int]

#: The commands set up from a module of their own, and that module.
_MODULE_OF: Final = {
    "export": "._export",
    "find": "._find",
    "diff": "._diff",
    "sessions": "._listing",
    "resume": "._resume",
    "sql": "._sql",
    "vacuum": "._vacuum",
    "compress": "._compress",
    "status": "._status",
}


def _setup(name: str) -> tuple[_Handler, str, Callable[[argparse.ArgumentParser], None]]:
    """A command's handler, epilog and arguments, its modules imported only now."""
    if name == "tail":
        return _tail, _TAIL_EPILOG, _tail_arguments
    if name == "show":
        return _show, _SHOW_EPILOG, _show_arguments
    if name in ("check", "inspect"):
        from . import _commands

        if name == "check":
            return _commands.cmd_check, _CHECK_EPILOG, _check_arguments
        return _commands.cmd_inspect, _INSPECT_EPILOG, _inspect_arguments
    if name == "demo":
        from ._demo import cmd_demo

        return cmd_demo, _DEMO_EPILOG, _demo_arguments
    # Each of these lives in a module of its own, which names its parts after the
    # command: cmd_NAME, NAME_epilog(exit_help) and add_NAME_arguments.
    module = importlib.import_module(_MODULE_OF[name], __package__)
    return (
        getattr(module, f"cmd_{name}"),
        getattr(module, f"{name}_epilog")(_EXIT_HELP),
        getattr(module, f"add_{name}_arguments"),
    )


#: Every command, in the order of ``--help``, with its one-line text.
_COMMANDS: Final = {
    "tail": "Print a session's records, and follow it live.",
    "show": "A readable timeline of a session.",
    "check": "Verify session files.",
    "inspect": "Runs and their gaps.",
    "status": "What the daemon holds.",
    "demo": "Record a simulated agent session.",
    "export": "Send sessions to an OTLP backend.",
    "find": "Records across sessions.",
    "diff": "Where two runs part ways.",
    "sessions": "Every session, newest first.",
    "resume": "What a program needs to continue a session; repair it, or fork it.",
    "sql": "SQL over every session (DuckDB).",
    "vacuum": "Remove old sessions, within limits.",
    "compress": "Compress sessions nobody writes (zstd).",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``command``, the others are named (for
    ``--help``) but take no arguments, and their modules are not imported: a command
    starts without the cost of the rest."""
    parser = _Parser(
        prog="flightlog",
        description=_DESCRIPTION,
        epilog=_MAIN_EPILOG,
        formatter_class=_Formatter,
    )
    _common(parser, suppress=False)
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for name, text in _COMMANDS.items():
        if command is not None and name != command:
            commands.add_parser(name, help=text)
            continue
        handler, epilog, add_arguments = _setup(name)
        sub = commands.add_parser(
            name, help=text, description=text, epilog=epilog, formatter_class=_Formatter
        )
        _common(sub, suppress=True)
        sub.set_defaults(handler=handler)
        add_arguments(sub)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs, when it names one before any other word."""
    words = iter(argv)
    for word in words:
        if word in ("--socket", "--color"):
            next(words, None)  # the option's value
        elif not word.startswith("-"):
            return word if word in _COMMANDS else None
    return None


# ------------------------------------------------------------------------ running


def _daemon_error_status(exc: DaemonError) -> int:
    if exc.code == ErrorCode.SESSION_CORRUPT:
        return EXIT_UNSOUND
    if exc.code == ErrorCode.SESSION_NOT_FOUND:
        return EXIT_USAGE
    return EXIT_REFUSED


def run(argv: Sequence[str] | None = None) -> int:
    """Run ``flightlog`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    style = Style.for_stream(sys.stdout, args.color)
    handler: Callable[[argparse.Namespace, Style], int] = args.handler
    stdout = sys.stdout
    if stdout.isatty() and not getattr(args, "json", False):
        # Records may hold escape sequences; a terminal must not run them.
        sys.stdout = TerminalText(stdout, colours=style.enabled)
    try:
        return handler(args, style)
    except CommandError as exc:
        _err(f"flightlog: {exc.message}")
        return exc.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (| head): not an error.  Keep Python's exit-time flush
        # of stdout from failing again.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except ConnectError as exc:
        _err(f"flightlog: {exc.message}")
        return EXIT_NO_DAEMON
    except ConnectionLost as exc:
        _err(f"flightlog: {exc.message}")
        return EXIT_NO_DAEMON
    except DaemonError as exc:
        _err(f"flightlog: the daemon refused: {exc.message} [{exc.code}]")
        return _daemon_error_status(exc)
    except FileFormatError as exc:
        _err(f"flightlog: {exc.message}")
        return EXIT_UNSOUND
    except FlightlogError as exc:
        _err(f"flightlog: {exc}")
        return EXIT_REFUSED
    finally:
        sys.stdout = stdout


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``flightlog`` console script."""
    sys.exit(run(argv))
