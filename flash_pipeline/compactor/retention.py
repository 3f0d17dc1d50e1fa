"""Housekeeping of compacted partitions: orphaned attempt files and old versions.

Every compaction round and rehash writes under its own attempt folder ``compacted/{data,index}/<version>-<id>``.
An attempt folder that no committed version references and whose version number is already committed (by
that attempt's rival or by a resumed run) belongs to a dead or losing attempt: nobody can ever commit it, so
it is removed. Folders of versions not yet committed may belong to a live session and are left alone.
"""

from __future__ import annotations

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import PartitionKeys
from flash_pipeline.catalog.model import CompactedVersion


def referenced_attempts(versions: list[CompactedVersion], prefix: str) -> set[str]:
    out = set()
    for v in versions:
        keys = [f.key for f in v.files]
        if v.index is not None:
            keys += [f.key for files in v.index.buckets for f in files]
        for key in keys:
            if key.startswith(prefix + "/"):
                rest = key[len(prefix) + 1 :]
                kind, _, tail = rest.partition("/")
                out.add(f"{kind}/{tail.split('/', 1)[0]}")
    return out


def remove_orphan_attempts(catalog: Catalog, table_id: str, partition: PartitionKeys) -> list[str]:
    """Delete attempt folders of dead or losing attempts; returns the folders removed."""
    prefix = catalog.compacted_prefix(table_id, partition)
    numbers = catalog.compacted_versions(table_id, partition)
    if not numbers:
        latest = 0
        versions: list[CompactedVersion] = []
    else:
        latest = max(numbers)
        versions = [catalog.compacted_version(table_id, partition, n) for n in numbers]
    keep = referenced_attempts(versions, prefix)
    removed = []
    for kind in ("data", "index"):
        for attempt in catalog.storage.list_children(f"{prefix}/{kind}"):
            name = f"{kind}/{attempt}"
            if name in keep:
                continue
            try:
                version = int(attempt.split("-", 1)[0])
            except ValueError:
                continue
            if version <= latest:
                catalog.storage.delete_prefix(f"{prefix}/{name}")
                removed.append(name)
    return removed
