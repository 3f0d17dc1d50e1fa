"""After optimize rewrites files: every primary key index pointer moved to the file and row its row now lives
at, a row of a purged file (deletion vector dropped) moving up by the dead rows before it."""

from __future__ import annotations

import numpy as np

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import format_partition
from flash_pipeline.catalog.model import CompactedVersion, IndexVersion
from flash_pipeline.compactor.model.options import DEFAULT_ROWS_PER_INDEX_FILE
from flash_pipeline.errors import IntegrityError, InternalError


def dead_row_keys(dead: dict[int, np.ndarray]) -> np.ndarray:
    """The purged rows of every file as one ascending array of ``file number << 32 | row`` (row indexes are
    uint32), so that the dead rows before an index row's pointer are two ``searchsorted`` calls: one pass over
    a bucket whatever the number of purged files (a pass per purged file was O(files x rows))."""
    if not dead:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([(np.int64(number) << 32) | np.asarray(dead[number], dtype=np.int64)
                           for number in sorted(dead)])


def rows_after_purge(file: np.ndarray, row: np.ndarray, dead_keys: np.ndarray) -> np.ndarray:
    """Each live row's index in its file once the file's dead rows (``dead_row_keys``) are dropped: its
    index less the dead rows before it."""
    if not len(dead_keys):
        return row
    return row - (np.searchsorted(dead_keys, (file << 32) | row) - np.searchsorted(dead_keys, file << 32))


def remap_index(
    cat: Catalog,
    prior: CompactedVersion,
    file_numbers: list[int],
    target: np.ndarray,
    offset: np.ndarray,
    index_prefix: str,
    dead: dict[int, np.ndarray] | None = None,
) -> IndexVersion:
    """The prior index with every (file, row) pointer moved to the file and row its row now lives at (a row of a
    purged file moves up by the dead rows before it)."""
    from flash_pipeline.compactor.index import dead_entries, pk_index

    if prior.index is None:
        raise InternalError(f"compacted version {prior.version} of {prior.table_id}: remapping an index it does not "
                            "have")
    n = len(prior.files)
    if file_numbers != list(range(1, n + 1)):
        raise IntegrityError(f"compacted version {prior.version} of {prior.table_id} "
                             f"[{format_partition(prior.partition)}]: file numbers are not 1..{n}; run flash-compactor "
                             "verify")
    new_number = np.concatenate(([0], target)).astype(np.int64)  # by old file number
    row_offset = np.concatenate(([0], offset)).astype(np.int64)
    per_file = max((f.rows for files in prior.index.buckets for f in files), default=0) or DEFAULT_ROWS_PER_INDEX_FILE
    dead_keys = dead_row_keys(dead or {})
    # the dead entries of carried index files (IndexFile.dead_rows) are dropped: the remapped index has none
    gone = dead_entries.version_dead_pointers(cat, prior.files) if prior.index.dead_rows else None
    buckets = []
    for b in range(prior.index.hash_bucket_count):
        rows = dead_entries.live_rows(pk_index.read_bucket(cat.storage, prior.index, b), gone).copy()
        old = rows["file"].astype(np.int64)
        if len(old) and (old.min() < 1 or old.max() > n):
            raise IntegrityError(f"compacted version {prior.version} of {prior.table_id} "
                                 f"[{format_partition(prior.partition)}]: index bucket {b} points outside files "
                                 f"1..{n}; run flash-compactor verify, then compact --rebuild")
        row = rows["row"].astype(np.int64)
        rows["row"] = rows_after_purge(old, row, dead_keys) + row_offset[old]
        rows["file"] = new_number[old]
        buckets.append(pk_index.write_bucket(cat.storage, index_prefix, b, rows, per_file))
    return IndexVersion(prior.index.version + 1, prior.index.hash_bucket_count, prior.index.sort_key_width,
                        tuple(buckets))
