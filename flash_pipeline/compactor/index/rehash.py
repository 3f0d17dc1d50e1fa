"""Primary key index rehashing: the index alone, re-split into a new bucket count (digest modulo N).

No table data is read. The result is committed as a new compacted stream version that keeps the same files
(``data_change=False``) and points at the new index version; the old index version can then be deleted.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Callable

import numpy as np

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.commits import Attempt, retry_on_moved_base
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.catalog.model import CompactedVersion, IndexVersion
from flash_pipeline.compactor.carried_files import check_carried
from flash_pipeline.compactor.index import dead_entries, pk_index
from flash_pipeline.compactor.model.options import DEFAULT_ROWS_PER_INDEX_FILE, check_bucket_count
from flash_pipeline.compactor.model.rows import take_rows
from flash_pipeline.errors import FlashError


def rehash_version(catalog: Catalog, prior: CompactedVersion, bucket_count: int,
                   rows_per_file: int | None = None) -> CompactedVersion:
    """Commit ``prior`` with its index re-split into ``bucket_count`` buckets, as version ``prior.version + 1``.

    Index files hold at most ``rows_per_file`` rows: by default the count the table's compaction recorded."""
    if rows_per_file is None:
        rows_per_file = int(prior.options.get("rows_per_primary_key_index_file", DEFAULT_ROWS_PER_INDEX_FILE))
    if prior.index is None:
        raise FlashError(f"compacted version {prior.version} of {prior.table_id!r} has no primary key index to rehash")
    if bucket_count < 1:
        raise FlashError(f"hash bucket count must be at least 1, got {bucket_count}")
    # the data files are carried unread: as a compaction does, check that each still has its recorded size
    check_carried(catalog.storage, prior.files, f"{prior.table_id!r} [{format_partition(prior.partition)}]")
    rows = pk_index.read_all(catalog.storage, prior.index)
    if prior.index.dead_rows:  # carried index files' dead entries: not carried into the re-split index
        rows = dead_entries.live_rows(rows, dead_entries.version_dead_pointers(catalog, prior.files))
    buckets = pk_index.bucket_of_rows(rows, bucket_count)
    order = np.argsort(buckets, kind="stable")
    grouped = take_rows(rows, order)
    bounds = np.concatenate(([0], np.cumsum(np.bincount(buckets, minlength=bucket_count))))
    version = prior.version + 1
    attempt = f"{version:010d}-{uuid.uuid4().hex[:12]}"
    prefix = f"{catalog.compacted_prefix(prior.table_id, prior.partition)}/index/{attempt}"
    # files are removed on failure only when this attempt is known not to be committed (see Attempt)
    with Attempt(catalog, prior.table_id, prior.partition, prior.version,
                 lambda: catalog.storage.delete_prefix(prefix)) as txn:
        files = tuple(
            pk_index.write_bucket(catalog.storage, prefix, b, grouped[bounds[b] : bounds[b + 1]], rows_per_file)
            for b in range(bucket_count)
        )
        index = IndexVersion(prior.index.version + 1, bucket_count, prior.index.sort_key_width, files)
        new = prior.replace(
            version=version,
            index=index,
            commit_id=uuid.uuid4().hex,
            created_at=time.time(),
            data_change=False,
            stats={"rehash": {"from": prior.index.hash_bucket_count, "to": bucket_count, "rows": int(len(rows))}},
        )
        txn.commit(new)
    return new


def rehash(
    catalog: Catalog | str,
    table_id: str,
    hash_bucket_count: int,
    partitions: list | None = None,
    log: Callable[[str], None] = lambda message: print(message, file=sys.stderr),
    rows_per_index_file: int | None = None,
) -> list[CompactedVersion]:
    """Rehash the index of every (or the named) compacted partition of ``table_id`` to ``hash_bucket_count``."""
    check_bucket_count(hash_bucket_count)  # the documented bound on requests (automatic choices may exceed it)
    cat = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
    cat.require_table(table_id)
    parts = [normalize_partition(p) for p in partitions] if partitions else cat.compacted_partitions(table_id)
    out = []
    for part in parts:

        def attempt(part: PartitionKeys = part) -> CompactedVersion:
            cat.settle_compacted(table_id, part)  # a Delta commit whose writer died: completed before planning
            prior = cat.latest_compacted(table_id, part)
            if prior is None:
                raise FlashError(f"{table_id!r} [{format_partition(part)}] has never been compacted: nothing to rehash")
            return rehash_version(cat, prior, hash_bucket_count, rows_per_index_file)

        out.append(retry_on_moved_base(attempt, f"rehash {table_id} [{format_partition(part)}]", log))
    return out
