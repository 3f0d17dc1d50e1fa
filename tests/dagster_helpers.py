"""Shared helpers of the Dagster tests (no test functions here)."""

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from dagster import DagsterInstance, build_sensor_context

REPO = Path(__file__).resolve().parents[1]

TABLES_YAML = """
defaults:
  rehash_buckets: 3
tables:
  - name: orders
    source: T.ORDERS
    destination: T.ORDERS_COMPACTED
    primary_keys: [id]
    sort_keys: ["ts:ascending"]
    rows_per_file: 3
    hash_buckets: 2
    trigger: {policy: immediate}
  - name: batched
    source: T.BATCHED
    primary_keys: [id]
    trigger: {policy: upsolver, min_files: 3, quiet_seconds: 100, max_files: 6, small_file_bytes: 1000000, stale_seconds: 10000, max_pending_rows: 50}
"""


# one table compacted on any new delta (the feed and scale tests)
ONE_TABLE = """
tables:
  - name: orders
    source: T.ORDERS
    destination: T.ORDERS_COMPACTED
    primary_keys: [id]
    sort_keys: ["ts:ascending"]
    hash_buckets: 2
    trigger: {policy: immediate}
"""


def write_config(tmp_path: Path, text: str = TABLES_YAML) -> Path:
    p = tmp_path / "tables.yaml"
    p.write_text(text)
    return p


def rows(ids: list[int], ts: list[int] | None = None, day: str = "d1") -> pa.Table:
    ts = ts if ts is not None else [1] * len(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "day": [day] * len(ids), "ts": pa.array(ts, pa.int64()), "v": [f"v{i}" for i in ids]})


def tick(defs: Any, instance: DagsterInstance, cursor: str | None, name: str = "new_delta_sensor", resources: dict | None = None) -> tuple[Any, str | None]:
    """Evaluate a sensor once like the daemon would: apply partition requests, return (result, new cursor)."""
    sensor = defs.resolve_sensor_def(name)
    resources = resources if resources is not None else {k: v for k, v in defs.resources.items() if k in ("catalog", "sqs")}
    ctx = build_sensor_context(instance=instance, cursor=cursor, definitions=defs, resources=resources)
    result = sensor(ctx)
    for req in getattr(result, "dynamic_partitions_requests", None) or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    new_cursor = getattr(result, "cursor", None) or ctx.cursor
    return result, new_cursor


def run_requests(result: Any) -> list[Any]:
    return list(getattr(result, "run_requests", None) or [])


def streams_of(req: Any) -> list[str]:
    """The partition streams a run request compacts: a batched run's from its config, else its partition."""
    if req.partition_key is not None:
        return [req.partition_key]
    (op,) = req.run_config["ops"].values()
    return list(op["config"]["partitions"])


def request_for(result: Any, partition: str) -> Any:
    """The run request (of a tick's ``result``) that compacts ``partition``."""
    return next(r for r in run_requests(result) if partition in streams_of(r))


def cursor_entries(cursor: str, table: str) -> dict[str, Any]:
    return json.loads(cursor)["tables"][table]
