"""The delta catalog: tables, partition streams, deltas and compacted stream versions on one Storage.

Layout (docs/catalog-layout.md has the full description):

    destinations/<T>/<D>.json                                          <T> is compacted into table <D>
    tables/<T>/table.json
    tables/<T>/partitions/<P>/partition.json
    tables/<T>/partitions/<P>/streams/<V>/stream.json
    tables/<T>/partitions/<P>/streams/<V>/deltas/<position>.json      commit point of a delta
    tables/<T>/partitions/<P>/streams/<V>/files/<commit id>/<n>.<ext> its files
    tables/<T>/partitions/<P>/streams/<V>/rounds/<round id>.json      round-completion files
    tables/<T>/partitions/<P>/compacted/versions/<version>.json       commit point of a compaction round
    tables/<T>/partitions/<P>/compacted/data/<attempt>/...             compacted files
    tables/<T>/partitions/<P>/compacted/index/<attempt>/...            primary key index files
    tables/<T>/partitions/<P>/compacted/data/_delta_log/<v>.json       the Delta table of the compacted versions

A delta becomes visible the instant its manifest is created (exclusive create); its files are written first,
so a reader never sees part of a delta. Positions are allocated by racing for the next manifest name.

``Catalog`` is the facade, the top of a stack of layers each using only those below it (tables.py lists them):
tables, partitions and streams (``tables.py``), compacted version numbers and manifests
(``compacted_versions.py``), their Delta Lake log (``deltalake_table.py``), deltas (``deltas.py``) and compacted
versions' commits and reads (``compacted.py``); the checks of appended files live in ``validation.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from flash_pipeline.catalog.compacted import INTERNAL_COLUMNS, CompactedLog, NewStream, user_columns
from flash_pipeline.catalog.deltalake_table import publication_enabled
from flash_pipeline.catalog.encoding import PartitionKeys
from flash_pipeline.catalog.iceberg_table import iceberg_enabled
from flash_pipeline.catalog.model import Delta
from flash_pipeline.catalog.storage import Storage
from flash_pipeline.catalog.validation import POSITION_DIGITS, VERSION_DIGITS, recovery_hint

__all__ = ["Catalog", "INTERNAL_COLUMNS", "NewStream", "POSITION_DIGITS", "VERSION_DIGITS", "iter_partition_deltas",
           "recovery_hint", "user_columns"]


class Catalog(CompactedLog):
    """Reads and commits deltas and compacted versions of the tables under one lake root (the layers are
    described in tables.py)."""

    def __init__(self, storage: Storage | str | Path, **storage_options: Any) -> None:
        # the publication switches are read at commit time: a malformed value fails here, before any write
        publication_enabled(), iceberg_enabled()
        super().__init__(storage, **storage_options)


def iter_partition_deltas(catalog: Catalog, table_id: str) -> Iterable[tuple[PartitionKeys, list[Delta]]]:
    for part in catalog.partitions(table_id):
        yield part, catalog.deltas(table_id, part)
