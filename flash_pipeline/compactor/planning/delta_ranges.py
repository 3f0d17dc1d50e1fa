"""The range of a session's delta keys before any row is read, for the latency planner.

Why: without it the planner takes every update as spread over the whole table, so a 1% update clustered in one
of ten compacted files was predicted at the cost of rewriting and probing all ten (scenario 3: "expected 5.7s"
for a 0.8 s compaction), and an SLA check could call a quick session slow. The compacted files record the range
of their first key column (catalog/key_ranges.py); the deltas' range comes from their Parquet footers' row group
statistics: one ranged read per delta file (catalog/parquet_footers.py; side by side on an object store),
bounded by MAX_FOOTERS so that a session of thousands of small deltas (where the answer hardly matters) reads
none. The round computes the exact
range from the rows and dedupe skips by that one: this estimate only steers the prediction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import pyarrow as pa

from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.key_ranges import KeyRange, footer_key_range
from flash_pipeline.catalog.parquet_footers import read_footer
from flash_pipeline.catalog.storage import overlapped
from flash_pipeline.errors import FlashError

if TYPE_CHECKING:
    from flash_pipeline.catalog.model import CompactedVersion, DataFile, Delta
    from flash_pipeline.catalog.storage import Storage

MAX_FOOTERS = 16


def delta_key_range(storage: "Storage", deltas: Sequence["Delta"], prior: "CompactedVersion | None") -> KeyRange | None:
    """The range of the deltas' values of the column the prior version's files record ranges of; None when no
    prior file records one, when the deltas hold more than MAX_FOOTERS files, or when a file's footer does not
    give the range (not Parquet, a null, no statistics, the column missing or not an integer)."""
    if prior is None:
        return None
    column = next((f.key_range.column for f in prior.files if f.key_range is not None), None)
    files = [f for d in deltas for f in d.files]
    if column is None or not files or len(files) > MAX_FOOTERS:
        return None
    files = [f for f in files if f.rows]
    if any(f.content_type is not ContentType.PARQUET for f in files):
        return None

    def file_range(f: "DataFile") -> KeyRange | None:
        try:
            return footer_key_range(read_footer(storage, f.key, f.bytes), column)
        except (FlashError, OSError, pa.ArrowException):  # the round meets it again and reports it as usual
            return None

    found = overlapped(storage, file_range, files, "flash-footer")  # side by side on an object store
    if not found or any(r is None for r in found):
        return None
    return KeyRange(column, min(r.low for r in found if r), max(r.high for r in found if r))
