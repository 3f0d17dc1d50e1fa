"""Inside one compaction job each version manifest is fetched once, and a present Delta commit is asked for
once (Catalog.immutable_facts_read_once); the memory ends with the job, so a lake recreated at the same address
is read afresh."""

from __future__ import annotations

import shutil
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from compaction_helpers import DeltaLog, oracle, read_compacted, rows_of, run_compact
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.storage import LocalStorage

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.float64())])
COLUMNS = ["k", "ts", "v"]


def _delta(rng: np.random.Generator, step: int) -> pa.Table:
    n = int(rng.integers(3, 12))
    return pa.table({"k": rng.integers(0, 30, n), "ts": np.full(n, step), "v": rng.random(n)}, schema=SCHEMA)


def _counting(monkeypatch: Any) -> Counter:
    """Reads and existence checks of the local storage, by key (the real methods, counted on the way)."""
    calls: Counter = Counter()
    read, exists = LocalStorage.read, LocalStorage.exists

    def counted_read(self: LocalStorage, key: str) -> bytes:
        calls[("read", key)] += 1
        return read(self, key)

    def counted_exists(self: LocalStorage, key: str) -> bool:
        calls[("exists", key)] += 1
        return exists(self, key)

    monkeypatch.setattr(LocalStorage, "read", counted_read)
    monkeypatch.setattr(LocalStorage, "exists", counted_exists)
    return calls


def test_one_job_fetches_each_manifest_and_delta_commit_once(lake: Catalog, monkeypatch: Any) -> None:
    rng = np.random.default_rng(5)
    log = DeltaLog(lake, "M.T", (), SCHEMA)
    for step in range(3):
        log.append("upsert", [_delta(rng, step)])
        run_compact(lake, "M.T", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    log.append("upsert", [_delta(rng, 3)])
    calls = _counting(monkeypatch)
    run_compact(lake, "M.T", None, None)
    manifests = {key: n for (op, key), n in calls.items() if op == "read" and "/compacted/versions/" in key}
    assert manifests and max(manifests.values()) == 1, manifests
    present = {key: n for (op, key), n in calls.items() if op == "exists" and "/_delta_log/" in key and lake.storage.exists(key)}
    assert present and max(present.values()) == 1, present
    assert lake._immutable_memo is None, "the memory must end with the job"
    assert rows_of(read_compacted(lake, "M.T", ()), COLUMNS) == rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], COLUMNS), COLUMNS)


def test_a_lake_recreated_at_the_same_address_is_read_afresh(lake: Catalog) -> None:
    """One long-lived catalog (a Dagster resource holds one): the lake is deleted and rebuilt with other rows
    between two jobs; the second job must plan on the new lake's manifests, not remembered ones."""
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        log = DeltaLog(lake, "M.R", (), SCHEMA)
        for step in range(2):
            log.append("upsert", [_delta(rng, step)])
            run_compact(lake, "M.R", ["k"], [("ts", "ascending")], hash_bucket_count=2)
        want = rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], COLUMNS), COLUMNS)
        assert rows_of(read_compacted(lake, "M.R", ()), COLUMNS) == want
        shutil.rmtree(lake.storage.root)
