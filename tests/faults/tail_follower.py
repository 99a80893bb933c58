"""A follower that tails through daemon restarts, as a dashboard or `tail -f` does.

    python tail_follower.py SOCKET OUT PATH|all sync|async [GRACE]

It follows the session at PATH (``client.tail(PATH, follow=True)``), or every session
(``client.tail_all(follow=True)``), with the sync or the async client, and appends one
JSON line per record to OUT: ``{"path", "seq", "session_id", "type", "reconnects"}``
(the path is PATH for a tail of one session).  Once its subscription is in place it
appends ``{"ready": true}``.  When the iteration ends it appends ``{"end": REASON}``, or
``{"error": "Class: message [code]"}`` when it raised.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

import anyio

from flightlog.protocol import FlightlogError, Record
from flightlog.sdk import connect
from flightlog.sdk.aio import aconnect


def write(out: TextIO, item: dict[str, Any]) -> None:
    out.write(json.dumps(item) + "\n")
    out.flush()


def line(path: str, record: Record, reconnects: int) -> dict[str, Any]:
    return {
        "path": path,
        "seq": record.seq,
        "session_id": record.session_id,
        "type": record.type,
        "reconnects": reconnects,
    }


def follow_sync(socket: str, out: TextIO, target: str, grace: float) -> str | None:
    with connect(socket, reconnect_grace=grace) as client:
        if target == "all":
            with client.tail_all(follow=True) as every:
                write(out, {"ready": True})
                for path, record in every:
                    write(out, line(path, record, client.reconnects))
            return every.end_reason
        with client.tail(target, follow=True) as one:
            write(out, {"ready": True})
            for record in one:
                write(out, line(target, record, client.reconnects))
        return one.end_reason


async def follow_async(socket: str, out: TextIO, target: str, grace: float) -> str | None:
    async with aconnect(socket, reconnect_grace=grace) as client:
        if target == "all":
            async with client.tail_all(follow=True) as every:
                write(out, {"ready": True})
                async for path, record in every:
                    write(out, line(path, record, client.reconnects))
            return every.end_reason
        async with client.tail(target, follow=True) as one:
            write(out, {"ready": True})
            async for record in one:
                write(out, line(target, record, client.reconnects))
        return one.end_reason


def main(socket: str, output: str, target: str, flavour: str, grace: float) -> None:
    with open(output, "a", encoding="utf-8") as out:
        try:
            if flavour == "sync":
                reason = follow_sync(socket, out, target, grace)
            else:
                reason = anyio.run(follow_async, socket, out, target, grace)
        except FlightlogError as exc:
            write(out, {"error": f"{type(exc).__name__}: {exc}"})
        else:
            write(out, {"end": reason})


if __name__ == "__main__":
    grace = float(sys.argv[5]) if len(sys.argv) > 5 else 30.0
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], grace)
