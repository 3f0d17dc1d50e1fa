"""Step 1, hash bucket: digest the primary keys of a group of delta files and split row pointers by bucket.

Only primary key and sort key columns are read, except of the plan's *coalesced* small units, read whole once
and handed to materialize (planning/rounds.py coalesced_units). The output per bucket is a *delta primary key
index* in rank order: a structured array of (digest, rank[, sort key bytes]) -- 28 to 61 bytes a row, never full
rows.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from flash_pipeline.catalog.key_ranges import KeyRangeBuilder
from flash_pipeline.catalog.model import schema_from_b64
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.kernels import jit
from flash_pipeline.compactor.kernels.digest import hash_buckets, primary_key_digests, sort_key_bytes
from flash_pipeline.compactor.kernels.index_kernels import append_by_bucket_kernel
from flash_pipeline.compactor.model.plans import RoundPlan, SourceFile, rank_of
from flash_pipeline.compactor.steps.source_io import read_units


def envelope_dtype(sort_key_width: int) -> np.dtype:
    fields: list[tuple[str, object]] = [("digest", "S20"), ("rank", "<i8")]
    if sort_key_width:
        fields.append(("sort", f"S{sort_key_width}"))
    return np.dtype(fields)


def hash_bucket_files(storage: Storage, plan: RoundPlan, src_ids: tuple[int, ...],
                      coalesced: dict[int, pa.Table] | None = None,
                      key_range: KeyRangeBuilder | None = None) -> list[np.ndarray]:
    """Envelopes of ``src_ids`` grouped by bucket; bucket b's array is in ascending rank order. The whole rows
    of the plan's coalesced units among ``src_ids`` go into ``coalesced`` (src -> table) for materialize, and
    every unit's keys into ``key_range`` (dedupe's probe skips index files by it: catalog/key_ranges.py).

    Rows are digested BATCH_ROWS at a time into one small scratch array (its framing and digests stay in
    cache), then appended to their bucket's region of one array (_BucketRegions): no per-file arrays, no
    argsort, and no second array of every envelope to group them afterwards."""
    dtype = envelope_dtype(plan.spec.sort_key_width)
    schema = schema_from_b64(plan.spec.schema_b64)
    total = sum(plan.sources[src].rows for src in src_ids)
    keys = list(plan.spec.primary_keys)
    with_sort = keys + [name for name, _ in plan.spec.sort_keys if name not in keys]
    sources = [plan.sources[src] for src in src_ids]
    columns = list(plan.spec.columns)

    def wanted(source: SourceFile) -> list[str]:
        if source.src in plan.coalesced and coalesced is not None:
            return columns
        return keys if source.is_delete else with_sort

    tasks = next((len(groups) for groups in plan.hash_groups if src_ids in groups), 1)  # this round's tasks
    tables = read_units(storage, sources, wanted, schema, threads=plan.decodes_on_threads(tasks))
    if jit.loading() and not plan.releases_memory:  # a session under a memory budget holds nothing extra
        tables = _decoded_ahead(tables)
    if coalesced is not None and plan.coalesced:
        tables = _keeping(tables, src_ids, plan, coalesced, schema)
    if key_range is not None:
        tables = key_range.watching(tables)
    units = ((src, source, table, 0) for src, source, table in zip(src_ids, sources, tables))
    if plan.bucket_count == 1:  # one bucket: envelopes straight into the output, in rank order
        env = np.empty(total, dtype=dtype)
        at = 0
        for batch in _batches(units):
            at += _envelope_batch(plan, batch, env[at:], None)
        return [env]
    regions = _BucketRegions(plan.bucket_count, total, dtype)
    scratch = np.empty(min(total, BATCH_ROWS), dtype=dtype)
    scratch_buckets = np.empty(len(scratch), dtype=np.int64)
    for batch in _batches(units):
        n = _envelope_batch(plan, batch, scratch, scratch_buckets)
        regions.append(scratch[:n], scratch_buckets[:n])
    return regions.buckets()


# bytes of decoded key columns a hash bucket task holds ahead while Numba loads: in a fresh command of s1,
# 3% faster (8 paired runs; peak RSS +13 MB); 64 MiB was 3.4% faster but raised the peak by 88 MB
AHEAD_BYTES = 24 << 20


def _decoded_ahead(tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``tables``, of which up to AHEAD_BYTES are decoded before the first is handed on while Numba loads on
    its own thread (jit.expect_work): Parquet decoding needs no kernel, so the task's core decodes instead of
    waiting for the first kernel call to return (in a fresh command of s1, ~0.5 s of one core)."""
    ahead: deque[pa.Table] = deque()
    held = 0
    while held < AHEAD_BYTES and jit.loading():
        table = next(tables, None)
        if table is None:
            break
        ahead.append(table)
        held += table.nbytes
    while ahead:
        yield ahead.popleft()
    yield from tables


class _BucketRegions:
    """Each bucket's envelopes in its own region of one array, appended batch after batch (input order, so rank
    order). A region holds the expected rows of its bucket plus a margin many standard deviations wide (a
    digest's bucket is uniform): pages of the margin never written are never touched. A bucket that still
    outgrows its region (possible only by extreme chance, or with tiny inputs) moves every region to a larger
    array."""

    def __init__(self, bucket_count: int, total: int, dtype: np.dtype) -> None:
        per = total // bucket_count
        self.capacity = min(total, per + 8 * math.isqrt(per) + 1024)
        self.rows = np.empty(bucket_count * self.capacity, dtype=dtype)
        self.fill = np.zeros(bucket_count, dtype=np.int64)

    def _raw(self, rows: np.ndarray) -> np.ndarray:
        return rows.view(np.uint8).reshape(len(rows), rows.dtype.itemsize)

    def append(self, env: np.ndarray, buckets: np.ndarray) -> None:
        while not append_by_bucket_kernel(self._raw(env), buckets, self._raw(self.rows), self.capacity, self.fill):
            self._grow(self.capacity + len(env))

    def _grow(self, capacity: int) -> None:
        rows = np.empty(len(self.fill) * capacity, dtype=self.rows.dtype)
        for b, n in enumerate(self.fill):
            rows[b * capacity : b * capacity + n] = self.rows[b * self.capacity : b * self.capacity + n]
        self.rows, self.capacity = rows, capacity

    def buckets(self) -> list[np.ndarray]:
        return [self.rows[b * self.capacity : b * self.capacity + int(n)] for b, n in enumerate(self.fill)]


def _keeping(tables: Iterable[pa.Table], src_ids: tuple[int, ...], plan: RoundPlan, coalesced: dict[int, pa.Table],
             schema: pa.Schema) -> Iterator[pa.Table]:
    """Pass ``tables`` on, keeping those of coalesced units as materialize would read them."""
    for src, table in zip(src_ids, tables):
        if src in plan.coalesced:
            coalesced[src] = as_materialized(table, plan, schema)
        yield table


def as_materialized(table: pa.Table, plan: RoundPlan, schema: pa.Schema) -> pa.Table:
    """A unit's rows in the compacted table's columns and types (what materialize writes). A unit whose types
    already match differs at most in metadata or nullability: relabel it (10 us a unit of s4's deltas, where a
    cast costs 26-73 us: a kernel call per column)."""
    table = table.select(list(plan.spec.columns))
    if table.schema == schema:
        return table
    if all(a.type == b.type for a, b in zip(table.schema, schema)):
        return pa.Table.from_arrays(table.columns, schema=schema)
    return table.cast(schema)


# consecutive small units are digested together (the digest and sort-key kernels cost a fixed overhead per
# call), and a large unit BATCH_ROWS rows at a time (its framing and digests stay in cache)
BATCH_ROWS = 1 << 16

Unit = tuple[int, SourceFile, pa.Table, int]  # (src, source, rows of the unit, index of their first row in it)


def _batches(units: Iterable[Unit]) -> Iterator[list[Unit]]:
    """Consecutive units of the same kind (upsert or delete: different columns) up to about BATCH_ROWS rows,
    a larger unit cut into slices of BATCH_ROWS rows."""
    batch: list[Unit] = []
    rows = 0
    for src, source, table, _ in units:
        for first in range(0, max(table.num_rows, 1), BATCH_ROWS):
            piece = table if table.num_rows <= BATCH_ROWS else table.slice(first, BATCH_ROWS)
            if batch and (source.is_delete != batch[0][1].is_delete or rows + piece.num_rows > BATCH_ROWS):
                yield batch
                batch, rows = [], 0
            batch.append((src, source, piece, first))
            rows += piece.num_rows
    if batch:
        yield batch


def _envelope_batch(plan: RoundPlan, batch: list[Unit], env: np.ndarray, buckets: np.ndarray | None) -> int:
    """Fill the first rows of ``env`` and ``buckets`` (None: one bucket) with the envelopes of one batch, in rank
    order."""
    if len(batch) == 1:
        table = batch[0][2]
    else:
        try:
            table = pa.concat_tables([t for _, _, t, _ in batch])
        except pa.ArrowInvalid:  # schemas differing in metadata or nullability only: one unit at a time
            at = 0
            for unit in batch:
                at += _envelope_batch(plan, [unit], env[at:], buckets[at:] if buckets is not None else None)
            return at
    n = table.num_rows
    sizes = np.array([t.num_rows for _, _, t, _ in batch], dtype=np.int64)
    srcs = np.repeat(np.array([src for src, _, _, _ in batch], dtype=np.int64), sizes)
    # row index inside its unit: position in the batch, less where the unit's piece starts, plus the piece's first row
    starts = np.repeat(np.cumsum(sizes) - sizes - np.array([first for _, _, _, first in batch], dtype=np.int64), sizes)
    part = env[:n]
    digests = primary_key_digests(table, list(plan.spec.primary_keys))
    part["digest"] = digests.view("S20").reshape(-1)
    part["rank"] = rank_of(srcs, np.arange(n, dtype=np.int64) - starts)
    if plan.spec.sort_key_width:
        if batch[0][1].is_delete:
            part["sort"] = b""
        else:
            sk = sort_key_bytes(table, list(plan.spec.sort_keys))
            part["sort"] = np.ascontiguousarray(sk).view(f"S{plan.spec.sort_key_width}").reshape(-1)
    if buckets is not None:
        buckets[:n] = hash_buckets(digests, plan.bucket_count)
    return n
