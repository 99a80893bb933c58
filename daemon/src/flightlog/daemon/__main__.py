"""``flightlogd``: run the daemon.  Signals become the shutdown trigger here only."""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import sys
from collections.abc import Sequence

import anyio
import structlog

from flightlog.protocol import FlightlogError

from ._config import Config
from ._logging import configure_logging
from ._server import serve
from ._systemd import Notifier, SystemdError, listen_fds

_EPILOG = """\
examples:
  flightlogd                                  default socket and data root
  flightlogd --socket /tmp/fl.sock --root ~/agent-logs --allow /srv/agents
  FLIGHTLOG_SOCKET=/run/user/1000/fl.sock flightlogd --log-format console

Under systemd socket activation (LISTEN_FDS) the socket is inherited and --socket is
ignored.  SIGTERM or SIGINT drains: every session is written, synced and closed, then
the daemon exits 0; a second signal exits at once with status 2.
"""


def _mode(text: str) -> int:
    return int(text, 8)


def _seconds(text: str) -> float:
    """A duration option: a number of seconds, zero or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = Config()
    parser = argparse.ArgumentParser(
        prog="flightlogd",
        description="The flight recorder daemon for AI agents.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--socket",
        default=defaults.socket_path,
        help="Unix socket path "
        "(default: $FLIGHTLOG_SOCKET, $XDG_RUNTIME_DIR/flightlog/flightlog.sock "
        "or /tmp/flightlog-$UID/flightlog.sock; now %(default)s)",
    )
    parser.add_argument(
        "--root",
        default=defaults.root,
        help="data root for relative "
        "session paths (default: $FLIGHTLOG_ROOT or "
        "$XDG_STATE_HOME/flightlog; now %(default)s)",
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="DIR",
        help="also accept absolute session paths under DIR (repeatable)",
    )
    parser.add_argument(
        "--socket-mode",
        type=_mode,
        default=defaults.socket_mode,
        metavar="OCTAL",
        help="socket file mode (default: 0600)",
    )
    parser.add_argument("--log-format", choices=("json", "console"), default="json")
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    parser.add_argument(
        "--max-frame-size",
        type=int,
        default=defaults.max_frame_size,
        metavar="BYTES",
        help="largest frame accepted (default: %(default)s)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=defaults.idle_timeout,
        metavar="SECONDS",
        help="close a session's file after this long without writes (default: %(default)s)",
    )
    parser.add_argument(
        "--max-open-files",
        type=int,
        default=defaults.max_open_files,
        metavar="N",
        help="session files kept open at once (default: %(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=defaults.max_connections,
        metavar="N",
        help="client connections served at once; more are refused with too_many "
        "(default: %(default)s, lowered to fit the descriptor limit)",
    )
    parser.add_argument(
        "--read-window",
        type=_seconds,
        default=defaults.read_window,
        metavar="SECONDS",
        help="leave a client that streams records, and has made no request for 40 "
        "windows, unread this long between reads, so that its sends do not wake the "
        "daemon one by one; 0 reads every frame at once (default: %(default)s)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=_seconds,
        default=defaults.shutdown_grace,
        metavar="SECONDS",
        help="how long shutdown waits for connections",
    )
    return parser.parse_args(argv)


async def _run(config: Config) -> None:
    stop = anyio.Event()
    listeners = listen_fds()
    notifier = Notifier.from_environment()

    async def watch_signals() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if stop.is_set():
                    structlog.get_logger("flightlogd").warning(
                        "forced_exit", signal=signal.Signals(signum).name
                    )
                    os._exit(2)
                structlog.get_logger("flightlogd").info(
                    "signal_received", signal=signal.Signals(signum).name
                )
                stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_signals)
        await serve(config, listeners=listeners, shutdown_trigger=stop.wait, notifier=notifier)
        tg.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # Past a file-size limit (RLIMIT_FSIZE) the kernel sends SIGXFSZ, which kills by
    # default; ignored, the write fails with EFBIG and only that session fails.
    # CPython ignores it already at start-up; this keeps it so when embedded.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _raise_descriptor_limit()
    configure_logging(format=args.log_format, level=args.log_level)
    config = Config(
        socket_path=args.socket,
        root=args.root,
        allow=tuple(args.allow),
        socket_mode=args.socket_mode,
        max_frame_size=args.max_frame_size,
        idle_timeout=args.idle_timeout,
        max_open_files=args.max_open_files,
        max_connections=args.max_connections,
        read_window=args.read_window,
        shutdown_grace=args.shutdown_grace,
    )
    try:
        anyio.run(_run, config, backend="asyncio", backend_options={"use_uvloop": True})
    except BaseException as exc:
        # Task groups wrap what escapes them in exception groups; a refusal to start
        # (another daemon, a bad socket path) is one error a person should read as a
        # sentence, not as a traceback.
        error = _single(exc)
        if not isinstance(error, (FlightlogError, SystemdError, OSError)):
            raise
        structlog.get_logger("flightlogd").error(
            "failed_to_start", reason=str(error), code=getattr(error, "code", None)
        )
        print(f"flightlogd: {error}", file=sys.stderr)  # noqa: T201
        sys.exit(1)


def _raise_descriptor_limit() -> None:
    """Raise the soft descriptor limit to the hard one: the soft default (1024) is kept
    low for programs that still use select(), which the daemon does not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _single(exc: BaseException) -> BaseException:
    """The one error inside nested single-error exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


if __name__ == "__main__":
    main()
