"""Step 2, dedupe: one hash bucket's prior primary key index plus its new envelopes -> the surviving rows.

Rows arrive in rank order (prior index first, then hash bucket task outputs in source order), so one O(n)
pass with a digest hash table and a sort-key comparator finds each key's survivor (see compiled.dedupe_kernel);
prior rows no new row touches skip that pass (see dedupe_bucket).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.kernels.compiled import dedupe_kernel, member_kernel, prior_envelopes_kernel
from flash_pipeline.compactor.steps.hash_bucket import envelope_dtype
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.model.plans import RoundPlan, src_of
from flash_pipeline.errors import IntegrityError, InternalError


@dataclass
class DedupeOutput:
    survivors: np.ndarray  # envelope rows (digest, rank[, sort]) of surviving *new* rows, ascending rank
    counts: np.ndarray  # surviving new rows per source file (length S; 0 for prior units)
    prior: np.ndarray  # the prior index rows this bucket deduped against, in pointer order
    lost_at: np.ndarray  # positions in ``prior`` of the rows a new row or a delete removed, ascending
    lost_ranks: np.ndarray  # their ranks (prior unit src << 40 | row inside the unit), ascending
    upsert_rows: int  # new upsert rows seen (excluding prior index rows)
    delete_rows: int
    deleted: int  # upsert rows (new or prior) removed by a later delete

    @property
    def prior_rows(self) -> int:
        return len(self.prior)

    @property
    def survivor_rows(self) -> int:
        return len(self.survivors) + len(self.prior) - len(self.lost_at)


def _digest_view(rows: np.ndarray) -> np.ndarray:
    """(n, 20) uint8 view of a structured array's digest field, without copying it."""
    if len(rows) == 0:
        return np.zeros((0, 20), dtype=np.uint8)
    return np.lib.stride_tricks.as_strided(rows.view(np.uint8), shape=(len(rows), 20), strides=(rows.itemsize, 1), writeable=False)


def _survivors_of(plan: RoundPlan, rows: np.ndarray) -> tuple[np.ndarray, int]:
    """(keep mask, rows removed by a delete) of rows in rank order: the O(n) comparator pass."""
    is_delete = plan.is_delete_by_src()[src_of(rows["rank"])] if len(rows) else np.zeros(0, dtype=bool)
    digests = np.ascontiguousarray(rows["digest"]).view(np.uint8).reshape(-1, 20)
    if plan.spec.sort_key_width:
        sort = np.ascontiguousarray(rows["sort"]).view(np.uint8).reshape(-1, plan.spec.sort_key_width)
    else:
        sort = np.zeros((len(rows), 0), dtype=np.uint8)
    keep, deleted = dedupe_kernel(digests, sort, is_delete)
    return keep, int(deleted)


def _prior_envelopes(plan: RoundPlan, prior: np.ndarray) -> np.ndarray | None:
    """Envelopes (pointer -> rank) of prior index rows, in one pass (see compiled.prior_envelopes_kernel).
    None when the rows are not in pointer order (not written by us)."""
    out = np.empty(len(prior), dtype=envelope_dtype(plan.spec.sort_key_width))
    if len(prior) == 0:
        return out
    raw = np.ascontiguousarray(prior).view(np.uint8).reshape(len(prior), prior.dtype.itemsize)
    written = prior_envelopes_kernel(
        raw, np.ones(len(prior), dtype=bool), plan.prior_unit_keys(), plan.src_row_start(), plan.spec.sort_key_width,
        out.view(np.uint8).reshape(len(out), out.dtype.itemsize),
    )
    if written == -1:
        return None
    if written != len(out):
        raise IntegrityError(f"{plan.where}: a primary key index pointer lies outside the compacted files; run flash-compactor verify, then rebuild the index (compact --rebuild)")
    return out


def dedupe_bucket(plan: RoundPlan, prior: np.ndarray, envelopes: list[np.ndarray]) -> DedupeOutput:
    """Survivors of one bucket. Prior index rows hold one row per key and rank below every new row, so only
    the prior rows whose digest appears among the new rows can lose: they are found by probing a hash table
    of the (small) new digests, and the comparator pass runs over those plus the new rows alone. The output
    names the prior rows that lost (not the millions that stay), so the work is one probe per indexed row
    plus the dedupe of the delta, whatever the width of the table's rows."""
    dtype = envelope_dtype(plan.spec.sort_key_width)
    if plan.prior_index is not None and plan.prior_index.sort_key_width != plan.spec.sort_key_width:
        if len(prior):
            raise IntegrityError(f"{plan.where}: the primary key index holds sort keys of {plan.prior_index.sort_key_width} bytes, the table's take {plan.spec.sort_key_width}; compact with --rebuild")
        prior = np.empty(0, dtype=pk_index.index_dtype(plan.spec.sort_key_width))  # an empty index from deletes only
    parts = [e for e in envelopes if len(e)]
    new = np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype=dtype)
    ranks = new["rank"]
    if len(ranks) > 1 and not bool(np.all(ranks[1:] > ranks[:-1])):
        raise InternalError(f"{plan.where}: a hash bucket's input is not in rank order")
    if len(new) < len(prior):  # an incremental round: probe the (large) index against the (small) delta
        new_digests = np.ascontiguousarray(new["digest"]).view(np.uint8).reshape(-1, 20)
        at = np.flatnonzero(member_kernel(new_digests, _digest_view(prior)))
    else:  # a probe table as large as the comparator's would only double the work
        at = np.arange(len(prior), dtype=np.int64)
    old_touched = _prior_envelopes(plan, prior[at])
    if old_touched is None:
        return dedupe_bucket(plan, prior[pk_index.pointer_order(prior)], envelopes)  # an index not in pointer order
    if len(old_touched) and len(new) and old_touched["rank"][-1] >= ranks[0]:
        raise InternalError(f"{plan.where}: a hash bucket's input is not in rank order")
    sub = np.concatenate([old_touched, new]) if len(old_touched) else new
    keep_sub, deleted = _survivors_of(plan, sub)
    lost = ~keep_sub[: len(at)]
    survivors = new[keep_sub[len(at) :]]
    counts = np.bincount(src_of(survivors["rank"]), minlength=len(plan.sources)).astype(np.int64)
    new_delete = int(plan.is_delete_by_src()[src_of(ranks)].sum()) if len(new) else 0
    return DedupeOutput(
        survivors=survivors,
        counts=counts,
        prior=prior,
        lost_at=at[lost],
        lost_ranks=old_touched["rank"][lost],  # a mask copy: contiguous
        upsert_rows=len(new) - new_delete,
        delete_rows=new_delete,
        deleted=deleted,
    )


def dedupe_step(storage: Storage, plan: RoundPlan, bucket: int, envelopes: list[np.ndarray]) -> DedupeOutput:
    """The dedupe task of one hash bucket: read the bucket of the prior primary key index, then dedupe."""
    prior = (
        pk_index.read_bucket(storage, plan.prior_index, bucket)
        if plan.prior_index is not None
        else np.empty(0, dtype=pk_index.index_dtype(plan.spec.sort_key_width))
    )
    return dedupe_bucket(plan, prior, envelopes)


def dedupe_stats(out: DedupeOutput) -> dict[str, int]:
    """What a dedupe task reports to the driver (summed over buckets into the round's statistics)."""
    return {
        "upsert_rows": out.upsert_rows,
        "delete_rows": out.delete_rows,
        "prior_rows": out.prior_rows,
        "deleted": out.deleted,
        "survivors": out.survivor_rows,
    }
