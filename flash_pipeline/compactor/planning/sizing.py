"""The session launcher's arithmetic: hash bucket counts, task groups and round budgets.

The paper sizes buckets so that dedupe uses about half of the memory available to one task, and rehashes
an inherited index first when it would use more than 90%. Memory per index row is fixed (digest, pointer,
sort key bytes), which is what makes this computable before any work starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flash_pipeline.compactor.model.options import check_bucket_count

# bytes of dedupe working memory per row: envelope (20 digest + 8 rank + k sort) + hash table slots
# (2 x 8 bytes) + group bookkeeping (2 x 8 bytes) + survivor copy
DEDUPE_OVERHEAD_BYTES = 20 + 8 + 16 + 16 + 28


def dedupe_bytes_per_row(sort_key_width: int) -> int:
    return DEDUPE_OVERHEAD_BYTES + 2 * sort_key_width


@dataclass(frozen=True)
class BucketChoice:
    bucket_count: int
    rehash_needed: bool
    reason: str


def choose_bucket_count(
    rows: int,
    sort_key_width: int,
    memory_per_task: int,
    cpus: int,
    inherited: int | None = None,
    requested: int | None = None,
) -> BucketChoice:
    """The paper's rule: target ~1/2 of per-task memory in dedupe; rehash an inherited count above 90%."""
    per_row = dedupe_bytes_per_row(sort_key_width)
    need_half = max(1, math.ceil(rows * per_row / (0.5 * memory_per_task)))
    if requested is not None:
        check_bucket_count(requested)
        if inherited is not None and requested != inherited:
            return BucketChoice(requested, True, f"requested {requested} buckets; the index has {inherited}: rehashing first")
        return BucketChoice(requested, False, f"requested {requested} buckets")
    if inherited is not None:
        use = rows * per_row / inherited / memory_per_task
        if use > 0.9:
            n = max(need_half, inherited)
            return BucketChoice(n, True, f"{inherited} inherited buckets would use {use:.0%} of task memory (>90%): rehashing to {n}")
        return BucketChoice(inherited, False, f"keeping the index's {inherited} buckets ({use:.1%} of task memory each)")
    n = max(need_half, min(cpus, max(1, rows // 100_000)) if rows else 1)
    return BucketChoice(n, False, f"{rows} rows x {per_row} B in dedupe over {memory_per_task >> 20} MiB per task: {n} bucket(s)")


# Parquet and friends decompress to about this many times their size at rest in Arrow memory.
DECOMPRESSION_FACTOR = 3


def delta_round_bytes(rows: int, sort_key_width: int) -> int:
    """Intermediate memory a delta costs a round: its envelopes in the object store and dedupe's survivors of
    them (upper bound: every row survives). Its rows themselves are not a round's: materialize runs once, after
    the last round, in tasks sized from the budget (planning/rounds.py)."""
    envelope = 28 + sort_key_width
    return rows * 2 * envelope


def default_round_budget(heap_bytes: int, object_store_bytes: int) -> int:
    """Half of the smaller of Ray's object store and heap: the paper's rule 1 with room for the index."""
    return max(16 << 20, min(heap_bytes, object_store_bytes) // 2)
