"""The compacted layout a round will produce, computed from row counts alone before any row is written.

Order of rows in the new compacted stream version (the paper's "predictive" primary key index relies on it):
1. prior compacted files that lost no row are carried by reference, unchanged, numbered first;
2. then each materialize task in order; inside a task, its source files in src order; inside a prior unit that
   lost rows, its surviving rows in their old order; inside a delta file, surviving rows grouped by hash bucket
   (bucket order) and, inside a bucket, by row index;
3. each task's rows are cut into files of at most ``rows_per_file`` rows, numbered consecutively.
Given the per (bucket, delta file) survivor counts and the list of prior rows that lost, every survivor's
(file number, row index) is known. Prior rows are described by what they lost, never row by row: an
incremental round touches few of its millions of prior rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flash_pipeline.catalog.numpy_sets import sorted_union
from flash_pipeline.compactor.kernels.index_kernels import (
    index_pointers_kernel,
    prior_pointers_kernel,
    survivor_index_rows_kernel,
)
from flash_pipeline.compactor.model.plans import ROW_BITS, RoundPlan, row_of
from flash_pipeline.errors import IntegrityError, InternalError


@dataclass
class Layout:
    task_groups: tuple[tuple[int, ...], ...]  # the units each materialize task rewrites (RoundPlan.materialize_tasks)
    carried_file_number: np.ndarray  # per src: new file number of a carried prior file, else 0
    task_of_src: np.ndarray  # per src: materialize task index, -1 for delete files and carried files
    # (buckets, S): offset inside its task of the (src, bucket) block (a prior unit: one block, bucket 0)
    block_start: np.ndarray
    task_rows: np.ndarray  # rows per materialize task
    task_file_base: np.ndarray  # first file number of each materialize task
    rows_per_file: int
    src_row_start: np.ndarray  # per src: first row of the unit inside its file
    src_survivors: np.ndarray  # per src: surviving rows (all buckets)
    lost_ranks: np.ndarray  # ranks of the prior rows that lost (all buckets), ascending
    lost_src_first: np.ndarray  # per src (+1): where its lost ranks start in ``lost_ranks``

    @property
    def carried(self) -> np.ndarray:
        return self.carried_file_number > 0

    def lost_rows(self, src: int) -> np.ndarray:
        """Rows (inside the unit) of prior unit ``src`` that lost, ascending."""
        return row_of(self.lost_ranks[self.lost_src_first[src] : self.lost_src_first[src + 1]])


def compute_layout(plan: RoundPlan, counts: np.ndarray, lost_ranks: np.ndarray) -> Layout:
    """``counts[b, src]`` = survivors of delta file ``src`` in bucket ``b``; ``lost_ranks`` = ranks of the prior
    rows that lost, ascending.

    Rows the prior files' deletion vectors already mark dead (``plan.dead_ranks``) count as lost too: a rewritten
    file drops them, and the layout's lost ranks are every dead row of the new version's carried files (their
    new deletion vectors, round.py). The per-file cost model: a prior file is carried by reference when it lost
    no row this round (its vector, if any, unchanged), or, with deletion vectors on, when at most
    ``plan.spec.max_dead_fraction`` (catalog/deletion_vectors.py's MAX_DEAD_FRACTION) of its rows are dead
    afterwards; otherwise its surviving rows are rewritten."""
    sources = plan.sources
    S = len(sources)
    B = max(1, plan.bucket_count)
    counts = counts.reshape(B, S) if counts.size else np.zeros((B, S), dtype=np.int64)
    new_lost_by_src = np.diff(np.searchsorted(lost_ranks,
                                              np.arange(S + 1, dtype=np.int64) << ROW_BITS)).astype(np.int64)
    if plan.dead_ranks is not None and len(plan.dead_ranks):
        lost_ranks = sorted_union(np.asarray(lost_ranks, dtype=np.int64), plan.dead_ranks)
    lost_src_first = np.searchsorted(lost_ranks, np.arange(S + 1, dtype=np.int64) << ROW_BITS).astype(np.int64)
    lost_by_src = np.diff(lost_src_first)
    is_prior = np.array([s.prior for s in sources], dtype=bool)
    if counts[:, is_prior].any():
        raise InternalError(f"{plan.where}: a dedupe task counted prior rows as new survivors")
    if lost_by_src[~is_prior].any():
        raise InternalError(f"{plan.where}: a dedupe task reported a new row as a lost prior row")
    counts = counts.copy()
    counts[0, is_prior] = np.array([s.rows for s in sources], dtype=np.int64)[is_prior] - lost_by_src[is_prior]
    totals = counts.sum(axis=0)
    # a prior file is carried when no row of its units lost this round, or (vectors on) when few rows are dead
    file_survivors: dict[int, int] = {}
    file_new_lost: dict[int, int] = {}
    for s in sources:
        if s.prior:
            file_survivors[s.file_number] = file_survivors.get(s.file_number, 0) + int(totals[s.src])
            file_new_lost[s.file_number] = file_new_lost.get(s.file_number, 0) + int(new_lost_by_src[s.src])
    limit = plan.spec.max_dead_fraction if plan.spec.deletion_vectors else -1.0
    carried_files = [
        n for n, rows in enumerate(plan.prior_file_rows, 1)
        if file_survivors.get(n, 0) > 0 and (file_new_lost.get(n, 0) == 0 or rows - file_survivors[n] <= limit * rows)
    ] if plan.spec.carry_prior else []
    new_number = {n: i for i, n in enumerate(carried_files, 1)}
    carried_file_number = np.array([new_number.get(s.file_number, 0) if s.prior else 0 for s in sources],
                                   dtype=np.int64)
    carried = carried_file_number > 0
    is_delete = plan.is_delete_by_src()
    task_groups = plan.materialize_tasks(~is_delete & ~carried)
    task_of_src = np.full(S, -1, dtype=np.int64)
    for m, group in enumerate(task_groups):
        task_of_src[list(group)] = m
    materialized = task_of_src >= 0
    blocks = (counts.T * materialized[:, None]).astype(np.int64)  # (S, buckets), src-major like the output
    flat = blocks.reshape(-1)
    exclusive = np.concatenate(([0], np.cumsum(flat)[:-1])).reshape(blocks.shape)
    n_tasks = len(task_groups)
    task_rows = np.zeros(n_tasks, dtype=np.int64)
    task_start = np.zeros(n_tasks, dtype=np.int64)
    for m, group in enumerate(task_groups):
        first = min(group)
        task_start[m] = exclusive[first, 0] if blocks.shape[1] else 0
        task_rows[m] = int(blocks[list(group)].sum())
    src_task_start = task_start[np.maximum(task_of_src, 0)] if n_tasks else np.zeros(S, dtype=np.int64)
    block_start = (exclusive - src_task_start[:, None]).T.copy()
    R = plan.spec.rows_per_file
    files_per_task = -(-task_rows // R)
    base = len(carried_files) + 1
    task_file_base = base + np.concatenate(([0], np.cumsum(files_per_task)[:-1])).astype(np.int64)
    return Layout(
        task_groups, carried_file_number, task_of_src, block_start, task_rows, task_file_base, R, plan.src_row_start(),
        totals.astype(np.int64), np.asarray(lost_ranks, dtype=np.int64), lost_src_first,
    )


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


def survivor_index_rows(layout: Layout, bucket: int, envelopes: np.ndarray, sort_width: int, out: np.ndarray,
                        keep: np.ndarray | None = None) -> int:
    """Write the index rows (``out``: raw rows of the pk_index layout) of ``bucket``'s survivor envelopes
    (ranks ascending; with ``keep``, only the envelopes it flags): their digest and sort key bytes with the
    pointers index_pointers gives, in one pass. Returns the rows written."""
    if not len(envelopes):
        return 0
    raw = np.ascontiguousarray(envelopes).view(np.uint8).reshape(len(envelopes), envelopes.dtype.itemsize)
    every = np.zeros(0, dtype=np.bool_)
    return int(survivor_index_rows_kernel(
        raw, every if keep is None else np.ascontiguousarray(keep, dtype=np.bool_), bucket, layout.block_start,
        layout.task_of_src, layout.task_file_base, layout.rows_per_file, layout.carried_file_number,
        layout.src_row_start, sort_width, out,
    ))


def prior_index_pointers(plan: RoundPlan, layout: Layout, prior: np.ndarray,
                         keep: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """New (file number, row index) of the kept rows of a prior index bucket (``prior`` in pointer order);
    None when ``prior`` is not in pointer order. See index_kernels.prior_pointers_kernel."""
    n = int(keep.sum())
    files = np.empty(n, dtype=np.int64)
    rows = np.empty(n, dtype=np.int64)
    if len(prior) == 0:
        return files, rows
    raw = np.ascontiguousarray(prior).view(np.uint8).reshape(len(prior), prior.dtype.itemsize)
    written = prior_pointers_kernel(
        raw, keep, plan.prior_unit_keys(), layout.lost_ranks, layout.lost_src_first, layout.carried_file_number,
        np.ascontiguousarray(layout.block_start[0]), layout.task_of_src, layout.task_file_base, layout.rows_per_file,
        files, rows,
    )
    if written == -1:
        return None
    if written != n:
        raise IntegrityError(f"{plan.where}: a primary key index pointer lies outside the compacted files; run "
                             "flash-compactor verify, then rebuild the index (compact --rebuild)")
    return files, rows
