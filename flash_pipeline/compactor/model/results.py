"""What a compaction job run reports, per partition stream and in total."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from flash_pipeline.catalog.encoding import PartitionKeys, format_partition


@dataclass
class PartitionResult:
    """Statistics of one compaction session (one partition stream).

    rows_in: upsert rows of the new deltas; rows_out: rows in the new compacted stream version;
    duplicates_dropped: upsert rows (new or previously compacted) replaced by a better row of the same key;
    deletes_applied: upsert rows (new or previously compacted) removed by a later delete of their key.
    """

    partition: PartitionKeys
    status: str = "compacted"  # compacted | up-to-date | failed (only with compact(..., failures="report"))
    rows_in: int = 0
    delete_rows_in: int = 0
    prior_rows: int = 0
    rows_out: int = 0
    duplicates_dropped: int = 0
    deletes_applied: int = 0
    files_written: int = 0
    bytes_written: int = 0
    files_carried: int = 0
    bytes_carried: int = 0
    bytes_read: int = 0  # bytes at rest of the files the session opened (delta files, rewritten files, index)
    index_rows: int = 0
    index_bytes_written: int = 0
    index_bytes_carried: int = 0
    # prior index files the probe skipped unread: their compacted files' key ranges missed the deltas'
    index_bytes_skipped: int = 0
    hash_bucket_count: int = 0
    rounds: int = 0
    compacted_version: int | None = None
    last_position: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    expected_seconds: float | None = None
    notes: list[str] = field(default_factory=list)
    schema_changes: list[str] = field(default_factory=list)  # what the version changed in the schema: "added 'w'", ...
    error: str | None = None  # a failed session's one-line error
    failure: BaseException | None = field(default=None, repr=False, compare=False)  # and the error itself

    def to_json(self) -> dict[str, Any]:
        failure, self.failure = self.failure, None
        try:
            d = asdict(self)
        finally:
            self.failure = failure
        d.pop("failure", None)
        d["partition"] = [[n, v] for n, v in self.partition]
        return d

    def describe(self) -> str:
        if self.status == "failed":
            return f"{format_partition(self.partition)}: failed: {self.error}"
        if self.status != "compacted":
            return f"{format_partition(self.partition)}: {self.status}"
        return (
            f"{format_partition(self.partition)}: {self.rows_in} rows in (+{self.prior_rows} compacted), "
            f"{self.rows_out} out, {self.duplicates_dropped} duplicates dropped, {self.deletes_applied} deleted; "
            f"{self.files_written} files written ({self.bytes_written} B), {self.files_carried} carried "
            f"({self.bytes_carried} B), {self.bytes_read} B read; "
            f"{self.hash_bucket_count} buckets, {self.rounds} round(s), version {self.compacted_version}, "
            f"{self.seconds.get('total', sum(self.seconds.values())):.2f}s"
        )


@dataclass
class CompactionResult:
    source_table_id: str
    destination_table_id: str
    partitions: list[PartitionResult] = field(default_factory=list)
    seconds: float = 0.0

    def total(self, name: str) -> int:
        return sum(int(getattr(p, name) or 0) for p in self.partitions)

    @property
    def rows_in(self) -> int:
        return self.total("rows_in")

    @property
    def rows_out(self) -> int:
        return self.total("rows_out")

    def to_json(self) -> dict[str, Any]:
        return {
            "source_table_id": self.source_table_id,
            "destination_table_id": self.destination_table_id,
            "seconds": self.seconds,
            "partitions": [p.to_json() for p in self.partitions],
        }
