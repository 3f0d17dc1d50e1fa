"""What a compaction run's primary key check reads: the files changed since the last version the check passed on.

Cost follows change. Reading every key of a stream on every run made the check the run's largest cost at lake
scale (10.9 s of SHA-1 over 5M keys after a 0.8 s incremental compaction, issue 58's clustered scenario). A
passed check on version ``Vs`` proved ``Vs``'s live keys distinct. A later version ``V`` keeps some of ``Vs``'s
files unchanged (the same entry: key, content, deletion vector, key range; verify_scope.unchanged_data_keys)
and adds or changes the rest, so a key appearing twice in ``V`` has at least one row in a changed file, and the
other row in a changed file or in an unchanged one whose recorded key range (the first primary key column's
bounds) holds that key's value. The
check reads those files only, and fails if a changed file's keys lie outside its own recorded range, so every
range it later relies on was checked when its file was new. Without a passed check to start from (the first
compaction, a version made by the command, a lost history) every file is read.

The proof is Dagster's record of the check (its ``compacted version`` and ``version committed at`` metadata),
read from the instance's event log; anything unexpected there means "no proof": a slower check, never a weaker
one. ``files_intact`` finds its own proof the same way (flash_pipeline/verify_scope.py decides what it skips).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.key_ranges import KeyRange
from flash_pipeline.catalog.model import CompactedVersion, DataFile
from flash_pipeline.errors import FlashError
from flash_pipeline.verify_scope import unchanged_data_keys

# metadata of a passed primary key check: the commit time of the version it read (with ``compacted version``)
PROVEN_AT = "version committed at"
# passed checks of one stream looked at for a proof older than the version being checked
PROOFS_LOOKED_AT = 5
# a version of fewer bytes is checked in full without looking for a proof: reading it all costs less than the
# look-up (~3 ms in a SQLite instance holding 2,000 check records), which a batch run does for every stream
PROOF_MIN_BYTES = 16 << 20


@dataclass(frozen=True)
class CheckScope:
    """The files a check of ``version`` reads: ``changed`` (all of their live rows), and ``unchanged`` ones since
    ``proven`` (None: nothing proven, every file is changed), read where their key range may meet a changed key."""

    version: CompactedVersion
    proven: CompactedVersion | None
    changed: list[DataFile]
    unchanged: list[DataFile]

    def unchanged_meeting(self, changed_range: KeyRange | None) -> list[DataFile]:
        """The unchanged files that may hold a key of the changed rows (all of them without a range to compare)."""
        if changed_range is None:
            return list(self.unchanged)
        return [f for f in self.unchanged if f.key_range is None or f.key_range.overlaps(changed_range)]


def scope_since(version: CompactedVersion, proven: CompactedVersion | None) -> CheckScope:
    if proven is None or proven.version >= version.version or list(proven.primary_keys) != list(version.primary_keys):
        return CheckScope(version, None, list(version.files), [])
    kept = unchanged_data_keys(version, proven)  # the same entry: key, content, deletion vector, key range
    unchanged = [f for f in version.files if f.key in kept]
    return CheckScope(version, proven, [f for f in version.files if f.key not in kept], unchanged)


def _proof(record: Any, partition_key: str) -> tuple[int, float] | None:
    """(version, its commit time) a passed check record vouches for, or None."""
    if record.event is None or record.partition != partition_key:
        return None
    evaluation = record.event.dagster_event.event_specific_data
    meta = evaluation.metadata
    if not evaluation.passed or "compacted version" not in meta or PROVEN_AT not in meta:
        return None
    return int(meta["compacted version"].value), float(meta[PROVEN_AT].value)


def proven_version(instance: Any, check_key: Any, partition_key: str, catalog: Catalog,
                   version: CompactedVersion) -> CompactedVersion | None:
    """The newest version of ``version``'s stream, older than it, on which the check ``check_key`` passed for
    ``partition_key`` (Dagster's event log), if that very version (same number, same commit time: not one of
    another lake at the same path) is still in the lake; else None (and for a version under PROOF_MIN_BYTES)."""
    if sum(f.bytes for f in version.files) < PROOF_MIN_BYTES:
        return None
    try:
        from dagster._core.event_api import PartitionKeyFilter
        from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

        records = instance.event_log_storage.get_asset_check_execution_history(
            check_key, limit=PROOFS_LOOKED_AT, status={AssetCheckExecutionRecordStatus.SUCCEEDED},
            partition_filter=PartitionKeyFilter(key=partition_key))
        proofs = [p for p in (_proof(r, partition_key) for r in records) if p is not None]
    except Exception:  # noqa: BLE001 - no readable proof: the check reads every file
        return None
    for number, committed_at in proofs:
        if not 0 < number < version.version:
            continue
        try:
            proven = catalog.compacted_version(version.table_id, version.partition, number)
        except FlashError:  # expired by retention: no proof left to build on
            return None
        return proven if proven.created_at == committed_at else None
    return None
