"""The compacted files a round carries by reference into its version: the checksums they keep, their deletion
vectors, and the cheap check before the commit that each still has its recorded size (``verify`` does the
thorough one)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

from flash_pipeline.catalog.deletion_vectors import DeletionVector, write_vectors
from flash_pipeline.catalog.model import DataFile
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.kernels.layout import Layout
from flash_pipeline.compactor.model.plans import RoundPlan
from flash_pipeline.errors import IntegrityError, NotFound

IO_THREADS = 8  # a HEAD (S3) or stat per file: latency-bound, so side by side


def prior_checksums(plan: RoundPlan) -> dict[str, str]:
    """Checksums recorded for the round's prior compacted files, by key, so carried files keep theirs."""
    return {s.key: plan.prior_file_checksums[s.file_number - 1] for s in plan.sources
            if s.prior and plan.prior_file_checksums}


def check_carried(storage: Storage, files: Sequence[DataFile], where: str) -> None:
    """Raise IntegrityError (exit 4) naming the first file carried by reference whose stored size is not the
    recorded one, or that is gone: committing would publish a version whose files do not match it.
    One HEAD (S3) or stat (local) per file, concurrently."""
    if not files:
        return

    def size(f: DataFile) -> int | None:
        try:
            return storage.size(f.key)
        except NotFound:
            return None
        except FileNotFoundError:
            return None

    if len(files) > 4:
        with ThreadPoolExecutor(max_workers=min(IO_THREADS, len(files))) as pool:
            sizes = list(pool.map(size, files))
    else:
        sizes = [size(f) for f in files]
    for f, got in zip(files, sizes):
        if got is None:
            raise IntegrityError(
                f"{where}: compacted file {f.key} (file {f.file_number}), carried by reference into the new version, "
                "is missing: nothing was committed; run `flash-compactor verify`"
            )
        if got != f.bytes:
            raise IntegrityError(
                f"{where}: compacted file {f.key} (file {f.file_number}), carried by reference into the new version, "
                f"holds {got} B but its version recorded {f.bytes} B: it was changed after its commit; nothing was "
                "committed; run `flash-compactor verify`"
            )


def carried_vectors(storage: Any, plan: RoundPlan, layout: Layout) -> dict[int, DeletionVector]:
    """The deletion vector of each carried prior file (by its prior file number) with dead rows: its vector
    unchanged when it lost nothing this round, else a new one (all written to one vector file of the attempt)."""
    dead_by_file: dict[int, list[np.ndarray]] = {}
    for s in plan.sources:
        if s.prior and layout.carried_file_number[s.src]:
            rows = layout.lost_rows(s.src)
            if len(rows):
                dead_by_file.setdefault(s.file_number, []).append(rows + s.row_start)
    out: dict[int, DeletionVector] = {}
    fresh: dict[int, np.ndarray] = {}
    for number, parts in dead_by_file.items():
        dead = np.concatenate(parts)
        old = plan.prior_vectors[number - 1] if plan.prior_vectors else None
        if old is not None and old.cardinality == len(dead):
            out[number] = old  # nothing new died in it: its vector is carried too
        else:
            fresh[number] = dead
    root, _, attempt = plan.data_prefix.rpartition("/")
    out.update(write_vectors(storage, root, attempt, fresh))
    return out
