"""A Parquet file's footer, read from the end of the object with a ranged read, never the whole file.

Why: planning (a large delta's row groups), the latency planner (a delta's key range) and the Iceberg publication
(a written file's column statistics) need only a file's metadata. ``pq.ParquetFile(storage.arrow_source(key))``
reads just the footer of a local file; on S3 it downloaded the whole file (the Iceberg statistics of a version
re-read every file it wrote) until arrow_source became ranged (catalog/ranged_objects.py), and even now its
opening GET brings the object's last 1 MiB, or the whole object when it is smaller: more than a footer needs.

One ranged read of the last FOOTER_GUESS bytes holds the footer of nearly every file (a footer grows with columns
times row groups: ~2 KiB for 9 columns and 10 row groups); a larger one takes a second read of what is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from flash_pipeline.catalog.storage import Storage

FOOTER_GUESS = 64 << 10
_TRAILER = 8  # the footer's length (4 bytes, little-endian) and the magic "PAR1"
_MAGIC = b"PAR1"


def read_footer(storage: "Storage", key: str, size: int) -> pq.FileMetaData:
    """The metadata of the Parquet file ``key`` of ``size`` bytes (as its manifest records it). A file whose end
    is not a Parquet trailer (a size that does not match, a damaged file) is opened the whole-file way, so that
    its error is the reader's usual one."""
    if size < _TRAILER + len(_MAGIC):
        return _whole(storage, key)
    tail = storage.read_range(key, size - min(size, FOOTER_GUESS), min(size, FOOTER_GUESS))
    if len(tail) < _TRAILER or tail[-4:] != _MAGIC:
        return _whole(storage, key)
    need = int.from_bytes(tail[-_TRAILER:-4], "little") + _TRAILER
    if need + len(_MAGIC) > size:
        return _whole(storage, key)
    if need > len(tail):
        tail = storage.read_range(key, size - need, need - len(tail)) + tail
    try:
        return pq.ParquetFile(pa.BufferReader(tail[len(tail) - need:])).metadata
    except (pa.ArrowInvalid, OSError):
        return _whole(storage, key)


def _whole(storage: "Storage", key: str) -> pq.FileMetaData:
    return pq.ParquetFile(storage.arrow_source(key)).metadata
