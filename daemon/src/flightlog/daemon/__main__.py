"""``flightlogd``: run the daemon.  Signals become the shutdown trigger here only."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import grp
import os
import resource
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import Final

import anyio
import anyio.abc
import structlog

from flightlog.protocol import FlightlogError
from flightlog.protocol.ring import MAX_RING_SIZE, MIN_RING_SIZE
from flightlog.sdk.storage import Limits, parse_age, parse_size

from ._config import Config
from ._fairness import PerUidLimits
from ._logging import configure_logging
from ._refusals import BURST
from ._retention import RetentionSettings, archive_problem
from ._server import SHUTDOWN_BOUND, Daemon, serve
from ._systemd import Notifier, SystemdError, listen_fds

_EPILOG = f"""\
examples:
  flightlogd                                  default socket and data root
  flightlogd --socket /tmp/fl.sock --root ~/agent-logs --allow /srv/agents
  FLIGHTLOG_SOCKET=/run/user/1000/fl.sock flightlogd --log-format console

Under systemd socket activation (LISTEN_FDS) the socket is inherited and --socket is
ignored.  SIGTERM or SIGINT drains: every session is written, synced and closed, then
the daemon exits 0; a second signal exits at once with status 2, and so does a drain
that outlasts --shutdown-grace by more than {SHUTDOWN_BOUND:g} s.  SIGHUP is logged (there is
nothing to reopen: logs go to stderr); SIGUSR1 and SIGUSR2 log the daemon's status.
"""


#: Signals that drain and stop the daemon, and signals that only log a line.
_DRAIN_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
_LOG_SIGNALS: Final = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)

#: The smallest and largest --max-frame-size: a frame must hold a request with a long
#: path, and one frame is buffered whole.
_FRAME_SIZES: Final = (4096, 1 << 30)


def _mode(text: str) -> int:
    """--socket-mode: an octal file mode, 0 to 0777."""
    try:
        value = int(text, 8)
    except ValueError:
        value = -1
    if not 0 <= value <= 0o777:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal file mode (0 to 0777)")
    return value


def _count(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer option from ``low`` to ``high`` (no upper bound when None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            bounds = f"from {low:,} to {high:,}" if high is not None else f"{low:,} or more"
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number {bounds}")
        return value

    return parse


def _group(text: str) -> int:
    """A group name or number, as its gid."""
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise argparse.ArgumentTypeError(f"no group named {text!r}") from None


def _ring_size(text: str) -> int:
    """A ring's size: 0 (no rings), or a power of two from 4 KiB to 64 MiB."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value and (value < MIN_RING_SIZE or value > MAX_RING_SIZE or value & (value - 1)):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not 0 or a power of two from {MIN_RING_SIZE:,} to {MAX_RING_SIZE:,}"
        )
    return value


def _seconds_from(least: float) -> Callable[[str], float]:
    """A duration option's type: a number of seconds, ``least`` or more."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= least:  # also refuses nan
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= {least:g}")
        return value

    return seconds


_seconds = _seconds_from(0)
#: The refusals' window: 0.1 s or more (each window wakes the daemon once).
_window = _seconds_from(0.1)


def _size(text: str) -> int:
    """A size option: bytes, or K, M, G, T (powers of 1024)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"takes {exc}") from None


def _age(text: str) -> timedelta:
    """An age option: s, m, h, d."""
    try:
        return parse_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"takes {exc}") from None


def _command(text: str) -> list[str]:
    """A command line, split as a shell would split it (no shell runs it)."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    if not argv:
        raise argparse.ArgumentTypeError("an empty command")
    return argv


def _version() -> str:
    try:
        return version("flightlogd")
    except PackageNotFoundError:
        return "unknown (not installed)"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; a bad option or value exits with a usage error (status 2)."""
    defaults = Config()
    low_frame, high_frame = _FRAME_SIZES
    parser = argparse.ArgumentParser(
        prog="flightlogd",
        description="The flight recorder daemon for AI agents.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
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
        help="also accept absolute session paths under DIR (default: none; repeatable)",
    )
    parser.add_argument(
        "--socket-mode",
        type=_mode,
        default=defaults.socket_mode,
        metavar="OCTAL",
        help=f"socket file mode, 0 to 0777 (default: {defaults.socket_mode:04o})",
    )
    parser.add_argument(
        "--readers-group",
        type=_group,
        default=None,
        metavar="GROUP",
        help="members of GROUP (a name or a gid) may read every session through the "
        "daemon; each session's owner and root always may (default: none)",
    )
    parser.add_argument(
        "--log-format",
        choices=("json", "console"),
        default="json",
        help="JSON lines or readable lines on stderr (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="the least severe level logged (default: %(default)s)",
    )
    parser.add_argument(
        "--max-frame-size",
        type=_count(low_frame, high_frame),
        default=defaults.max_frame_size,
        metavar="BYTES",
        help=f"largest frame accepted, {low_frame:,} to {high_frame:,} (default: %(default)s)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=defaults.idle_timeout,
        metavar="SECONDS",
        help="close a session's file after this long without writes (default: %(default)s)",
    )
    parser.add_argument(
        "--compress-after",
        type=_seconds,
        default=defaults.compress_after,
        metavar="SECONDS",
        help="compress a session this long after it closed with no run open; 0: never "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--blobs",
        action="store_true",
        help="store base64 payloads of 4,096+ characters once, by their SHA-256, beside "
        "the sessions, and write a reference in the record (default: off)",
    )
    parser.add_argument(
        "--max-open-files",
        type=_count(1),
        default=defaults.max_open_files,
        metavar="N",
        help="session files kept open at once, 1 or more (default: %(default)s, lowered "
        "to fit the descriptor limit)",
    )
    parser.add_argument(
        "--max-connections",
        type=_count(1),
        default=defaults.max_connections,
        metavar="N",
        help="client connections served at once, 1 or more; more are refused with "
        "too_many (default: %(default)s, lowered to fit the descriptor limit)",
    )
    per_uid = defaults.per_uid
    parser.add_argument(
        "--max-connections-per-uid",
        type=_count(1),
        default=per_uid.connections,
        metavar="N",
        help="connections one uid (other than the daemon's) may have at once, 1 or more; "
        "more are refused with too_many (default: %(default)s)",
    )
    parser.add_argument(
        "--max-sessions-per-uid",
        type=_count(1),
        default=per_uid.sessions,
        metavar="N",
        help="sessions one uid (other than the daemon's) may write at once, 1 or more; "
        "more are refused with too_many (default: %(default)s)",
    )
    parser.add_argument(
        "--max-bytes-per-second-per-uid",
        type=_count(4096),
        default=per_uid.bytes_per_second,
        metavar="BYTES",
        help="bytes per second read from the sockets of one uid (other than the "
        "daemon's), 4096 or more; past it they are left unread for a while "
        "(default: %(default)s)",
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
        "--ring-size",
        type=_ring_size,
        default=defaults.ring_size,
        metavar="BYTES",
        help="bytes of the ring of shared memory a client that asks for one sends its "
        "frames through instead of its socket (a power of two); 0 makes no rings "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=_seconds,
        default=defaults.shutdown_grace,
        metavar="SECONDS",
        help="how long shutdown waits for connections (default: %(default)s); "
        f"shutdown ends at most {SHUTDOWN_BOUND:g} s after that",
    )
    parser.add_argument(
        "--send-timeout",
        type=_seconds,
        default=defaults.send_timeout,
        metavar="SECONDS",
        help="give up on a client that reads none of its replies for this long "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--hello-timeout",
        type=_seconds,
        default=defaults.hello_timeout,
        metavar="SECONDS",
        help="close a connection that has not sent its hello after this long "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--refusal-window",
        type=_window,
        default=defaults.refusal_window,
        metavar="SECONDS",
        help=f"log at most {BURST} refusals of a client (a connection, or a uid), and "
        f"{BURST} connections opened by a uid, in a window this long, and count the rest "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-buffered",
        type=_count(4 * low_frame, 1 << 40),
        default=None,
        metavar="BYTES",
        help="bytes every connection together may make the daemon hold (frames being "
        "read, requests waiting for their session), at least four maximum frames "
        f"(default: {defaults.max_buffered}, or four maximum frames if more)",
    )
    _add_retention_arguments(parser, defaults.retention)
    args = parser.parse_args(argv)
    args.retention = RetentionSettings(
        limits=Limits(
            max_use=args.max_use,
            max_age=args.max_age,
            keep_free=args.keep_free,
            protect=args.protect,
            max_use_total=args.max_use_total,
        ),
        interval=args.vacuum_interval,
        archive=os.path.abspath(args.archive) if args.archive else None,
        archive_command=tuple(args.archive_command) if args.archive_command else None,
    )
    if args.archive is not None and args.archive_command is not None:
        parser.error("--archive and --archive-command: choose one")
    if args.archive is not None:
        problem = archive_problem(args.archive, args.root, args.retention.limits)
        if problem is not None:
            parser.error(problem)
    if args.max_buffered is None:
        args.max_buffered = max(defaults.max_buffered, 4 * args.max_frame_size)
    elif args.max_buffered < 4 * args.max_frame_size:
        parser.error("--max-buffered must be at least 4 times --max-frame-size")
    return args


def _add_retention_arguments(parser: argparse.ArgumentParser, defaults: RetentionSettings) -> None:
    group = parser.add_argument_group(
        "retention",
        "Limits on the session files of the data root, applied at start and then "
        "every sweep, oldest first, by the rules of flightlog vacuum.  None is set by "
        "default: the daemon removes nothing unless told to.  The size and age limits "
        "apply to each uid's files alone; the total and free space ones to all of them.",
    )
    group.add_argument(
        "--max-use",
        type=_size,
        metavar="SIZE",
        help="at most SIZE in each uid's session files and blobs, e.g. 10G (default: no limit)",
    )
    group.add_argument(
        "--max-use-total",
        type=_size,
        metavar="SIZE",
        help="at most SIZE in every uid's session files and blobs together: past it the oldest "
        "removable sessions go, whoever owns them (default: no limit)",
    )
    group.add_argument(
        "--max-age",
        type=_age,
        metavar="AGE",
        help="remove sessions inactive for longer than AGE, e.g. 90d (default: no limit)",
    )
    group.add_argument(
        "--keep-free",
        type=_size,
        metavar="SIZE",
        help="remove the oldest sessions, whoever owns them, while the data root's "
        "filesystem has less than SIZE available (default: no limit)",
    )
    group.add_argument(
        "--protect",
        type=_age,
        default=defaults.limits.protect,
        metavar="AGE",
        help="never remove a session active within AGE (default: 1d)",
    )
    group.add_argument(
        "--vacuum-interval",
        type=_seconds,
        default=defaults.interval,
        metavar="SECONDS",
        help="seconds between sweeps (default: %(default)s)",
    )
    group.add_argument(
        "--archive",
        metavar="DIR",
        help="move removed sessions into DIR, same relative path, instead of deleting "
        "(default: none, they are deleted)",
    )
    group.add_argument(
        "--archive-command",
        type=_command,
        metavar="CMD",
        help="hand each session to CMD (split like a shell does, no shell run; the "
        "file's path the last argument) and remove it once CMD exits with 0 "
        "(default: none)",
    )


async def _run(config: Config) -> None:
    stop = anyio.Event()
    listeners = listen_fds()
    notifier = Notifier.from_environment()
    log = structlog.get_logger("flightlogd")
    daemon: Daemon | None = None

    async def watch_signals(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        with anyio.open_signal_receiver(*_DRAIN_SIGNALS, *_LOG_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP:
                    log.info("signal_received", signal=name, action="none: logs go to stderr")
                elif signum in _LOG_SIGNALS:
                    status = daemon.status_line() if daemon is not None else "starting"
                    log.info("signal_received", signal=name, action="status", status=status)
                elif stop.is_set():
                    log.warning("forced_exit", signal=name)
                    os._exit(2)
                else:
                    log.info("signal_received", signal=name, action="drain")
                    _exit_after(config.shutdown_grace + SHUTDOWN_BOUND)
                    stop.set()

    async with anyio.create_task_group() as tg:
        # The handlers are in place before the socket is bound: a SIGTERM that comes
        # as soon as the daemon is reachable drains it instead of killing it.
        await tg.start(watch_signals)
        async with anyio.create_task_group() as serving:
            daemon = await serving.start(
                functools.partial(
                    serve,
                    config,
                    listeners=listeners,
                    shutdown_trigger=stop.wait,
                    notifier=notifier,
                )
            )
        tg.cancel_scope.cancel()


def _exit_after(seconds: float) -> None:
    """Exit with status 2 after ``seconds``, whatever the drain still waits for (a
    disk that hangs in fsync cannot be abandoned from the event loop)."""

    def give_up() -> None:
        structlog.get_logger("flightlogd").error("shutdown_timed_out", seconds=seconds)
        os._exit(2)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # Past a file-size limit (RLIMIT_FSIZE) the kernel sends SIGXFSZ, which kills by
    # default; ignored, the write fails with EFBIG and only that session fails.
    # CPython ignores it already at start-up; this keeps it so when embedded.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _raise_descriptor_limit()
    tune_malloc()
    configure_logging(format=args.log_format, level=args.log_level)
    config = Config(
        socket_path=args.socket,
        root=args.root,
        allow=tuple(args.allow),
        socket_mode=args.socket_mode,
        readers_group=args.readers_group,
        per_uid=PerUidLimits(
            connections=args.max_connections_per_uid,
            sessions=args.max_sessions_per_uid,
            bytes_per_second=args.max_bytes_per_second_per_uid,
        ),
        max_frame_size=args.max_frame_size,
        idle_timeout=args.idle_timeout,
        compress_after=args.compress_after,
        blobs=args.blobs,
        max_open_files=args.max_open_files,
        max_connections=args.max_connections,
        read_window=args.read_window,
        ring_size=args.ring_size,
        shutdown_grace=args.shutdown_grace,
        send_timeout=args.send_timeout,
        hello_timeout=args.hello_timeout,
        refusal_window=args.refusal_window,
        max_buffered=args.max_buffered,
        retention=args.retention,
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


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
_M_ARENA_MAX: Final = -8
#: Allocations up to this size come from the heap, and this much freed memory at its
#: top is kept: glibc's dynamic thresholds reach as much by themselves on 64-bit
#: systems (an mmap threshold of up to 32 MiB), but only after freeing a mapped block
#: of each size, so until then the daemon maps, unmaps and faults in again its read
#: and line buffers batch after batch (docs/benchmarks.md).
MALLOC_THRESHOLD: Final = 32 * 1024 * 1024


#: Arenas malloc may use.  One: every thread allocates from the main arena, so the
#: freed memory kept at the top (up to :data:`MALLOC_THRESHOLD`) is kept once, not once
#: per disk thread: 40 sessions' checkpoints read back by their disk threads for a slow
#: reader grew the peak RSS by 164 MiB for a budget of 64 MiB with an arena per thread,
#: 76 MiB with one (docs/reliability.md).  The threads allocate with the GIL held
#: (bytes of a read, a line): they would rarely contend for the arena's lock anyway.
MALLOC_ARENAS: Final = 1


def tune_malloc() -> bool:
    """Set glibc's thresholds to :data:`MALLOC_THRESHOLD` and its arenas to
    :data:`MALLOC_ARENAS`; whether they were set (False under another C library)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MALLOC_THRESHOLD)
        and mallopt(_M_TRIM_THRESHOLD, MALLOC_THRESHOLD)
        and mallopt(_M_ARENA_MAX, MALLOC_ARENAS)
    )


def _single(exc: BaseException) -> BaseException:
    """The one error inside nested single-error exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


if __name__ == "__main__":
    main()
