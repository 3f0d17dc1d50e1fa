"""Step 1, hash bucket: digest the primary keys of a group of delta files and split row pointers by bucket.

Only primary key and sort key columns are read. The output per bucket is a *delta primary key index* in
rank order: a structured array of (digest, rank[, sort key bytes]) -- 28 to 61 bytes a row, never full rows.
"""

from __future__ import annotations

import numpy as np

from flash_pipeline.catalog.model import schema_from_b64
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.kernels.compiled import scatter_by_bucket_kernel
from flash_pipeline.compactor.kernels.digest import hash_buckets, primary_key_digests, sort_key_bytes
from flash_pipeline.compactor.model.plans import RoundPlan, rank_of
from flash_pipeline.compactor.steps.source_io import read_unit


def envelope_dtype(sort_key_width: int) -> np.dtype:
    fields: list[tuple[str, object]] = [("digest", "S20"), ("rank", "<i8")]
    if sort_key_width:
        fields.append(("sort", f"S{sort_key_width}"))
    return np.dtype(fields)


def hash_bucket_files(storage: Storage, plan: RoundPlan, src_ids: tuple[int, ...]) -> list[np.ndarray]:
    """Envelopes of ``src_ids`` grouped by bucket; bucket b's array is in ascending rank order.

    Envelopes are written straight into one array sized from the plan's row counts, then grouped by a
    stable counting sort (see compiled.scatter_by_bucket_kernel): no per-file arrays, no argsort."""
    dtype = envelope_dtype(plan.spec.sort_key_width)
    schema = schema_from_b64(plan.spec.schema_b64)
    total = sum(plan.sources[src].rows for src in src_ids)
    env = np.empty(total, dtype=dtype)
    buckets = np.empty(total, dtype=np.int64)
    at = 0
    for src in src_ids:
        source = plan.sources[src]
        columns = list(plan.spec.primary_keys)
        if not source.is_delete:
            columns += [name for name, _ in plan.spec.sort_keys if name not in columns]
        table = read_unit(storage, source, columns, schema)
        n = table.num_rows
        part = env[at : at + n]
        digests = primary_key_digests(table, list(plan.spec.primary_keys))
        part["digest"] = digests.view("S20").reshape(-1)
        part["rank"] = rank_of(src, np.arange(n, dtype=np.int64))
        if plan.spec.sort_key_width:
            if source.is_delete:
                part["sort"] = b""
            else:
                sk = sort_key_bytes(table, list(plan.spec.sort_keys))
                part["sort"] = np.ascontiguousarray(sk).view(f"S{plan.spec.sort_key_width}").reshape(-1)
        buckets[at : at + n] = hash_buckets(digests, plan.bucket_count)
        at += n
    if plan.bucket_count == 1:
        return [env]
    grouped = np.empty_like(env)
    counts = scatter_by_bucket_kernel(
        env.view(np.uint8).reshape(total, dtype.itemsize), buckets, plan.bucket_count, grouped.view(np.uint8).reshape(total, dtype.itemsize)
    )
    bounds = np.concatenate(([0], np.cumsum(counts)))
    return [grouped[bounds[b] : bounds[b + 1]] for b in range(plan.bucket_count)]
