"""Retention of compacted partitions: old versions expire, and the files only they referenced are deleted.

Attempt folders left by lost or dead attempts are removed by ``catalog.commits.remove_orphan_attempts``, which
every retention run calls at its end."""

from __future__ import annotations

# ----- version retention ----------------------------------------------------------------------------------------
# Old compacted stream versions (and the index versions only they use) are deleted after a retention given as a
# count (keep the newest N versions) and/or an age (keep versions committed within the last S seconds); with
# both, a version is kept when either keeps it. The current and the previous version are always kept (a reader
# that listed the versions just before a new commit may still be reading the previous one). A version's files
# are deleted only when no kept version references them: compaction carries unchanged files by reference, so one
# file often belongs to many versions. Only keys under the partition's ``compacted/`` folder are ever deleted
# (an optimize-only version may reference delta files, which belong to the stream). The version is first marked
# expired (``versions/<n>.expired``; its manifest stays, so the number can never be committed again by a writer
# that read an old base), then its unreferenced files go, then ``versions/<n>.vacuumed`` marks it done. A crash
# before that mark leaves only invisible orphans, which the next retention run deletes: it re-reads the expired
# versions without the mark (those of lakes expired before the mark existed too, once). Each run ends with
# :func:`remove_orphan_attempts`, which also removes the attempt folders the deleted versions leave empty.
import time as _time
from dataclasses import dataclass as _dataclass
from dataclasses import field as _field
from typing import Any as _Any
from typing import Sequence as _Sequence

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.commits import attempt_roots, referenced_attempts, remove_orphan_attempts
from flash_pipeline.catalog.encoding import PartitionKeys, normalize_partition
from flash_pipeline.catalog.model import CompactedVersion

MIN_KEEP = 2  # the current and the previous version
# a local write's temporary file idle this long belongs to a writer that died (a live one renames it right away)
TEMP_IDLE_SECONDS = 3600.0


@_dataclass
class RetentionResult:
    table_id: str
    partition: PartitionKeys
    kept_versions: list[int] = _field(default_factory=list)
    deleted_versions: list[int] = _field(default_factory=list)
    deleted_index_versions: list[int] = _field(default_factory=list)
    deleted_files: list[str] = _field(default_factory=list)
    deleted_bytes: int = 0
    dry_run: bool = False
    removed_attempts: list[str] = _field(default_factory=list)  # orphaned attempt folders removed
    removed_temp_files: list[str] = _field(default_factory=list)  # dead writers' temporary files (local lakes)

    def to_json(self) -> dict[str, _Any]:
        return {
            "table_id": self.table_id,
            "partition": [[n, v] for n, v in self.partition],
            "kept_versions": self.kept_versions,
            "deleted_versions": self.deleted_versions,
            "deleted_index_versions": self.deleted_index_versions,
            "deleted_files": len(self.deleted_files),
            "deleted_bytes": self.deleted_bytes,
            "dry_run": self.dry_run,
            "removed_attempts": len(self.removed_attempts),
            "removed_temp_files": len(self.removed_temp_files),
        }

    def describe(self) -> str:
        from flash_pipeline.catalog.encoding import format_partition

        verb = "would delete" if self.dry_run else "deleted"
        orphans = f"; removed {len(self.removed_attempts)} orphaned attempt folder(s)" if self.removed_attempts else ""
        if self.removed_temp_files:
            orphans += f"; {'would remove' if self.dry_run else 'removed'} {len(self.removed_temp_files)} temporary " \
                       f"file(s) of dead writers"
        if not self.deleted_versions:
            return (f"{format_partition(self.partition)}: nothing to delete "
                    f"(versions {self.kept_versions} kept){orphans}")
        return (
            f"{format_partition(self.partition)}: {verb} versions {self.deleted_versions}, index versions "
            f"{self.deleted_index_versions}, {len(self.deleted_files)} files ({self.deleted_bytes} B); kept "
            f"{self.kept_versions}{orphans}"
        )


def _version_keys(v: CompactedVersion) -> dict[str, int]:
    keys = {f.key: f.bytes for f in v.files}
    # a deletion vector's file (in the attempt folder of the version that wrote it, often not the data file's)
    keys.update({f.deletion_vector.key: 0 for f in v.files if f.deletion_vector is not None})
    if v.index is not None:
        keys.update({f.key: f.bytes for files in v.index.buckets for f in files})
    return keys


def deltalake_head(catalog: Catalog, versions: list[CompactedVersion]) -> int | None:
    """The compacted version the partition's Delta table holds now: the newest that can be published (the ones
    after it have empty Delta commits, catalog/deltalake_table.py). Retention keeps it with its files, so a Delta
    read of the latest version does not fail on files deleted under it; None when nothing is published."""
    for v in sorted(versions, key=lambda v: v.version, reverse=True):
        if catalog.deltalake_blocker(v) is None:
            return v.version
    return None


def _kept(catalog: Catalog, table_id: str, partition: PartitionKeys, versions: dict[int, CompactedVersion],
          keep_last: int | None, max_age_seconds: float | None, now: float) -> set[int]:
    """The version numbers the retention keeps: the newest MIN_KEEP, the last ``keep_last``, those younger than
    the age, and the versions Delta and Iceberg readers read now (when the newest could not be published)."""
    numbers = sorted(versions)
    keep = set(numbers[-MIN_KEEP:])
    if keep_last is not None:
        keep.update(numbers[-keep_last:])
    if max_age_seconds is not None:
        keep.update(n for n in numbers if now - versions[n].created_at <= max_age_seconds)
    head = deltalake_head(catalog, [versions[n] for n in numbers])
    if head is not None:
        keep.add(head)
    published = [n for n in catalog.iceberg_versions(table_id, partition) if n in versions]
    if published:  # catalog/iceberg_table.py
        keep.add(published[-1])
    return keep


def retain_versions(
    catalog: Catalog,
    table_id: str,
    partition: PartitionKeys | object,
    keep_last: int | None = None,
    max_age_seconds: float | None = None,
    now: float | None = None,
    dry_run: bool = False,
) -> RetentionResult:
    """Delete the compacted versions of one partition (any form ``Catalog.append`` takes: a dict, pairs or
    ``NAME=VALUE`` strings) that the retention no longer keeps; see above."""
    from flash_pipeline.errors import FlashError

    partition = normalize_partition(partition)

    if keep_last is None and max_age_seconds is None:
        raise FlashError("give a retention: keep the last N versions and/or versions younger than an age")
    if keep_last is not None and keep_last < 1:
        raise FlashError(f"versions to keep must be a positive integer, got {keep_last}")
    if max_age_seconds is not None and max_age_seconds < 0:
        raise FlashError(f"retention age must not be negative, got {max_age_seconds}")
    now = _time.time() if now is None else float(now)
    result = RetentionResult(table_id, partition, dry_run=dry_run)
    result.removed_temp_files = _remove_stale_temp_files(catalog, table_id, partition, dry_run)
    numbers = sorted(catalog.compacted_versions(table_id, partition))
    versions = {n: catalog.compacted_version(table_id, partition, n) for n in numbers}
    keep = _kept(catalog, table_id, partition, versions, keep_last, max_age_seconds, now)
    doomed = [n for n in numbers if n not in keep]
    result.kept_versions = sorted(keep)
    # versions an earlier retention expired but died before deleting their files: their files go now
    unfinished = [n for n in catalog.expired_unvacuumed(table_id, partition) if n not in versions]
    versions.update({n: catalog.compacted_version(table_id, partition, n) for n in unfinished})
    if not doomed and not unfinished:
        if not dry_run:  # vacuum the attempts of writers that lost a race or died, even with nothing to expire
            result.removed_attempts = remove_orphan_attempts(catalog, table_id, partition)
        return result
    kept_keys: set[str] = set()
    kept_index = set()
    for n in keep:
        kept_keys.update(_version_keys(versions[n]))
        index = versions[n].index
        if index is not None:
            kept_index.add(index.version)
    owned = (catalog.compacted_prefix(table_id, partition) + "/", catalog.deltalake_root(table_id, partition) + "/")
    files: dict[str, int] = {}
    for n in doomed + unfinished:
        for key, size in _version_keys(versions[n]).items():
            if key not in kept_keys and key.startswith(owned):
                files[key] = size
    result.deleted_versions = doomed
    result.deleted_index_versions = sorted(
        {versions[n].index.version for n in doomed  # type: ignore[union-attr]
         if versions[n].index is not None} - kept_index
    )
    result.deleted_files = sorted(files)
    result.deleted_bytes = sum(files.values())
    if dry_run:
        return result
    from flash_pipeline.faults import maybe_crash

    for n in doomed:
        catalog.expire_compacted(table_id, partition, n)
    maybe_crash("retain:after_expire")
    # Iceberg's snapshots of the expired versions go before their files do (readers of the catalog never see them)
    catalog.expire_iceberg(table_id, partition, keep)
    for i, key in enumerate(result.deleted_files):
        catalog.storage.delete(key)
        if i == 0:
            maybe_crash("retain:during_delete")
    for n in doomed + unfinished:  # a crash before this mark: the next retention deletes them again
        catalog.mark_vacuumed(table_id, partition, n)
    # the now empty (local) attempt folders, and those of writers that lost a race or died: only the latter are
    # reported as orphans (the folders of the versions just deleted are this run's own)
    own = referenced_attempts([versions[n] for n in doomed + unfinished], attempt_roots(catalog, table_id, partition))
    result.removed_attempts = [a for a in remove_orphan_attempts(catalog, table_id, partition) if a not in own]
    return result


def _remove_stale_temp_files(catalog: Catalog, table_id: str, partition: PartitionKeys, dry_run: bool) -> list[str]:
    """The temporary files that writers which died left beside the partition's commit records: its streams' delta
    manifests, its compacted version manifests and its Delta log (files no listing shows, never committed, idle for
    TEMP_IDLE_SECONDS). One listing a folder, not a walk of the partition's data: the attempt folders of dead
    compactions go whole (remove_orphan_attempts)."""
    if not catalog.storage.writes_temp_files:  # S3: no listing at all
        return []
    streams = f"{catalog.partition_prefix(table_id, partition)}/streams"
    folders = [f"{streams}/{v}/deltas" for v in catalog.storage.list_children(streams)]
    folders += [f"{catalog.compacted_prefix(table_id, partition)}/versions",
                f"{catalog.deltalake_root(table_id, partition)}/_delta_log"]
    sweep = catalog.storage.remove_stale_temp_files
    return [key for folder in folders for key in sweep(folder, TEMP_IDLE_SECONDS, dry_run)]


def retain(
    catalog: Catalog | str,
    table_id: str,
    keep_last: int | None = None,
    max_age_seconds: float | None = None,
    partitions: _Sequence[_Any] | None = None,
    now: float | None = None,
    dry_run: bool = False,
) -> list[RetentionResult]:
    """:func:`retain_versions` for every compacted (or the named) partition of ``table_id``."""

    cat = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
    parts = cat.chosen_partitions(table_id, partitions, compacted_only=True)
    return [retain_versions(cat, table_id, p, keep_last, max_age_seconds, now, dry_run) for p in parts]
