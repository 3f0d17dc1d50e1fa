"""The session launcher's arithmetic: hash bucket counts, task groups and round budgets.

The paper sizes buckets so that dedupe uses about half of the memory available to one task, and rehashes
an inherited index first when it would use more than 90%. Memory per index row is fixed (digest, pointers,
sort key bytes: 28 + k bytes), which is what makes this computable before any work starts; new delta rows cost
more (the comparator pass), and both costs are measured, not guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flash_pipeline.compactor.model.options import check_bucket_count

# Bytes a row costs a hash bucket's tasks during a round, measured with tracemalloc
# (tests/compactor/steps/test_dedupe_memory.py measures both kinds of row):
# - an *indexed* row (a row of the prior primary key index): dedupe streams the bucket (one chunk and the rows a
#   new digest touches: ~3 B a row) and the index writer holds the row's next version (the 28 + k byte index
#   row: 20-byte digest, file and row pointers, sort key bytes) plus one chunk: index row + 1 byte.
INDEXED_ROW_OVERHEAD_BYTES = 1
# - a *new* row (of a delta): dedupe holds its envelope, the bucket's concatenated copy of the envelopes, the
#   digest hash table (2 to 4 slots of 8 bytes a row), group bookkeeping and the survivor copy; measured 162 B
#   a row without sort keys and 198 B with 9 bytes of them.
NEW_ROW_BYTES = 162
NEW_ROW_BYTES_PER_SORT_BYTE = 4
# kept for callers of the first model: the cost of a new row
DEDUPE_OVERHEAD_BYTES = NEW_ROW_BYTES


def dedupe_bytes_per_row(sort_key_width: int) -> int:
    """Bytes a new (delta) row costs dedupe."""
    return NEW_ROW_BYTES + NEW_ROW_BYTES_PER_SORT_BYTE * sort_key_width


def indexed_row_bytes(sort_key_width: int) -> int:
    """Bytes a row of the prior primary key index costs (the index writer's output row, dedupe streams)."""
    return 28 + sort_key_width + INDEXED_ROW_OVERHEAD_BYTES


def round_bytes(rows: int, sort_key_width: int, indexed_rows: int = 0) -> int:
    """Memory the hash buckets of a job run need in total: ``rows`` input records, ``indexed_rows`` of them
    rows of the prior compacted version (the primary key index), the rest new delta rows."""
    indexed = min(max(0, indexed_rows), rows)
    return (rows - indexed) * dedupe_bytes_per_row(sort_key_width) + indexed * indexed_row_bytes(sort_key_width)


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
    indexed_rows: int = 0,
) -> BucketChoice:
    """The paper's rule: target ~1/2 of per-task memory in dedupe; rehash an inherited count above 90%.

    ``rows`` are the job run's input records (deltas + prior compacted), ``indexed_rows`` of them in the prior
    primary key index: with the measured costs per row, the paper's numbers (8 GiB/CPU, half of it) give Figure
    3-1's bucket counts (tests/compactor/planning/test_figure_3_1.py)."""
    need = round_bytes(rows, sort_key_width, indexed_rows)
    per_row = need / rows if rows else dedupe_bytes_per_row(sort_key_width)
    need_half = max(1, math.ceil(need / (0.5 * memory_per_task)))
    if requested is not None:
        check_bucket_count(requested)
        if inherited is not None and requested != inherited:
            return BucketChoice(requested, True,
                                f"requested {requested} buckets; the index has {inherited}: rehashing first")
        return BucketChoice(requested, False, f"requested {requested} buckets")
    if inherited is not None:
        use = need / inherited / memory_per_task
        if use > 0.9:
            n = max(need_half, inherited)
            return BucketChoice(n, True,
                                f"{inherited} inherited buckets would use {use:.0%} of task memory (>90%): rehashing "
                                f"to {n}")
        return BucketChoice(inherited, False,
                            f"keeping the index's {inherited} buckets ({use:.1%} of task memory each)")
    n = max(need_half, min(cpus, max(1, rows // 100_000)) if rows else 1)
    return BucketChoice(n, False,
                        f"{rows} rows x {per_row:.0f} B over {memory_per_task >> 20} MiB per task: {n} bucket(s)")


# Parquet and friends decompress to about this many times their size at rest in Arrow memory.
DECOMPRESSION_FACTOR = 3


def delta_round_bytes(rows: int, sort_key_width: int) -> int:
    """Intermediate memory a delta costs a round: its envelopes in the object store and dedupe's survivors of
    them (upper bound: every row survives). Its rows themselves are not a round's: materialize runs once, after
    the last round, in tasks sized from the budget (planning/rounds.py)."""
    envelope = 28 + sort_key_width
    return rows * 2 * envelope


# the least memory a task is planned with: below it a bucket's fixed costs (its task, its files) dominate
MIN_TASK_MEMORY = 64 << 20
MIN_BUDGET_TASK_MEMORY = 8 << 20


def budget_memory_per_task(heap_bytes: int, cpus: int, max_round_bytes: int | None = None) -> int:
    """Memory one dedupe task may plan with: its share of the heap, and with a round budget given
    (``--max-round-bytes``) at most its share of that budget, since the round's ``cpus`` tasks run at once.

    Without the budget's share, a session of many rounds kept the heap-sized bucket count (2 on this machine for
    6M rows) and its last round merged every earlier round's summary of half the table in each of two
    concurrent tasks: 580 MiB live against a 100 MiB budget on the benchmark's s5 (docs/compaction.md)."""
    per_task = max(MIN_TASK_MEMORY, heap_bytes // max(1, cpus))
    if max_round_bytes:
        per_task = min(per_task, max(MIN_BUDGET_TASK_MEMORY, max_round_bytes // max(1, cpus)))
    return per_task


def default_round_budget(heap_bytes: int, object_store_bytes: int) -> int:
    """Half of the smaller of Ray's object store and heap: the paper's rule 1 with room for the index."""
    return max(16 << 20, min(heap_bytes, object_store_bytes) // 2)
