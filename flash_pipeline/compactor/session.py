"""A compaction session: one partition stream, split into serial rounds, each round three BSP steps on Ray.

Each round ends with one atomic commit (a new compacted stream version whose manifest also names the new
primary key index version), followed by its round-completion file. A session that dies resumes from the last
committed round because the next run starts from that version's ``last_position``; files written by a dead
attempt live under their own attempt prefix and are never referenced, so readers never see them.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.commits import Attempt, remove_orphan_attempts
from flash_pipeline.catalog.encoding import format_partition
from flash_pipeline.catalog.model import CompactedVersion, dumps
from flash_pipeline.compactor.model.plans import RoundPlan, SessionSizing, SessionSpec
from flash_pipeline.compactor.model.results import PartitionResult
from flash_pipeline.compactor.planning.rounds import build_round_plan
from flash_pipeline.compactor.round import run_round
from flash_pipeline.compactor.runtime.faults import maybe_crash
from flash_pipeline.errors import InternalError


def run_session(
    catalog: Catalog,
    spec: SessionSpec,
    sizing: SessionSizing,
    prior: CompactedVersion | None,
    cpus: int,
    progress: Callable[[str], None] = lambda message: None,
    publisher: Any = None,
    expected_seconds: float | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    in_process: bool = False,
) -> PartitionResult:
    """Compact the sized rounds (all after ``prior.last_position``) of one partition stream, in order.

    Round k builds on the version round k-1 committed and commits exactly the next number; another writer
    taking that number first raises BaseMoved (the job re-plans)."""
    result = PartitionResult(partition=spec.partition, hash_bucket_count=sizing.bucket_count)
    where = f"{spec.source_table_id} [{format_partition(spec.partition)}]"
    rounds = sizing.rounds
    timings: dict[str, float] = {}
    session_start = time.perf_counter()
    base = sizing.base_version
    for k, round_deltas in enumerate(rounds, 1):
        version = base + 1
        plan = build_round_plan(catalog, spec, sizing, prior, round_deltas, version, cpus)
        # files are removed on failure only when this round is known not to be committed (see Attempt)
        with Attempt(catalog, spec.destination_table_id, spec.partition, base, lambda: _cleanup_attempt(catalog, plan)) as txn:
            carried, written, index, stats = run_round(catalog, plan, timings, in_process, cpus)
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
    if prior is None:
        raise InternalError(f"{where}: a session without rounds was started")
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
