"""The asset keys of one configured table (every module of the Dagster layer names assets through these)."""

from __future__ import annotations

from dagster import AssetKey

from resources.config import TableConfig


def keys(table: TableConfig) -> dict[str, AssetKey]:
    """load (tables with a PySpark load), deltas, compacted, index, rehash and optimized: the assets of a table."""
    return {
        "load": AssetKey([table.name, "load"]),
        "deltas": AssetKey([table.name, "deltas"]),
        "compacted": AssetKey([table.name, "compacted"]),
        "index": AssetKey([table.name, "pk_index"]),
        "rehash": AssetKey([table.name, "index_rehash"]),
        "optimized": AssetKey([table.name, "optimized"]),
    }
