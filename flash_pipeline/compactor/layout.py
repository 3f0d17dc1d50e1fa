"""The compacted layout a round will produce, computed from row counts alone before any row is written.

Order of rows in the new compacted stream version (the paper's "predictive" primary key index relies on it):
1. prior compacted files that lost no row are carried by reference, unchanged, numbered first;
2. then each materialize task in order; inside a task, its source files in src order; inside a source file,
   surviving rows grouped by hash bucket (bucket order) and, inside a bucket, by row index;
3. each task's rows are cut into files of at most ``rows_per_file`` rows, numbered consecutively.
Given the per (bucket, source file) survivor counts, every survivor's (file number, row index) is known.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flash_pipeline.compactor._kernels import index_pointers_kernel
from flash_pipeline.compactor.plan import RoundPlan


@dataclass
class Layout:
    carried_file_number: np.ndarray  # per src: new file number of a carried prior file, else 0
    task_of_src: np.ndarray  # per src: materialize task index, -1 for delete files
    block_start: np.ndarray  # (buckets, S): offset inside its task of the (src, bucket) block
    task_rows: np.ndarray  # rows per materialize task
    task_file_base: np.ndarray  # first file number of each materialize task
    rows_per_file: int
    src_row_start: np.ndarray  # per src: first row of the unit inside its file
    src_survivors: np.ndarray  # per src: surviving rows (all buckets)

    @property
    def carried(self) -> np.ndarray:
        return self.carried_file_number > 0


def compute_layout(plan: RoundPlan, counts: np.ndarray) -> Layout:
    """``counts[b, src]`` = survivors of source file ``src`` in bucket ``b``."""
    sources = plan.sources
    S = len(sources)
    totals = counts.sum(axis=0) if counts.size else np.zeros(S, dtype=np.int64)
    # a prior file is carried when all rows of all its units survive
    file_survivors: dict[int, int] = {}
    for s in sources:
        if s.prior:
            file_survivors[s.file_number] = file_survivors.get(s.file_number, 0) + int(totals[s.src])
    carried_files = [n for n, rows in enumerate(plan.prior_file_rows, 1) if rows > 0 and file_survivors.get(n) == rows]
    new_number = {n: i for i, n in enumerate(carried_files, 1)}
    carried_file_number = np.array([new_number.get(s.file_number, 0) if s.prior else 0 for s in sources], dtype=np.int64)
    carried = carried_file_number > 0
    task_of_src = np.full(S, -1, dtype=np.int64)
    for m, group in enumerate(plan.materialize_groups):
        task_of_src[list(group)] = m
    materialized = (task_of_src >= 0) & ~carried
    blocks = (counts.T * materialized[:, None]).astype(np.int64)  # (S, buckets), src-major like the output
    flat = blocks.reshape(-1)
    exclusive = np.concatenate(([0], np.cumsum(flat)[:-1])).reshape(blocks.shape)
    n_tasks = len(plan.materialize_groups)
    task_rows = np.zeros(n_tasks, dtype=np.int64)
    task_start = np.zeros(n_tasks, dtype=np.int64)
    for m, group in enumerate(plan.materialize_groups):
        first = min(group)
        task_start[m] = exclusive[first, 0] if blocks.shape[1] else 0
        task_rows[m] = int(blocks[list(group)].sum())
    src_task_start = task_start[np.maximum(task_of_src, 0)] if n_tasks else np.zeros(S, dtype=np.int64)
    block_start = (exclusive - src_task_start[:, None]).T.copy()
    R = plan.rows_per_file
    files_per_task = -(-task_rows // R)
    base = len(carried_files) + 1
    task_file_base = base + np.concatenate(([0], np.cumsum(files_per_task)[:-1])).astype(np.int64)
    return Layout(carried_file_number, task_of_src, block_start, task_rows, task_file_base, R, plan.src_row_start(), totals.astype(np.int64))


def index_pointers(layout: Layout, bucket: int, survivor_ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(compacted file number, row index) of each survivor of ``bucket`` (ranks ascending).

    A carried file keeps its rows where they were; a materialized survivor is the k-th row of its (src, bucket)
    block, so its offset in its task is the block's start plus k, cut into files of ``rows_per_file`` rows."""
    n = len(survivor_ranks)
    files = np.empty(n, dtype=np.int64)
    rows = np.empty(n, dtype=np.int64)
    if n:
        index_pointers_kernel(
            np.ascontiguousarray(survivor_ranks, dtype=np.int64), bucket, layout.block_start, layout.task_of_src,
            layout.task_file_base, layout.rows_per_file, layout.carried_file_number, layout.src_row_start, files, rows,
        )
    return files, rows
