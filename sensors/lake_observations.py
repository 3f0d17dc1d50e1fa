"""The lake observation sensor: compactions committed outside this deployment appear in the UI.

A compacted stream version committed by ``flash-compactor compact``, the Python API, another deployment or an
optimize/rehash run is reported as a materialization of the table's compacted stream asset and its primary key
index asset, for the partition it belongs to (registered first if this deployment has not seen it), so that
no compacted partition shows as Missing and the asset's history lists every version.

A version a run of this deployment materialized (the "compacted version" metadata of the asset's latest
materialization: a compaction run records both assets, a rehash run the index) is not reported twice.

The sensor follows the destination table's change feed (``flash_pipeline/catalog/changes.py``): a tick costs
one listing when nothing was committed, plus one read per new record; no partition is walked. Cursor (JSON):
``{"v": 2, "tables": {<table name>: {"pos": last record read, "wait": [[partition key, version], ...]}}}``, where
``wait`` holds the versions of partitions a run of this deployment was working on (looked at again after it).
A fresh cursor replays the feed and reports each partition's latest version only (the history before the sensor
is not replayed into the UI); a table from before the feed is walked once, partition by partition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetMaterialization,
    AssetRecordsFilter,
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from resources.keys import keys
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.changes import Change
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.model import CompactedVersion
from resources import CatalogResource
from resources.config import ProjectConfig, TableConfig, parse_partition_key, partition_key
from sensors.new_deltas import CURSOR_VERSION, add_requests, lake_not_found, streams_in_flight, unregistered

ORIGIN = "committed outside a compaction run of this deployment (CLI, Python API, another deployment, optimize or rehash)"


@dataclass(frozen=True)
class VersionSeen:
    """What the UI is told of one compacted version: from its change record (or, for tables from before the feed,
    its manifest)."""

    partition: PartitionKeys
    version: int
    last_position: int | None
    rows: int
    files: int
    bytes: int
    data_change: bool
    created_at: float
    index_version: int | None
    hash_buckets: int | None
    index_rows: int
    index_bytes: int

    @classmethod
    def of(cls, v: CompactedVersion | Change) -> "VersionSeen":
        if isinstance(v, Change):
            x = v.details
            return cls(v.partition, int(x["version"]), v.position, int(x.get("rows", 0)), int(x.get("files", 0)),
                       int(x.get("bytes", 0)), bool(x.get("data_change", True)), float(x.get("committed_at", v.created_at)),
                       x.get("index_version"), x.get("hash_buckets"), int(x.get("index_rows", 0)), int(x.get("index_bytes", 0)))
        index = v.index
        return cls(v.partition, v.version, v.last_position, v.rows, len(v.files), v.bytes, bool(v.data_change), v.created_at,
                   index.version if index else None, index.hash_bucket_count if index else None,
                   index.live_rows if index else 0, index.bytes if index else 0)


def _walk_latest(catalog: Catalog, table: TableConfig) -> list[tuple[str, VersionSeen]]:
    """The latest version of every partition: a fresh start on a table whose feed does not hold its history."""
    found = []
    for part in catalog.partitions(table.destination):
        latest = catalog.latest_compacted(table.destination, part)
        if latest is not None:
            found.append((partition_key(part), VersionSeen.of(latest)))
    return found


def new_versions(catalog: Catalog, table: TableConfig, state: dict[str, Any],
                 skip: set[str] | frozenset[str] = frozenset()) -> tuple[dict[str, Any], list[tuple[str, VersionSeen]]]:
    """(updated state, [(partition key, version)] for every compacted version committed since the state's position,
    in commit order); the versions of partitions in ``skip`` wait in the state for a later tick."""
    fresh = "pos" not in state
    state = {"pos": int(state.get("pos", 0)), "wait": list(state.get("wait", []))}
    feed = catalog.changes
    if fresh and catalog.table_exists(table.destination) and not catalog.table_metadata(table.destination).get("changes_recorded"):
        state["pos"] = feed.head(table.destination)
        candidates = _walk_latest(catalog, table)
    else:
        read = feed.read(table.destination, state["pos"])
        if read:
            state["pos"] = read[-1].seq
        records = [r for r in read if r.kind == "compacted" and r.details.get("source_table_id") == table.source]
        waited = [(pkey, catalog.compacted_version(table.destination, parse_partition_key(pkey), v)) for pkey, v in state["wait"]]
        candidates = [(pkey, VersionSeen.of(v)) for pkey, v in waited] + [(partition_key(r.partition), VersionSeen.of(r)) for r in records]
        if fresh:  # the history before the sensor: each partition's latest version only
            latest: dict[str, VersionSeen] = {}
            for pkey, v in candidates:
                if pkey not in latest or v.version > latest[pkey].version:
                    latest[pkey] = v
            candidates = sorted(latest.items(), key=lambda kv: kv[1].version)
    state["wait"] = [[pkey, v.version] for pkey, v in candidates if pkey in skip]
    return state, [(pkey, v) for pkey, v in candidates if pkey not in skip]


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


def version_events(table: TableConfig, pkey: str, v: VersionSeen) -> list[AssetMaterialization]:
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
                "files": v.files,
                "bytes": v.bytes,
                "data change": bool(v.data_change),
                "committed at": v.created_at,
                "origin": ORIGIN,
            },
        )
    ]
    if v.index_version is not None:
        events.append(
            AssetMaterialization(
                asset_key=k["index"], partition=pkey,
                description=f"{where}: primary key index version {v.index_version} of compacted version {v.version} {ORIGIN}",
                metadata={
                    "compacted version": v.version,
                    "index version": v.index_version,
                    "hash buckets": v.hash_buckets,
                    "dagster/row_count": v.index_rows,
                    "bytes": v.index_bytes,
                    "origin": ORIGIN,
                },
            )
        )
    return events


def partitions_in_flight(context: SensorEvaluationContext, table: TableConfig) -> set[str] | None:
    """Partition keys of this table that a run of this deployment is compacting or rehashing right now (None: a
    run over a partition range, so every partition of the table). Such a run commits its version before it
    records its materialization: a tick in between would report the run's own version as committed elsewhere, so
    those partitions wait for a tick after the run."""
    return streams_in_flight(context.instance, table)


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
        tables_state = cursor.get("tables", {}) if cursor.get("v") == CURSOR_VERSION else {}
        cat = catalog.get_catalog()
        events: list[AssetMaterialization] = []
        partition_requests = []
        for table in project.tables:
            busy = partitions_in_flight(context, table)
            if busy is None:
                continue  # a range run in flight: this table's partitions are looked at after it
            seen, found = new_versions(cat, table, tables_state.get(table.name, {}), skip=busy)
            tables_state[table.name] = seen
            missing = unregistered(context.instance, partitions[table.name], sorted({pkey for pkey, _ in found})) if found else []
            if missing:
                partition_requests += add_requests(partitions[table.name], missing)
            per_partition = {pkey: sum(1 for p, _ in found if p == pkey) for pkey, _ in found}
            for pkey, version in found:
                # a version one of the asset's recent materializations of the partition records was materialized
                # by this deployment (a compaction run both assets, a rehash run the index): not reported again
                fresh = [e for e in version_events(table, pkey, version)
                         if version.version not in _materialized_versions(context, e.asset_key, pkey, per_partition[pkey] + 1)]
                if fresh:
                    events += fresh
                    context.log.info(f"{table.name} {pkey}: compacted version {version.version} {ORIGIN}")
        new_cursor = json.dumps({"v": CURSOR_VERSION, "tables": tables_state}, separators=(",", ":"), sort_keys=True)
        if not events and not partition_requests:
            context.update_cursor(new_cursor)
            missing = [t.destination for t in project.tables if not cat.table_exists(t.destination)]
            if missing and len(missing) == len(project.tables) and not any(cat.table_exists(t.source) for t in project.tables):
                return SkipReason(lake_not_found(cat, "compacted", missing))
            return SkipReason("every compacted version in the lake is already in the asset history")
        return SensorResult(asset_events=events, dynamic_partitions_requests=partition_requests, cursor=new_cursor)

    return lake_observation_sensor


__all__ = ["build_lake_observation_sensor", "new_versions", "version_events"]
