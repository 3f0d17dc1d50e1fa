"""Small files read in turn or ahead on threads (``Storage.read_ahead``, ``FLASH_READ_AHEAD``): the same rows
either way, the setting travels with the storage to Ray tasks, and a bad value stops a command in one line."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from compaction_helpers import DeltaLog, assert_compact_command_refused, fresh_lake, oracle, read_compacted, rows_of, run_compact
from flash_pipeline import Catalog
from flash_pipeline.compactor.steps import source_io

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.string())])


def _compact_small_deltas(monkeypatch: pytest.MonkeyPatch, read_ahead: str | None, seed: int) -> tuple[list, list, list[int]]:
    """40 small deltas (upserts and deletes) compacted in process; returns (rows, oracle rows, read-ahead pool sizes)."""
    if read_ahead is None:
        monkeypatch.delenv("FLASH_READ_AHEAD", raising=False)
    else:
        monkeypatch.setenv("FLASH_READ_AHEAD", read_ahead)
    pools: list[int] = []

    class Recording(ThreadPoolExecutor):
        def __init__(self, max_workers: int, **kw: Any) -> None:
            pools.append(max_workers)
            super().__init__(max_workers, **kw)

    monkeypatch.setattr(source_io, "ThreadPoolExecutor", Recording)
    rng = np.random.default_rng(seed)
    with fresh_lake() as cat:
        log = DeltaLog(cat, "T", {"p": "a"}, SCHEMA)
        for i in range(40):
            n = int(rng.integers(1, 60))
            k = rng.integers(0, 300, n)
            if i % 9 == 8:
                log.append("delete", [pa.table({"k": k}, schema=pa.schema([SCHEMA.field("k")]))])
            else:
                log.append("upsert", [pa.table({"k": k, "ts": rng.integers(0, 5, n), "v": [f"{i}-{j}" for j in range(n)]}, schema=SCHEMA)])
        run_compact(cat, "T", ["k"], [("ts", "ascending")], executor="in-process", hash_bucket_count=2)
        got = rows_of(read_compacted(cat, "T", {"p": "a"}), SCHEMA.names)
        want = rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], SCHEMA.names), SCHEMA.names)
    return got, want, pools


@pytest.mark.parametrize("seed", [1, 2])
def test_small_files_read_in_turn_or_ahead_give_the_same_rows(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    got_default, want, pools_default = _compact_small_deltas(monkeypatch, None, seed)
    assert got_default == want
    assert pools_default == [], "a local lake reads its small files in turn by default"
    got_ahead, want_ahead, pools_ahead = _compact_small_deltas(monkeypatch, "4", seed)
    assert got_ahead == want_ahead == want
    assert pools_ahead and set(pools_ahead) == {4}, pools_ahead


def test_the_setting_travels_with_the_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray tasks unpickle the driver's storage: they read as the driver was told, whatever their environment."""
    monkeypatch.setenv("FLASH_READ_AHEAD", "3")
    storage = Catalog(tmp_path / "lake").storage
    assert storage.read_ahead == 3
    monkeypatch.delenv("FLASH_READ_AHEAD")
    assert pickle.loads(pickle.dumps(storage)).read_ahead == 3
    assert Catalog(tmp_path / "lake").storage.read_ahead == 0


def test_s3_reads_ahead_by_default_and_keeps_the_setting_when_pickled(s3_lake: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    assert s3_lake.storage.read_ahead == 8
    monkeypatch.setenv("FLASH_READ_AHEAD", "2")
    copy = pickle.loads(pickle.dumps(s3_lake.storage))  # rebuilt from the pickled state, not the environment
    assert copy.read_ahead == 8


@pytest.mark.parametrize("value", ["many", "-1", "65", "2.5"])
def test_a_bad_flash_read_ahead_is_refused_in_one_line_before_anything_is_written(tmp_path: Path, value: str) -> None:
    """Through the CLI: exit non-zero, one line naming the variable and what to set, the lake as it was."""
    assert_compact_command_refused(tmp_path, {"FLASH_READ_AHEAD": value}, "FLASH_READ_AHEAD must be a whole number")
