"""One round of a session: the paper's three bulk-synchronous steps on Ray, then the new primary key index.

hash bucket (one task per group of delta units) -> dedupe (one task per hash bucket; row counts go to the
RowCountsPendingMaterialize actor, which lays out the files) -> materialize (one task per group of units) and
the index writers (one per bucket). The round returns what the session commits; it writes no catalog document.
"""

from __future__ import annotations

import time

from flash_pipeline.catalog.catalog import Catalog

from flash_pipeline.catalog.model import DataFile, IndexVersion
from flash_pipeline.compactor.model.plans import RoundPlan
from flash_pipeline.compactor.runtime.faults import maybe_crash
from flash_pipeline.compactor.runtime.tasks import remotes
from flash_pipeline.compactor.steps.row_counts import get_actor
from flash_pipeline.errors import InternalError


def run_round(catalog: Catalog, plan: RoundPlan, timings: dict[str, float]) -> tuple[list[DataFile], list[DataFile], IndexVersion, dict[str, int]]:
    """Hash bucket, dedupe, materialize (+ index write) for one round; returns (carried, written, index, stats)."""
    import ray

    fns = remotes()
    storage = catalog.storage
    N = plan.bucket_count
    plan_ref = ray.put(plan)
    t0 = time.perf_counter()
    hash_out = []
    for group in plan.hash_groups:
        refs = fns["hash_bucket"].options(num_returns=N).remote(storage, plan_ref, group)
        hash_out.append([refs] if N == 1 else list(refs))
    all_hash = [r for refs in hash_out for r in refs]
    maybe_crash("driver:hash_bucket")
    if all_hash:
        ray.wait(all_hash, num_returns=len(all_hash), fetch_local=False)
    t1 = time.perf_counter()
    actor = get_actor()
    dedupe_out = [fns["dedupe"].remote(storage, plan_ref, b, actor, *[refs[b] for refs in hash_out]) for b in range(N)]
    maybe_crash("driver:dedupe")
    stats_list = ray.get([d[0] for d in dedupe_out])
    ray.get([ref for s in stats_list for ref in s.pop("counted")])
    layout = ray.get(actor.layout.remote(plan.round_id, plan_ref))
    actor.finish.remote(plan.round_id)
    # the delta envelopes are consumed: drop our references now so the object store frees them before
    # materialize allocates (a round's intermediate data must stay within its budget)
    hash_out = all_hash = refs = None  # noqa: F841
    t2 = time.perf_counter()
    layout_ref = ray.put(layout)
    survivors = [d[1] for d in dedupe_out]
    mat_refs = [
        fns["materialize"].remote(storage, plan_ref, layout_ref, m, *survivors) for m in range(len(plan.materialize_groups))
    ]
    idx_refs = [fns["index"].remote(storage, plan_ref, layout_ref, b, survivors[b], d[2], d[3]) for b, d in enumerate(dedupe_out)]
    if mat_refs:
        ray.wait(mat_refs, num_returns=1)  # at least one task's files are on storage when a crash test fires
    maybe_crash("driver:materialize")
    try:
        written = [f for files in ray.get(mat_refs) for f in files]
        index_files = ray.get(idx_refs)
    except BaseException:
        # let the sibling writers finish before the caller removes the attempt's folder, so that none of
        # them writes a file into it afterwards (a failed round must leave the lake as it was)
        ray.wait(mat_refs + idx_refs, num_returns=len(mat_refs) + len(idx_refs), timeout=120, fetch_local=False)
        raise
    t3 = time.perf_counter()
    timings["hash_bucket"] = timings.get("hash_bucket", 0.0) + (t1 - t0)
    timings["dedupe"] = timings.get("dedupe", 0.0) + (t2 - t1)
    timings["materialize"] = timings.get("materialize", 0.0) + (t3 - t2)
    from flash_pipeline.verify import check_carried, prior_checksums

    carried = []
    seen: set[int] = set()
    checksums = prior_checksums(plan) if layout.carried_file_number.any() else {}
    for s in plan.sources:
        number = int(layout.carried_file_number[s.src])
        if number and s.file_number not in seen:
            seen.add(s.file_number)
            carried.append(DataFile(number, s.key, plan.prior_file_rows[s.file_number - 1], plan.prior_file_bytes[s.file_number - 1], s.content_type, checksums.get(s.key, "")))
    # a carried file is published unread: its recorded size must still hold before the version is committed
    check_carried(storage, carried, plan.where)
    prior_version = plan.prior_index.version if plan.prior_index is not None else 0
    index = IndexVersion(prior_version + 1, N, plan.spec.sort_key_width, tuple(tuple(f) for f in index_files))
    stats = {k: sum(int(s[k]) for s in stats_list) for k in stats_list[0]} if stats_list else {}
    # bytes at rest of what the round opened: delta units (key columns only, so an upper bound), the units
    # materialize rewrote, and the previous index
    stats["bytes_read"] = (
        sum(s.bytes for s in plan.sources if not s.prior)
        + sum(s.bytes for s in plan.sources if not layout.carried_file_number[s.src] and layout.src_survivors[s.src] and s.prior)
        + (plan.prior_index.bytes if plan.prior_index is not None else 0)
    )
    expected_rows = sum(s["survivors"] for s in stats_list)
    got_rows = sum(f.rows for f in carried) + sum(f.rows for f in written)
    if expected_rows != got_rows:
        raise InternalError(f"{plan.where}: {got_rows} rows materialized, {expected_rows} survived dedupe")
    return carried, written, index, stats
