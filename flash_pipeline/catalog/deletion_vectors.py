"""Deletion vectors: the dead rows of a compacted file, in Delta Lake's format, so a file that loses a few rows
to an update or delete is carried with a small bitmap instead of being rewritten.

The primary key index already knows, for every superseded or deleted key, the file and row that held it
(dedupe's lost rows), so a compaction round gets each file's dead rows for free (compactor/kernels/layout.py
decides per file: carry, carry with a vector, or rewrite).

Format (Delta's PROTOCOL.md, "Deletion Vector Format"), written by hand because neither deltalake nor pyroaring
writes Delta's framing: a vector is a ``RoaringBitmapArray`` -- the magic number 1681511377 (int32 little
endian), then the 64-bit "portable" serialization: the number of 32-bit bitmaps (int64 little endian) and for
each its high 32 bits (uint32 little endian) followed by the 32-bit portable Roaring serialization (pyroaring's
``BitMap.serialize``). A vector file starts with a version byte (1) and holds vectors back to back, each as
its size (int32 big endian), the bytes, and their CRC-32 (big endian). The Delta descriptor uses storage type
``u``: ``pathOrInlineDv`` is the attempt folder's name followed by the Z85 encoding of a UUID, which names the
file ``<attempt>/deletion_vector_<uuid>.bin`` under the Delta table root (the partition's ``compacted/data``),
so vector files live and die with their attempt folder like the compacted files.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from flash_pipeline.catalog.numpy_sets import sorted_unique
from flash_pipeline.errors import IntegrityError

if TYPE_CHECKING:
    import pyarrow as pa

    from flash_pipeline.catalog.storage import Storage

# The per-file cost model (compactor/kernels/layout.py): a prior compacted file that loses rows in a round is
# carried with a deletion vector while at most MAX_DEAD_FRACTION of its rows are dead afterwards, else rewritten;
# optimize rewrites (purges) files with at least PURGE_DEAD_FRACTION dead (Delta's OPTIMIZE default ratio).
# Chosen from benchmarks/results_deletion_vectors_forced.md (5M rows in 10 files, vectors forced at every fraction):
# they save 79% of the compaction at 1% dead and 64% at 5%, but 20% at 20% dead, where they make a Polars read 17%
# and a deltalake read 90% slower than the rewritten table.
MAX_DEAD_FRACTION = 0.10
PURGE_DEAD_FRACTION = 0.05


def drop_dead_rows(table: "pa.Table", dead: np.ndarray) -> "pa.Table":
    """``table`` without the rows at positions ``dead`` (a file's deletion vector): what a reader of it gets."""
    from flash_pipeline.catalog.arrow_arrays import mask_array

    if not len(dead):
        return table
    keep = np.ones(table.num_rows, dtype=bool)
    keep[dead] = False
    return table.filter(mask_array(keep))


def max_dead_fraction() -> float:
    """MAX_DEAD_FRACTION, or ``FLASH_DV_MAX_DEAD_FRACTION`` (0..1) when set: the benchmark forces vectors with it
    to measure what they cost at every fraction. Read once on the driver (the session spec carries it)."""
    from flash_pipeline.settings import env_number

    return env_number("FLASH_DV_MAX_DEAD_FRACTION", MAX_DEAD_FRACTION, 0.0, 1.0, "a fraction between 0 and 1")

MAGIC = 1681511377
FILE_VERSION = 1
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


@dataclass(frozen=True)
class DeletionVector:
    """Where a file's dead rows are: ``size`` bytes of a serialized bitmap at ``offset`` (its size field) of the
    vector file ``key``; ``cardinality`` dead rows; ``delta_id`` Delta's ``pathOrInlineDv``."""

    key: str
    offset: int
    size: int
    cardinality: int
    delta_id: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "offset": self.offset, "size": self.size, "cardinality": self.cardinality,
                "delta_id": self.delta_id}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DeletionVector":
        return cls(d["key"], int(d["offset"]), int(d["size"]), int(d["cardinality"]), d["delta_id"])

    def delta_descriptor(self) -> dict[str, Any]:
        return {"storageType": "u", "pathOrInlineDv": self.delta_id, "offset": self.offset,
                "sizeInBytes": self.size, "cardinality": self.cardinality}


def z85(data: bytes) -> str:
    """ZeroMQ's Z85 text encoding (``len(data)`` a multiple of 4), as Delta names vector files."""
    out: list[str] = []
    for i in range(0, len(data), 4):
        n = int.from_bytes(data[i : i + 4], "big")
        chunk = []
        for _ in range(5):
            n, r = divmod(n, 85)
            chunk.append(_Z85[r])
        out.extend(reversed(chunk))
    return "".join(out)


def encode(rows: np.ndarray) -> bytes:
    """The RoaringBitmapArray of the (non-negative) row indices ``rows``."""
    from pyroaring import BitMap

    rows = sorted_unique(np.asarray(rows, dtype=np.int64))
    if len(rows) and rows[0] < 0:
        raise ValueError("row indices are non-negative")
    highs = sorted_unique(rows >> 32) if len(rows) else np.zeros(0, dtype=np.int64)
    parts = [struct.pack("<i", MAGIC), struct.pack("<q", len(highs))]
    for high in highs:
        low = rows[(rows >> 32) == high] & 0xFFFFFFFF
        parts.append(struct.pack("<I", int(high)))
        parts.append(BitMap(low.astype(np.uint32)).serialize())
    return b"".join(parts)


def decode(data: bytes) -> np.ndarray:
    """Sorted row indices (int64) of a serialized RoaringBitmapArray."""
    from pyroaring import BitMap

    if len(data) < 12 or struct.unpack_from("<i", data, 0)[0] != MAGIC:
        raise ValueError("not a RoaringBitmapArray (bad magic number)")
    (count,) = struct.unpack_from("<q", data, 4)
    at, out = 12, []
    for _ in range(count):
        (high,) = struct.unpack_from("<I", data, at)
        bitmap = BitMap.deserialize(data[at + 4 :])
        at += 4 + len(bitmap.serialize())
        out.append((np.array(bitmap.to_array(), dtype=np.int64) if len(bitmap) else np.zeros(0, dtype=np.int64))
                   | (np.int64(high) << 32))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def write_vectors(storage: "Storage", root: str, attempt: str,
                  dead: Mapping[int, np.ndarray]) -> dict[int, DeletionVector]:
    """One vector file under ``<root>/<attempt>/`` holding a vector per entry of ``dead`` (file number -> dead
    rows); returns each file's descriptor. Nothing is written for an empty ``dead``."""
    if not dead:
        return {}
    file_id = uuid.uuid4()
    key = f"{root}/{attempt}/deletion_vector_{file_id}.bin"
    parts, out, at = [bytes([FILE_VERSION])], {}, 1
    for number in sorted(dead):
        data = encode(dead[number])
        parts += [struct.pack(">i", len(data)), data, struct.pack(">I", zlib.crc32(data) & 0xFFFFFFFF)]
        out[number] = DeletionVector(key, at, len(data), int(len(sorted_unique(dead[number]))),
                                     f"{attempt}{z85(file_id.bytes)}")
        at += 8 + len(data)
    storage.write(key, b"".join(parts))
    return out


def read_dead_rows(storage: "Storage", vector: DeletionVector) -> np.ndarray:
    """The dead rows of one vector, checked against its size and CRC-32 (IntegrityError if they differ)."""
    blob = storage.read_range(vector.key, vector.offset, vector.size + 8)
    if len(blob) != vector.size + 8 or struct.unpack_from(">i", blob, 0)[0] != vector.size:
        raise IntegrityError(f"deletion vector at {vector.key}:{vector.offset} is truncated or misplaced; run "
                             "flash-compactor verify")
    data = blob[4 : 4 + vector.size]
    if struct.unpack_from(">I", blob, 4 + vector.size)[0] != zlib.crc32(data) & 0xFFFFFFFF:
        raise IntegrityError(f"deletion vector at {vector.key}:{vector.offset} fails its CRC-32; run flash-compactor "
                             "verify")
    rows = decode(data)
    if len(rows) != vector.cardinality:
        raise IntegrityError(f"deletion vector at {vector.key}:{vector.offset} holds {len(rows)} rows, its descriptor "
                             f"says {vector.cardinality}")
    return rows
