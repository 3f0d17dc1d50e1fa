"""Functions run in spawned processes by the tests (importable by name from the tests directory)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def append_worker(uri: str, endpoint: str | None, table_id: str, partition: list, writer: int, count: int, barrier: Any) -> None:
    from flash_pipeline.catalog.catalog import Catalog

    catalog = Catalog(uri, endpoint_url=endpoint) if uri.startswith("s3://") else Catalog(uri)
    barrier.wait(timeout=120)  # all processes start appending at the same instant
    for seq in range(count):
        table = pa.table({"writer": pa.array([writer], pa.int64()), "seq": pa.array([seq], pa.int64())})
        catalog.append(table_id, partition, "upsert", [table])
