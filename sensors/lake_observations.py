"""The lake observation sensor: compactions committed outside this deployment appear in the UI.

A compacted stream version committed by ``flash-compactor compact``, the Python API, another deployment or an
optimize/rehash run is reported as a materialization of the table's compacted stream asset and its primary key
index asset, for the partition it belongs to (registered first if this deployment has not seen it), so that
no compacted partition shows as Missing and the asset's history lists every version.

A version a run of this deployment materialized (the "compacted version" metadata of the asset's latest
materialization: a compaction run records both assets, a rehash run the index) is not reported twice. Cursor (JSON): ``{"tables": {<table name>: {<partition key>: last version reported or seen}}}``;
a tick costs one listing of the destination's partitions and one of each partition's versions, and reads
only the manifests of versions it has not seen.
"""

from __future__ import annotations

import json
from typing import Any

from dagster import (
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterRunStatus,
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from resources.keys import keys
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import format_partition
from flash_pipeline.catalog.model import CompactedVersion
from resources import CatalogResource
from resources.config import ProjectConfig, TableConfig, partition_key
from sensors.new_deltas import lake_not_found

ORIGIN = "committed outside a compaction run of this deployment (CLI, Python API, another deployment, optimize or rehash)"


def new_versions(catalog: Catalog, table: TableConfig, seen: dict[str, int],
                 skip: set[str] | frozenset[str] = frozenset()) -> tuple[dict[str, int], list[tuple[str, CompactedVersion]]]:
    """(updated cursor entries, [(partition key, version)] for every live compacted version newer than the
    cursor's, ascending); partitions in ``skip`` are left for a later tick (cursor unchanged). A partition the
    cursor has never seen reports its latest version only: the history before the sensor is not replayed.
    Several versions committed between two ticks are each reported (only the latest was, so the asset's history
    missed the others)."""
    seen = dict(seen)
    found: list[tuple[str, CompactedVersion]] = []
    if not catalog.table_exists(table.destination):
        return seen, found
    for part in catalog.partitions(table.destination):
        versions = catalog.compacted_versions(table.destination, part)
        if not versions:
            continue
        pkey = partition_key(part)
        if pkey in skip or seen.get(pkey, 0) >= versions[-1]:
            continue
        newer = [v for v in versions if v > seen[pkey]] if pkey in seen else versions[-1:]
        for number in newer:
            found.append((pkey, catalog.compacted_version(table.destination, part, number)))
        seen[pkey] = versions[-1]
    return seen, found


def _materialized_versions(context: SensorEvaluationContext, asset_key: Any, pkey: str, limit: int) -> set[int]:
    """The compacted versions the asset's latest ``limit`` materializations of ``pkey`` recorded."""
    records = context.instance.fetch_materializations(AssetRecordsFilter(asset_key=asset_key, asset_partitions=[pkey]), limit=limit).records
    found = set()
    for record in records:
        mat = record.asset_materialization
        value = mat.metadata.get("compacted version") if mat is not None else None
        if value is not None and value.value is not None:
            found.add(int(value.value))
    return found


def version_events(table: TableConfig, pkey: str, v: CompactedVersion) -> list[AssetMaterialization]:
    """The compacted stream and primary key index materializations of one version committed elsewhere."""
    k = keys(table)
    where = f"{table.destination} [{format_partition(v.partition)}]"
    events = [
        AssetMaterialization(
            asset_key=k["compacted"], partition=pkey,
            description=f"{where}: compacted version {v.version} {ORIGIN}",
            metadata={
                "compacted version": v.version,
                "last position": v.last_position,
                "dagster/row_count": v.rows,
                "files": len(v.files),
                "bytes": v.bytes,
                "data change": bool(v.data_change),
                "committed at": v.created_at,
                "origin": ORIGIN,
            },
        )
    ]
    if v.index is not None:
        events.append(
            AssetMaterialization(
                asset_key=k["index"], partition=pkey,
                description=f"{where}: primary key index version {v.index.version} of compacted version {v.version} {ORIGIN}",
                metadata={
                    "compacted version": v.version,
                    "index version": v.index.version,
                    "hash buckets": v.index.hash_bucket_count,
                    "dagster/row_count": v.index.rows,
                    "bytes": v.index.bytes,
                    "origin": ORIGIN,
                },
            )
        )
    return events


IN_FLIGHT = (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
             DagsterRunStatus.CANCELING)


def partitions_in_flight(context: SensorEvaluationContext, table: TableConfig) -> set[str] | None:
    """Partition keys of this table that a run of this deployment is compacting or rehashing right now (None: a
    run over a partition range, so every partition of the table). Such a run commits its version before it
    records its materialization: a tick in between would report the run's own version as committed elsewhere, so
    those partitions wait for a tick after the run."""
    k = keys(table)
    watched = {k["compacted"], k["index"], k["rehash"]}
    jobs = {table.compact_job_name, table.rehash_job_name}
    found: set[str] = set()
    for run in context.instance.get_runs(filters=RunsFilter(statuses=list(IN_FLIGHT))):
        if run.job_name not in jobs and not (run.asset_selection and watched & set(run.asset_selection)):
            continue
        pkey = run.tags.get("dagster/partition")
        if pkey is None:
            return None  # a partition range (a backfill run) or an unpartitioned launch: the whole table waits
        found.add(pkey)
    return found


def build_lake_observation_sensor(project: ProjectConfig, partitions: dict[str, DynamicPartitionsDefinition],
                                  minimum_interval_seconds: int = 30,
                                  default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING) -> Any:
    @sensor(
        name="lake_observation_sensor",
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Reports compacted versions committed outside this deployment's compaction runs (CLI, Python "
        "API, another deployment) as materializations of the right partitions, so the UI reflects the lake.",
    )
    def lake_observation_sensor(context: SensorEvaluationContext, catalog: CatalogResource) -> SensorResult | SkipReason:
        cursor = json.loads(context.cursor) if context.cursor else {}
        tables_state = cursor.get("tables", {})
        cat = catalog.get_catalog()
        events: list[AssetMaterialization] = []
        partition_requests = []
        for table in project.tables:
            busy = partitions_in_flight(context, table)
            if busy is None:
                continue  # a range run in flight: this table's partitions are looked at after it
            seen, found = new_versions(cat, table, tables_state.get(table.name, {}), skip=busy)
            tables_state[table.name] = seen
            known = set(context.instance.get_dynamic_partitions(partitions[table.name].name)) if found else set()
            missing = sorted({pkey for pkey, _ in found} - known)
            if missing:
                partition_requests.append(partitions[table.name].build_add_request(missing))
            per_partition = {pkey: sum(1 for p, _ in found if p == pkey) for pkey, _ in found}
            for pkey, version in found:
                # a version one of the asset's recent materializations of the partition records was materialized
                # by this deployment (a compaction run both assets, a rehash run the index): not reported again
                fresh = [e for e in version_events(table, pkey, version)
                         if version.version not in _materialized_versions(context, e.asset_key, pkey, per_partition[pkey] + 1)]
                if fresh:
                    events += fresh
                    context.log.info(f"{table.name} {pkey}: compacted version {version.version} {ORIGIN}")
        new_cursor = json.dumps({"tables": tables_state}, separators=(",", ":"), sort_keys=True)
        if not events and not partition_requests:
            context.update_cursor(new_cursor)
            missing = [t.destination for t in project.tables if not cat.table_exists(t.destination)]
            if missing and len(missing) == len(project.tables) and not any(cat.table_exists(t.source) for t in project.tables):
                return SkipReason(lake_not_found(cat, "compacted", missing))
            return SkipReason("every compacted version in the lake is already in the asset history")
        return SensorResult(asset_events=events, dynamic_partitions_requests=partition_requests, cursor=new_cursor)

    return lake_observation_sensor


__all__ = ["build_lake_observation_sensor", "new_versions", "version_events"]
