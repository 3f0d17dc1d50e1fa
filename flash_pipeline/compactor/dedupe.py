"""Step 2, dedupe: one hash bucket's prior primary key index plus its new envelopes -> the surviving rows.

Rows arrive in rank order (prior index first, then hash bucket task outputs in source order), so one O(n)
pass with a digest hash table and a sort-key comparator finds each key's survivor (see _kernels.dedupe_kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flash_pipeline.compactor import pk_index
from flash_pipeline.compactor._kernels import dedupe_kernel
from flash_pipeline.compactor.hash_bucket import envelope_dtype
from flash_pipeline.compactor.plan import ROW_BITS, RoundPlan, rank_of, src_of


@dataclass
class DedupeOutput:
    survivors: np.ndarray  # envelope rows (digest, rank[, sort]) in ascending rank order
    counts: np.ndarray  # surviving rows per source file (length S)
    upsert_rows: int  # new upsert rows seen (excluding prior index rows)
    delete_rows: int
    prior_rows: int
    deleted: int  # upsert rows (new or prior) removed by a later delete


def prior_envelopes(prior_rows: np.ndarray, sort_key_width: int, unit_keys: np.ndarray, unit_row_start: np.ndarray) -> np.ndarray:
    """Prior index rows as envelopes: each (file, row) pointer becomes (unit src, row inside the unit)."""
    env = np.empty(len(prior_rows), dtype=envelope_dtype(sort_key_width))
    env["digest"] = prior_rows["digest"]
    file = prior_rows["file"].astype(np.int64)
    row = prior_rows["row"].astype(np.int64)
    src = np.searchsorted(unit_keys, (file << ROW_BITS) | row, side="right") - 1
    env["rank"] = rank_of(src, row - unit_row_start[src])
    if sort_key_width:
        env["sort"] = prior_rows["sort"]
    ranks = env["rank"]
    if len(ranks) > 1 and not bool(np.all(ranks[1:] > ranks[:-1])):
        env = env[np.argsort(ranks, kind="stable")]  # index files we write are sorted; others may not be
    return env


def dedupe_bucket(plan: RoundPlan, prior: np.ndarray, envelopes: list[np.ndarray]) -> DedupeOutput:
    dtype = envelope_dtype(plan.sort_key_width)
    if plan.prior_index is not None and plan.prior_index.sort_key_width != plan.sort_key_width:
        if len(prior):
            raise AssertionError(f"index sort key width {plan.prior_index.sort_key_width} != {plan.sort_key_width}")
        prior = np.empty(0, dtype=pk_index.index_dtype(plan.sort_key_width))  # an empty index from deletes only
    parts = [prior_envelopes(prior, plan.sort_key_width, plan.prior_unit_keys(), plan.src_row_start())] + [e for e in envelopes if len(e)]
    rows = np.concatenate(parts) if len(parts) > 1 else parts[0].astype(dtype, copy=False)
    ranks = rows["rank"]
    if len(ranks) > 1 and not bool(np.all(ranks[1:] > ranks[:-1])):
        raise AssertionError(f"bucket input of round {plan.round_id} is not in rank order")
    is_delete = plan.is_delete_by_src()[src_of(ranks)] if len(rows) else np.zeros(0, dtype=bool)
    digests = np.ascontiguousarray(rows["digest"]).view(np.uint8).reshape(-1, 20)
    if plan.sort_key_width:
        sort = np.ascontiguousarray(rows["sort"]).view(np.uint8).reshape(-1, plan.sort_key_width)
    else:
        sort = np.zeros((len(rows), 0), dtype=np.uint8)
    keep, deleted = dedupe_kernel(digests, sort, is_delete)
    survivors = rows[keep]
    counts = np.bincount(src_of(survivors["rank"]), minlength=len(plan.sources)).astype(np.int64)
    n_prior = len(prior)
    new_delete = int(is_delete.sum())
    return DedupeOutput(
        survivors=survivors,
        counts=counts,
        upsert_rows=len(rows) - n_prior - new_delete,
        delete_rows=new_delete,
        prior_rows=n_prior,
        deleted=int(deleted),
    )
