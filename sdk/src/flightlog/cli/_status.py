"""``flightlog status``: what the daemon holds, from its ``status`` reply."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import msgspec

from flightlog.protocol.wire import StatusReply
from flightlog.sdk import connect

from ._commands import _CLIENT_NAME, EXIT_OK, _out, _plural, _socket
from ._render import Style, format_bytes, format_duration

__all__ = ["add_status_arguments", "cmd_status", "status_epilog"]


def status_epilog(exit_help: str) -> str:
    return f"""\
examples:
  flightlog status
  flightlog status --json | jq '.sessions[].path'
  FLIGHTLOG_SOCKET=/run/flightlog/flightlog.sock flightlog status

{exit_help}
"""


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="the daemon's reply as JSON")


def _storage_lines(reply: StatusReply) -> Iterator[str]:
    for mine in reply.storage:
        limits = [
            f"at most {format_bytes(mine.max_use)}" if mine.max_use is not None else "",
            f"none older than {format_duration(mine.max_age)}" if mine.max_age else "",
            f"{format_bytes(mine.keep_free)} kept free" if mine.keep_free is not None else "",
            f"at most {format_bytes(mine.max_use_total)} for all uids"
            if mine.max_use_total is not None
            else "",
        ]
        said = ", ".join(limit for limit in limits if limit) or "no limits"
        removed = (
            f", {mine.removed_files:,} removed ({format_bytes(mine.removed_bytes)})"
            if mine.removed_files
            else ""
        )
        blobs = (
            f", {_plural(mine.blobs, 'blob')} ({format_bytes(mine.blob_bytes)})"
            if mine.blobs
            else ""
        )
        yield (
            f"  uid {mine.uid} files: {mine.files:,} sessions, {format_bytes(mine.bytes)}"
            f"{blobs}{removed}; retention: {said}"
        )


def _status_lines(reply: StatusReply, socket: str, style: Style) -> Iterator[str]:
    yield (
        f"{style.bold('flightlogd')} {reply.version}, pid {reply.pid}, "
        f"up {format_duration(reply.uptime)}, socket {socket}"
    )
    yield (
        f"  {_plural(reply.connections, 'connection')}, "
        f"{_plural(reply.subscribers, 'subscriber')}, {_plural(reply.open_files, 'open file')}"
    )
    errors = _plural(reply.errors, "error")
    yield (
        f"  written: {reply.records_written:,} records, {format_bytes(reply.bytes_written)}, "
        f"{reply.records_per_second:,.1f} records/s now, "
        + (style.red(errors) if reply.errors else errors)
    )
    if (mine := reply.uid_limits) is not None:
        if mine.max_connections is None:
            yield f"  uid {mine.uid}: the daemon's own, no per-uid limits"
        else:
            rate = format_bytes(mine.max_bytes_per_second or 0)
            yield (
                f"  uid {mine.uid}: {mine.connections:,} of {mine.max_connections:,} "
                f"connections, {mine.sessions:,} of {mine.max_sessions:,} sessions, "
                f"at most {rate}/s"
            )
    yield from _storage_lines(reply)
    if not reply.sessions:
        yield "  no open sessions"
        return
    yield ""
    yield style.bold(f"open sessions ({len(reply.sessions)}):")
    for session in sorted(reply.sessions, key=lambda s: s.path):
        writer = f"writer pid {session.writer_pid}" if session.writer_pid else "no writer"
        run = f"run {session.run_id[:8]}" if session.run_id else "no open run"
        yield f"  {session.path}"
        facts = [
            writer,
            run,
            f"last seq {session.last_seq}",
            f"{session.records:,} records / {format_bytes(session.bytes)} written",
            _plural(session.subscribers, "subscriber"),
        ]
        if not session.file_open:
            facts.append("file closed (idle)")
        yield "    " + ", ".join(facts)
        if session.error:
            yield "    " + style.red(f"error: {session.error}")


def cmd_status(args: argparse.Namespace, style: Style) -> int:
    socket = _socket(args)
    with connect(socket, client_name=_CLIENT_NAME) as client:
        reply = client.status()
    if args.json:
        sys.stdout.write(msgspec.json.encode(reply).decode() + "\n")
    else:
        for line in _status_lines(reply, socket, style):
            _out(line)
    return EXIT_OK
