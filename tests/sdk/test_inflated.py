"""``InflatedFile``: a compressed session's plain bytes read at any offset, in any order,
give what the plain file gives there (reads behind the last one, within the bytes just
decompressed, are served from them)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from flightlog.sdk.storage import InflatedFile, plain_size

#: 3.5 MiB of lines: more than three of the reader's 1 MiB steps.
PLAIN = b"".join(
    b'{"seq":%d,"data":"%s"}\n' % (n, hashlib.sha256(b"%d" % n).hexdigest().encode() * (n % 9))
    for n in range(30_000)
)


@pytest.fixture(scope="module")
def compressed() -> Iterator[str]:
    fd, path = tempfile.mkstemp()
    with os.fdopen(fd, "wb") as out:
        out.write(zstandard.ZstdCompressor().compress(PLAIN))
    try:
        yield path
    finally:
        os.unlink(path)


reads = st.lists(
    st.tuples(st.integers(0, len(PLAIN) + 10), st.integers(0, 3 * 1024 * 1024)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(reads=reads)
def test_every_read_gives_the_plain_bytes(compressed: str, reads: list[tuple[int, int]]) -> None:
    inflated = InflatedFile(os.open(compressed, os.O_RDONLY))
    try:
        for offset, size in reads:
            assert inflated.pread(size, offset) == PLAIN[offset : offset + size]
    finally:
        inflated.close()


def test_the_plain_size_is_in_the_header(compressed: str) -> None:
    fd = os.open(compressed, os.O_RDONLY)
    try:
        assert plain_size(fd) == len(PLAIN)
    finally:
        os.close(fd)
