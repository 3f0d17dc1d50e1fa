"""A round's three steps as Ray tasks (runtime/tasks.py): every round's hash bucket and dedupe tasks, then the
materialize tasks and the index writers once. The driver lays out the compacted files from the dedupe tasks'
counts (round_steps.layout_of) and drops each object reference as soon as the tasks that need it hold it, so
that the object store frees what a step consumed while the next runs."""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.compactor import round_steps as rs
from flash_pipeline.compactor.kernels.layout import Layout
from flash_pipeline.compactor.model.plans import RoundPlan
from flash_pipeline.compactor.runtime.progress import StepTick
from flash_pipeline.faults import maybe_crash


def _wait_counting(refs: list[Any], count: Callable[[int, int], None]) -> None:
    """Wait for Ray objects, reporting (done, total) about twice a second; failures surface at ``ray.get``."""
    import ray

    pending = list(refs)
    count(0, len(refs))
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5, fetch_local=False)
        count(len(refs) - len(pending), len(refs))


def steps_on_ray(catalog: Catalog, plan: RoundPlan, timings: dict[str, float], after: rs.AfterRound, tick: StepTick,
                  stop: rs.StopCheck = rs.never) -> rs.StepsOutput:
    """The three steps as Ray tasks (runtime/tasks.py); the layout is computed here from the dedupe tasks' counts."""
    import ray

    state = _RayRounds(ray.put(plan))
    _hash_and_dedupe_on_ray(catalog.storage, plan, state, timings, after, tick, stop)
    t2 = time.perf_counter()
    stats_list = state.stats_list
    layout = rs.layout_of(plan, [s.pop("row_counts") for s in stats_list], [s.pop("lost_ranks") for s in stats_list])
    rs.add_time(timings, "dedupe", time.perf_counter() - t2)
    stop("materialize")
    t2 = time.perf_counter()
    written, index_files = _materialize_on_ray(catalog.storage, plan, state, layout, tick)
    rs.add_time(timings, "materialize", time.perf_counter() - t2)
    return layout, stats_list, written, index_files


@dataclasses.dataclass
class _RayRounds:
    """The refs the hash bucket and dedupe steps leave for materialize. Each is dropped as soon as it may be: Ray
    keeps an object while a reference to it lives, so a ref held here longer holds object store memory longer."""

    plan_ref: Any
    dedupe_out: list[Any] = dataclasses.field(default_factory=list)
    stats_list: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # (a hash task's units, its coalesced units)
    coalesced_refs: list[tuple[set[int], Any]] = dataclasses.field(default_factory=list)
    envelopes_of: list[list[Any]] | None = None  # per bucket its envelopes' refs, for the index writers (one round)


def _hash_and_dedupe_on_ray(storage: Any, plan: RoundPlan, state: _RayRounds, timings: dict[str, float],
                            after: rs.AfterRound, tick: StepTick, stop: rs.StopCheck) -> None:
    """Every round's hash bucket and dedupe steps; the last round's dedupe outputs stay in ``state``."""
    import ray

    from flash_pipeline.compactor.runtime.tasks import remotes

    fns = remotes()
    N = plan.bucket_count
    key_range_refs: list[Any] = []  # every round's hash bucket tasks' key ranges
    for k in rs.rounds_to_run(plan):
        stop(f"round {k}'s hash bucket step")
        last = k == plan.rounds
        t0 = time.perf_counter()
        hash_out: Any = []
        # more returns after the buckets: the key range (if the plan probes by it), the small units read whole
        extra = int(plan.probes_by_key_range) + int(bool(plan.coalesced))
        for group in plan.hash_groups[k - 1]:
            refs = fns["hash_bucket"].options(num_returns=N + extra).remote(storage, state.plan_ref, group)
            refs = [refs] if N + extra == 1 else list(refs)
            if plan.coalesced:
                state.coalesced_refs.append((set(group), refs.pop()))
            if plan.probes_by_key_range:
                key_range_refs.append(refs.pop())
            hash_out.append(refs)
        all_hash: Any = [r for refs in hash_out for r in refs]
        maybe_crash("driver:hash_bucket")
        # a task's first return
        _wait_counting([refs[0] for refs in hash_out], functools.partial(tick, k, rs.HASH_BUCKET))
        if all_hash:
            ray.wait(all_hash, num_returns=len(all_hash), fetch_local=False)
        stop(f"round {k}'s dedupe step")
        t1 = time.perf_counter()
        probe_range = rs.probe_range_of(plan, ray.get(key_range_refs)) if last else None
        state.dedupe_out = [
            fns["dedupe"].remote(storage, state.plan_ref, b, k, last, probe_range, *[refs[b] for refs in hash_out])
            for b in range(N)
        ]
        # each dedupe task holds its bucket's envelopes (Ray counts a submitted task's arguments, and keeps them
        # for its retries): with the driver's references dropped now, a bucket's envelopes leave the object store
        # as soon as its task ends, not after the last bucket's. The last of several rounds returns the survivors'
        # ranks of the whole table while its envelopes were all still held: 71 of s5's 99.6 MiB budget in the store.
        # A one-round session keeps them for its index writers instead, which read the survivors among them (a
        # flag each from dedupe): dedupe's output is then their ranks, not a second copy of the envelopes.
        state.envelopes_of = [[refs[b] for refs in hash_out] for b in range(N)] if last and plan.rounds == 1 else None
        hash_out = all_hash = refs = None
        maybe_crash("driver:dedupe")
        _wait_counting([d[0] for d in state.dedupe_out], functools.partial(tick, k, rs.DEDUPE))
        state.stats_list = ray.get([d[0] for d in state.dedupe_out])
        rs.add_time(timings, "hash_bucket", t1 - t0)
        rs.add_time(timings, "dedupe", time.perf_counter() - t1)
        if not last:
            after(k, rs.summed(state.stats_list))


def _materialize_on_ray(storage: Any, plan: RoundPlan, state: _RayRounds, layout: Layout, tick: StepTick
                        ) -> tuple[list[Any], list[Any]]:
    """The materialize tasks (largest first) and the index writers; returns their files."""
    import ray

    from flash_pipeline.compactor.runtime.cluster import cluster_cpus
    from flash_pipeline.compactor.runtime.tasks import remotes

    fns = remotes()
    N = plan.bucket_count
    layout_ref = ray.put(layout)
    survivors = [d[1] for d in state.dedupe_out]
    envelopes_of = state.envelopes_of
    index_inputs = [(*d[2:], *(envelopes_of[b] if envelopes_of else ())) for b, d in enumerate(state.dedupe_out)]
    if plan.rounds > 1:  # the ranks become one map; the index writers read the saved state
        survivors = [ray.put(rs.survivor_map(plan, (ray.get(ref) for ref in survivors)))]
        index_inputs = [(None, None)] * N
    state.dedupe_out = []
    idx_refs = [fns["index"].remote(storage, state.plan_ref, layout_ref, b, *index_inputs[b]) for b in range(N)]
    state.envelopes_of = None
    del envelopes_of, index_inputs  # the index writers hold the envelopes now; they go when those end
    order = rs.largest_first(layout)
    last_wave = set(order[-cluster_cpus():])  # likely each worker's last task: it returns Arrow's pages at its end
    by_task = {
        m: fns["materialize"].remote(storage, state.plan_ref, layout_ref, m, m in last_wave, *survivors,
                                     *_coalesced_for(layout, m, state.coalesced_refs))
        for m in order
    }
    mat_refs = [by_task[m] for m in range(len(layout.task_groups))]
    if mat_refs:
        ray.wait(mat_refs, num_returns=1)  # at least one task's files are on storage when a crash test fires
    maybe_crash("driver:materialize")
    try:
        _wait_counting(mat_refs + idx_refs, functools.partial(tick, plan.rounds, rs.MATERIALIZE))
        return [f for files in ray.get(mat_refs) for f in files], ray.get(idx_refs)
    except BaseException:
        # let the sibling writers finish before the caller removes the attempt's folder, so that none of
        # them writes a file into it afterwards (a failed round must leave the lake as it was)
        ray.wait(mat_refs + idx_refs, num_returns=len(mat_refs) + len(idx_refs), timeout=120, fetch_local=False)
        raise


def _coalesced_for(layout: Layout, task: int, coalesced_refs: list[tuple[set[int], Any]]) -> list[Any]:
    """The refs of the hash bucket tasks' coalesced units that materialize task ``task`` uses."""
    group = set(layout.task_groups[task])
    return [ref for units, ref in coalesced_refs if units & group]
