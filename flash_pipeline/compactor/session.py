"""A compaction session: one partition stream, split into serial rounds, each round three BSP steps on Ray.

Each round ends with one atomic commit (a new compacted stream version whose manifest also names the new
primary key index version), followed by its round-completion file. A session that dies resumes from the last
committed round because the next run starts from that version's ``last_position``; files written by a dead
attempt live under their own attempt prefix and are never referenced, so readers never see them.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.model import CompactedVersion, DataFile, Delta, IndexVersion, dumps
from flash_pipeline.compactor import pk_index
from flash_pipeline.compactor.dedupe import dedupe_bucket
from flash_pipeline.compactor.faults import crash_settings, maybe_crash
from flash_pipeline.compactor.retention import remove_orphan_attempts
from flash_pipeline.compactor.hash_bucket import hash_bucket_files
from flash_pipeline.compactor.layout import Layout
from flash_pipeline.compactor.materialize import materialize_task
from flash_pipeline.compactor.planner import DECOMPRESSION_FACTOR, delta_round_bytes
from flash_pipeline.compactor.plan import RoundPlan, SourceFile, balanced_groups, contiguous_groups
from flash_pipeline.compactor.result import PartitionResult
from flash_pipeline.compactor.row_counts import get_actor
from flash_pipeline.compactor.source_io import UNIT_ROWS, split_units
from flash_pipeline.catalog.commits import Attempt

# materialize tasks read about max(1M rows, input/16) rows each (capped by rows per compacted file)
MATERIALIZE_MIN_ROWS = 1_000_000
MATERIALIZE_MAX_TASKS = 16
MATERIALIZE_IN_FLIGHT = 4
MIN_UNIT_ROWS = 10_000
# compacted Parquet files get row groups of at most this many rows, so later rounds can read them in units
COMPACTED_ROW_GROUP_ROWS = 256 * 1024


@dataclass(frozen=True)
class SessionSpec:
    """What the job run asks of one partition stream."""

    source_table_id: str
    destination_table_id: str
    partition: PartitionKeys
    stream_version: int
    primary_keys: tuple[str, ...]
    sort_keys: tuple[tuple[str, str], ...]
    sort_key_width: int
    columns: tuple[str, ...]
    schema_b64: str
    rows_per_file: int
    rows_per_index_file: int
    content_type: ContentType
    bucket_count: int
    max_round_bytes: int
    rebuild: bool
    # the latest version number when the session was planned (the prior version's, or the one a rebuild
    # replaces): round k commits exactly base_version + k, conditionally
    base_version: int = 0


# ----- Ray tasks (thin wrappers over the pure step functions) -------------------------------------------------
def _remote_functions() -> dict[str, Any]:
    import ray

    @ray.remote(num_cpus=1)
    def hash_bucket_step(storage: Any, plan: RoundPlan, src_ids: tuple[int, ...]) -> Any:
        out = hash_bucket_files(storage, plan, src_ids)
        maybe_crash("worker:hash_bucket", plan.crash)
        return out[0] if plan.bucket_count == 1 else tuple(out)

    @ray.remote(num_cpus=1, num_returns=4)
    def dedupe_step(storage: Any, plan: RoundPlan, bucket: int, actor: Any, *envelopes: np.ndarray) -> Any:
        prior = (
            pk_index.read_bucket(storage, plan.prior_index, bucket)
            if plan.prior_index is not None
            else np.empty(0, dtype=pk_index.index_dtype(plan.sort_key_width))
        )
        out = dedupe_bucket(plan, prior, list(envelopes))
        maybe_crash("worker:dedupe", plan.crash)
        # not awaited here (a blocked task makes Ray start extra workers); the driver awaits the returned ref
        counted = actor.add_row_counts.remote(plan.round_id, bucket, out.counts, out.lost_ranks)
        stats = {
            "counted": [counted],
            "upsert_rows": out.upsert_rows,
            "delete_rows": out.delete_rows,
            "prior_rows": out.prior_rows,
            "deleted": out.deleted,
            "survivors": out.survivor_rows,
        }
        # the prior rows go on to the index writer, which re-points the kept ones (see layout.prior_index_pointers)
        return stats, out.survivors, out.prior, out.lost_at

    @ray.remote(num_cpus=1)
    def materialize_step(storage: Any, plan: RoundPlan, layout: Layout, task: int, *survivors: np.ndarray) -> list[DataFile]:
        files = materialize_task(storage, plan, layout, task, list(survivors))
        maybe_crash("worker:materialize", plan.crash)
        return files

    @ray.remote(num_cpus=1)
    def index_step(storage: Any, plan: RoundPlan, layout: Layout, bucket: int, survivors: np.ndarray, prior: np.ndarray, lost_at: np.ndarray) -> Any:
        index_rows = pk_index.next_bucket_rows(plan, layout, bucket, survivors, prior, lost_at)
        return pk_index.write_bucket(storage, plan.index_prefix, bucket, index_rows, plan.rows_per_index_file, in_pointer_order=True)

    return {
        "hash_bucket": hash_bucket_step,
        "dedupe": dedupe_step,
        "materialize": materialize_step,
        "index": index_step,
    }


_REMOTES: dict[str, Any] | None = None


def remotes() -> dict[str, Any]:
    global _REMOTES
    if _REMOTES is None:
        _REMOTES = _remote_functions()
    return _REMOTES


# ----- planning -----------------------------------------------------------------------------------------------
def split_rounds(deltas: list[Delta], max_round_bytes: int, sort_key_width: int = 0) -> list[list[Delta]]:
    """Consecutive deltas per round, each round's estimated intermediate memory within the budget.

    Greedy from the first delta, so a resumed session splits its remaining deltas exactly as the interrupted
    one would have. A single delta above the budget forms a round of its own (a delta is never split: round K
    may only hold positions after round K-1).
    """
    weights = [delta_round_bytes(d.rows, d.bytes, sort_key_width) for d in deltas]
    rounds: list[list[Delta]] = []
    current: list[Delta] = []
    used = 0
    for d, w in zip(deltas, weights):
        if current and used + w > max_round_bytes:
            rounds.append(current)
            current, used = [], 0
        current.append(d)
        used += w
    if current:
        rounds.append(current)
    return rounds


def build_round_plan(
    spec: SessionSpec, prior: CompactedVersion | None, deltas: list[Delta], cpus: int, attempt: str, catalog: Catalog
) -> RoundPlan:
    prior_files = sorted(prior.files, key=lambda f: f.file_number) if prior is not None else []
    if [f.file_number for f in prior_files] != list(range(1, len(prior_files) + 1)):
        raise AssertionError(f"compacted version {prior.version if prior else '-'} file numbers are not 1..n")
    delta_files = [(d, f) for d in deltas for f in sorted(d.files, key=lambda f: f.file_number)]
    upsert_files = prior_files + [f for d, f in delta_files if d.operation == "upsert"]
    total_rows = sum(f.rows for f in upsert_files)
    # materialize groups depend only on the input and the budget, never on the cluster: deterministic files.
    # A few materialize tasks run at once, each holding its rows decompressed: keep them within the budget.
    target = min(spec.rows_per_file, max(MATERIALIZE_MIN_ROWS, -(-total_rows // MATERIALIZE_MAX_TASKS)))
    if total_rows:
        row_bytes = DECOMPRESSION_FACTOR * sum(f.bytes for f in upsert_files) / total_rows
        target = min(target, max(MIN_UNIT_ROWS, int(spec.max_round_bytes / MATERIALIZE_IN_FLIGHT / max(1.0, row_bytes))))
    unit_rows = min(UNIT_ROWS, target)

    sources: list[SourceFile] = []
    for f in prior_files:
        for row_groups, rows, size, row_start in split_units(catalog.storage, f, unit_rows):
            sources.append(SourceFile(len(sources), f.key, f.content_type, rows, size, -1, f.file_number, False, True, row_groups, row_start))
    n_prior = len(sources)
    for d, f in delta_files:
        for row_groups, rows, size, row_start in split_units(catalog.storage, f, unit_rows):
            sources.append(
                SourceFile(len(sources), f.key, f.content_type, rows, size, d.position, f.file_number, d.operation == "delete", False, row_groups, row_start)
            )
    delta_sources = sources[n_prior:]
    hash_groups = tuple(
        tuple(range(n_prior + a, n_prior + b)) for a, b in balanced_groups([s.bytes for s in delta_sources], cpus)
    )
    upsert_src = [s for s in sources if not s.is_delete]
    mgroups = []
    for a, b in contiguous_groups([s.rows for s in upsert_src], target):
        mgroups.append(tuple(s.src for s in upsert_src[a:b]))
    base = f"{catalog.compacted_prefix(spec.destination_table_id, spec.partition)}"
    return RoundPlan(
        round_id=attempt,
        source_table_id=spec.source_table_id,
        destination_table_id=spec.destination_table_id,
        partition=spec.partition,
        primary_keys=spec.primary_keys,
        sort_keys=spec.sort_keys,
        sort_key_width=spec.sort_key_width,
        bucket_count=spec.bucket_count,
        sources=tuple(sources),
        prior_index=prior.index if prior is not None else None,
        hash_groups=hash_groups,
        materialize_groups=tuple(mgroups),
        columns=spec.columns,
        schema_b64=spec.schema_b64,
        rows_per_file=spec.rows_per_file,
        rows_per_index_file=spec.rows_per_index_file,
        content_type=spec.content_type,
        data_prefix=f"{base}/data/{attempt}",
        index_prefix=f"{base}/index/{attempt}",
        prior_file_rows=tuple(f.rows for f in prior_files),
        prior_file_bytes=tuple(f.bytes for f in prior_files),
        prior_file_checksums=tuple(f.checksum for f in prior_files),
        row_group_rows=max(MIN_UNIT_ROWS, min(COMPACTED_ROW_GROUP_ROWS, target)),
        crash=crash_settings(),
    )


# ----- running ------------------------------------------------------------------------------------------------
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
    check_carried(storage, carried, f"{plan.destination_table_id} [{format_partition(plan.partition)}] round {plan.round_id}")
    prior_version = plan.prior_index.version if plan.prior_index is not None else 0
    index = IndexVersion(prior_version + 1, N, plan.sort_key_width, tuple(tuple(f) for f in index_files))
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
        raise AssertionError(f"round {plan.round_id}: {got_rows} rows materialized, {expected_rows} survived dedupe")
    return carried, written, index, stats


def run_session(
    catalog: Catalog,
    spec: SessionSpec,
    deltas: list[Delta],
    prior: CompactedVersion | None,
    cpus: int,
    progress: Callable[[str], None] = lambda message: None,
    publisher: Any = None,
    expected_seconds: float | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> PartitionResult:
    """Compact ``deltas`` (all after ``prior.last_position``) of one partition stream, round by round."""
    result = PartitionResult(partition=spec.partition, hash_bucket_count=spec.bucket_count)
    where = f"{spec.source_table_id} [{format_partition(spec.partition)}]"
    rounds = split_rounds(deltas, spec.max_round_bytes, spec.sort_key_width)
    timings: dict[str, float] = {}
    session_start = time.perf_counter()
    base = spec.base_version
    for k, round_deltas in enumerate(rounds, 1):
        version = base + 1
        attempt = f"{version:010d}-{uuid.uuid4().hex[:12]}"
        plan = build_round_plan(spec, prior, round_deltas, cpus, attempt, catalog)
        # files are removed on failure only when this round is known not to be committed (see Attempt)
        with Attempt(catalog, spec.destination_table_id, spec.partition, base, lambda: _cleanup_attempt(catalog, plan)) as txn:
            carried, written, index, stats = run_round(catalog, plan, timings)
            t = time.perf_counter()
            files = tuple(sorted(carried + written, key=lambda f: f.file_number))
            new = CompactedVersion(
                table_id=spec.destination_table_id,
                partition=spec.partition,
                version=version,
                source_table_id=spec.source_table_id,
                source_stream_version=spec.stream_version,
                last_position=round_deltas[-1].position,
                primary_keys=spec.primary_keys,
                sort_keys=spec.sort_keys,
                content_type=spec.content_type,
                files=files,
                index=index,
                schema=tuple(),
                commit_id=uuid.uuid4().hex,
                created_at=time.time(),
                data_change=True,
                stats={"round": k, "rounds": len(rounds), "base_version": base, **stats},
                arrow_schema=spec.schema_b64,
                options=spec_options(spec),
            )
            maybe_crash("driver:before_commit")
            txn.commit(new)
            maybe_crash("driver:after_commit")
            timings["commit"] = timings.get("commit", 0.0) + (time.perf_counter() - t)
        base = version
        write_round_completion(catalog, spec, new, plan)
        prior = new
        if k < len(rounds):
            maybe_crash("driver:between_rounds")
        result.rounds += 1
        result.rows_in += stats.get("upsert_rows", 0)
        result.delete_rows_in += stats.get("delete_rows", 0)
        if k == 1:
            result.prior_rows = stats.get("prior_rows", 0)
        result.deletes_applied += stats.get("deleted", 0)
        result.files_written += len(written)
        result.bytes_written += sum(f.bytes for f in written)
        result.files_carried = len(carried)
        result.bytes_carried = sum(f.bytes for f in carried)
        result.index_bytes_written += index.bytes
        result.bytes_read += stats.get("bytes_read", 0)
        elapsed = time.perf_counter() - session_start
        refined = elapsed * len(rounds) / k
        if expected_seconds is not None and k < len(rounds):
            refined = max(refined, elapsed + (expected_seconds - elapsed) * 0.5 + (elapsed / k) * (len(rounds) - k) * 0.5)
        progress(
            f"{where}: round {k}/{len(rounds)} committed version {version} at position {new.last_position} "
            f"({new.rows} rows, {len(written)} files written, {len(carried)} carried); "
            f"{elapsed:.1f}s elapsed, expected total {refined:.1f}s"
        )
        round_info = {
            "source_table_id": spec.source_table_id, "partition": [list(kv) for kv in spec.partition],
            "round": k, "rounds": len(rounds), "compacted_version": version, "last_position": new.last_position,
            "rows": new.rows, "files_written": len(written), "files_carried": len(carried), "elapsed_seconds": elapsed,
            "expected_seconds": refined,
        }
        if publisher is not None:
            publisher.publish("round_completed", **round_info)
        if on_round is not None:
            on_round(round_info)
    assert prior is not None
    removed = remove_orphan_attempts(catalog, spec.destination_table_id, spec.partition)
    if removed:
        progress(f"{where}: removed {len(removed)} folder(s) left by interrupted attempts")
    result.rows_out = prior.rows
    result.index_rows = prior.index.rows if prior.index else 0
    result.duplicates_dropped = result.rows_in + result.prior_rows - result.rows_out - result.deletes_applied
    result.compacted_version = prior.version
    result.last_position = prior.last_position
    result.seconds = {k: round(v, 4) for k, v in timings.items()}
    return result


def spec_options(spec: SessionSpec) -> dict[str, int]:
    """Settings later runs inherit when not given again (like the keys)."""
    return {"rows_per_compacted_file": spec.rows_per_file, "rows_per_primary_key_index_file": spec.rows_per_index_file}


def write_round_completion(catalog: Catalog, spec: SessionSpec, version: CompactedVersion, plan: RoundPlan) -> None:
    """The paper's round-completion file, beside the source partition stream it describes."""
    doc = {
        "source_table_id": spec.source_table_id,
        "partition": [[n, v] for n, v in spec.partition],
        "source_stream_version": spec.stream_version,
        "last_source_position_processed": version.last_position,
        "hash_bucket_count": plan.bucket_count,
        "compacted_table_id": version.table_id,
        "compacted_stream_version": version.version,
        "compacted_stream_bytes": version.bytes,
        "primary_key_index_version": version.index.version if version.index else None,
        "round_id": plan.round_id,
        "completed_at": time.time(),
    }
    key = f"{catalog.stream_prefix(spec.source_table_id, spec.partition, spec.stream_version)}/rounds/{version.table_id and plan.round_id}.json"
    catalog.storage.write(key, dumps(doc))


def _cleanup_attempt(catalog: Catalog, plan: RoundPlan) -> None:
    for prefix in (plan.data_prefix, plan.index_prefix):
        try:
            catalog.storage.delete_prefix(prefix)
        except Exception:  # noqa: BLE001 - unreferenced files are invisible; a later gc removes them
            pass
