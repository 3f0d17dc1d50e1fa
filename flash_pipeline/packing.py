"""Planning and reporting of small-file packing (Delta's OPTIMIZE): which files go into which bin, and the
operation metrics a run reports (Delta's numFilesAdded/Removed, file size statistics). Pure: no catalog I/O."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from flash_pipeline.catalog.deletion_vectors import PURGE_DEAD_FRACTION
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.model import DataFile
from flash_pipeline.errors import FlashError

DEFAULT_MIN_FILE_SIZE = 1 << 30  # Delta's spark.databricks.delta.optimize.minFileSize default (1 GiB)
DEFAULT_MAX_FILE_SIZE = 1 << 30  # Delta's spark.databricks.delta.optimize.maxFileSize default (1 GiB)
ROW_GROUP_ROWS = 256 * 1024


# ----- planning ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BinPlan:
    """Indices (into the size list given to :func:`plan_bins`) of the files each bin concatenates, in order."""

    bins: tuple[tuple[int, ...], ...]
    considered: int  # every file of the partition stream that was looked at
    candidates: int  # files smaller than the minimum size

    @property
    def removed(self) -> int:
        return sum(len(b) for b in self.bins)

    @property
    def skipped(self) -> int:
        return self.considered - self.removed


def plan_bins(sizes: Sequence[int], min_file_size: int, max_file_size: int) -> BinPlan:
    """Delta's groupFilesIntoBins for one partition: small files by size, greedy bins within the maximum.

    A file joins the current bin unless that would make the bin larger than ``max_file_size``; then the bin is
    closed and the file starts the next one. Bins of a single file are dropped (nothing to merge).
    """
    check_sizes(min_file_size, max_file_size)
    small = sorted((i for i, s in enumerate(sizes) if s < min_file_size), key=lambda i: (sizes[i], i))
    bins: list[tuple[int, ...]] = []
    current: list[int] = []
    used = 0
    for i in small:
        if current and used + sizes[i] > max_file_size:
            bins.append(tuple(current))
            current, used = [], 0
        current.append(i)
        used += sizes[i]
    if current:
        bins.append(tuple(current))
    return BinPlan(tuple(b for b in bins if len(b) > 1), len(sizes), len(small))


def with_purges(plan: BinPlan, files: Sequence[DataFile]) -> BinPlan:
    """``plan`` plus a bin of its own for each file whose deletion vector marks at least PURGE_DEAD_FRACTION of
    its rows dead (Delta's purge of deletion vectors): rewriting it drops the dead rows and the vector."""
    binned = {i for b in plan.bins for i in b}
    purge = [i for i, f in enumerate(files) if i not in binned and f.deletion_vector is not None
             and f.deletion_vector.cardinality >= PURGE_DEAD_FRACTION * max(1, f.rows)]
    if not purge:
        return plan
    return replace(plan, bins=plan.bins + tuple((i,) for i in purge))


def check_sizes(min_file_size: int, max_file_size: int) -> None:
    for name, value in (("minimum file size", min_file_size), ("maximum file size", max_file_size)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise FlashError(f"{name} must be a positive number of bytes, got {value!r}")


# ----- results -------------------------------------------------------------------------------------------------
@dataclass
class FileSizeStats:
    """Delta's FileSizeStats: how many files and how big."""

    total_files: int = 0
    total_size: int = 0
    min: int | None = None
    max: int | None = None

    @property
    def avg(self) -> float:
        return self.total_size / self.total_files if self.total_files else 0.0

    def add(self, size: int) -> None:
        self.total_files += 1
        self.total_size += size
        self.min = size if self.min is None else min(self.min, size)
        self.max = size if self.max is None else max(self.max, size)

    def merge(self, other: "FileSizeStats") -> None:
        if other.total_files:
            self.total_files += other.total_files
            self.total_size += other.total_size
            self.min = other.min if self.min is None else min(self.min, other.min or 0)
            self.max = other.max if self.max is None else max(self.max, other.max or 0)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "avg": round(self.avg, 1)}


@dataclass
class PartitionOptimizeResult:
    partition: PartitionKeys
    status: str  # optimized | nothing-to-do | skipped
    compacted_version: int | None = None
    last_position: int | None = None
    bins: int = 0
    files_considered: int = 0
    files_skipped: int = 0
    files_added: FileSizeStats = field(default_factory=FileSizeStats)
    files_removed: FileSizeStats = field(default_factory=FileSizeStats)
    deltas_absorbed: int = 0
    data_change: bool = False  # True when the version absorbed deltas (new rows), False for a pure repacking
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["partition"] = [[n, v] for n, v in self.partition]
        d["files_added"] = self.files_added.to_json()
        d["files_removed"] = self.files_removed.to_json()
        return d

    def describe(self) -> str:
        where = format_partition(self.partition)
        if self.status != "optimized":
            return f"{where}: {self.status}" + (f" ({'; '.join(self.notes)})" if self.notes else "")
        return (
            f"{where}: {self.bins} bin(s), {self.files_removed.total_files} files ({self.files_removed.total_size} B) "
            f"-> {self.files_added.total_files} ({self.files_added.total_size} B); {self.files_considered} considered, "
            f"{self.files_skipped} skipped; version {self.compacted_version} "
            f"(data_change={str(self.data_change).lower()})"
        )


@dataclass
class OptimizeResult:
    """Delta-like OPTIMIZE metrics for one run over a table."""

    table_id: str
    min_file_size: int
    max_file_size: int
    partitions: list[PartitionOptimizeResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def files_added(self) -> FileSizeStats:
        out = FileSizeStats()
        for p in self.partitions:
            out.merge(p.files_added)
        return out

    @property
    def files_removed(self) -> FileSizeStats:
        out = FileSizeStats()
        for p in self.partitions:
            out.merge(p.files_removed)
        return out

    @property
    def num_files_added(self) -> int:
        return self.files_added.total_files

    @property
    def num_files_removed(self) -> int:
        return self.files_removed.total_files

    @property
    def partitions_optimized(self) -> int:
        return sum(1 for p in self.partitions if p.status == "optimized")

    @property
    def num_bins(self) -> int:
        return sum(p.bins for p in self.partitions)

    @property
    def total_considered_files(self) -> int:
        return sum(p.files_considered for p in self.partitions)

    @property
    def total_files_skipped(self) -> int:
        return sum(p.files_skipped for p in self.partitions)

    def to_json(self) -> dict[str, Any]:
        return {
            "table_id": self.table_id,
            "min_file_size": self.min_file_size,
            "max_file_size": self.max_file_size,
            "num_files_added": self.num_files_added,
            "num_files_removed": self.num_files_removed,
            "files_added": self.files_added.to_json(),
            "files_removed": self.files_removed.to_json(),
            "partitions_optimized": self.partitions_optimized,
            "num_bins": self.num_bins,
            "total_considered_files": self.total_considered_files,
            "total_files_skipped": self.total_files_skipped,
            "seconds": round(self.seconds, 4),
            "partitions": [p.to_json() for p in self.partitions],
        }


