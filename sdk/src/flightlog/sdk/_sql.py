"""SQL over session files, through DuckDB reading the JSONL directly.

Theory of operation
-------------------
There is no import step and no second copy: :func:`sql_connection` opens an in-memory
DuckDB database whose views read the session files where they lie (DuckDB's
``read_json``), each time a query runs.  A query therefore sees what the files hold at
that moment, and nothing the caller may not read: the files are opened by the caller's
own process, with the caller's own permissions, and a file it cannot read is left out
(and named in :attr:`SqlResult.skipped`).

The reading rules are the format's (docs/format.md), as far as a SQL engine can keep
them:

* ``records`` holds every complete line; the unfinished tail a crash may leave (a last
  line without its ``\\n``) is left out even when it is valid JSON, as every reader
  leaves it out.  Only the end of each file is read to find it.
* A line that does not parse is skipped, not fatal: one damaged file must not hide every
  other session from a query.  ``flightlog check`` says whether a file is sound.

The views on top of ``records`` (``sessions``, ``runs``, ``calls``, ``messages``) are
plain SQL over it, so a user can read them (``flightlog sql --schema``) and write their
own the same way.  Calls pair their starts and ends by run, execution id, attempt and
kind, and a call with no end is ``open``, never a success.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from flightlog.protocol.wire import (
    default_root,
)

from ._compression import is_compressed, open_regular, session_files
from ._exceptions import MissingExtra

if TYPE_CHECKING:
    import duckdb

__all__ = ["SQL_VIEWS", "SqlResult", "sql", "sql_connection"]

#: The longest line the format allows (``MAX_LINE_BYTES``), plus room: DuckDB refuses
#: objects past ``maximum_object_size``.
_MAX_OBJECT: Final = 256 * 1024 * 1024 + 64 * 1024
#: How much of a file's end is read at a time, looking for an unfinished tail's start.
_TAIL_BLOCK: Final = 64 * 1024
_SEQ: Final = re.compile(rb'\{\s*"session_id"\s*:\s*"[^"\\]*"\s*,\s*"seq"\s*:\s*(\d{1,19})\b')

_COLUMNS: Final = (
    "{session_id: 'VARCHAR', seq: 'BIGINT', type: 'VARCHAR', time: 'VARCHAR', "
    "run_id: 'VARCHAR', data: 'JSON'}"
)

#: Sums of a model call's usage, written once for the views that aggregate it.
_USAGE = """
    sum(TRY_CAST(data->'usage'->>'input_tokens' AS BIGINT)) {filter} AS input_tokens,
    sum(TRY_CAST(data->'usage'->>'output_tokens' AS BIGINT)) {filter} AS output_tokens,
    sum(TRY_CAST(data->'usage'->>'cache_read_tokens' AS BIGINT)) {filter} AS cache_read_tokens,
    sum(TRY_CAST(data->'usage'->>'cache_write_tokens' AS BIGINT)) {filter} AS cache_write_tokens,
    sum(TRY_CAST(data->'usage'->>'cost' AS DOUBLE)) {filter} AS cost"""

_MODEL_END: Final = "FILTER (WHERE type = 'model_exec_end')"

#: The documented views, in the order they are made (each reads the ones before it).
SQL_VIEWS: Final[dict[str, str]] = {
    "sessions": f"""
SELECT path, session_id,
    any_value(data->'meta') FILTER (WHERE type = 'session_start') AS meta,
    any_value(data->'origin'->>'session_id') FILTER (WHERE type = 'session_start')
        AS origin_session_id,
    any_value(data->'origin'->>'path') FILTER (WHERE type = 'session_start') AS origin_path,
    any_value(TRY_CAST(data->'origin'->>'seq' AS BIGINT)) FILTER (WHERE type = 'session_start')
        AS origin_seq,
    min(time) FILTER (WHERE type = 'session_start') AS started,
    max(time) AS last_time,
    count(*) AS records,
    count(*) FILTER (WHERE type = 'run_start') AS runs,
    count(*) FILTER (WHERE type = 'run_close') AS closed_runs,
    count(DISTINCT data->>'agent') FILTER (WHERE type = 'agent_start') AS agents,
    {_USAGE.format(filter=_MODEL_END)}
FROM records GROUP BY path, session_id""",
    "runs": f"""
SELECT path, session_id, run_id,
    min(time) FILTER (WHERE type = 'run_start') AS started,
    max(time) FILTER (WHERE type = 'run_close') AS closed_at,
    max(time) AS last_time,
    bool_or(type = 'run_close') AS closed,
    coalesce(bool_or(TRY_CAST(data->>'repaired' AS BOOLEAN)) FILTER (WHERE type = 'run_close'),
        false) AS repaired,
    any_value(data->>'error') FILTER (WHERE type = 'run_close') AS error,
    any_value(TRY_CAST(data->>'pid' AS BIGINT)) FILTER (WHERE type = 'run_start') AS pid,
    any_value(data->>'client') FILTER (WHERE type = 'run_start') AS client,
    any_value(data->>'agent') FILTER (WHERE type = 'agent_start' AND data->>'parent_id' IS NULL)
        AS agent,
    any_value(TRY_CAST(data->>'ok' AS BOOLEAN)) FILTER (WHERE type = 'agent_end') AS ok,
    count(*) AS records,
    count(*) FILTER (WHERE type = 'turn_start') AS turns,
    count(*) FILTER (WHERE type = 'retry') AS retries,
    {_USAGE.format(filter=_MODEL_END)}
FROM records WHERE run_id IS NOT NULL GROUP BY path, session_id, run_id""",
    "calls": f"""
WITH facts AS (
    SELECT *, data->'execution'->>'id' AS execution_id,
        TRY_CAST(data->'execution'->>'attempt' AS BIGINT) AS attempt,
        data->'execution'->>'kind' AS kind
    FROM records
    WHERE type IN ('model_request', 'model_exec_start', 'model_exec_end', 'tool_queued',
        'tool_exec_start', 'tool_invoke_start', 'tool_invoke_end', 'tool_exec_end', 'retry',
        'retry_wait_start', 'retry_wait_end', 'context_compacted')
        AND data->'execution'->>'id' IS NOT NULL
), calls AS (
    SELECT path, session_id, run_id, execution_id, attempt, kind,
        any_value(data->'execution'->>'parent_id') AS parent_id,
        any_value(TRY_CAST(data->'execution'->>'turn_index' AS BIGINT)) AS turn_index,
        any_value(data->'execution'->>'agent') AS agent,
        any_value(data->'execution'->>'replaces') AS replaces,
        coalesce(
            any_value(data->>'name') FILTER (WHERE type LIKE 'tool_%'),
            any_value(data->>'model') FILTER (WHERE type = 'model_exec_start'),
            any_value(data->'config'->>'model') FILTER (WHERE type = 'model_request'),
            any_value(data->'message'->>'model') FILTER (WHERE type = 'model_exec_end')
        ) AS name,
        coalesce(
            min(time) FILTER (WHERE type IN ('model_exec_start', 'tool_exec_start')),
            min(time)
        ) AS started,
        max(time) FILTER (WHERE type IN ('model_exec_end', 'tool_exec_end')) AS ended,
        bool_or(type IN ('model_exec_end', 'tool_exec_end')) AS has_end,
        any_value(data->>'error') FILTER (WHERE type = 'model_exec_end') AS model_error,
        any_value(TRY_CAST(data->>'is_error' AS BOOLEAN)) FILTER (WHERE type = 'tool_exec_end')
            AS tool_failed,
        any_value(data->>'disposition')
            FILTER (WHERE type IN ('tool_exec_end', 'model_exec_end')) AS disposition,
        any_value(array_to_string(json_extract_string(data, '$.content[*].text'), ''))
            FILTER (WHERE type = 'tool_exec_end') AS tool_text,
        any_value(data->'arguments') FILTER (WHERE type IN ('tool_queued', 'tool_exec_start'))
            AS arguments,
        bool_or(type = 'retry') AS retried,
        min(seq) AS first_seq,
        max(seq) AS last_seq,
        {_USAGE.format(filter=_MODEL_END)}
    FROM facts GROUP BY path, session_id, run_id, execution_id, attempt, kind
)
SELECT path, session_id, run_id, execution_id, attempt, kind, name, agent, parent_id,
    turn_index, replaces, started, ended,
    date_diff('microsecond', started, ended) / 1000.0 AS duration_ms,
    CASE
        WHEN NOT has_end THEN 'open'
        WHEN disposition IS NOT NULL AND disposition <> 'ran' THEN disposition
        WHEN model_error IS NOT NULL OR coalesce(tool_failed, false) THEN 'error'
        ELSE 'ok'
    END AS status,
    CASE WHEN kind = 'tool' THEN (CASE WHEN tool_failed THEN tool_text END) ELSE model_error END
        AS error,
    arguments, retried, first_seq, last_seq,
    input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost
FROM calls""",
    "messages": """
WITH listed AS (
    SELECT path, session_id, run_id, seq, type, data->'execution'->>'id' AS execution_id,
        json_extract(data, '$.messages[*]') AS list
    FROM records WHERE type IN ('model_request', 'agent_start')
), single AS (
    SELECT path, session_id, run_id, seq, type, data->'execution'->>'id' AS execution_id,
        0 AS position, data->'message' AS message
    FROM records
    WHERE type IN ('model_exec_end', 'message_end') AND json_type(data->'message') = 'OBJECT'
), every AS (
    SELECT path, session_id, run_id, seq, type, execution_id,
        generate_subscripts(list, 1) - 1 AS position, unnest(list) AS message
    FROM listed
    UNION ALL
    SELECT * FROM single
)
SELECT path, session_id, run_id, seq, type AS source, execution_id, position,
    message->>'$."$type"' AS role,
    CASE WHEN json_type(message->'content') = 'VARCHAR' THEN message->>'content'
        ELSE array_to_string(json_extract_string(message, '$.content[*].text'), '') END AS text,
    message
FROM every""",
}


@dataclass
class SqlResult:
    """The rows a query returned, and the files it could not read.

    ``columns`` names the columns; each of ``rows`` is a tuple in that order, with
    DuckDB's Python values (a ``JSON`` column is a ``str`` of JSON).  ``skipped`` maps
    each session file left out to the reason (it could not be opened).
    """

    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    skipped: dict[str, str] = field(default_factory=dict)

    def dicts(self) -> list[dict[str, Any]]:
        """The rows as dicts keyed by column name."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise MissingExtra("sql", "duckdb") from None
    return duckdb


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _unfinished_tail_seq(fileobj: Any) -> int | None:
    """The seq of the open file's unfinished last line (one without ``\\n``), if any.

    The tail's start is found by reading back from the end, a block at a time; its seq
    is read from its first bytes, where every writer puts it (``{"session_id":…,"seq":N``).
    A tail that does not start so cannot parse as a record, and DuckDB skips it anyway.
    """
    end = os.fstat(fileobj.fileno()).st_size
    if end == 0:
        return None
    fileobj.seek(end - 1)
    if fileobj.read(1) == b"\n":
        return None
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        fileobj.seek(start)
        cut = fileobj.read(end - start).rfind(b"\n")
        if cut >= 0 or start == 0:
            fileobj.seek(start + cut + 1)
            match = _SEQ.match(fileobj.read(128))
            return int(match[1]) if match else None
        end = start
    return None


def _readable(
    paths: Iterable[str],
) -> tuple[list[str], list[str], list[tuple[str, int]], dict[str, str]]:
    """The plain and the compressed files a query reads, the (file, seq) of the plain
    ones' unfinished tails, the skipped."""
    files: list[str] = []
    compressed: list[str] = []
    tails: list[tuple[str, int]] = []
    skipped: dict[str, str] = {}

    def not_regular(path: str, exc: OSError) -> None:
        skipped[path] = exc.strerror or str(exc)

    for path in session_files(paths, skipped=not_regular):
        try:
            with os.fdopen(open_regular(path), "rb") as fileobj:
                if is_compressed(fileobj.read(4)):
                    # Compressed at rest, by flightlog compress or the daemon: whole.
                    compressed.append(path)
                    continue
                seq = _unfinished_tail_seq(fileobj)
        except OSError as exc:
            skipped[path] = exc.strerror or str(exc)
            continue
        files.append(path)
        if seq is not None:
            tails.append((path, seq))
    return files, compressed, tails, skipped


def sql_connection(
    paths: Sequence[str | os.PathLike[str]] | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
) -> tuple[duckdb.DuckDBPyConnection, dict[str, str]]:
    """A DuckDB connection whose views read the session files of ``paths``.

    ``paths`` are session files or directories searched at any depth for ``*.jsonl``;
    by default the data root (``root``, else ``$FLIGHTLOG_ROOT``, else
    ``$XDG_STATE_HOME/flightlog``).  Returns the connection, with the views ``records``,
    ``sessions``, ``runs``, ``calls`` and ``messages`` (docs/cli.md, "flightlog sql"),
    and the files left out because they could not be read, with the reason.  Use it
    for what DuckDB offers beyond rows (Arrow, pandas, ``COPY ... TO`` Parquet).
    Raises :class:`MissingExtra` when DuckDB is not installed (``flightlog-sdk[sql]``).
    """
    duckdb = _duckdb()
    if paths is None:
        base = root if root is not None else default_root(os.environ, os.path.expanduser("~"))
        paths = [base]
    files, compressed, tails, skipped = _readable(os.fspath(path) for path in paths)
    connection = duckdb.connect(":memory:")
    # Never reach for the network: the JSON reader is built in.
    connection.execute("SET autoinstall_known_extensions = false")
    connection.execute("SET TimeZone = 'UTC'")
    connection.execute("CREATE TEMP TABLE unfinished_tails (path VARCHAR, seq BIGINT)")
    if tails:
        connection.executemany("INSERT INTO unfinished_tails VALUES (?, ?)", tails)
    if files or compressed:
        sources = [
            f"SELECT * FROM read_json([{', '.join(map(_literal, group))}], "
            f"format = 'newline_delimited', compression = '{kind}', columns = {_COLUMNS}, "
            f"filename = true, ignore_errors = true, maximum_object_size = {_MAX_OBJECT})"
            for group, kind in ((files, "none"), (compressed, "zstd"))
            if group
        ]
        source = f"({' UNION ALL '.join(sources)})"
        connection.execute(
            f"""CREATE TEMP VIEW records AS
SELECT filename AS path, session_id, seq, type, TRY_CAST(time AS TIMESTAMPTZ) AS time,
    run_id, data
FROM {source} AS raw
WHERE session_id IS NOT NULL AND seq IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM unfinished_tails AS t
                    WHERE t.path = raw.filename AND t.seq = raw.seq)"""
        )
    else:
        connection.execute(
            """CREATE TEMP VIEW records AS
SELECT NULL::VARCHAR AS path, NULL::VARCHAR AS session_id, NULL::BIGINT AS seq,
    NULL::VARCHAR AS type, NULL::TIMESTAMPTZ AS time, NULL::VARCHAR AS run_id,
    NULL::JSON AS data
WHERE false"""
        )
    for name, body in SQL_VIEWS.items():
        connection.execute(f"CREATE TEMP VIEW {name} AS {body}")
    return connection, skipped


def sql(
    query: str,
    paths: Sequence[str | os.PathLike[str]] | None = None,
    *,
    parameters: Sequence[Any] | None = None,
    root: str | os.PathLike[str] | None = None,
) -> SqlResult:
    """Run ``query`` over the session files of ``paths`` and return its rows.

    ``paths`` and ``root`` are as in :func:`sql_connection`; ``parameters`` fill the
    query's ``?`` placeholders.  Raises :class:`MissingExtra` when DuckDB is not
    installed, and DuckDB's own ``duckdb.Error`` for a query it refuses.
    """
    connection, skipped = sql_connection(paths, root=root)
    try:
        cursor = connection.execute(query, parameters or [])
        description = cursor.description or []
        rows = cursor.fetchall()
    finally:
        connection.close()
    return SqlResult(
        columns=tuple(column[0] for column in description),
        types=tuple(str(column[1]) for column in description),
        rows=rows,
        skipped=skipped,
    )
