"""Key ranges: the least and greatest value of a table's first primary key column in a set of rows.

Why: an incremental round probes the prior primary key index for the keys its deltas touch. The index holds
SHA-1 digests, in no key order, so the probe read every index file of a bucket: scenario 3 read 176 MiB of
index to find the 1% of keys that all live in one of ten compacted files. A compacted file now records the
range of its first key column (``DataFile.key_range``), and the hash bucket step the range of the deltas' keys;
an index file whose compacted files all lie outside the deltas' range holds no touched key, and dedupe skips it
unread (steps/dedupe.py, stream_probe). That is zone-map pruning, exact: a key outside a file's range is not
in it.

Only integer columns without nulls get a range. For them equal values are equal keys and the reverse (a
column has one type in the whole stream, and the digest frames its value), so a range comparison never misses
a key the digest would match. Floats (-0.0, NaN), nulls, strings and temporal types are left out: their
equality and order take more care than the saving is worth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class KeyRange:
    """``column``'s values lie in [low, high] (inclusive) in the rows it describes."""

    column: str
    low: int
    high: int

    def overlaps(self, other: "KeyRange") -> bool:
        """Whether a key in ``other`` may lie in this range (always, for ranges of different columns)."""
        return self.column != other.column or (self.low <= other.high and other.low <= self.high)

    def to_json(self) -> dict[str, Any]:
        return {"column": self.column, "min": self.low, "max": self.high}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "KeyRange":
        return cls(str(d["column"]), int(d["min"]), int(d["max"]))


@dataclass
class KeyRangeBuilder:
    """The range of the rows fed to it so far. ``known`` turns False for good when a fed column is not an
    integer column or holds a null: then no range describes the rows. Small and picklable: a Ray task returns
    its builder, and the driver merges them."""

    column: str
    known: bool = True
    low: int | None = None
    high: int | None = None

    def add(self, table: pa.Table) -> None:
        if not self.known or table.num_rows == 0:
            return
        if self.column not in table.column_names:
            self.known = False
            return
        col = table.column(self.column)
        if not pa.types.is_integer(col.type) or col.null_count:
            self.known = False
            return
        mm = pc.min_max(col)
        self._widen(mm["min"].as_py(), mm["max"].as_py())

    def _widen(self, low: int | None, high: int | None) -> None:
        if low is None or high is None:
            return
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def merge(self, other: "KeyRangeBuilder") -> None:
        """Fold in the rows ``other`` saw (of the same column)."""
        if not other.known or other.column != self.column:
            self.known = False
            return
        self._widen(other.low, other.high)

    def watching(self, tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
        """``tables`` passed on unchanged, each fed to this builder on its way."""
        for table in tables:
            self.add(table)
            yield table

    def result(self) -> KeyRange | None:
        """The range of the rows seen; None when unknown or when no row was seen."""
        if not self.known or self.low is None or self.high is None:
            return None
        return KeyRange(self.column, self.low, self.high)


def merged(builders: Iterable[KeyRangeBuilder | None], column: str) -> KeyRange | None:
    """The range of all rows several builders saw; None if any of them is missing or unknown."""
    out = KeyRangeBuilder(column)
    for b in builders:
        if b is None:
            return None
        out.merge(b)
    return out.result()


def key_range_of(rows: pa.Table, primary_keys: Sequence[str]) -> KeyRange | None:
    """The range of ``rows``' first primary key column, as a compaction records it for a file it writes (None
    without primary keys): optimize records it for a packed file of a keyed version, so that the next round's
    probe skips index files by it."""
    if not primary_keys:
        return None
    builder = KeyRangeBuilder(primary_keys[0])
    builder.add(rows)
    return builder.result()


def files_miss(ranges: Sequence[KeyRange | None], first: int, last: int, key_range: KeyRange | None) -> bool:
    """Whether compacted files ``first``..``last`` (numbers from 1 into ``ranges``) all record a range that misses
    ``key_range``: an index file pointing only at them holds none of its keys. An unknown range or an unrecorded
    file number answers False (the index file is read)."""
    if key_range is None or not first or not last or last > len(ranges):
        return False
    return all(r is not None and not r.overlaps(key_range) for r in ranges[first - 1 : last])


def footer_key_range(meta: Any, column: str) -> KeyRange | None:
    """The range of integer column ``column`` in a Parquet file, from its footer's row group statistics
    (``meta``: a ``pyarrow.parquet.FileMetaData``); None when the column is missing, not a plain integer, may
    hold a null, or a row group has no min/max. The latency planner's estimate of a delta's keys, before any
    row is read (the round computes the exact range from the rows: KeyRangeBuilder)."""
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if column not in names:
        return None
    i = names.index(column)
    described = meta.schema.column(i)
    if described.physical_type not in ("INT32", "INT64") or described.logical_type.type not in ("NONE", "INT"):
        return None
    low = high = None
    for g in range(meta.num_row_groups):
        if meta.row_group(g).num_rows == 0:
            continue
        stats = meta.row_group(g).column(i).statistics
        if stats is None or not stats.has_min_max or not stats.has_null_count or stats.null_count:
            return None
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    return None if low is None or high is None else KeyRange(column, int(low), int(high))
