"""systemd integration without libsystemd: socket activation, sd_notify, watchdog, journal.

Theory of operation
-------------------
systemd talks to a service through a handful of environment variables, all of which
this module reads and none of which it needs a C library for:

- Socket activation (``sd_listen_fds(3)``): the socket unit's listening sockets arrive
  as file descriptors 3, 4, ... ; ``LISTEN_FDS`` says how many, ``LISTEN_PID`` says which
  process they are meant for (a forked child must not take its parent's sockets) and
  ``LISTEN_FDNAMES`` names them, colon-separated. The variables are removed once read,
  so that nothing the daemon starts believes it was activated too.
- Notification (``sd_notify(3)``): ``NOTIFY_SOCKET`` names an ``AF_UNIX`` datagram socket,
  a filesystem path or, with a leading ``@``, an abstract name. Each datagram is a list of
  ``KEY=VALUE`` lines: ``READY=1``, ``STATUS=...``, ``STOPPING=1``, ``WATCHDOG=1``.
- Watchdog (``sd_watchdog_enabled(3)``): ``WATCHDOG_USEC`` is the deadline for the next
  ``WATCHDOG=1``; ``WATCHDOG_PID``, when set, names the process it applies to. We ping at
  half the deadline, from the event loop, so that a wedged loop stops pinging and systemd
  restarts the daemon.
- Journal (``systemd.exec(5)``): ``JOURNAL_STREAM`` holds ``device:inode`` of the stream
  systemd connected to stdout/stderr; when fd 2 still is that stream, log lines may carry
  ``<N>`` syslog priority prefixes that journald turns into priorities.

Notifications are best effort: a failed send returns ``False`` and never raises into the
daemon, and nothing here logs (the caller decides what a failure is worth).
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Mapping

import anyio
from anyio.abc import TaskStatus

__all__ = [
    "SD_LISTEN_FDS_START",
    "Notifier",
    "SystemdError",
    "listen_fds",
    "listen_fds_with_names",
    "stderr_is_journal",
    "watchdog_loop",
]

#: The first file descriptor passed by socket activation (``SD_LISTEN_FDS_START``).
SD_LISTEN_FDS_START = 3

_LISTEN_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class SystemdError(RuntimeError):
    """The environment systemd handed us is malformed or not what the daemon can use."""


# --------------------------------------------------------------------------- activation


def listen_fds() -> list[socket.socket]:
    """Take the listening sockets passed by systemd socket activation.

    Returns one ``AF_UNIX`` ``SOCK_STREAM`` listening socket per passed descriptor, in
    descriptor order, each close-on-exec; the empty list when the process was not
    activated (no ``LISTEN_PID``/``LISTEN_FDS``) or the descriptors were meant for another
    process (``LISTEN_PID`` is not ours). ``LISTEN_PID``, ``LISTEN_FDS`` and
    ``LISTEN_FDNAMES`` are removed from ``os.environ`` in every case.

    Raises:
        SystemdError: a variable is malformed, ``LISTEN_FDNAMES`` does not name every
            descriptor, or a descriptor is not an ``AF_UNIX`` stream socket in the
            listening state. Sockets already taken are closed before raising.
    """
    return [sock for _, sock in listen_fds_with_names()]


def listen_fds_with_names() -> list[tuple[str, socket.socket]]:
    """Like :func:`listen_fds`, paired with each descriptor's ``LISTEN_FDNAMES`` name.

    A descriptor without a name (``LISTEN_FDNAMES`` unset) is named ``"unknown"``, as
    ``sd_listen_fds_with_names(3)`` does.

    Raises:
        SystemdError: as :func:`listen_fds`.
    """
    try:
        count = _activated_count(os.environ)
        if count == 0:
            return []
        names = _fd_names(os.environ.get("LISTEN_FDNAMES"), count)
    finally:
        # Unset before anything can fail or fork, so no child inherits them.
        for name in _LISTEN_VARIABLES:
            os.environ.pop(name, None)

    taken: list[tuple[str, socket.socket]] = []
    try:
        for offset, name in enumerate(names):
            taken.append((name, _adopt(SD_LISTEN_FDS_START + offset, name)))
    except BaseException:
        for _, sock in taken:
            sock.close()
        raise
    return taken


def _activated_count(environ: Mapping[str, str]) -> int:
    pid_text = environ.get("LISTEN_PID")
    count_text = environ.get("LISTEN_FDS")
    if pid_text is None or count_text is None:
        return 0
    pid = _parse_int("LISTEN_PID", pid_text)
    if pid != os.getpid():
        # Meant for another process (we are a child that inherited the environment).
        return 0
    count = _parse_int("LISTEN_FDS", count_text)
    if count < 0:
        raise SystemdError(f"LISTEN_FDS={count_text!r} is negative")
    return count


def _fd_names(names_text: str | None, count: int) -> list[str]:
    if names_text is None:
        return ["unknown"] * count
    names = names_text.split(":")
    if len(names) != count:
        raise SystemdError(
            f"LISTEN_FDNAMES names {len(names)} descriptor(s) but LISTEN_FDS={count};"
            " the socket unit and the environment disagree"
        )
    return names


def _parse_int(variable: str, text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise SystemdError(f"{variable}={text!r} is not a decimal integer") from None


def _adopt(fd: int, name: str) -> socket.socket:
    what = f"socket-activated fd {fd} ({name})"
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFD)
        fcntl.fcntl(fd, fcntl.F_SETFD, flags | fcntl.FD_CLOEXEC)
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise SystemdError(
            f"{what} is not a usable socket ({exc.strerror or exc}); the socket unit"
            " must use ListenStream= on a filesystem path"
        ) from exc
    try:
        family = sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)
        kind = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError as exc:
        sock.close()
        raise SystemdError(f"{what} cannot be inspected: {exc.strerror or exc}") from exc
    if family != socket.AF_UNIX or kind != socket.SOCK_STREAM:
        sock.close()
        raise SystemdError(
            f"{what} is {_family_name(family)}/{_type_name(kind)}, not AF_UNIX/SOCK_STREAM;"
            " the socket unit must use ListenStream= on a filesystem path"
        )
    if not listening:
        sock.close()
        raise SystemdError(f"{what} is not listening; the socket unit must not use Accept=yes")
    return sock


def _family_name(family: int) -> str:
    try:
        return socket.AddressFamily(family).name
    except ValueError:
        return f"family {family}"


def _type_name(kind: int) -> str:
    try:
        return socket.SocketKind(kind).name
    except ValueError:
        return f"type {kind}"


# --------------------------------------------------------------------------- notify


class Notifier:
    """Sends ``sd_notify(3)`` state updates to the service manager.

    Each send opens a non-blocking, close-on-exec ``AF_UNIX`` datagram socket, sends one
    datagram and closes it, as ``sd_notify`` does: the notifier holds no descriptor, needs
    no closing, and a restarted manager (``daemon-reexec``) is reached at the same address.
    Every send returns whether the datagram left; a failure (no listener, a full queue,
    descriptor exhaustion) returns ``False`` and is never raised.
    """

    __slots__ = ("_address", "_address_text", "_watchdog_usec")

    def __init__(self, address: str, *, watchdog_usec: int | None = None) -> None:
        """Make a notifier for ``address``, the value ``NOTIFY_SOCKET`` would hold.

        ``address`` is a filesystem path (``/run/systemd/notify``) or an abstract name
        with a leading ``@``. ``watchdog_usec`` is the watchdog deadline in microseconds,
        or ``None`` when no watchdog applies to this process.

        Raises:
            SystemdError: ``address`` is neither an absolute path nor ``@name`` (systemd's
                ``vsock:`` addresses are not supported), or ``watchdog_usec`` is not
                positive.
        """
        if address.startswith("@") and len(address) > 1:
            self._address: str | bytes = b"\0" + os.fsencode(address[1:])
        elif address.startswith("/"):
            self._address = address
        else:
            raise SystemdError(
                f"NOTIFY_SOCKET={address!r} is neither an absolute path nor an abstract"
                " '@name'; only AF_UNIX notification sockets are supported"
            )
        if watchdog_usec is not None and watchdog_usec <= 0:
            raise SystemdError(f"watchdog deadline {watchdog_usec} µs is not positive")
        self._address_text = address
        self._watchdog_usec = watchdog_usec

    @classmethod
    def from_environment(cls) -> Notifier | None:
        """The notifier systemd asked for through the environment, or ``None``.

        ``None`` when ``NOTIFY_SOCKET`` is unset or empty (not started as ``Type=notify``).
        The watchdog applies when ``WATCHDOG_USEC`` is set and ``WATCHDOG_PID`` is unset
        or our pid. The variables are left in place.

        Raises:
            SystemdError: ``NOTIFY_SOCKET`` is not a supported address, or
                ``WATCHDOG_USEC``/``WATCHDOG_PID`` is malformed.
        """
        address = os.environ.get("NOTIFY_SOCKET")
        if not address:
            return None
        return cls(address, watchdog_usec=_watchdog_usec(os.environ))

    def __repr__(self) -> str:
        return f"Notifier({self._address_text!r}, watchdog_usec={self._watchdog_usec!r})"

    @property
    def address(self) -> str:
        """The notification socket, as ``NOTIFY_SOCKET`` spells it."""
        return self._address_text

    # The messages the daemon sends.

    def ready(self, status: str | None = None) -> bool:
        """Tell systemd start-up is complete (``READY=1``), optionally with a status line."""
        if status is None:
            return self.send("READY=1")
        return self.send(f"READY=1\nSTATUS={_one_line(status)}")

    def status(self, text: str) -> bool:
        """Set the free-form status ``systemctl status`` shows; newlines become spaces."""
        return self.send(f"STATUS={_one_line(text)}")

    def stopping(self, status: str | None = None) -> bool:
        """Tell systemd the daemon is shutting down (``STOPPING=1``)."""
        if status is None:
            return self.send("STOPPING=1")
        return self.send(f"STOPPING=1\nSTATUS={_one_line(status)}")

    def watchdog(self) -> bool:
        """Ping the watchdog (``WATCHDOG=1``)."""
        return self.send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for ``seconds`` more before the start or stop timeout fires.

        Useful while a shutdown drain runs longer than expected (``EXTEND_TIMEOUT_USEC``).
        """
        return self.send(f"EXTEND_TIMEOUT_USEC={max(0, round(seconds * 1_000_000))}")

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=VALUE`` assignments in one datagram: ``notify(READY=1, STATUS="up")``.

        Raises:
            ValueError: no field was given, or a value contains a newline (it would be
                read as a further assignment).
        """
        if not fields:
            raise ValueError("notify() needs at least one field")
        lines = []
        for key, value in fields.items():
            text = str(value)
            if "\n" in text:
                raise ValueError(f"the value of {key} contains a newline")
            lines.append(f"{key}={text}")
        return self.send("\n".join(lines))

    def send(self, state: str) -> bool:
        """Send ``state``, newline-separated ``KEY=VALUE`` lines, as one datagram.

        Returns ``True`` once the datagram is queued on the manager's socket, ``False``
        on any ``OSError`` (never raised): the daemon must not fail because the manager
        is busy or gone.
        """
        try:
            # Paths decoded with surrogateescape go out as the bytes they came from.
            payload = state.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            payload = state.encode("utf-8", "backslashreplace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)
                sock.sendto(payload, self._address)
        except OSError:
            return False
        return True

    # The watchdog.

    def watchdog_interval(self) -> float | None:
        """Seconds between watchdog pings (half the deadline), or ``None`` without a watchdog."""
        if self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2_000_000


def _watchdog_usec(environ: Mapping[str, str]) -> int | None:
    usec_text = environ.get("WATCHDOG_USEC")
    if not usec_text:
        return None
    pid_text = environ.get("WATCHDOG_PID")
    if pid_text and _parse_int("WATCHDOG_PID", pid_text) != os.getpid():
        return None
    usec = _parse_int("WATCHDOG_USEC", usec_text)
    if usec <= 0:
        raise SystemdError(f"WATCHDOG_USEC={usec_text!r} is not positive")
    return usec


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


async def watchdog_loop(
    notifier: Notifier, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Ping the watchdog every :meth:`Notifier.watchdog_interval` seconds, forever.

    Runs on the event loop on purpose: if the loop wedges, the pings stop and systemd
    restarts the daemon. The first ping goes out at once. Returns immediately when no
    watchdog is configured. Start it with ``tg.start_soon`` or ``await tg.start``; it ends
    when its task group is cancelled.

    Raises:
        Nothing of its own: a failed ping is ignored, the next one is tried on time.
    """
    interval = notifier.watchdog_interval()
    task_status.started()
    if interval is None:
        return
    deadline = anyio.current_time()
    while True:
        notifier.watchdog()
        # Schedule from the previous deadline, not from now, so pings do not drift late;
        # after a stall, count from now instead of catching up with a burst of pings.
        deadline += interval
        now = anyio.current_time()
        if deadline <= now:
            deadline = now + interval
        await anyio.sleep_until(deadline)


# --------------------------------------------------------------------------- journal


def stderr_is_journal() -> bool:
    """Whether fd 2 is the journal stream systemd connected (``JOURNAL_STREAM``).

    When it is, log lines may start with a ``<N>`` syslog priority prefix. ``False`` when
    the variable is unset or malformed, or fd 2 was redirected since.

    Raises:
        Nothing: every failure means "not the journal".
    """
    value = os.environ.get("JOURNAL_STREAM", "")
    device_text, sep, inode_text = value.partition(":")
    if not sep:
        return False
    try:
        device, inode = int(device_text, 10), int(inode_text, 10)
        stat = os.fstat(2)
    except (ValueError, OSError):
        return False
    return stat.st_dev == device and stat.st_ino == inode
