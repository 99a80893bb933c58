"""How session files are kept at rest: compressed in place, blobs stored once, removed
within limits.  The code both ``flightlog compress`` / ``flightlog vacuum`` and
flightlogd's own sweeps run, so that the two can never disagree.

``from flightlog.sdk import storage`` and use ``storage.compress_path``,
``storage.survey``; see docs/format.md (the compressed form, blob references) and
docs/operations.md (limits).
"""

from __future__ import annotations

from ._blobs import BlobRemoval, References, blob_stores, collect_blobs, resolving, stored_blobs
from ._compression import (
    TEMP_SUFFIX,
    Compressed,
    FileBusy,
    InflatedFile,
    compress_at,
    compress_path,
    decompress_at,
    index_name,
    is_compressed,
    open_session_file,
    plain_size,
    remove_leftovers,
)
from ._retention import (
    BlobUse,
    Limits,
    Removal,
    StoredFile,
    available,
    blob_use,
    parse_age,
    parse_size,
    plan,
    remove,
    survey,
)

__all__ = [
    "TEMP_SUFFIX",
    "BlobRemoval",
    "BlobUse",
    "Compressed",
    "FileBusy",
    "InflatedFile",
    "Limits",
    "References",
    "Removal",
    "StoredFile",
    "available",
    "blob_stores",
    "blob_use",
    "collect_blobs",
    "compress_at",
    "compress_path",
    "decompress_at",
    "index_name",
    "is_compressed",
    "open_session_file",
    "parse_age",
    "parse_size",
    "plain_size",
    "plan",
    "remove",
    "remove_leftovers",
    "resolving",
    "stored_blobs",
    "survey",
]
