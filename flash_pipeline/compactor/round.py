"""The rounds of a session: the paper's three bulk-synchronous steps, then the new primary key index.

hash bucket (one task per group of delta units) -> dedupe (one task per hash bucket; its row counts go to the
driver, which lays out the files) -> materialize (one task per group of units) and the index writers (one per
bucket). The result is what the session commits; no catalog document is written.

When the input exceeds the memory budget, hash bucket and dedupe run once per round (a slice of the deltas
that fits the budget), each round's dedupe state saved per bucket (steps/dedupe.py); materialize and the index
writers run once, after the last round, so the compacted table is written once per session, however many
rounds it takes. A resumed session skips the rounds whose state a round-completion file names (session.py).

The steps run as Ray tasks, or -- for inputs too small to be worth starting Ray (see runtime/executor.py) -- as
the same step functions on a thread pool in this process.

The paper gathers the row counts in a RowCountsPendingMaterialize actor; here the driver is that actor: it
awaits every dedupe task's statistics anyway, and the counts ride with them (a separate actor cost the s3
benchmark's round two more calls, and the plan shipped to it, between dedupe and materialize).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.key_ranges import KeyRange, KeyRangeBuilder, merged
from flash_pipeline.catalog.model import DataFile, IndexFile, IndexVersion
from flash_pipeline.compactor.carried_files import carried_vectors, check_carried, prior_checksums
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.kernels import jit
from flash_pipeline.compactor.kernels.layout import Layout, compute_layout
from flash_pipeline.compactor.model.plans import RoundPlan
from flash_pipeline.compactor.model.survivors import MaskedSurvivors, SurvivorMap
from flash_pipeline.compactor.runtime.memory import release_freed_memory, reusing_freed_memory
from flash_pipeline.compactor.runtime.progress import StepTick, no_ticks
from flash_pipeline.compactor.steps import dedupe
from flash_pipeline.compactor.steps.hash_bucket import hash_bucket_files
from flash_pipeline.compactor.steps.materialize import materialize_task
from flash_pipeline.errors import InternalError
from flash_pipeline.faults import maybe_crash

HASH_BUCKET, DEDUPE, MATERIALIZE = "hash bucket", "dedupe", "materialize"  # the step names progress reports use
StepsOutput = tuple[Layout, list[dict[str, int]], list[DataFile], list[tuple[IndexFile, ...]]]
# called after each round but the last, once its dedupe state is saved: (round number, summed statistics)
AfterRound = Callable[[int, dict[str, int]], None]
# called at each step boundary with what comes next: raises to stop the session there (runtime/interrupt.py)
StopCheck = Callable[[str], None]


def _never(before: str) -> None:
    """The StopCheck of a round nobody stops."""


def run_round(catalog: Catalog, plan: RoundPlan, timings: dict[str, float], in_process: bool = False,
              cpus: int = 1, after_round: AfterRound | None = None, tick: StepTick = no_ticks,
              stop: StopCheck = _never) -> tuple[list[DataFile], list[DataFile], IndexVersion, dict[str, int]]:
    """Hash bucket and dedupe for each round of ``plan`` not yet done, then materialize (+ index write) once;
    returns (carried, written, index, stats). ``tick`` hears of every finished task (runtime/progress.py);
    ``stop`` is asked before every step."""
    after = after_round or (lambda k, stats: None)
    if in_process:
        with reusing_freed_memory():  # each Ray task does the same in its worker (runtime/tasks.py)
            steps = _steps_in_process(catalog, plan, timings, cpus, after, tick, stop)
    else:
        steps = _steps_on_ray(catalog, plan, timings, after, tick, stop)
    return _finish_round(catalog, plan, *steps)


def _rounds_to_run(plan: RoundPlan) -> range:
    """Round numbers (1-based) still to run: a resumed session skips the rounds its state holds."""
    return range((plan.resume[0] if plan.resume is not None else 0) + 1, plan.rounds + 1)


def _releasing(plan: RoundPlan) -> Callable[[], None]:
    """What an in-process session does at a step's end: return what the step freed to the system when the plan
    says so (``RoundPlan.releases_memory``; each Ray task does the same in its worker), else nothing."""
    return release_freed_memory if plan.releases_memory else (lambda: None)


def _summed(stats_list: list[dict[str, int]]) -> dict[str, int]:
    return {k: sum(int(s[k]) for s in stats_list) for k in stats_list[0]} if stats_list else {}


def _add(timings: dict[str, float], step: str, seconds: float) -> None:
    timings[step] = timings.get(step, 0.0) + seconds


def _for_materialize(plan: RoundPlan, survivors: np.ndarray) -> np.ndarray:
    """What the driver keeps of a bucket's survivors: all of them (one round), or only their ranks (several
    rounds, whose survivors add up to the whole input: 8 bytes a row instead of the envelope, until the
    survivor map takes them)."""
    if plan.rounds > 1 and survivors.dtype.names:
        return np.ascontiguousarray(survivors["rank"])
    return survivors


def _dedupe_kept_small(storage: Any, plan: RoundPlan, bucket: int, envelopes: list[np.ndarray], k: int,
                       survivors: SurvivorMap | None = None, key_range: KeyRange | None = None) -> dedupe.DedupeOutput:
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
    return dataclasses.replace(out, survivors=np.empty(0, dtype=ranks.dtype), mapped=len(ranks))  # not a view: frees them


def _survivor_map(plan: RoundPlan, bucket_ranks: Iterable[np.ndarray]) -> SurvivorMap:
    """The last round's survivors (each bucket's ranks, in bucket order) as materialize reads them in a session
    of several rounds: a bucket number per input row (model/survivors.py), 1 byte a row instead of 8 a survivor."""
    survivors = SurvivorMap.empty(plan)
    for bucket, ranks in enumerate(bucket_ranks):
        survivors.mark(bucket, ranks)
    return survivors


def _hash_bucket_task(storage: Any, plan: RoundPlan, group: tuple[int, ...], coalesced: dict[int, Any]
                      ) -> tuple[list[np.ndarray], KeyRangeBuilder | None]:
    """One hash bucket task in this process: its envelopes by bucket, and the range of its keys if the plan
    probes by key range."""
    key_range = plan.key_range_builder() if plan.probes_by_key_range else None
    return hash_bucket_files(storage, plan, group, coalesced, key_range), key_range


def _probe_range(plan: RoundPlan, builders: list[KeyRangeBuilder | None]) -> KeyRange | None:
    """The range of the session's delta keys, for dedupe's probe to skip index files by (catalog/key_ranges.py).
    None when the plan does not probe by range, or in a resumed session: the rounds it skips saw keys this
    process never did."""
    if not plan.probes_by_key_range or plan.resume is not None:
        return None
    return merged(builders, plan.spec.primary_keys[0])


def _map_counting(pool: ThreadPoolExecutor, fn: Callable[[Any], Any], items: Sequence[Any], count: Callable[[int, int], None]) -> list[Any]:
    """``pool.map`` that reports (done, total) as tasks finish; results in the order of ``items``."""
    futures = [pool.submit(fn, item) for item in items]
    count(0, len(futures))
    for done, _ in enumerate(as_completed(futures), 1):
        count(done, len(futures))
    return [f.result() for f in futures]


def _wait_counting(refs: list[Any], count: Callable[[int, int], None]) -> None:
    """Wait for Ray objects, reporting (done, total) about twice a second; failures surface at ``ray.get``."""
    import ray

    pending = list(refs)
    count(0, len(refs))
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5, fetch_local=False)
        count(len(refs) - len(pending), len(refs))


def _steps_in_process(catalog: Catalog, plan: RoundPlan, timings: dict[str, float], cpus: int, after: AfterRound,
                      tick: StepTick, stop: StopCheck = _never) -> StepsOutput:
    """The three steps as plain calls of the step functions, ``cpus`` at a time (NumPy, Arrow and the compiled
    kernels release the GIL). Each step still ends before the next begins, as on Ray."""
    storage = catalog.storage
    N = plan.bucket_count
    jit.expect_rows(sum(s.rows for s in plan.sources))  # every input row meets a kernel (the index: its probe)
    with ThreadPoolExecutor(max_workers=max(1, cpus), thread_name_prefix="flash-step") as pool:
        outs: list[dedupe.DedupeOutput] = []
        survivors: Any = None  # the last round's survivors for materialize: per bucket (one round), or a map
        coalesced: dict[int, Any] = {}  # the small units hash bucket read whole, for materialize
        release = _releasing(plan)
        key_ranges: list[KeyRangeBuilder | None] = []  # every round's hash bucket tasks' key ranges
        bucket_parts: list[tuple[np.ndarray, ...]] = []  # one round: each bucket's envelopes, for its index writer
        for k in _rounds_to_run(plan):
            stop(f"round {k}'s hash bucket step")
            t0 = time.perf_counter()
            hashed = _map_counting(pool, lambda group: _hash_bucket_task(storage, plan, group, coalesced), plan.hash_groups[k - 1],
                                   functools.partial(tick, k, HASH_BUCKET))
            hash_out = [envelopes for envelopes, _ in hashed]
            key_ranges += [key_range for _, key_range in hashed]
            del hashed
            probe_range = _probe_range(plan, key_ranges) if k == plan.rounds else None
            maybe_crash("driver:hash_bucket")
            release()  # the units' decoded keys, in Arrow's pool
            t1 = time.perf_counter()
            stop(f"round {k}'s dedupe step")
            if k == plan.rounds > 1:  # the last of several rounds: materialize reads its survivors from a map
                survivors = SurvivorMap.empty(plan)
            outs = _map_counting(pool, lambda b: _dedupe_kept_small(storage, plan, b, [h[b] for h in hash_out], k, survivors, probe_range),
                                 range(N), functools.partial(tick, k, DEDUPE))
            maybe_crash("driver:dedupe")
            if plan.rounds == 1:
                bucket_parts = [tuple(h[b] for h in hash_out) for b in range(N)]
            hash_out = []  # the envelopes are consumed
            release()  # the bucket's envelopes and dedupe's arrays, from malloc
            _add(timings, "hash_bucket", t1 - t0)
            _add(timings, "dedupe", time.perf_counter() - t1)
            if k < plan.rounds:
                stats = _summed([dedupe.dedupe_stats(o) for o in outs])
                outs = []  # saved: the next round reads it back
                after(k, stats)
        t2 = time.perf_counter()
        layout = _layout(plan, [o.counts for o in outs], [o.lost_ranks for o in outs])
        stats_list = [dedupe.dedupe_stats(o) for o in outs]
        if plan.rounds == 1:
            survivors = [o.survivors for o in outs]
        index_inputs: list[tuple[Any, Any]] = [(None, None)] * N if plan.rounds > 1 else [
            (MaskedSurvivors(bucket_parts[b], o.survivor_keep) if o.survivor_keep is not None else o.survivors, o.lost_at) for b, o in enumerate(outs)]
        bucket_parts = []
        outs = []
        _add(timings, "dedupe", time.perf_counter() - t2)
        stop("materialize")
        t2 = time.perf_counter()
        idx = [pool.submit(_write_index, storage, plan, layout, b, *index_inputs[b]) for b in range(N)]
        by_task = {m: pool.submit(materialize_task, storage, plan, layout, m, survivors, coalesced) for m in _largest_first(layout)}
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
    _add(timings, "materialize", t3 - t2)
    return layout, stats_list, written, index_files


def _layout(plan: RoundPlan, counts: list[np.ndarray], lost_ranks: list[np.ndarray]) -> Layout:
    """The round's compacted layout from every bucket's row counts and lost prior ranks (in bucket order)."""
    if not counts:
        return compute_layout(plan, np.zeros((0, len(plan.sources)), dtype=np.int64), np.zeros(0, dtype=np.int64))
    return compute_layout(plan, np.stack(counts), np.sort(np.concatenate(lost_ranks).astype(np.int64)))


def _largest_first(layout: Layout) -> list[int]:
    """The order materialize tasks are started in: the most rows first, after the index writers (each a
    bucket's whole index). Started in task order, with the index writers last, a round ended with one CPU
    writing an index while the other idled (s1: ~0.27 s of its 2.4 s materialize); the small tasks now
    fill the end instead."""
    return sorted(range(len(layout.task_rows)), key=lambda m: (-int(layout.task_rows[m]), m))


def _write_index(storage: Any, plan: RoundPlan, layout: Layout, bucket: int, *inputs: Any) -> tuple[IndexFile, ...]:
    return pk_index.write_next_bucket(storage, plan, layout, bucket, *dedupe.index_writer_inputs(storage, plan, bucket, *inputs))


def _steps_on_ray(catalog: Catalog, plan: RoundPlan, timings: dict[str, float], after: AfterRound, tick: StepTick,
                  stop: StopCheck = _never) -> StepsOutput:
    """The three steps as Ray tasks (runtime/tasks.py); the layout is computed here from the dedupe tasks' counts."""
    import ray

    from flash_pipeline.compactor.runtime.cluster import cluster_cpus
    from flash_pipeline.compactor.runtime.tasks import remotes

    fns = remotes()
    storage = catalog.storage
    N = plan.bucket_count
    plan_ref = ray.put(plan)
    dedupe_out: list[Any] = []
    stats_list: list[dict[str, Any]] = []
    coalesced_refs: list[tuple[set[int], Any]] = []  # (units of a hash bucket task, its coalesced units' ref)
    key_range_refs: list[Any] = []  # every round's hash bucket tasks' key ranges
    envelopes_of: list[list[Any]] | None = None  # per bucket its envelopes' refs, for the index writers (one round)
    for k in _rounds_to_run(plan):
        stop(f"round {k}'s hash bucket step")
        last = k == plan.rounds
        t0 = time.perf_counter()
        hash_out: Any = []
        # more returns after the buckets: the key range (if the plan probes by it), the small units read whole
        extra = int(plan.probes_by_key_range) + int(bool(plan.coalesced))
        for group in plan.hash_groups[k - 1]:
            refs = fns["hash_bucket"].options(num_returns=N + extra).remote(storage, plan_ref, group)
            refs = [refs] if N + extra == 1 else list(refs)
            if plan.coalesced:
                coalesced_refs.append((set(group), refs.pop()))
            if plan.probes_by_key_range:
                key_range_refs.append(refs.pop())
            hash_out.append(refs)
        all_hash: Any = [r for refs in hash_out for r in refs]
        maybe_crash("driver:hash_bucket")
        _wait_counting([refs[0] for refs in hash_out], functools.partial(tick, k, HASH_BUCKET))  # a task's first return
        if all_hash:
            ray.wait(all_hash, num_returns=len(all_hash), fetch_local=False)
        stop(f"round {k}'s dedupe step")
        t1 = time.perf_counter()
        probe_range = _probe_range(plan, ray.get(key_range_refs)) if last else None
        dedupe_out = [
            fns["dedupe"].remote(storage, plan_ref, b, k, last, probe_range, *[refs[b] for refs in hash_out]) for b in range(N)
        ]
        # each dedupe task holds its bucket's envelopes (Ray counts a submitted task's arguments, and keeps them
        # for its retries): with the driver's references dropped now, a bucket's envelopes leave the object store
        # as soon as its task ends, not after the last bucket's. The last of several rounds returns the survivors'
        # ranks of the whole table while its envelopes were all still held: 71 of s5's 99.6 MiB budget in the store.
        # A one-round session keeps them for its index writers instead, which read the survivors among them (a
        # flag each from dedupe): dedupe's output is then their ranks, not a second copy of the envelopes.
        envelopes_of = [[refs[b] for refs in hash_out] for b in range(N)] if last and plan.rounds == 1 else None
        hash_out = all_hash = refs = None
        maybe_crash("driver:dedupe")
        _wait_counting([d[0] for d in dedupe_out], functools.partial(tick, k, DEDUPE))
        stats_list = ray.get([d[0] for d in dedupe_out])
        _add(timings, "hash_bucket", t1 - t0)
        _add(timings, "dedupe", time.perf_counter() - t1)
        if not last:
            after(k, _summed(stats_list))
    t2 = time.perf_counter()
    layout = _layout(plan, [s.pop("row_counts") for s in stats_list], [s.pop("lost_ranks") for s in stats_list])
    _add(timings, "dedupe", time.perf_counter() - t2)
    stop("materialize")
    t2 = time.perf_counter()
    layout_ref = ray.put(layout)
    survivors = [d[1] for d in dedupe_out]
    index_inputs = [(*d[2:], *(envelopes_of[b] if envelopes_of else ())) for b, d in enumerate(dedupe_out)]
    if plan.rounds > 1:  # the ranks become one map; the index writers read the saved state
        survivors = [ray.put(_survivor_map(plan, (ray.get(ref) for ref in survivors)))]
        index_inputs = [(None, None)] * N
        dedupe_out = []
    idx_refs = [fns["index"].remote(storage, plan_ref, layout_ref, b, *index_inputs[b]) for b in range(N)]
    del envelopes_of, index_inputs  # the index writers hold the envelopes now; they go when those end
    order = _largest_first(layout)
    last_wave = set(order[-cluster_cpus():])  # likely each worker's last task: it returns Arrow's pages at its end
    by_task = {
        m: fns["materialize"].remote(storage, plan_ref, layout_ref, m, m in last_wave, *survivors,
                                     *_coalesced_for(layout, m, coalesced_refs))
        for m in order
    }
    mat_refs = [by_task[m] for m in range(len(layout.task_groups))]
    if mat_refs:
        ray.wait(mat_refs, num_returns=1)  # at least one task's files are on storage when a crash test fires
    maybe_crash("driver:materialize")
    try:
        _wait_counting(mat_refs + idx_refs, functools.partial(tick, plan.rounds, MATERIALIZE))
        written = [f for files in ray.get(mat_refs) for f in files]
        index_files = ray.get(idx_refs)
    except BaseException:
        # let the sibling writers finish before the caller removes the attempt's folder, so that none of
        # them writes a file into it afterwards (a failed round must leave the lake as it was)
        ray.wait(mat_refs + idx_refs, num_returns=len(mat_refs) + len(idx_refs), timeout=120, fetch_local=False)
        raise
    t3 = time.perf_counter()
    _add(timings, "materialize", t3 - t2)
    return layout, stats_list, written, index_files


def _coalesced_for(layout: Layout, task: int, coalesced_refs: list[tuple[set[int], Any]]) -> list[Any]:
    """The refs of the hash bucket tasks' coalesced units that materialize task ``task`` uses."""
    group = set(layout.task_groups[task])
    return [ref for units, ref in coalesced_refs if units & group]


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
                                    s.content_type, checksums.get(s.key, ""), vectors.get(s.file_number), row_groups, key_range, columns))
    # a carried file is published unread: its recorded size must still hold before the version is committed
    check_carried(storage, carried, plan.where)
    prior_version = plan.prior_index.version if plan.prior_index is not None else 0
    index = IndexVersion(prior_version + 1, N, plan.spec.sort_key_width, tuple(tuple(f) for f in index_files))
    stats = _summed(stats_list)
    # bytes at rest of what the round opened: delta units (key columns only, so an upper bound), the units
    # materialize rewrote, and the previous index
    stats["bytes_read"] = (
        sum(s.bytes for s in plan.sources if not s.prior)
        + sum(s.bytes for s in plan.sources if not layout.carried_file_number[s.src] and layout.src_survivors[s.src] and s.prior)
        + (plan.prior_index.bytes - stats.get("index_bytes_skipped", 0) if plan.prior_index is not None else 0)
    )
    expected_rows = sum(s["survivors"] for s in stats_list)
    got_rows = sum(f.live_rows for f in carried) + sum(f.rows for f in written)
    if expected_rows != got_rows:
        raise InternalError(f"{plan.where}: {got_rows} rows materialized, {expected_rows} survived dedupe")
    return carried, written, index, stats
