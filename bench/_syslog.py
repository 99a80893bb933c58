"""rsyslog and syslog-ng as peers of flightlogd for scenarios 1 and 2.

The job is the one flightlogd does: many local processes send records, one daemon
writes a file per session.  Each peer runs as the harness's own foreground process,
with a configuration generated into the scenario's scratch directory (no system
service, nothing under ``/etc``):

* ``rsyslog``: ``imptcp`` on a Unix stream socket (octet-counted framing, flow
  control, no rate limit), one ruleset writing ``omfile`` with a dynafile per
  session and a template of the message alone.
* ``syslog-ng``: a ``unix-stream`` source (newline framing) into a ``file``
  destination templated by session, ``flags(flow-control)``, the message alone.

Both accept messages far larger than the 64 KiB events (``maxMessageSize``,
``log-msg-size``), so none is cut.  An agent connects once per session and sends
every record as one RFC 5424 message whose APP-NAME names the session and whose MSG
is the very line flightlogd would write (:class:`bench._events.LineEncoder`), with
one ``sendall``, as a syslog client would.  As for flightlogd, a line counts once it
is in its file (the agent watches the file reach its expected size), and after the
measured phase every agent checks its file line by line: each line present once, in
order, byte for byte the line it sent.

The peers come from Debian packages that conflict with each other, so the harness
installs neither: :func:`find_peers` looks for ``rsyslogd`` on the PATH and for
syslog-ng on the PATH or in a directory where its packages were unpacked
(``--syslog-ng DIR``, or ``$BENCH_SYSLOG_NG``); docs/benchmarks.md shows how to get
both.  A peer that cannot be found is reported as skipped, with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from flightlog.protocol import (
    Event,
    FileFormatError,
    new_id,
)
from flightlog.protocol.format import (
    parse_line,
)

from ._daemon import Daemon
from ._events import LineEncoder, line_lengths
from ._report import SYSTEM_TITLES, TIMES, Row, markdown_table

__all__ = [
    "ENV_SYSLOG_NG",
    "MAX_MESSAGE",
    "PEERS",
    "LineCheckFailed",
    "Peer",
    "PeerDaemons",
    "SyslogAgent",
    "SyslogDaemon",
    "SyslogSink",
    "find_peers",
    "find_rsyslog",
    "find_syslog_ng",
    "peer_table",
]

PEERS = ("rsyslog", "syslog-ng")

#: Where syslog-ng's packages were unpacked, when ``--syslog-ng`` is not given.
ENV_SYSLOG_NG = "BENCH_SYSLOG_NG"

#: Accepted message size: far above a 64 KiB event's line, so nothing is cut.
MAX_MESSAGE = 256 * 1024

_DRAIN_TIMEOUT = 120.0
_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


class LineCheckFailed(RuntimeError):
    """A peer's session file is not, line for line, what the agent sent."""


# ------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class Peer:
    """A peer as found on this machine: how to run it, or why it is skipped."""

    name: str
    binary: str = ""
    version: str = ""
    module_path: str = ""
    library_path: str = ""
    skipped: str = ""

    @property
    def title(self) -> str:
        return f"{self.name} {self.version}" if self.version else self.name

    def environment(self) -> dict[str, str] | None:
        if not self.library_path:
            return None
        return {**os.environ, "LD_LIBRARY_PATH": self.library_path}

    def describe(self) -> str:
        if self.skipped:
            return f"{self.name}: skipped ({self.skipped})"
        return f"{self.title} ({self.binary})"


def _which(name: str) -> str | None:
    path = os.environ.get("PATH", os.defpath)
    return shutil.which(name, path=os.pathsep.join([path, *_SBIN]))


def _run(command: list[str], env: dict[str, str] | None = None) -> tuple[bool, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    output = (done.stdout + done.stderr).strip()
    return done.returncode == 0, output


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else "no output"


def find_rsyslog() -> Peer:
    binary = _which("rsyslogd")
    if binary is None:
        return Peer(
            "rsyslog", skipped="rsyslogd not found on PATH nor in sbin (apt-get install rsyslog)"
        )
    ok, output = _run([binary, "-v"])
    found = re.match(r"rsyslogd\s+(\S+)", output)
    if not ok or found is None:
        return Peer("rsyslog", skipped=f"{binary} -v failed: {_first_line(output)}")
    return Peer("rsyslog", binary=binary, version=found.group(1))


def find_syslog_ng(directory: str | None) -> Peer:
    """syslog-ng unpacked under ``directory`` (``dpkg -x`` of its packages), else on PATH."""
    if directory:
        root = Path(directory)
        binary = str(root / "usr" / "sbin" / "syslog-ng")
        if not os.access(binary, os.X_OK):
            return Peer("syslog-ng", skipped=f"no usr/sbin/syslog-ng under {directory}")
        libraries = [root / "usr" / "lib" / "syslog-ng"]
        for lib in (root / "usr" / "lib", root / "lib"):
            libraries += sorted(lib.glob("*-linux-gnu*"))
        library_path = os.pathsep.join(str(path) for path in libraries if path.is_dir())
    else:
        found_binary = _which("syslog-ng")
        if found_binary is None:
            return Peer(
                "syslog-ng",
                skipped=f"syslog-ng not found on PATH, and neither --syslog-ng DIR nor "
                f"${ENV_SYSLOG_NG} given (see docs/benchmarks.md)",
            )
        binary, root, library_path = found_binary, Path("/"), ""
    peer = Peer("syslog-ng", binary=binary, library_path=library_path)
    ok, output = _run([binary, "--version"], peer.environment())
    version = re.search(r"^syslog-ng \d+ \((\S+)\)", output, re.MULTILINE)
    modules = re.search(r"^Module-Directory: (\S+)", output, re.MULTILINE)
    if not ok or version is None or modules is None:
        return Peer("syslog-ng", skipped=f"{binary} --version failed: {_first_line(output)}")
    module_path = str(root / modules.group(1).lstrip("/"))
    return Peer(
        "syslog-ng",
        binary=binary,
        version=version.group(1),
        module_path=module_path,
        library_path=library_path,
    )


def find_peers(syslog_ng: str | None) -> list[Peer]:
    """rsyslog and syslog-ng, each runnable or skipped with the reason."""
    return [find_rsyslog(), find_syslog_ng(syslog_ng or os.environ.get(ENV_SYSLOG_NG))]


# --------------------------------------------------------------------------- daemons

_RSYSLOG_CONFIG = """\
global(workDirectory="{base}" maxMessageSize="{max_message}"
       parser.escapeControlCharactersOnReceive="off")
module(load="imptcp")
main_queue(queue.type="FixedArray" queue.size="8192" queue.dequeueBatchSize="1024"
           queue.timeoutEnqueue="120000")
template(name="session_file" type="string" string="{out}/%app-name%.jsonl")
template(name="message_only" type="string" string="%msg%\\n")
ruleset(name="sessions") {{
    action(type="omfile" dynaFile="session_file" template="message_only"
           dynaFileCacheSize="256" ioBufferSize="256k" flushOnTXEnd="on"
           createDirs="on" dirCreateMode="0700" fileCreateMode="0600")
}}
input(type="imptcp" path="{socket}" unlink="on" ruleset="sessions"
      supportOctetCountedFraming="on" maxFrameSize="{max_message}"
      flowControl="on" ratelimit.interval="0")
"""

_SYSLOG_NG_CONFIG = """\
@version: 3.38
options {{
    stats-freq(0); mark-freq(0); use-dns(no); dns-cache(no); use-fqdn(no);
    log-msg-size({max_message}); create-dirs(yes); dir-perm(0700); perm(0600);
    time-reap(1); threaded(yes);
}};
source s_agents {{
    unix-stream("{socket}" max-connections(128) log-iw-size(128000)
                log-fetch-limit(100) log-msg-size({max_message}) flags(syslog-protocol));
}};
destination d_sessions {{
    file("{out}/${{PROGRAM}}.jsonl" template("${{MSG}}\\n") log-fifo-size(128000));
}};
log {{ source(s_agents); destination(d_sessions); flags(flow-control); }};
"""


class SyslogDaemon(Daemon):
    """A peer in the foreground on ``base/in.sock``, writing under ``base/out``."""

    def __init__(self, peer: Peer, base: Path) -> None:
        super().__init__(base)
        self.peer = peer
        self.title = peer.name
        self.socket = str(base / "in.sock")
        self.root = base / "out"
        self.log_path = base / f"{peer.name}.log"
        self.config = base / f"{peer.name}.conf"
        self.env = peer.environment()

    @property
    def command(self) -> list[str]:
        base = str(self.base)
        if self.peer.name == "rsyslog":
            return [self.peer.binary, "-n", "-f", str(self.config), "-i", f"{base}/pid"]
        return [
            self.peer.binary,
            "--foreground",
            "--stderr",
            "--no-caps",
            f"--module-path={self.peer.module_path}",
            f"--cfgfile={self.config}",
            f"--persist-file={base}/persist",
            f"--control={base}/ctl",
            f"--pidfile={base}/pid",
        ]

    def start(self) -> SyslogDaemon:
        template = _RSYSLOG_CONFIG if self.peer.name == "rsyslog" else _SYSLOG_NG_CONFIG
        self.base.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            template.format(
                base=self.base, out=self.root, socket=self.socket, max_message=MAX_MESSAGE
            )
        )
        super().start()
        return self

    def close_files(self) -> None:
        """rsyslog keeps its dynafiles open until a HUP (syslog-ng closes them after a
        second idle): after a run, so that its deleted files free their space."""
        if self.peer.name == "rsyslog" and self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)


class PeerDaemons:
    """The peers found, each running for one scenario in its own scratch directory."""

    def __init__(self, peers: Sequence[Peer], directory: Path) -> None:
        self.daemons = [
            SyslogDaemon(peer, directory / peer.name) for peer in peers if not peer.skipped
        ]

    def start(self) -> PeerDaemons:
        try:
            for daemon in self.daemons:
                daemon.start()
        except BaseException:
            self.stop()
            raise
        return self

    def get(self, name: str) -> SyslogDaemon | None:
        return next((d for d in self.daemons if d.peer.name == name), None)

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.stop()


# ---------------------------------------------------------------------------- agents


class SyslogAgent:
    """An agent sending to a peer: one connection per session."""

    def __init__(self, peer: str, socket_path: str, directory: str) -> None:
        self.peer = peer
        self.socket_path = socket_path
        self.directory = directory
        self.sinks: list[SyslogSink] = []

    def session(self, name: str) -> SyslogSink:
        sink = SyslogSink(self.peer, self.socket_path, self.directory, name)
        self.sinks.append(sink)
        return sink

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class SyslogSink:
    """A session as a syslog client writes it: one message per record, one ``sendall``.

    The session's name, flattened, is the message's APP-NAME, which the peer's
    template turns into the file name; the MSG is the line itself.  rsyslog gets
    octet-counted frames (RFC 6587: the length, a space, the message); syslog-ng gets
    the message ended by the line's own newline.  Both drop that newline from MSG and
    their templates add it back.
    """

    def __init__(self, peer: str, socket_path: str, directory: str, name: str) -> None:
        app_name = name.removesuffix(".jsonl").replace("/", "-")
        self.path = os.path.join(directory, f"{app_name}.jsonl")
        self.header = f"<14>1 - - {app_name} - - - ".encode()
        self.octet_counted = peer == "rsyslog"
        self.lines = LineEncoder(new_id(), new_id())
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(socket_path)
        self._segments: list[tuple[int, Event]] = []  # (first seq, event)
        self._last_event: Event | None = None
        self._drained = 0  # lines known to be in the file

    def record(self, event: Event) -> None:
        if event is not self._last_event:
            self._last_event = event
            self._segments.append((self.lines.seq + 1, event))
        line, header = self.lines.line(event), self.header
        if self.octet_counted:
            self.sock.sendall(b"%d %b%b" % (len(header) + len(line), header, line))
        else:
            self.sock.sendall(header + line)

    record_new = record

    def checkpoint(self, snapshot: object) -> None:
        raise NotImplementedError("the syslog peers are measured in scenarios 1 and 2 only")

    def _expected_size(self) -> int:
        total = 0
        ends = [first for first, _ in self._segments[1:]] + [self.lines.seq + 1]
        for (first, event), end in zip(self._segments, ends, strict=True):
            at_one = len(LineEncoder(self.lines.session_id, self.lines.run_id).line(event))
            total += line_lengths(at_one, first, end - first)
        return total

    def drain(self) -> None:
        expected = self._expected_size()
        deadline = time.monotonic() + _DRAIN_TIMEOUT
        while True:
            try:
                if os.stat(self.path).st_size >= expected:
                    break
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.path} did not reach {expected} bytes")
            time.sleep(0.0005)
        self._drained = self.lines.seq

    def check(self) -> None:
        """Raises :class:`LineCheckFailed` unless the file holds exactly the lines
        drained so far, in order, each byte for byte as sent."""
        expected = LineEncoder(self.lines.session_id, self.lines.run_id)
        starts = dict(self._segments)
        event = self._segments[0][1]
        lineno = 0
        with open(self.path, "rb") as file:
            for lineno, line in enumerate(file, 1):
                event = starts.get(lineno, event)
                if lineno > self._drained or line != expected.line(event):
                    raise LineCheckFailed(self._mismatch(lineno, line))
        if lineno != self._drained:
            raise LineCheckFailed(
                f"{self.path}: {self._drained - lineno} of {self._drained} lines missing"
            )

    def _mismatch(self, lineno: int, line: bytes) -> str:
        if lineno > self._drained:
            return f"{self.path}: line {lineno}: a line beyond the {self._drained} sent"
        try:
            parse_line(
                line.removesuffix(b"\n"),
                lineno=lineno,
                session_id=self.lines.session_id,
                expected_seq=lineno,
            )
        except FileFormatError as exc:
            return f"{self.path}: {exc}"
        return (
            f"{self.path}: line {lineno}: not byte for byte the line sent "
            f"({len(line)} bytes: {line[:80]!r})"
        )

    def close(self) -> None:
        if self.sock.fileno() < 0:
            return
        self.sock.close()
        if self._drained:
            self.check()


# ----------------------------------------------------------------------------- table


def peer_table(rows: Sequence[Row], peers: Sequence[Peer]) -> str:
    """Scenarios 1 and 2 for flightlogd, the peers and the in-process recorder: rate,
    ratio to the recorder, and CPU per event split into the agents' and the daemon's."""
    by_key = {row.key: row for row in rows}
    scenarios = [key for key in ("1", "2") if key in by_key]
    header = ["system"]
    for key in scenarios:
        size = "small events" if key == "1" else "64 KiB events"
        header += [
            f"{size} ({by_key[key].unit})",
            f"vs {SYSTEM_TITLES['jsonl']}",
            "CPU per event, agents + daemon (µs)",
        ]
    lines = [header]
    systems = [("flightlog", SYSTEM_TITLES["flightlog"], "")]
    systems += [(peer.name, peer.title, peer.skipped) for peer in peers]
    systems.append(("jsonl", SYSTEM_TITLES["jsonl"], ""))
    for name, title, skipped in systems:
        if skipped:
            lines.append([title, f"skipped: {skipped}", *[""] * (len(header) - 2)])
            continue
        line = [title]
        for key in scenarios:
            rate, total, daemon = by_key[key], by_key[key + "b"], by_key[key + "c"]
            line += [rate.cell(name), _ratio(rate, name), _cpu_split(total, daemon, name)]
        lines.append(line)
    return markdown_table(lines)


def _ratio(row: Row, system: str) -> str:
    mine, reference = row.median(system), row.median("jsonl")
    return f"{mine / reference:.2f}{TIMES}" if mine and reference else "—"


def _cpu_split(total: Row, daemon: Row, system: str) -> str:
    """``all = agents + daemon``, medians over the runs (the daemon's row is absent for
    the in-process recorder, which has none)."""
    everything = total.median(system)
    if everything is None:
        return "—"
    own = daemon.median(system) or 0.0
    fmt = total.fmt.format
    return f"{fmt(everything)} = {fmt(everything - own)} + {fmt(own)}"
