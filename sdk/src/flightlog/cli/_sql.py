"""``flightlog sql``: any SQL over every session the caller may read, through DuckDB.

The engine and its views are :func:`flightlog.sdk.sql_connection`'s; this module only
prints: a table on a terminal (cells cut to a width, control characters escaped), JSON
lines (``--json``: a ``JSON`` column is embedded as JSON, times are RFC 3339), CSV
(``--csv``) or a Parquet file (``--parquet FILE``, written by DuckDB itself).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import decimal
import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Final

import msgspec

from flightlog.sdk import SQL_VIEWS, sql_connection

from ._commands import EXIT_OK, EXIT_USAGE, CommandError, local_path
from ._render import Style, say

__all__ = ["add_sql_arguments", "cmd_sql", "sql_epilog"]

_BATCH: Final = 1024
_CELL: Final = 60


def sql_epilog(exit_help: str) -> str:
    return f"""\
views (columns: flightlog sql --schema):
  records   every line: path, session_id, seq, type, time, run_id, data (JSON)
  sessions  one row per session file: meta, started, last_time, runs, tokens, cost
  runs      one row per run: started, closed, error, agent, ok, turns, retries, tokens
  calls     one row per model or tool call attempt: name, started, ended, duration_ms,
            status (ok, error, open, refused, ...), error, tokens, agent, parent_id
  messages  every message recorded: source, execution_id, role, text, message (JSON)

examples:
  flightlog sql "SELECT name, count(*) FROM calls WHERE status = 'error' GROUP BY name"
  flightlog sql "SELECT name, sum(input_tokens) FROM calls WHERE kind = 'model' GROUP BY ALL"
  flightlog sql --json "SELECT * FROM runs WHERE NOT closed" | jq .path
  flightlog sql --parquet calls.parquet "SELECT * FROM calls"
  flightlog sql "SELECT count(*) FROM records" demo/           only the files under demo/

Reads the data root (or the PATHs given) with your own permissions: a file you cannot
read is left out and named on stderr.  Needs DuckDB: pip install 'flightlog-sdk[sql]'.
docs/cli.md has ten ready queries.

{exit_help}
"""


def add_sql_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", metavar="QUERY", nargs="?", help="the SQL to run")
    parser.add_argument(
        "paths",
        metavar="PATH",
        nargs="*",
        help="session files or directories (default: the data root)",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="one JSON object per row")
    output.add_argument("--csv", action="store_true", help="CSV with a header row")
    output.add_argument("--parquet", metavar="FILE", help="write the rows to a Parquet file")
    output.add_argument(
        "--schema", action="store_true", help="print the views and their columns, then exit"
    )


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC)
            return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return value.isoformat()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    raise NotImplementedError(type(value).__name__)


def _embed_json(value: Any, kind: str) -> Any:
    """A value of a DuckDB ``JSON`` (or ``JSON[]``) column as the JSON it holds."""
    if value is None:
        return None
    if kind == "JSON":
        return msgspec.Raw(value.encode())
    return [_embed_json(item, kind[:-2]) for item in value]


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return str(value)


def _escape(text: str) -> str:
    # A cell is one line of a table: every control character is shown, never run.
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)


def _cut(text: str) -> str:
    return text if len(text) <= _CELL else text[: _CELL - 1] + "…"


def _batches(cursor: Any) -> Iterator[list[tuple[Any, ...]]]:
    while rows := cursor.fetchmany(_BATCH):
        yield rows


def _print_table(columns: Sequence[str], cursor: Any, style: Style) -> int:
    rows = [[_cut(_escape(_text(value))) for value in row] for row in cursor.fetchall()]
    widths = [len(name) for name in columns]
    for row in rows:
        for index, cell in enumerate(row):
            widths[index] = max(widths[index], len(cell))
    out = sys.stdout
    out.write(style.bold("  ".join(n.ljust(w) for n, w in zip(columns, widths, strict=True))))
    out.write("\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    out.write(style.dim(f"({len(rows)} row{'' if len(rows) == 1 else 's'})") + "\n")
    return len(rows)


def _print_json(columns: Sequence[str], types: Sequence[str], cursor: Any) -> None:
    encoder = msgspec.json.Encoder(enc_hook=_json_value)
    embedded = [i for i, kind in enumerate(types) if kind.startswith("JSON")]
    out = sys.stdout
    for rows in _batches(cursor):
        for row in rows:
            values = list(row)
            for index in embedded:
                values[index] = _embed_json(values[index], types[index])
            out.write(encoder.encode(dict(zip(columns, values, strict=True))).decode())
            out.write("\n")


def _print_csv(columns: Sequence[str], cursor: Any) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    for rows in _batches(cursor):
        writer.writerows([[_json_text(value) for value in row] for row in rows])


def _json_text(value: Any) -> Any:
    if isinstance(value, list | dict):
        return msgspec.json.encode(value, enc_hook=_json_value).decode()
    if isinstance(value, datetime.datetime):
        return _json_value(value)
    return value


def _print_schema(connection: Any, style: Style) -> None:
    out = sys.stdout
    for name in ("records", *SQL_VIEWS):
        out.write(style.bold(name) + "\n")
        for column, kind, *_ in connection.execute(f"DESCRIBE {name}").fetchall():
            out.write(f"  {column:<20} {kind}\n")


def cmd_sql(args: argparse.Namespace, style: Style) -> int:
    if args.query is None and not args.schema:
        raise CommandError("give a QUERY (or --schema to see the views)", EXIT_USAGE)
    paths = [local_path(path) for path in args.paths] if args.paths else None
    if paths:
        missing = [path for path in paths if not os.path.exists(path)]
        if missing:
            raise CommandError(f"no such file or directory: {missing[0]}", EXIT_USAGE)
    connection, skipped = sql_connection(paths)  # MissingExtra without DuckDB
    import duckdb

    for path, reason in skipped.items():
        say(f"flightlog: left out {path}: {reason}", sys.stderr)
    try:
        if args.schema:
            _print_schema(connection, style)
            return EXIT_OK
        query = args.query.strip().rstrip(";")
        try:
            if args.parquet:
                connection.execute(
                    f"COPY ({query}) TO '{args.parquet.replace(chr(39), chr(39) * 2)}' "
                    "(FORMAT parquet)"
                )
                return EXIT_OK
            cursor = connection.execute(query)
            description = cursor.description or []
            columns = [column[0] for column in description]
            types = [str(column[1]) for column in description]
            if args.json:
                _print_json(columns, types, cursor)
            elif args.csv:
                _print_csv(columns, cursor)
            else:
                _print_table(columns, cursor, style)
        except duckdb.Error as exc:
            raise CommandError(f"the query failed: {exc}", EXIT_USAGE) from None
        return EXIT_OK
    finally:
        connection.close()
