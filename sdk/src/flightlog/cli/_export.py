"""``flightlog export``: sessions as OTLP traces, through the official OpenTelemetry SDK.

The spans come from :mod:`._spans` (the GenAI semantic conventions, ids derived from the
session, run and execution ids); this module turns them into the SDK's ``ReadableSpan``
and hands them to the SDK's OTLP span exporter, which encodes and sends them and reads
the standard ``OTEL_EXPORTER_OTLP_*`` variables itself.  The SDK is the ``otel`` extra of
``flightlog-sdk``: the plain SDK does not need it.

``--follow`` runs until it is stopped: it reads every session under the data root, then
what the daemon pushes live (:mod:`._sessions`), and keeps one cursor file per session
in its state directory: the last seq whose spans the backend accepted.  A cursor moves
only after the export succeeded, so a restart (of the exporter or of the daemon) sends
nothing twice that was confirmed, and misses nothing: spans sent but not yet confirmed
when the exporter died go out again with the same ids, which a backend keeps once.  A
backend that is down or refuses is retried with a growing pause (up to a minute); the
records wait in the files, not in memory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from flightlog.protocol import (
    FileFormatError,
    Record,
)
from flightlog.protocol.wire import (
    default_root,
)
from flightlog.sdk import connect

from ._commands import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNSOUND,
    EXIT_USAGE,
    CommandError,
    installed_version,
    local_path,
)
from ._render import Style, say
from ._sessions import AllSessions, Doorbell, Rescan, SessionFile, session_files
from ._spans import Span, SpanBuilder

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = ["add_export_arguments", "cmd_export", "export_epilog", "state_dir"]

#: Spans per OTLP request.
BATCH: Final = 512
#: The longest pause between two attempts at a backend that is down.
MAX_BACKOFF: Final = 60.0
_CONTENT_VALUES: Final = frozenset({"true", "1", "span_only", "span_and_event"})


def export_epilog(exit_help: str) -> str:
    return f"""\
examples:
  flightlog export demo/session.jsonl                 one session, to $OTEL_EXPORTER_OTLP_ENDPOINT
  flightlog export --all --endpoint http://localhost:6006   every session, to Phoenix
  flightlog export --all --follow                     keep exporting as agents record
  OTEL_EXPORTER_OTLP_PROTOCOL=grpc flightlog export --all --endpoint http://collector:4317

The endpoint, protocol (http/protobuf, the default, or grpc), headers and timeout come
from the standard OTEL_EXPORTER_OTLP_* variables; --endpoint overrides the endpoint.
Message content is sent only with --content (or
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true).  Exporting twice sends the
same trace and span ids.  Needs the otel extra: pip install 'flightlog-sdk[otel]'.

{exit_help}
"""


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="PATH", nargs="*", help="session files or directories")
    parser.add_argument(
        "--all", action="store_true", help="every session under the data root (--root)"
    )
    parser.add_argument(
        "--root", metavar="DIR", help="the data root (default: $FLIGHTLOG_ROOT or the default)"
    )
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep exporting what is written, with a cursor per session in --state",
    )
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help="the OTLP endpoint (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
        "$OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318)",
    )
    parser.add_argument("--content", action="store_true", help="include message content (opt-in)")
    parser.add_argument(
        "--state",
        metavar="DIR",
        help="where --follow keeps its cursors (default: $STATE_DIRECTORY, else "
        "$XDG_STATE_HOME/flightlog-export)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="with --follow, how often the files are checked besides the daemon's pushes "
        "(default: %(default)s)",
    )


def state_dir(environ: dict[str, str] | os._Environ[str], home: str) -> str:
    """``$STATE_DIRECTORY`` (systemd's StateDirectory=), else
    ``$XDG_STATE_HOME/flightlog-export``, else ``~/.local/state/flightlog-export``."""
    if systemd := environ.get("STATE_DIRECTORY"):
        return systemd.split(":")[0]
    if state := environ.get("XDG_STATE_HOME"):
        return os.path.join(state, "flightlog-export")
    return os.path.join(home, ".local", "state", "flightlog-export")


def _err(text: str) -> None:
    say(text, sys.stderr)


# ------------------------------------------------------------- the OpenTelemetry side


class _Otel:
    """The SDK's objects an export needs: the exporter, the resource, the scope."""

    def __init__(self, endpoint: str | None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        except ImportError:
            raise CommandError(
                "flightlog export needs the OpenTelemetry SDK: pip install 'flightlog-sdk[otel]'",
                EXIT_USAGE,
            ) from None
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "flightlog"}))
        self.resource: Resource = resource
        self.scope: InstrumentationScope = InstrumentationScope("flightlog", installed_version("0"))
        self.exporter, self.endpoint = _span_exporter(endpoint)

    def convert(self, span: Span) -> ReadableSpan:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.trace import (
            Link,
            SpanContext,
            SpanKind,
            Status,
            StatusCode,
            TraceFlags,
        )

        flags = TraceFlags(TraceFlags.SAMPLED)

        def context(trace_id: int, span_id: int) -> SpanContext:
            return SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags)

        status = (
            Status(StatusCode.ERROR, span.error)
            if span.error is not None
            else Status(StatusCode.UNSET)
        )
        return ReadableSpan(
            name=span.name,
            context=context(span.trace_id, span.span_id),
            parent=None if span.parent_id is None else context(span.trace_id, span.parent_id),
            resource=self.resource,
            attributes=_carried(span.attributes),
            events=[Event(e.name, _carried(e.attributes), e.time_ns) for e in span.events],
            links=[
                Link(context(li.trace_id, li.span_id), _carried(li.attributes)) for li in span.links
            ],
            kind=SpanKind.CLIENT if span.kind == "client" else SpanKind.INTERNAL,
            status=status,
            start_time=span.start_ns,
            end_time=span.end_ns,
            instrumentation_scope=self.scope,
        )

    def send(self, spans: Sequence[Span]) -> bool:
        """Export ``spans``; True when the backend accepted them."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        result = self.exporter.export([self.convert(span) for span in spans])
        return result is SpanExportResult.SUCCESS

    def close(self) -> None:
        self.exporter.shutdown()


#: OTLP's integers are signed 64-bit.
_INT64: Final = range(-(1 << 63), 1 << 63)


def _carried(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """``attributes`` as OTLP carries them: an integer beyond 64 bits (a record may hold
    4,300 digits) as its decimal text."""
    return {
        key: str(value)
        if isinstance(value, int) and not isinstance(value, bool) and value not in _INT64
        else value
        for key, value in attributes.items()
    }


def _span_exporter(endpoint: str | None) -> tuple[SpanExporter, str]:
    try:
        return _otlp_exporter(endpoint)
    except ImportError as exc:
        raise CommandError(
            f"flightlog export needs the OTLP exporter ({exc.name}): "
            "pip install 'flightlog-sdk[otel]'",
            EXIT_USAGE,
        ) from None


def _otlp_exporter(endpoint: str | None) -> tuple[SpanExporter, str]:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        grpc = GrpcExporter(endpoint=endpoint)
        return grpc, endpoint or str(getattr(grpc, "_endpoint", "the default gRPC endpoint"))
    if protocol != "http/protobuf":
        raise CommandError(
            f"OTLP protocol {protocol!r} is not supported; use http/protobuf or grpc",
            EXIT_USAGE,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    http = OTLPSpanExporter(endpoint=endpoint)
    return http, str(getattr(http, "_endpoint", endpoint))


def _content(args: argparse.Namespace) -> bool:
    opt_in = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
    return bool(args.content) or opt_in.strip().lower() in _CONTENT_VALUES


# -------------------------------------------------------------------------- one shot


def _paths(args: argparse.Namespace) -> list[str]:
    root = args.root or default_root(os.environ, os.path.expanduser("~"))
    if args.all:
        if not os.path.isdir(root):
            raise CommandError(f"{root}: the data root does not exist (see --root)", EXIT_USAGE)
        return [root, *args.paths]
    if not args.paths:
        raise CommandError("export needs a PATH, or --all for every session", EXIT_USAGE)
    missing = [path for path in args.paths if not os.path.exists(local_path(path))]
    if missing:
        raise CommandError(f"{missing[0]}: no such file or directory", EXIT_USAGE)
    return [local_path(path) for path in args.paths]


def cmd_export(args: argparse.Namespace, style: Style) -> int:
    if args.interval <= 0:
        raise CommandError("--interval takes a number of seconds above 0", EXIT_USAGE)
    if args.follow:
        return _follow(args, style)
    paths = _paths(args)
    otel = _Otel(args.endpoint)
    content = _content(args)
    sessions = spans = open_runs = 0
    unsound = False

    def skipped(path: str, exc: OSError) -> None:
        _err(f"flightlog export: {path}: {_why(exc)}; skipped")

    try:
        for path in session_files(paths, skipped=skipped):
            builder = SpanBuilder(content=content, path=path)
            pending: list[Span] = []
            file = SessionFile(path, lambda _sid: 0)
            try:
                for record in file.read():
                    pending.extend(builder.add(record))
                    _report_skipped(path, builder)
                    if len(pending) >= BATCH:
                        spans += _send_now(otel, pending)
            except (OSError, FileFormatError) as exc:
                unsound = unsound or isinstance(exc, FileFormatError)
                _err(f"flightlog: {path}: {_why(exc)} (exported what comes before it)")
            spans += _send_now(otel, pending)
            sessions += 1
            open_runs += builder.run is not None
    finally:
        otel.close()
    note = f" ({open_runs:,} runs not ended yet: exported once they end)" if open_runs else ""
    _err(
        style.dim(
            f"-- exported {spans:,} spans of {sessions:,} sessions to {otel.endpoint}{note} --"
        )
    )
    return EXIT_UNSOUND if unsound else EXIT_OK


def _report_skipped(path: str, builder: SpanBuilder) -> None:
    """Say which records ``builder`` skipped (a time no span carries), once each."""
    for why in builder.skipped:
        _err(f"flightlog export: {path}: {why}")
    builder.skipped.clear()


def _why(exc: Exception) -> str:
    if isinstance(exc, FileFormatError):
        return f"line {exc.line}: {exc.reason}"
    if isinstance(exc, OSError):
        return f"cannot read: {exc.strerror or exc}"
    return str(exc)


def _send_now(otel: _Otel, spans: list[Span]) -> int:
    count = 0
    while spans:
        chunk, spans[:] = spans[:BATCH], spans[BATCH:]
        if not otel.send(chunk):
            raise CommandError(
                f"the OTLP backend at {otel.endpoint} did not take the spans "
                "(is it running? see the exporter's message above)",
                EXIT_REFUSED,
            )
        count += len(chunk)
    return count


# ---------------------------------------------------------------------------- follow


class _Cursors:
    """One file per session in the state directory: ``SESSION_ID.cursor`` holding
    ``{"seq": N, "path": P}``, replaced atomically (write, fsync, rename, fsync dir)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.seqs: dict[str, int] = {}
        for name in os.listdir(directory):
            if not name.endswith(".cursor"):
                continue
            try:
                with open(os.path.join(directory, name), "rb") as fileobj:
                    saved = json.load(fileobj)
                self.seqs[name.removesuffix(".cursor")] = int(saved["seq"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CommandError(
                    f"{os.path.join(directory, name)}: not a cursor file ({exc}); "
                    "move it away to export that session from its start",
                    EXIT_USAGE,
                ) from None

    def save(self, moved: dict[str, tuple[str, int]]) -> None:
        for session_id, (path, seq) in moved.items():
            if self.seqs.get(session_id, 0) >= seq:
                continue
            target = os.path.join(self.directory, f"{session_id}.cursor")
            fd, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as fileobj:
                    fileobj.write(json.dumps({"seq": seq, "path": path}).encode() + b"\n")
                    fileobj.flush()
                    os.fsync(fileobj.fileno())
                os.replace(temporary, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
            self.seqs[session_id] = seq
        if moved:
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)


class _Follower:
    """Records in, spans out to the backend, cursors moved after the backend took them."""

    def __init__(self, otel: _Otel, cursors: _Cursors, *, content: bool) -> None:
        self.otel = otel
        self.cursors = cursors
        self.content = content
        self.builders: dict[tuple[str, str], SpanBuilder] = {}
        self.pending: list[Span] = []
        self.moved: dict[str, tuple[str, int]] = {}
        self.sent = 0

    def take(self, items: Iterable[tuple[str, Record]]) -> None:
        for path, record in items:
            key = (path, record.session_id)
            builder = self.builders.get(key)
            if builder is None:
                builder = self.builders[key] = SpanBuilder(content=self.content, path=path)
            confirmed = self.cursors.seqs.get(record.session_id, 0)
            self.pending.extend(s for s in builder.add(record) if s.end_seq > confirmed)
            _report_skipped(path, builder)
            if record.seq > confirmed:
                self.moved[record.session_id] = (path, record.seq)

    def flush(self) -> None:
        """Send every pending span (retrying until the backend takes them), then move
        the cursors."""
        backoff = 1.0
        while self.pending:
            chunk = self.pending[:BATCH]
            if self.otel.send(chunk):
                del self.pending[:BATCH]
                self.sent += len(chunk)
                backoff = 1.0
                continue
            _err(
                f"flightlog export: {self.otel.endpoint} did not take the spans; "
                f"trying again in {backoff:.0f}s (the cursors stay where they are)"
            )
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
        self.cursors.save(self.moved)
        self.moved.clear()


def _terminate(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _follow(args: argparse.Namespace, style: Style) -> int:
    root = args.root or default_root(os.environ, os.path.expanduser("~"))
    roots = [root, *(local_path(path) for path in args.paths)]
    cursors = _Cursors(args.state or state_dir(os.environ, os.path.expanduser("~")))
    otel = _Otel(args.endpoint)
    follower = _Follower(otel, cursors, content=_content(args))
    socket = args.socket or None

    def on_error(path: str, exc: Exception) -> None:
        _err(f"flightlog export: {path}: {_why(exc)}; skipped")

    def subscribe() -> tuple[Iterable[tuple[str, Record]], Any]:
        # No reconnect: when the subscription ends the files are scanned again, after
        # this exporter's own cursors, which a tail riding through would read twice.
        client = connect(socket, client_name="flightlog-export", reconnect_grace=0)
        try:
            tail = client.tail_all(follow=True).__enter__()
        except BaseException:
            client.close()
            raise
        return tail, client.close

    signal.signal(signal.SIGTERM, _terminate)
    sessions = AllSessions(roots, {}, on_error)
    doorbell = Doorbell(subscribe, retry=args.interval).start()
    doorbell.started(timeout=10.0)
    _err(style.dim(f"-- exporting {root} to {otel.endpoint}, cursors in {cursors.directory} --"))
    try:
        follower.take(sessions.scan())
        follower.flush()
        while True:
            follower.take(_next_records(doorbell, sessions, args.interval))
            follower.flush()
    finally:
        doorbell.close()
        otel.close()


def _next_records(
    doorbell: Doorbell, sessions: AllSessions, interval: float
) -> Iterator[tuple[str, Record]]:
    """What to export next: the daemon's pushes (a few thousand at most at once), or,
    after ``interval`` without any or when the subscription ended, a scan of the files."""
    try:
        item = doorbell.items.get(timeout=interval)
    except queue.Empty:
        yield from sessions.scan()
        return
    for _ in range(5000):
        if isinstance(item, Rescan):
            yield from sessions.scan()
        else:
            yield from sessions.live(*item)
        try:
            item = doorbell.items.get_nowait()
        except queue.Empty:
            return
