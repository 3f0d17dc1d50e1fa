"""Batched compaction runs: one run compacts many partition streams of a table, as the paper's dispatcher puts many
sessions on one cluster, instead of one Dagster run per stream.

The new-delta sensor groups the streams that are due into a few runs of ``compact_<name>_batch`` (up to the
table's ``batch.streams`` streams and about ``batch.bytes`` pending bytes each). A run hands all its streams to
one engine job (``compact(..., failures="report")``): small inputs compact in the run's process, large ones on
the shared Ray, several sessions at a time. Each stream still gets its own materialization of the compacted
stream and primary key index partitions, with the metadata and blocking checks a one-stream run records; a
stream that fails (a bad delta, a lost commit race) is reported as that stream's failure while the others
commit, and the run fails at the end naming every failed stream.

No ``from __future__ import annotations`` here: Dagster resolves the op's config type from its annotation.
"""

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetMaterialization,
    Config,
    Failure,
    MetadataValue,
    OpExecutionContext,
    job,
    op,
)

from assets.checks import evaluate_checks
from assets.engine import engine_failure, log_traceback, on_engine_thread, own_version, ray_settings
from assets.metadata import compaction_metadata, index_metadata, published_tables, round_observation
from flash_pipeline.compactor.model.results import PartitionResult
from flash_pipeline.compactor.runtime.interrupt import StopRequest
from resources import CatalogResource, RayResource
from resources.config import TableConfig, parse_partition_key, partition_key
from resources.keys import keys

CHECK_THREADS = 4  # the checks read files: a few streams' at a time overlap their reads
# Every event a run logs is a row the instance writes (~8-13 ms each on SQLite, measured: a batch of 256 streams
# spent 19 s of 27 on its 2,800 events). A batch of more streams than this records each stream's materializations
# and checks but not a round observation per stream, and logs the engine's progress at most every few seconds.
OBSERVED_STREAMS = 16
BATCH_LOG_SECONDS = 5.0


class BatchConfig(Config):
    """The partition streams one batched run compacts (their Dagster partition keys)."""

    partitions: list[str]


def stream_events(catalog: Any, table: TableConfig, pres: PartitionResult, wall: float,
                  rounds: list[dict[str, Any]] | None = None, instance: Any = None) -> tuple[list[Any], list[str]]:
    """The events one stream of a batch records (its two materializations and its check evaluations) and the
    names of its failed checks."""
    k = keys(table)
    part = pres.partition
    pkey = partition_key(part)
    compacted = own_version(catalog, table.destination, part, pres.compacted_version)
    published = published_tables(catalog, table.destination, part, compacted)
    events: list[Any] = [
        AssetMaterialization(asset_key=k["compacted"], partition=pkey,
                             metadata=compaction_metadata(table, part, pres, compacted, wall, None, rounds or [], published)),
        AssetMaterialization(asset_key=k["index"], partition=pkey, metadata=index_metadata(part, pres, compacted)),
    ]
    failed = []
    for key, name, passed, meta in evaluate_checks(catalog, table, compacted, part, instance=instance):
        events.append(AssetCheckEvaluation(asset_key=key, check_name=name, passed=passed, metadata=meta,
                                           severity=AssetCheckSeverity.ERROR, blocking=True, partition=pkey))
        if not passed:
            failed.append(name)
    return events, failed


def run_batch(context: OpExecutionContext, table: TableConfig, config: BatchConfig, catalog: CatalogResource,
              ray: RayResource) -> Iterator[Any]:
    """Compact the batch and yield each stream's events as soon as they are known. Yielded, not only logged:
    Dagster hands an op's logged events over when the op yields, so a batch that fails at the end (one bad
    stream) still records every other stream's materializations and checks."""
    from flash_pipeline.compactor.job import compact

    cat = catalog.get_catalog()
    parts = [parse_partition_key(key) for key in config.partitions]
    context.log.info(f"{table.source}: compacting {len(parts)} partition stream(s) in one job")

    rounds: dict[str, list[dict[str, Any]]] = {}
    observe_rounds = len(parts) <= OBSERVED_STREAMS

    def on_round(info: dict[str, Any]) -> None:
        pkey = partition_key(tuple(tuple(kv) for kv in info["partition"]))
        rounds.setdefault(pkey, []).append(info)
        if observe_rounds:  # a large batch keeps its rounds in each stream's metadata (rounds table) only
            context.log_event(round_observation(keys(table)["compacted"], pkey, info))

    def call(report: Callable[[Any], None], stop: StopRequest) -> Any:
        options = table.options.replace(partitions=parts, **ray_settings(table, ray))
        return compact(table.source, options, catalog=cat, progress=report, on_round=report, stop=stop, failures="report")

    started = time.perf_counter()
    try:
        result = on_engine_thread(context, f"{table.source} ({len(parts)} streams)", call, on_round,
                                  log_every=0.0 if observe_rounds else BATCH_LOG_SECONDS)
    except BaseException as exc:  # a failure of the whole job (the lake unreachable, a bad option): the run's
        failure = engine_failure(exc, table.source, f"{len(parts)} streams", "batched compaction", table)
        if failure is exc:
            raise
        log_traceback(exc)
        raise failure from None
    wall = time.perf_counter() - started
    done = [p for p in result.partitions if p.status != "failed"]
    failures = {partition_key(p.partition): p for p in result.partitions if p.status == "failed"}
    failed_checks: dict[str, list[str]] = {}
    with ThreadPoolExecutor(max_workers=CHECK_THREADS, thread_name_prefix="flash-checks") as pool:
        outcomes = pool.map(lambda p: stream_events(cat, table, p, wall, rounds.get(partition_key(p.partition)),
                                                  context.instance), done)
        for pres, (events, failed) in zip(done, outcomes):
            for event in events:
                yield event
            if failed:
                failed_checks[partition_key(pres.partition)] = failed
    summary = {"streams": len(parts), "compacted": sum(p.status == "compacted" for p in done),
               "up to date": sum(p.status == "up-to-date" for p in done), "failed": len(failures),
               "failed checks": len(failed_checks), "seconds": round(time.perf_counter() - started, 3)}
    context.log.info(f"{table.source}: {summary}")
    if failures or failed_checks:
        raise batch_failure(table, len(parts), failures, failed_checks, summary)


def batch_failure(table: TableConfig, streams: int, failures: dict[str, PartitionResult], failed_checks: dict[str, list[str]],
                  summary: dict[str, Any]) -> Failure:
    """The run's failure once every other stream committed: each failed stream with the engine's one line (and
    the fix the one-stream run would name, from its ``engine_failure``); the first one's details as the run's."""
    described: dict[str, str] = {}
    details: dict[str, Any] = {}
    for pkey, pres in sorted(failures.items()):
        failure = engine_failure(pres.failure, table.source, pkey, "compaction", table) if pres.failure is not None else None
        if pres.failure is not None:
            log_traceback(pres.failure)
        described[pkey] = getattr(failure, "description", None) or pres.error or "failed"
        if not details and isinstance(failure, Failure):
            details = dict(failure.metadata)
    for pkey, names in sorted(failed_checks.items()):
        described[pkey] = f"check(s) {names} failed on its new version: run flash-compactor verify on {table.destination}"
    first = sorted(described)[0]
    return Failure(
        description=f"{len(described)} of {streams} partition stream(s) of {table.source} failed"
                    f"{' (the others committed)' if len(described) < streams else ''}; "
                    f"[{first}] {described[first]}",
        metadata={**details, "failed streams": MetadataValue.json(described), **summary},
    )


def build_batch_job(table: TableConfig) -> Any:
    @op(name=table.batch_op_name, out={}, description=f"Compact many partition streams of {table.source} into "
        f"{table.destination} in one engine job; each stream records its own materializations and checks.")
    def compact_batch(context: OpExecutionContext, config: BatchConfig, catalog: CatalogResource, ray: RayResource) -> Iterator[Any]:
        yield from run_batch(context, table, config, catalog, ray)

    @job(name=table.batch_job_name, tags={"flash/table": table.name},
         description=f"Compact a batch of partition streams of {table.source} (what the new-delta sensor launches).")
    def batch_job() -> None:
        compact_batch()

    return batch_job


__all__ = ["BatchConfig", "build_batch_job", "run_batch", "stream_events"]
