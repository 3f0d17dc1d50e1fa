"""Dead entries of the primary key index (issue 58): with deletion vectors, an index file whose compacted files were
all carried is carried by reference even when keys in it lost, and the rows of those keys stay in its bytes,
pointing at rows the version's deletion vectors mark dead (IndexFile.dead_rows counts them). Every reader of the
index drops them with these helpers: dedupe's probe (by rank: steps/dedupe.py), the index writer (which folds
them in when it rewrites a file), verify, rehash, optimize's remap and merge-on-read."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.model import DataFile


def row_pointers(rows: np.ndarray) -> np.ndarray:
    """Each index row's pointer as one int64, file number << 40 | row index (ascending in pointer order)."""
    return (rows["file"].astype(np.int64) << np.int64(40)) | rows["row"].astype(np.int64)


def dead_mask(rows: np.ndarray, dead_pointers: np.ndarray | None) -> np.ndarray:
    """Which index rows point at a row a deletion vector marks dead (``dead_pointers``: ascending, as
    row_pointers): the dead entries of an index file carried by reference (IndexFile.dead_rows)."""
    if dead_pointers is None or not len(dead_pointers) or not len(rows):
        return np.zeros(len(rows), dtype=bool)
    pointers = row_pointers(rows)
    at = np.minimum(np.searchsorted(dead_pointers, pointers), len(dead_pointers) - 1)
    return dead_pointers[at] == pointers


def live_rows(rows: np.ndarray, dead_pointers: np.ndarray | None) -> np.ndarray:
    """The index rows of live keys: ``rows`` without its dead entries."""
    dead = dead_mask(rows, dead_pointers)
    return rows[~dead] if dead.any() else rows


def dead_pointers(dead_by_file: Mapping[int, np.ndarray]) -> np.ndarray:
    """Dead rows by file number (each ascending) as ascending index pointers."""
    parts = [(np.int64(n) << np.int64(40)) | dead_by_file[n].astype(np.int64) for n in sorted(dead_by_file)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def version_dead_pointers(catalog: Catalog, files: Sequence[DataFile]) -> np.ndarray:
    """The dead rows of a version's data files (``catalog.dead_rows``) as ascending index pointers."""
    return dead_pointers({f.file_number: catalog.dead_rows(f) for f in files if f.deletion_vector is not None})
