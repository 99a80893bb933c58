"""``uv run python -m bench.find``: ``flightlog find`` against ``grep -c`` and ``jq``
(bench/_find.py)."""

from __future__ import annotations

from ._find import main

if __name__ == "__main__":
    raise SystemExit(main())
