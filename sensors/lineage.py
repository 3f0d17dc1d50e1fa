"""Materializations of the partitioned deltas asset: which partition streams got new deltas, from whom.

The deltas asset (``<name>/deltas``) is partitioned like the streams it feeds, so the UI draws the paper's
lineage per partition: deltas of a stream -> its compacted version and primary key index version -> rehash.
A PySpark load run reports the partitions it wrote; for any other writer the new-delta sensor reports them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from dagster import AssetMaterialization, DagsterInstance, DynamicPartitionsDefinition

from resources.keys import keys
from flash_pipeline.catalog.changes import Change
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.model import Delta
from resources.config import TableConfig, partition_key


@dataclass(frozen=True)
class DeltaSeen:
    """What the deltas asset reports of one delta: from its manifest (a load run) or its change record (the sensor)."""

    partition: PartitionKeys
    stream_version: int
    position: int
    operation: str
    rows: int
    files: int
    bytes: int

    @classmethod
    def of(cls, d: Delta | Change) -> "DeltaSeen":
        if isinstance(d, Change):
            x = d.details
            return cls(d.partition, int(d.stream_version or 0), int(d.position or 0), str(x.get("operation", "upsert")),
                       int(x.get("rows", 0)), int(x.get("files", 0)), int(x.get("bytes", 0)))
        return cls(d.partition, d.stream_version, d.position, d.operation, d.rows, len(d.files), d.bytes)


def delta_events(table: TableConfig, deltas: Iterable[Delta | Change], origin: str) -> list[AssetMaterialization]:
    """One materialization of ``<name>/deltas`` per partition stream among ``deltas`` (positions, rows, bytes)."""
    by_partition: dict[str, list[DeltaSeen]] = defaultdict(list)
    for d in map(DeltaSeen.of, deltas):
        by_partition[partition_key(d.partition)].append(d)
    out = []
    for pkey, ds in sorted(by_partition.items()):
        ds.sort(key=lambda d: d.position)
        upserts = [d for d in ds if d.operation == "upsert"]
        out.append(
            AssetMaterialization(
                asset_key=keys(table)["deltas"], partition=pkey,
                description=f"{table.source} [{format_partition(ds[0].partition)}]: {len(ds)} new delta(s) from {origin}",
                metadata={
                    "stream version": ds[-1].stream_version,
                    "last position": ds[-1].position,
                    "positions": ", ".join(f"{d.position} ({d.operation})" for d in ds),
                    "deltas": len(ds),
                    "upsert rows": sum(d.rows for d in upserts),
                    "delete rows": sum(d.rows for d in ds if d.operation != "upsert"),
                    "files": sum(d.files for d in ds),
                    "bytes": sum(d.bytes for d in ds),
                    "origin": origin,
                },
            )
        )
    return out


def register_partitions(instance: DagsterInstance, partitions: DynamicPartitionsDefinition, deltas: Iterable[Delta]) -> list[str]:
    """Add the partition streams of ``deltas`` this deployment has not seen (a run may write new ones)."""
    wanted = sorted({partition_key(d.partition) for d in deltas})
    known = set(instance.get_dynamic_partitions(str(partitions.name)))
    new = [k for k in wanted if k not in known]
    if new:
        instance.add_dynamic_partitions(str(partitions.name), new)
    return new


__all__ = ["delta_events", "register_partitions"]
