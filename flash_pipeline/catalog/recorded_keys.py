"""The primary and sort keys a partition's compactions recorded, which appends are checked against: a delete
must carry every key column, a key column keeps its type. Keys are the table's: a partition never compacted takes
them from another. A layer of ``Catalog`` (tables.py lists the layers)."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.iceberg_table import IcebergPublication
from flash_pipeline.catalog.key_types import require_key_types
from flash_pipeline.catalog.model import CompactedVersion
from flash_pipeline.catalog.storage import overlapped
from flash_pipeline.catalog.validation import StagedFile
from flash_pipeline.errors import FlashError, NotFound


class RecordedKeys(IcebergPublication):
    """Keys recorded by compaction, for the checks of an append."""

    def compactions_of(self, table_id: str, partition: PartitionKeys,
                       tables: Sequence[str] | None = None) -> list[CompactedVersion]:
        """The latest compacted version of every table (this one included; of ``tables`` when given) compacted
        from this partition."""
        out = []
        candidates = sorted({table_id, *self.possible_destinations(table_id)}) if tables is None else tables
        for dest in candidates:
            try:
                latest = self.latest_compacted(dest, partition)
            except NotFound:
                continue
            if latest is not None and latest.source_table_id == table_id:
                out.append(latest)
        return out

    def _table_key_compactions(self, table_id: str, partition: PartitionKeys,
                               thorough: bool = False) -> tuple[list[CompactedVersion], bool]:
        """(compactions recording keys, whether they are this partition's own): its own, else (keys are the
        table's: a partition never compacted takes them from another, as compact and read do) every other
        partition's compaction in place (one listing each), else the first compaction into one of the table's
        recorded destinations found (a request per destination and partition until then).
        ``thorough``: every compaction of every other partition (a refusal is checked against all of them)."""
        own = [c for c in self.compactions_of(table_id, partition) if c.primary_keys]
        if own:
            return own, True
        others = [p for p in self.partitions(table_id) if p != tuple(partition)]
        # a few requests a partition: overlapped on an object store (an append to a table of 60 partitions waited
        # for each in turn)
        in_place = overlapped(self.storage, lambda other: self.latest_compacted(table_id, other), others, "flash-keys")
        found: list[CompactedVersion] = [c for c in in_place if c is not None and c.primary_keys]
        destinations = self.possible_destinations(table_id) if not found or thorough else []
        for other in others if destinations else ():
            elsewhere = [c for c in self.compactions_of(table_id, other, destinations) if c.primary_keys]
            if elsewhere:
                found += elsewhere
                if not thorough:
                    break
        return found, False

    def _check_delete_keys(self, table_id: str, partition: PartitionKeys, staged: list[StagedFile]) -> None:
        """A delete names rows by primary key: once a compaction recorded the keys, every key column is required
        (each compaction's of this partition; of another partition's, those of one of its compactions: a delete
        lacking them in a new partition was accepted, then stopped every compaction of the table)."""
        if not self.table_exists(table_id):
            return
        compactions, own = self._table_key_compactions(table_id, partition)
        thorough = False
        for s in staged:
            lacking = [(c, [k for k in c.primary_keys if k not in s.schema.names]) for c in compactions]
            refused = [(c, m) for c, m in lacking if m] if own else ([] if any(not m for _, m in lacking)
                                                                     else lacking[:1])
            # before refusing: the keys of any other compaction of the table do
            if refused and not own and not thorough:
                compactions, thorough = self._table_key_compactions(table_id, partition, thorough=True)[0], True
                lacking = [(c, [k for k in c.primary_keys if k not in s.schema.names]) for c in compactions]
                refused = [] if any(not m for _, m in lacking) else lacking[:1]
            for compacted, missing in refused[:1]:
                where = "" if own else f" [{format_partition(compacted.partition)}]"
                raise FlashError(
                    f"delete file {s.source} lacks primary key column(s) {missing} of table {table_id!r} "
                    f"[{format_partition(partition)}] (recorded by its compaction into {compacted.table_id!r}{where}): "
                    "a delete names the rows to delete by their primary key, add the key column(s); nothing was "
                    "appended"
                )

    def _check_key_types(self, table_id: str, partition: PartitionKeys, staged: list[StagedFile]) -> None:
        """Once a compaction recorded the primary keys (of this partition, else of another: keys are the table's), a
        key column of a nested type is refused at append rather than failing the next compaction. Files without
        nested columns (nearly all) cost no catalog read."""
        nested = any(pa.types.is_nested(f.type) or pa.types.is_interval(f.type) for s in staged for f in s.schema)
        if not nested or not self.table_exists(table_id):
            return
        compactions, _ = self._table_key_compactions(table_id, partition)
        if compactions:
            for compacted in compactions:
                for s in staged:
                    require_key_types(s.schema, compacted.primary_keys,
                                      f"file {s.source} of table {table_id!r} [{format_partition(partition)}]")
