"""Verification of the engines' outputs: a digest of a result's rows (row count, and a hash of the rows sorted by
primary key, independent of how they are split into files and of their Arrow types), and the ``Verifier`` that
holds every scenario's first result and raises ``MismatchError`` when another engine's differs. It is its own
module because a benchmark's numbers mean nothing unless every engine computed the same rows, and because other
benchmarks (``deletion_vectors``) check their outputs the same way.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.generate import COLUMNS, SCHEMA


class MismatchError(AssertionError):
    """Two engines produced different compacted rows."""


def digest(files: list[str]) -> tuple[int, str]:
    """(rows, hash of the rows sorted by primary key) of parquet files, independent of file split and types."""
    return digest_tables([pq.read_table(f, columns=COLUMNS) for f in files])


def digest_tables(tables: list[pa.Table]) -> tuple[int, str]:
    """``digest`` of tables already read (e.g. a compacted table's live rows, deletion vectors applied)."""
    tables = [t.select(COLUMNS).cast(SCHEMA) for t in tables if t.num_rows]
    if not tables:
        return 0, "empty"
    t = pa.concat_tables(tables)
    t = t.take(pc.sort_indices(t, sort_keys=[("order_id", "ascending"), ("region", "ascending")]))
    h = hashlib.blake2b(digest_size=16)
    for name in COLUMNS:
        col = t[name].combine_chunks()
        h.update(name.encode())
        h.update(np.asarray(col.is_null()).tobytes() if col.null_count else b"no-nulls")
        if pa.types.is_string(col.type):
            col = col.cast(pa.large_string())
            _, offsets, data = col.buffers()
            off = np.frombuffer(offsets, dtype=np.int64)[col.offset : col.offset + len(col) + 1]
            h.update((off - off[0]).tobytes())
            h.update(memoryview(data)[off[0] : off[-1]])
        else:
            h.update(col.to_numpy(zero_copy_only=False).tobytes())
    return t.num_rows, h.hexdigest()


class Verifier:
    def __init__(self) -> None:
        self.reference: dict[str, tuple[int, str, str]] = {}

    def check(self, scenario: str, engine: str, files: list[str], expected_rows: int) -> str:
        rows, h = digest(files)
        return self.check_digest(scenario, engine, rows, h, expected_rows)

    def check_digest(self, scenario: str, engine: str, rows: int, h: str, expected_rows: int) -> str:
        if rows != expected_rows:
            raise MismatchError(f"{scenario}: {engine} wrote {rows} rows, the true result has {expected_rows}")
        if engine.startswith("copy"):  # the floor writes the right number of rows, not the right rows
            return h
        ref = self.reference.get(scenario)
        if ref is None:
            self.reference[scenario] = (rows, h, engine)
        elif ref[1] != h:
            raise MismatchError(f"{scenario}: {engine}'s rows differ from {ref[2]}'s ({rows} rows each; hash {h} != {ref[1]})")
        return h
