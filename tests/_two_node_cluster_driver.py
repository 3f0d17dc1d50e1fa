"""Run one compaction on a two-node Ray cluster simulated with ray.cluster_utils.Cluster (own process).

Launched by tests/test_determinism_and_cluster.py; exits 0 when the compacted table equals the DuckDB oracle,
1 on a mismatch (the difference is printed), and lets any other failure escape (non-zero exit as well).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import ray
from ray.cluster_utils import Cluster

from compaction_helpers import DeltaLog, oracle, read_compacted, rows_of
from flash_pipeline import Catalog, compact

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("ts", pa.int64()), ("v", pa.int64())])
TABLE = "ACME.CLUSTER.V1"


def main() -> int:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        with tempfile.TemporaryDirectory() as d:
            cat = Catalog(Path(d) / "lake")
            logs = {}
            for day in ("d1", "d2"):
                logs[day] = log = DeltaLog(cat, TABLE, {"day": day}, SCHEMA)
                rows = lambda start, n: pa.Table.from_pylist(  # noqa: E731
                    [{"k": "abc"[i % 3] if i % 7 else None, "n": i % 4, "ts": (i * 37) % 11, "v": i} for i in range(start, start + n)],
                    schema=SCHEMA,
                )
                log.append("upsert", [rows(0, 20), rows(20, 15)])
                log.append("delete", [pa.Table.from_pylist([{"k": "a", "n": 1}, {"k": None, "n": 0}], schema=pa.schema([SCHEMA.field(c) for c in ["k", "n"]]))])
                log.append("upsert", [rows(35, 10), rows(45, 0), rows(45, 6)])
            result = compact(
                TABLE,
                ["k", "n"],
                sort_keys=[("ts", "descending")],
                catalog=cat,
                hash_bucket_count=4,
                rows_per_compacted_file=5,
                rows_per_primary_key_index_file=3,
                ray_address=cluster.address,
                progress=lambda m: None,
            )
            assert ray.is_initialized()
            alive = [n for n in ray.nodes() if n["Alive"]]
            if len(alive) != 2 or int(ray.cluster_resources().get("CPU", 0)) != 2:
                print(f"expected the 2-node, 2-CPU cluster, got {len(alive)} nodes and {ray.cluster_resources()}")
                return 1
            if len(result.partitions) != 2:
                print(f"expected two compacted partitions, got {result.partitions}")
                return 1
            for day, log in logs.items():
                want = rows_of(oracle(log.log_table(), ["k", "n"], [("ts", "descending")], SCHEMA.names), SCHEMA.names)
                got = rows_of(read_compacted(cat, TABLE, {"day": day}), SCHEMA.names)
                if got != want:
                    print(f"mismatch in {day}:\n got  {got}\n want {want}")
                    return 1
        print("OK: two-node cluster compaction matches the oracle")
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
