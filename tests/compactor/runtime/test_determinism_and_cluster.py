"""Deterministic output, and a compaction on a two-node Ray cluster (simulated with ray.cluster_utils.Cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from compaction_helpers import DeltaLog, assert_layout_invariants, fresh_lake, oracle, read_compacted, rows_of, run_compact

TESTS = Path(__file__).resolve().parents[2]  # tests/, where the driver scripts live
REPO = TESTS.parent
TABLE = "ACME.DETERMINISM.V1"
PART = {"day": "d1"}
PART_T = (("day", "d1"),)
SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("ver", pa.int64()), ("v", pa.int64())])
PKS = ["k", "n"]
SORT_KEYS = [("ver", "ascending")]


def _load(cat: Any) -> DeltaLog:
    log = DeltaLog(cat, TABLE, PART, SCHEMA)

    def rows(start: int, n: int) -> pa.Table:
        return pa.Table.from_pylist(
            [{"k": ["a", "ab", "", None][i % 4], "n": i % 5, "ver": (i * 7) % 4 if i % 6 else None, "v": i} for i in range(start, start + n)],
            schema=SCHEMA,
        )

    log.append("upsert", [rows(0, 17), rows(17, 0), rows(17, 9)])
    log.append("delete", [pa.Table.from_pylist([{"k": "a", "n": 0}, {"k": None, "n": 3}], schema=pa.schema([SCHEMA.field(c) for c in PKS]))])
    log.append("upsert", [rows(26, 11), rows(37, 5)])
    return log


def _compact(cat: Any) -> None:
    run_compact(cat, TABLE, PKS, SORT_KEYS, hash_bucket_count=3, rows_per_compacted_file=3, rows_per_primary_key_index_file=4)


def _snapshot(cat: Any) -> tuple[list[tuple[int, int, list[dict]]], list[list[bytes]]]:
    cv = cat.latest_compacted(TABLE, PART_T)
    files = [(f.file_number, f.rows, cat.read_file(f).to_pylist()) for f in sorted(cv.files, key=lambda f: f.file_number)]
    index = [[cat.storage.read(ix.key) for ix in bucket] for bucket in cv.index.buckets]
    return files, index


def test_same_input_compacts_to_the_same_files_rows_and_order() -> None:
    snapshots = []
    for _ in range(2):
        with fresh_lake() as cat:
            log = _load(cat)
            _compact(cat)
            assert_layout_invariants(cat, TABLE, PART, 3, 4)
            want = rows_of(oracle(log.log_table(), PKS, SORT_KEYS, SCHEMA.names), SCHEMA.names)
            assert rows_of(read_compacted(cat, TABLE, PART), SCHEMA.names) == want
            snapshots.append(_snapshot(cat))
    (files_a, index_a), (files_b, index_b) = snapshots
    assert len(files_a) > 1  # the split into several files is part of what must repeat
    assert files_a == files_b  # same split, same rows, same order
    assert index_a == index_b  # and byte-identical primary key index files


def test_compaction_on_a_two_node_ray_cluster() -> None:
    """The main test process already has a local Ray, so the cluster and its driver run in a subprocess."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("FLASH_RAY_ADDRESS", None)
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, str(TESTS / "_two_node_cluster_driver.py")],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "OK: two-node cluster compaction matches the oracle" in proc.stdout
