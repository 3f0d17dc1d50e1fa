"""Step 1, hash bucket: digest the primary keys of a group of delta files and split row pointers by bucket.

Only primary key and sort key columns are read. The output per bucket is a *delta primary key index* in
rank order: a structured array of (digest, rank[, sort key bytes]) -- 28 to 61 bytes a row, never full rows.
"""

from __future__ import annotations

import numpy as np

from flash_pipeline.catalog.model import schema_from_b64
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.digest import hash_buckets, primary_key_digests, sort_key_bytes
from flash_pipeline.compactor.plan import RoundPlan, rank_of
from flash_pipeline.compactor.source_io import read_source


def envelope_dtype(sort_key_width: int) -> np.dtype:
    fields: list[tuple[str, object]] = [("digest", "S20"), ("rank", "<i8")]
    if sort_key_width:
        fields.append(("sort", f"S{sort_key_width}"))
    return np.dtype(fields)


def hash_bucket_files(storage: Storage, plan: RoundPlan, src_ids: tuple[int, ...]) -> list[np.ndarray]:
    """Envelopes of ``src_ids`` grouped by bucket; bucket b's array is in ascending rank order."""
    dtype = envelope_dtype(plan.sort_key_width)
    schema = schema_from_b64(plan.schema_b64)
    per_file = []
    for src in src_ids:
        source = plan.sources[src]
        columns = list(plan.primary_keys)
        if not source.is_delete:
            columns += [name for name, _ in plan.sort_keys if name not in columns]
        table = read_source(storage, source, columns, schema)
        n = table.num_rows
        env = np.empty(n, dtype=dtype)
        digests = primary_key_digests(table, list(plan.primary_keys))
        env["digest"] = digests.view("S20").reshape(-1)
        env["rank"] = rank_of(src, np.arange(n, dtype=np.int64))
        if plan.sort_key_width:
            if source.is_delete:
                env["sort"] = b""
            else:
                sk = sort_key_bytes(table, list(plan.sort_keys))
                env["sort"] = np.ascontiguousarray(sk).view(f"S{plan.sort_key_width}").reshape(-1)
        per_file.append((env, hash_buckets(digests, plan.bucket_count)))
    if not per_file:
        return [np.empty(0, dtype=dtype) for _ in range(plan.bucket_count)]
    env = np.concatenate([e for e, _ in per_file])
    buckets = np.concatenate([b for _, b in per_file])
    order = np.argsort(buckets, kind="stable")
    counts = np.bincount(buckets, minlength=plan.bucket_count)
    grouped = env[order]
    bounds = np.concatenate(([0], np.cumsum(counts)))
    return [grouped[bounds[b] : bounds[b + 1]] for b in range(plan.bucket_count)]
