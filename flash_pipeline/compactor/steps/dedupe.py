"""Step 2, dedupe: one hash bucket's prior primary key index plus its new envelopes -> the surviving rows.

Rows arrive in rank order (prior index first, then hash bucket task outputs in source order), so one O(n)
pass with a digest hash table and a sort-key comparator finds each key's survivor (see compiled.dedupe_kernel);
prior rows no new row touches skip that pass (see dedupe_bucket).

A session whose input exceeds its memory budget dedupes in rounds. A round before the last reduces its own
rows to a *round summary* per bucket (per key: its last delete and the best upsert after it; see
compiled.round_summary_kernel), saved to storage (save_run: raw arrays behind a one-line header) and never
read again until the last round, which probes the prior index once with every summary's digests and replays
the summaries and its own rows in one pass (dedupe_probed). Each round's work is proportional to its own rows,
not to all the rows of the rounds before it. A resumed session reads the summaries of the rounds it skips.
The last round's output is saved too (save_state), for the index writers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from flash_pipeline.catalog.key_ranges import KeyRange, files_miss
from flash_pipeline.catalog.model import IndexFile
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.index.dead_entries import dead_mask
from flash_pipeline.compactor.kernels.compiled import member_kernel, replay, round_summary_kernel
from flash_pipeline.compactor.kernels.index_kernels import prior_envelopes_kernel
from flash_pipeline.compactor.model.plans import ROW_BITS, RoundPlan, src_of
from flash_pipeline.compactor.model.rows import concat_rows, take_rows
from flash_pipeline.compactor.steps.dedupe_state import (
    DedupeOutput,
    RoundRun,
    load_run,
    load_state,
    save_run,
    save_state,
)
from flash_pipeline.compactor.steps.hash_bucket import envelope_dtype
from flash_pipeline.errors import IntegrityError, InternalError


@dataclass
class PriorProbe:
    """What dedupe needs of a prior index bucket: its size and the rows a new digest touches (only those can
    lose), at their positions in pointer order. Never the whole bucket (see stream_probe)."""

    rows: int
    at: np.ndarray  # ascending positions
    touched: np.ndarray  # the index rows at ``at``
    skipped_bytes: int = 0  # of index files skipped unread (stream_probe)


def _digest_view(rows: np.ndarray) -> np.ndarray:
    """(n, 20) uint8 view of a structured array's digest field, without copying it."""
    if len(rows) == 0:
        return np.zeros((0, 20), dtype=np.uint8)
    return np.lib.stride_tricks.as_strided(rows.view(np.uint8), shape=(len(rows), 20), strides=(rows.itemsize, 1),
                                           writeable=False)


def _sort_view(plan: RoundPlan, rows: np.ndarray) -> np.ndarray:
    if plan.spec.sort_key_width:
        return np.ascontiguousarray(rows["sort"]).view(np.uint8).reshape(-1, plan.spec.sort_key_width)
    return np.zeros((len(rows), 0), dtype=np.uint8)


def _is_delete(plan: RoundPlan, rows: np.ndarray) -> np.ndarray:
    by_src = plan.is_delete_by_src()
    if not len(rows) or not by_src.any():
        return np.zeros(len(rows), dtype=bool)
    return by_src[src_of(rows["rank"])]


def _survivors_of(plan: RoundPlan, rows: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, int]:
    """(keep mask, erasures counted) of rows in rank order: the O(n) comparator pass (compiled.replay: replay_kernel,
    partitioned by digest when large), handed the rows' digest and sort key bytes as views of the rows (no copies)."""
    rows = np.ascontiguousarray(rows)
    raw = rows.view(np.uint8).reshape(len(rows), rows.dtype.itemsize)
    width = plan.spec.sort_key_width
    keep, deleted = replay(raw[:, :20], raw[:, 28 : 28 + width], _is_delete(plan, rows), counts)
    return keep, int(deleted)


def summarize_round(plan: RoundPlan, new: np.ndarray) -> RoundRun:
    """The summary of a round before the last (compiled.round_summary_kernel)."""
    new = np.ascontiguousarray(new)
    raw = new.view(np.uint8).reshape(len(new), new.dtype.itemsize)
    keep, counts, deleted = round_summary_kernel(raw[:, :20], raw[:, 28 : 28 + plan.spec.sort_key_width],
                                                 _is_delete(plan, new))
    n_delete = int(_is_delete(plan, new).sum())
    return RoundRun(take_rows(new, keep), counts[keep], len(new) - n_delete, n_delete, int(deleted))


def _prior_envelopes(plan: RoundPlan, prior: np.ndarray) -> np.ndarray | None:
    """Envelopes (pointer -> rank) of prior index rows, in one pass (see index_kernels.prior_envelopes_kernel).
    None when the rows are not in pointer order (not written by us)."""
    out = np.empty(len(prior), dtype=envelope_dtype(plan.spec.sort_key_width))
    if len(prior) == 0:
        return out
    width = prior.dtype["sort"].itemsize if "sort" in (prior.dtype.names or ()) else 0
    # concatenation may go native-endian
    prior = np.ascontiguousarray(prior.astype(pk_index.index_dtype(width), copy=False))
    raw = prior.view(np.uint8).reshape(len(prior), prior.dtype.itemsize)
    written = prior_envelopes_kernel(
        raw, np.ones(len(prior), dtype=bool), plan.prior_unit_keys(), plan.src_row_start(), plan.spec.sort_key_width,
        out.view(np.uint8).reshape(len(out), out.dtype.itemsize),
    )
    if written == -1:
        return None
    if written != len(out):
        raise IntegrityError(f"{plan.where}: a primary key index pointer lies outside the compacted files; run "
                             "flash-compactor verify, then rebuild the index (compact --rebuild)")
    return out


def _live_touched(plan: RoundPlan, old_touched: np.ndarray, probe: PriorProbe) -> tuple[np.ndarray, PriorProbe]:
    """The touched prior rows without the dead entries of carried index files (IndexFile.dead_rows): a key a
    deletion vector already removed cannot lose again, and a deleted key's dead entry must not outrank the key's
    next insert."""
    dead = plan.dead_ranks
    if dead is None or not len(dead) or not len(old_touched):
        return old_touched, probe
    ranks = old_touched["rank"]
    hit = dead[np.minimum(np.searchsorted(dead, ranks), len(dead) - 1)] == ranks
    if not hit.any():
        return old_touched, probe
    live = ~hit
    return old_touched[live], PriorProbe(probe.rows, probe.at[live], probe.touched[live], probe.skipped_bytes)


def _touched(new_digests: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions in ``rows`` (one row per key) whose digest is among the new rows: only those can lose."""
    if len(new_digests) < len(rows):  # an incremental round: probe the (large) side against the (small) delta
        return np.flatnonzero(member_kernel(new_digests, _digest_view(rows)))
    return np.arange(len(rows), dtype=np.int64)  # a probe table as large as the comparator's would only double the work


def _new_rows(plan: RoundPlan, envelopes: list[np.ndarray]) -> np.ndarray:
    dtype = envelope_dtype(plan.spec.sort_key_width)
    # the rows of one hash bucket task come back as they are (concat_rows copies only to join several)
    return concat_rows([e for e in envelopes if len(e)], dtype)


def _digests(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows["digest"]).view(np.uint8).reshape(-1, 20)


def _check_width(plan: RoundPlan, prior_rows: int) -> None:
    if plan.prior_index is not None and plan.prior_index.sort_key_width != plan.spec.sort_key_width and prior_rows:
        raise IntegrityError(f"{plan.where}: the primary key index holds sort keys of "
                             f"{plan.prior_index.sort_key_width} bytes, the table's take {plan.spec.sort_key_width}; "
                             "compact with --rebuild")


def _all_digests(runs: Sequence[RoundRun], new: np.ndarray) -> np.ndarray:
    """(n, 20) digests of the earlier rounds' summaries and this round's rows: what the prior index is probed
    with (20 bytes a row, not the envelopes)."""
    if not runs:
        return _digests(new)
    return np.concatenate([_digests(r.rows) for r in runs] + [_digests(new)])


def dedupe_bucket(plan: RoundPlan, prior: np.ndarray, envelopes: list[np.ndarray], runs: Sequence[RoundRun] = (),
                  ranks_only: bool = False) -> DedupeOutput:
    """Survivors of one bucket, ``prior`` the whole prior index bucket in memory (dedupe_step streams it)."""
    _check_width(plan, len(prior))
    if len(prior) > 1 and not pk_index.pointers_ascending(prior):  # not written by us
        return dedupe_bucket(plan, pk_index.in_pointer_order(prior), envelopes, runs, ranks_only)
    new = _new_rows(plan, envelopes)
    at = _touched(_all_digests(runs, new), prior)
    live = len(prior) - int(dead_mask(prior, plan.dead_pointers).sum())
    return dedupe_probed(plan, PriorProbe(live, at, take_rows(prior, at)), new, runs, ranks_only)


def dedupe_probed(plan: RoundPlan, probe: PriorProbe, new: np.ndarray, runs: Sequence[RoundRun] = (),
                  ranks_only: bool = False) -> DedupeOutput:
    """Survivors of one bucket. Prior index rows hold one row per key and rank below every new row, so only
    the prior rows whose digest appears among the new rows can lose (``probe``), and the comparator pass runs
    over those plus the new rows alone. The output names the prior rows that lost (not the millions that
    stay), so the work is one probe per indexed row plus the dedupe of the delta, whatever the width of the
    table's rows.

    ``runs`` are the summaries of the session's earlier rounds (ranked below this round's rows): they are
    replayed with this round's rows, so the output is that of one pass over all the session's deltas. The
    probe must cover their digests too.

    ``ranks_only`` (a one-round session, whose index writer reads the survivors among the envelopes themselves
    by ``survivor_keep``): the survivors are returned as their ranks, without copying their envelopes first
    (s1: 95 MB a bucket beside its 116 MB of envelopes; on Ray at the warm peak, in process 0.06-0.07 s of its
    0.40-0.42 s dedupe)."""
    dtype = envelope_dtype(plan.spec.sort_key_width)
    old_touched = _prior_envelopes(plan, probe.touched)
    if old_touched is None:
        raise InternalError(f"{plan.where}: prior index rows out of pointer order reached dedupe")
    old_touched, probe = _live_touched(plan, old_touched, probe)
    # one array of prior rows, earlier summaries and this round's rows, in rank order: the only copy the last
    # round makes of them (none in a first compaction: nothing comes before this round's rows)
    sub = concat_rows([p for p in [old_touched, *(r.rows for r in runs)] if len(p)] + [new], dtype)
    counts = np.concatenate([np.ones(len(old_touched), dtype=bool)] + [r.counts.astype(bool, copy=False) for r in runs]
                            + [np.ones(len(new), dtype=bool)])
    ranks = sub["rank"]
    if len(ranks) > 1 and not bool(np.all(ranks[1:] > ranks[:-1])):
        raise InternalError(f"{plan.where}: a hash bucket's input is not in rank order")
    n_prior = len(probe.at)
    keep_sub, deleted = _survivors_of(plan, sub, counts)
    del counts, ranks
    lost = ~keep_sub[:n_prior]
    survivor_keep = None if runs else np.ascontiguousarray(keep_sub[n_prior:])  # over ``new`` alone
    if ranks_only and not runs:
        survivors = sub["rank"][n_prior:][keep_sub[n_prior:]]  # a mask copy: contiguous
        survivor_ranks = survivors
    else:
        survivors = take_rows(sub[n_prior:], keep_sub[n_prior:])
        survivor_ranks = survivors["rank"]
    del sub
    lost_at, lost_ranks = probe.at[lost], old_touched["rank"][lost]  # a mask copy: contiguous
    new_delete = int(_is_delete(plan, new).sum())
    counts_by_src = np.bincount(src_of(survivor_ranks), minlength=len(plan.sources)).astype(np.int64)
    return DedupeOutput(
        survivors=survivors,
        counts=counts_by_src,
        prior_rows=probe.rows,
        lost_at=lost_at,
        lost_ranks=lost_ranks,
        upsert_rows=len(new) - new_delete + sum(r.upsert_rows for r in runs),
        delete_rows=new_delete + sum(r.delete_rows for r in runs),
        deleted=deleted + sum(r.deleted for r in runs),
        index_bytes_skipped=probe.skipped_bytes,
        survivor_keep=survivor_keep,
    )


def untouched(plan: RoundPlan, f: IndexFile, key_range: KeyRange | None) -> bool:
    """Whether prior index file ``f`` cannot hold a key of the deltas, whose first key column lies in
    ``key_range``: every compacted file its rows point to records a range that misses it (catalog/key_ranges.py).
    Index files record the compacted files they point to (first_file..last_file, in the prior version's numbers)."""
    return files_miss(plan.prior_file_key_ranges, f.first_file, f.last_file, key_range)


def stream_probe(storage: Storage, plan: RoundPlan, bucket: int, new_digests: np.ndarray,
                 key_range: KeyRange | None = None) -> PriorProbe | None:
    """The prior index bucket probed chunk by chunk (pk_index.file_chunks): dedupe holds one chunk and the
    touched rows, never the bucket. Index files that cannot hold a key of the deltas' ``key_range`` are skipped
    unread (``untouched``): their rows only count. None when its rows are not in pointer order (an index from
    elsewhere)."""
    if plan.prior_index is None:
        return PriorProbe(0, np.zeros(0, dtype=np.int64),
                          np.empty(0, dtype=pk_index.index_dtype(plan.spec.sort_key_width)))
    ats, rows, first, last, skipped = [], [], 0, -1, 0
    width = plan.prior_index.sort_key_width
    buffer = pk_index.ChunkBuffer()
    for f in plan.prior_index.buckets[bucket]:
        if untouched(plan, f, key_range):
            if f.first_file < (last >> ROW_BITS):
                return None  # out of pointer order across files
            first += f.rows
            skipped += f.bytes
            last = f.last_file << ROW_BITS  # a lower bound of its last pointer (it has a row in last_file)
            continue
        for chunk in pk_index.file_chunks(storage, f, width, None, buffer):
            if not pk_index.pointers_ascending(chunk) or (len(chunk) and pk_index.first_pointer(chunk) <= last):
                return None
            if len(chunk):
                last = pk_index.last_pointer(chunk)
            at = (np.flatnonzero(member_kernel(new_digests, _digest_view(chunk))) if len(new_digests)
                  else np.zeros(0, dtype=np.int64))
            ats.append(at + first)
            rows.append(take_rows(chunk, at))
            first += len(chunk)
    touched = concat_rows(rows, pk_index.index_dtype(width))
    dead = sum(f.dead_rows for f in plan.prior_index.buckets[bucket])  # positions count them; the rows do not
    return PriorProbe(first - dead, np.concatenate(ats) if ats else np.zeros(0, dtype=np.int64), touched, skipped)


def read_prior(storage: Storage, plan: RoundPlan, bucket: int) -> np.ndarray:
    """One bucket of the prior primary key index, in pointer order (the order every round's state refers to)."""
    if plan.prior_index is None:
        return np.empty(0, dtype=pk_index.index_dtype(plan.spec.sort_key_width))
    return pk_index.in_pointer_order(pk_index.read_bucket(storage, plan.prior_index, bucket))


def dedupe_step(storage: Storage, plan: RoundPlan, bucket: int, envelopes: list[np.ndarray], round_number: int = 1,
                key_range: KeyRange | None = None, ranks_only: bool = False) -> DedupeOutput:
    """The dedupe task of one hash bucket in round ``round_number``. A round before the last saves its summary
    (and reports it: its survivors are the keys the round kept, prior rows untouched). The last round reads the
    earlier summaries, probes the prior index bucket once (streamed) and dedupes; a multi-round session saves
    its output for the index writer. Positions in the prior bucket are in pointer order, the order the index
    writer streams it in. ``ranks_only``: see :func:`dedupe_probed` (a one-round session only)."""
    n_prior = sum(f.rows for f in plan.prior_index.buckets[bucket]) if plan.prior_index is not None else 0
    _check_width(plan, n_prior)
    new = _new_rows(plan, envelopes)
    if round_number < plan.rounds:
        run = summarize_round(plan, new)
        save_run(storage, plan.state_key(round_number, bucket), run)
        kept = take_rows(run.rows, ~_is_delete(plan, run.rows)) if len(run.rows) else run.rows
        empty = np.zeros(0, dtype=np.int64)
        return DedupeOutput(kept, empty, 0, empty, empty, run.upsert_rows, run.delete_rows, run.deleted)
    runs = [load_run(storage, plan, plan.state_key(k, bucket)) for k in range(1, round_number)]
    no_digests = np.zeros((0, 20), dtype=np.uint8)  # without a prior index nothing is probed
    probe = stream_probe(storage, plan, bucket, _all_digests(runs, new) if plan.prior_index is not None else no_digests,
                         key_range)
    if probe is None:  # not in pointer order: read it whole, sorted as the index writer will sort it
        out = dedupe_bucket(plan, read_prior(storage, plan, bucket), envelopes, runs, ranks_only)
    else:
        out = dedupe_probed(plan, probe, new, runs, ranks_only)
    if plan.rounds > 1:
        save_state(storage, plan.state_key(round_number, bucket), out)
    return out


def index_writer_inputs(storage: Storage, plan: RoundPlan, bucket: int, survivors: np.ndarray | None,
                        lost_at: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(survivors, lost_at) for the index writer of ``bucket``: as dedupe handed them (one round), or read back
    from the last round's saved state (several rounds: the whole input's survivors never sit in memory)."""
    if lost_at is not None and survivors is not None:
        return survivors, lost_at  # arrays, or MaskedSurvivors (tasks.py index_step)
    state = load_state(storage, plan, plan.state_key(plan.rounds, bucket), 0)
    return state.survivors, state.lost_at


def dedupe_stats(out: DedupeOutput) -> dict[str, int]:
    """What a dedupe task reports to the driver (summed over buckets into the round's statistics)."""
    return {
        "upsert_rows": out.upsert_rows,
        "delete_rows": out.delete_rows,
        "prior_rows": out.prior_rows,
        "deleted": out.deleted,
        "survivors": out.survivor_rows,
        "index_bytes_skipped": out.index_bytes_skipped,
    }
