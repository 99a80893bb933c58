from collections.abc import Callable, Mapping, Set
from typing import Any

def check_json(data: bytes, limit: int, /) -> bool: ...
def is_time(text: str, /) -> bool: ...
def take_records(
    buf: bytearray,
    pos: int,
    max_frame_size: int,
    sessions: Mapping[str, Any],
    run_open: object,
    facts: Set[str],
    max_data: int,
    limit: int,
    make: Callable[..., Any],
    /,
) -> tuple[int, list[Any]]: ...
def append_lines(buf: bytearray, head: bytes, seq: int, tails: bytearray, /) -> int: ...
