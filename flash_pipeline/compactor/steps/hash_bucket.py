"""Step 1, hash bucket: digest the primary keys of a group of delta files and split row pointers by bucket.

Only primary key and sort key columns are read, except of the plan's *coalesced* small units, read whole once
and handed to materialize (planning/rounds.py coalesced_units). The output per bucket is a *delta primary key
index* in rank order: a structured array of (digest, rank[, sort key bytes]) -- 28 to 61 bytes a row, never full
rows.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from flash_pipeline.catalog.model import schema_from_b64
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.kernels.compiled import scatter_by_bucket_kernel
from flash_pipeline.compactor.kernels.digest import hash_buckets, primary_key_digests, sort_key_bytes
from flash_pipeline.compactor.model.plans import RoundPlan, SourceFile, rank_of
from flash_pipeline.compactor.steps.source_io import read_units


def envelope_dtype(sort_key_width: int) -> np.dtype:
    fields: list[tuple[str, object]] = [("digest", "S20"), ("rank", "<i8")]
    if sort_key_width:
        fields.append(("sort", f"S{sort_key_width}"))
    return np.dtype(fields)


def hash_bucket_files(storage: Storage, plan: RoundPlan, src_ids: tuple[int, ...],
                      coalesced: dict[int, pa.Table] | None = None) -> list[np.ndarray]:
    """Envelopes of ``src_ids`` grouped by bucket; bucket b's array is in ascending rank order. The whole rows
    of the plan's coalesced units among ``src_ids`` go into ``coalesced`` (src -> table) for materialize.

    Envelopes are written straight into one array sized from the plan's row counts, then grouped by a
    stable counting sort (see compiled.scatter_by_bucket_kernel): no per-file arrays, no argsort."""
    dtype = envelope_dtype(plan.spec.sort_key_width)
    schema = schema_from_b64(plan.spec.schema_b64)
    total = sum(plan.sources[src].rows for src in src_ids)
    env = np.empty(total, dtype=dtype)
    buckets = np.empty(total, dtype=np.int64)
    keys = list(plan.spec.primary_keys)
    with_sort = keys + [name for name, _ in plan.spec.sort_keys if name not in keys]
    sources = [plan.sources[src] for src in src_ids]
    columns = list(plan.spec.columns)

    def wanted(source: SourceFile) -> list[str]:
        if source.src in plan.coalesced and coalesced is not None:
            return columns
        return keys if source.is_delete else with_sort

    tables = read_units(storage, sources, wanted, schema)
    if coalesced is not None and plan.coalesced:
        tables = _keeping(tables, src_ids, plan, coalesced, schema)
    at = 0
    for batch in _batches(zip(src_ids, sources, tables)):
        n = _envelope_batch(plan, batch, env[at:], buckets[at:])
        at += n
    if plan.bucket_count == 1:
        return [env]
    grouped = np.empty_like(env)
    counts = scatter_by_bucket_kernel(
        env.view(np.uint8).reshape(total, dtype.itemsize), buckets, plan.bucket_count, grouped.view(np.uint8).reshape(total, dtype.itemsize)
    )
    bounds = np.concatenate(([0], np.cumsum(counts)))
    return [grouped[bounds[b] : bounds[b + 1]] for b in range(plan.bucket_count)]


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


# consecutive small units are digested together: the digest and sort-key kernels cost a fixed overhead per call
BATCH_ROWS = 1 << 16

Unit = tuple[int, SourceFile, pa.Table]


def _batches(units: Iterable[Unit]) -> Iterator[list[Unit]]:
    """Consecutive units of the same kind (upsert or delete: different columns) up to about BATCH_ROWS rows."""
    batch: list[Unit] = []
    rows = 0
    for unit in units:
        if batch and (unit[1].is_delete != batch[0][1].is_delete or rows + unit[2].num_rows > BATCH_ROWS):
            yield batch
            batch, rows = [], 0
        batch.append(unit)
        rows += unit[2].num_rows
    if batch:
        yield batch


def _envelope_batch(plan: RoundPlan, batch: list[Unit], env: np.ndarray, buckets: np.ndarray) -> int:
    """Fill the first rows of ``env`` and ``buckets`` with the envelopes of one batch, in rank order."""
    if len(batch) == 1:
        table = batch[0][2]
    else:
        try:
            table = pa.concat_tables([t for _, _, t in batch])
        except pa.ArrowInvalid:  # schemas differing in metadata or nullability only: one unit at a time
            at = 0
            for unit in batch:
                at += _envelope_batch(plan, [unit], env[at:], buckets[at:])
            return at
    n = table.num_rows
    sizes = np.array([t.num_rows for _, _, t in batch], dtype=np.int64)
    srcs = np.repeat(np.array([src for src, _, _ in batch], dtype=np.int64), sizes)
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
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
    buckets[:n] = hash_buckets(digests, plan.bucket_count)
    return n
