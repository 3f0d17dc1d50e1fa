"""The rounds of a session: the paper's three bulk-synchronous steps, then the new primary key index.

hash bucket (one task per group of delta units) -> dedupe (one task per hash bucket; its row counts go to the
driver, which lays out the files) -> materialize (one task per group of units) and the index writers (one per
bucket). The result is what the session commits; no catalog document is written.

When the input exceeds the memory budget, hash bucket and dedupe run once per round (a slice of the deltas
that fits the budget), each round's dedupe state saved per bucket (steps/dedupe.py); materialize and the index
writers run once, after the last round, so the compacted table is written once per session, however many
rounds it takes. A resumed session skips the rounds whose state a round-completion file names (session.py).

The steps run as Ray tasks (steps_on_ray.py), or -- for inputs too small to be worth starting Ray (see
runtime/executor.py) -- as the same step functions on a thread pool in this process (here); round_steps.py holds
what both share.

The paper gathers the row counts in a RowCountsPendingMaterialize actor; here the driver is that actor: it
awaits every dedupe task's statistics anyway, and the counts ride with them (a separate actor cost the s3
benchmark's round two more calls, and the plan shipped to it, between dedupe and materialize).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from typing import Any, Callable, Sequence

import numpy as np

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.key_ranges import KeyRange, KeyRangeBuilder
from flash_pipeline.catalog.model import DataFile, IndexFile, IndexVersion
from flash_pipeline.compactor.carried_files import carried_vectors, check_carried, prior_checksums
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.kernels import jit
from flash_pipeline.compactor.kernels.digest import warm_framing
from flash_pipeline.compactor.kernels.layout import Layout
from flash_pipeline.compactor.kernels.numpy_forms import expected_round_ns
from flash_pipeline.compactor.model.plans import RoundPlan
from flash_pipeline.compactor.model.rows import concat_rows
from flash_pipeline.compactor.model.survivors import MaskedSurvivors, SurvivorMap
from flash_pipeline.compactor.round_steps import (
    DEDUPE,
    HASH_BUCKET,
    MATERIALIZE,
    AfterRound,
    StepsOutput,
    StopCheck,
    add_time,
    largest_first,
    layout_of,
    never,
    probe_range_of,
    rounds_to_run,
    summed,
)
from flash_pipeline.compactor.runtime.memory import note_pool_thread, release_freed_memory, reusing_freed_memory
from flash_pipeline.compactor.runtime.progress import StepTick, no_ticks
from flash_pipeline.compactor.steps import dedupe
from flash_pipeline.compactor.steps.dedupe_state import DedupeOutput
from flash_pipeline.compactor.steps.hash_bucket import envelope_dtype, hash_bucket_files
from flash_pipeline.compactor.steps.materialize import materialize_task
from flash_pipeline.compactor.steps_on_ray import steps_on_ray
from flash_pipeline.errors import InternalError
from flash_pipeline.faults import maybe_crash


def run_round(catalog: Catalog, plan: RoundPlan, timings: dict[str, float], in_process: bool = False,
              cpus: int = 1, after_round: AfterRound | None = None, tick: StepTick = no_ticks,
              stop: StopCheck = never) -> tuple[list[DataFile], list[DataFile], IndexVersion, dict[str, int]]:
    """Hash bucket and dedupe for each round of ``plan`` not yet done, then materialize (+ index write) once;
    returns (carried, written, index, stats). ``tick`` hears of every finished task (runtime/progress.py);
    ``stop`` is asked before every step."""
    after = after_round or (lambda k, stats: None)
    if in_process:
        with reusing_freed_memory(), jit.running_on(cpus):  # each Ray task does the same in its worker (tasks.py)
            steps = _steps_in_process(catalog, plan, timings, cpus, after, tick, stop)
    else:
        steps = steps_on_ray(catalog, plan, timings, after, tick, stop)
    return _finish_round(catalog, plan, *steps)


def _releasing(plan: RoundPlan) -> Callable[[], None]:
    """What an in-process session does at a step's end: return what the step freed to the system when the plan
    says so (``RoundPlan.releases_memory``; each Ray task does the same in its worker), else nothing."""
    return release_freed_memory if plan.releases_memory else (lambda: None)


def _for_materialize(plan: RoundPlan, survivors: np.ndarray) -> np.ndarray:
    """What the driver keeps of a bucket's survivors: all of them (one round), or only their ranks (several
    rounds, whose survivors add up to the whole input: 8 bytes a row instead of the envelope, until the
    survivor map takes them)."""
    if plan.rounds > 1 and survivors.dtype.names:
        return np.ascontiguousarray(survivors["rank"])
    return survivors


def _dedupe_kept_small(storage: Any, plan: RoundPlan, bucket: int, envelopes: list[np.ndarray], k: int,
                       survivors: SurvivorMap | None = None, key_range: KeyRange | None = None) -> DedupeOutput:
    """``dedupe.dedupe_step`` whose output keeps only its survivors' ranks, as a Ray task returns them. One
    round: taken from the envelopes by their keep flags, never a copy of the survivors' envelopes (the index
    writer reads those among the bucket's envelopes, which the caller keeps: MaskedSurvivors). Several rounds:
    the state is saved (the index writer reads it back), or, in the last round, the ranks go to the survivor map
    as soon as the bucket is done. Held as envelopes until the step ended, the last round's outputs added up to
    the whole table's survivors at 37+ bytes a row: 190 MiB of s5's 6.26M rows, against its 100 MiB budget; as
    ranks, 41 MiB."""
    out = dedupe.dedupe_step(storage, plan, bucket, envelopes, k, key_range, ranks_only=plan.rounds == 1)
    if plan.rounds == 1:
        return out
    ranks = _for_materialize(plan, out.survivors)
    if survivors is None:
        return dataclasses.replace(out, survivors=ranks)
    survivors.mark(bucket, ranks)
    # not a view: frees them
    return dataclasses.replace(out, survivors=np.empty(0, dtype=ranks.dtype), mapped=len(ranks))


def _joined(plan: RoundPlan, parts: list[list[np.ndarray]], bucket: int) -> list[np.ndarray]:
    """Bucket ``bucket``'s envelopes from every hash bucket task as one array, which replaces them in ``parts``:
    the parts are freed as soon as they are copied, and dedupe and the index writer share the one array. (The
    index writer read the parts, so they lived beside dedupe's joined copy: s1's two buckets held 450 MB of
    envelopes through dedupe where 225 MB are the rows.)"""
    joined = concat_rows([p for p in parts[bucket] if len(p)], envelope_dtype(plan.spec.sort_key_width))
    parts[bucket] = [joined]
    return [joined]


def _hash_bucket_task(storage: Any, plan: RoundPlan, group: tuple[int, ...], coalesced: dict[int, Any]
                      ) -> tuple[list[np.ndarray], KeyRangeBuilder | None]:
    """One hash bucket task in this process: its envelopes by bucket, and the range of its keys if the plan
    probes by key range."""
    key_range = plan.key_range_builder() if plan.probes_by_key_range else None
    return hash_bucket_files(storage, plan, group, coalesced, key_range), key_range


def _map_counting(pool: ThreadPoolExecutor, fn: Callable[[Any], Any], items: Sequence[Any],
                  count: Callable[[int, int], None]) -> list[Any]:
    """``pool.map`` that reports (done, total) as tasks finish; results in the order of ``items``."""
    futures = [pool.submit(fn, item) for item in items]
    count(0, len(futures))
    for done, _ in enumerate(as_completed(futures), 1):
        count(done, len(futures))
    return [f.result() for f in futures]


def _steps_in_process(catalog: Catalog, plan: RoundPlan, timings: dict[str, float], cpus: int, after: AfterRound,
                      tick: StepTick, stop: StopCheck = never) -> StepsOutput:
    """The three steps as plain calls of the step functions, ``cpus`` at a time (NumPy, Arrow and the compiled
    kernels release the GIL). Each step still ends before the next begins, as on Ray."""
    storage = catalog.storage
    N = plan.bucket_count
    jit.expect_work(expected_round_ns(sum(s.rows for s in plan.sources if s.position >= 0),
                                      sum(s.rows for s in plan.sources if s.position < 0)), warm=warm_framing)
    with ThreadPoolExecutor(max_workers=max(1, cpus), thread_name_prefix="flash-step",
                            initializer=note_pool_thread) as pool:
        outs: list[DedupeOutput] = []
        survivors: Any = None  # the last round's survivors for materialize: per bucket (one round), or a map
        coalesced: dict[int, Any] = {}  # the small units hash bucket read whole, for materialize
        release = _releasing(plan)
        key_ranges: list[KeyRangeBuilder | None] = []  # every round's hash bucket tasks' key ranges
        bucket_parts: list[tuple[np.ndarray, ...]] = []  # one round: each bucket's envelopes, for its index writer
        for k in rounds_to_run(plan):
            stop(f"round {k}'s hash bucket step")
            t0 = time.perf_counter()
            hashed = _map_counting(pool, lambda group: _hash_bucket_task(storage, plan, group, coalesced),
                                   plan.hash_groups[k - 1], functools.partial(tick, k, HASH_BUCKET))
            hash_out = [envelopes for envelopes, _ in hashed]
            key_ranges += [key_range for _, key_range in hashed]
            del hashed
            probe_range = probe_range_of(plan, key_ranges) if k == plan.rounds else None
            maybe_crash("driver:hash_bucket")
            release()  # the units' decoded keys, in Arrow's pool
            t1 = time.perf_counter()
            stop(f"round {k}'s dedupe step")
            if k == plan.rounds > 1:  # the last of several rounds: materialize reads its survivors from a map
                survivors = SurvivorMap.empty(plan)
            parts = [[h[b] for h in hash_out] for b in range(N)]
            hash_out = []  # each bucket's parts live in ``parts`` alone: joined, they are freed (_joined)
            outs = _map_counting(pool, lambda b: _dedupe_kept_small(storage, plan, b, _joined(plan, parts, b), k,
                                                                    survivors, probe_range),
                                 range(N), functools.partial(tick, k, DEDUPE))
            maybe_crash("driver:dedupe")
            if plan.rounds == 1:
                bucket_parts = [tuple(parts[b]) for b in range(N)]
            parts = []  # the envelopes are consumed
            release()  # the bucket's envelopes and dedupe's arrays, from malloc
            add_time(timings, "hash_bucket", t1 - t0)
            add_time(timings, "dedupe", time.perf_counter() - t1)
            if k < plan.rounds:
                stats = summed([dedupe.dedupe_stats(o) for o in outs])
                outs = []  # saved: the next round reads it back
                after(k, stats)
        t2 = time.perf_counter()
        layout = layout_of(plan, [o.counts for o in outs], [o.lost_ranks for o in outs])
        stats_list = [dedupe.dedupe_stats(o) for o in outs]
        if plan.rounds == 1:
            survivors = [o.survivors for o in outs]
        index_inputs: list[tuple[Any, Any]] = [(None, None)] * N if plan.rounds > 1 else [
            (MaskedSurvivors(bucket_parts[b], o.survivor_keep, reusable=True) if o.survivor_keep is not None
             else o.survivors,
             o.lost_at) for b, o in enumerate(outs)]
        bucket_parts = []
        outs = []
        add_time(timings, "dedupe", time.perf_counter() - t2)
        stop("materialize")
        t2 = time.perf_counter()
        idx = [pool.submit(_write_index, storage, plan, layout, b, *index_inputs[b]) for b in range(N)]
        index_inputs = []  # each index task holds its bucket's envelopes until it ends, not all of materialize
        by_task = {m: pool.submit(materialize_task, storage, plan, layout, m, survivors, coalesced)
                   for m in largest_first(layout)}
        mat = [by_task[m] for m in range(len(layout.task_groups))]
        if mat:
            wait(mat, return_when=FIRST_COMPLETED)  # one task's files are on storage when a crash test fires
        maybe_crash("driver:materialize")
        count = functools.partial(tick, plan.rounds, MATERIALIZE)
        count(0, len(mat) + len(idx))
        every: list[Future[Any]] = [*mat, *idx]
        for done, _ in enumerate(as_completed(every), 1):
            count(done, len(mat) + len(idx))
        written = [f for future in mat for f in future.result()]
        index_files = [future.result() for future in idx]
        t3 = time.perf_counter()
    add_time(timings, "materialize", t3 - t2)
    return layout, stats_list, written, index_files


def _write_index(storage: Any, plan: RoundPlan, layout: Layout, bucket: int, *inputs: Any) -> tuple[IndexFile, ...]:
    return pk_index.write_next_bucket(storage, plan, layout, bucket,
                                      *dedupe.index_writer_inputs(storage, plan, bucket, *inputs))


def _finish_round(catalog: Catalog, plan: RoundPlan, layout: Layout, stats_list: list[dict[str, int]],
                  written: list[DataFile], index_files: list[tuple[IndexFile, ...]]
                  ) -> tuple[list[DataFile], list[DataFile], IndexVersion, dict[str, int]]:
    """The carried files, the new index version and the round's statistics; checks the row count."""
    N = plan.bucket_count
    storage = catalog.storage

    carried = []
    seen: set[int] = set()
    checksums = prior_checksums(plan) if layout.carried_file_number.any() else {}
    vectors = carried_vectors(storage, plan, layout)
    for s in plan.sources:
        number = int(layout.carried_file_number[s.src])
        if number and s.file_number not in seen:
            seen.add(s.file_number)
            n = s.file_number - 1
            row_groups = plan.prior_file_row_group_rows[n] if plan.prior_file_row_group_rows else 0
            key_range = plan.prior_file_key_ranges[n] if plan.prior_file_key_ranges else None
            columns = plan.prior_file_columns[n] if plan.prior_file_columns else ()
            carried.append(DataFile(number, s.key, plan.prior_file_rows[n], plan.prior_file_bytes[n],
                                    s.content_type, checksums.get(s.key, ""), vectors.get(s.file_number), row_groups,
                                    key_range, columns))
    # a carried file is published unread: its recorded size must still hold before the version is committed
    check_carried(storage, carried, plan.where)
    prior_version = plan.prior_index.version if plan.prior_index is not None else 0
    index = IndexVersion(prior_version + 1, N, plan.spec.sort_key_width, tuple(tuple(f) for f in index_files))
    stats = summed(stats_list)
    # bytes at rest of what the round opened: delta units (key columns only, so an upper bound), the units
    # materialize rewrote, and the previous index
    stats["bytes_read"] = (
        sum(s.bytes for s in plan.sources if not s.prior)
        + sum(s.bytes for s in plan.sources
              if not layout.carried_file_number[s.src] and layout.src_survivors[s.src] and s.prior)
        + (plan.prior_index.bytes - stats.get("index_bytes_skipped", 0) if plan.prior_index is not None else 0)
    )
    expected_rows = sum(s["survivors"] for s in stats_list)
    got_rows = sum(f.live_rows for f in carried) + sum(f.rows for f in written)
    if expected_rows != got_rows:
        raise InternalError(f"{plan.where}: {got_rows} rows materialized, {expected_rows} survived dedupe")
    return carried, written, index, stats
