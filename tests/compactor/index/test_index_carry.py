"""Index files carried by reference (issue 15, item 4): an incremental round whose changes are clustered in a few
compacted files rewrites only the index files of those files; the others stay where they are, read through the
``file_shift`` their new entry records. Checked against the DuckDB oracle, a hand check of every pointer, and
``verify``, across retention (an expired version's carried index files must stay)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flash_pipeline import Catalog
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.kernels.digest import sort_key_bytes
from flash_pipeline.retention import retain
from flash_pipeline.verify import verify
from tests.compaction_helpers import DeltaLog, oracle, read_compacted, rows_of, run_compact
from tests.compactor.index.test_rehash_and_incremental import check_index_resolves

SCHEMA = pa.schema([("k", pa.int64()), ("region", pa.string()), ("ts", pa.int64()), ("v", pa.float64())])
PKS = ["k", "region"]
SORT = [("ts", "ascending")]


def _rows(keys: np.ndarray, rng: np.random.Generator, ts: int) -> pa.Table:
    return pa.table({"k": keys, "region": np.array(["n", "s", "e"])[keys % 3], "ts": np.full(len(keys), ts), "v": rng.random(len(keys))}, schema=SCHEMA)


def _check(cat: Catalog, log: DeltaLog) -> None:
    assert rows_of(read_compacted(cat, "C.T", ()), SCHEMA.names) == rows_of(oracle(log.log_table(), PKS, SORT, SCHEMA.names), SCHEMA.names)
    check_index_resolves(cat, "C.T")
    cv = cat.latest_compacted("C.T", ())
    files = {f.file_number: cat.read_file(f) for f in cv.files}
    for b in range(cv.index.hash_bucket_count):  # sort bytes too, and each file's recorded compacted files
        for f in cv.index.buckets[b]:
            rows = pk_index.file_rows(cat.storage.read(f.key), f, cv.index.sort_key_width)
            assert f.first_file == int(rows["file"].min()) and f.last_file == int(rows["file"].max()), f
            for fn in np.unique(rows["file"]):
                sel = rows["file"] == fn
                want = sort_key_bytes(files[int(fn)].take(pa.array(rows["row"][sel].astype(np.int64))), SORT)
                assert np.ascontiguousarray(rows["sort"][sel]).view(np.uint8).reshape(-1, want.shape[1]).tolist() == want.tolist()
    result = verify(cat, "C.T", all_versions=True)
    assert not result.problems, [p.describe() if hasattr(p, "describe") else p for p in result.problems]


@pytest.mark.parametrize("seed", range(6))
def test_clustered_changes_carry_index_files_and_stay_correct(tmp_path: Any, monkeypatch: Any, seed: int) -> None:
    # index files of one compacted file, or spanning several (a change in any of them rewrites the index file)
    monkeypatch.setattr(pk_index, "MIN_INDEX_FILE_ROWS", [8, 40, 120, 8, 70, 8][seed])
    rng = np.random.default_rng(seed)
    cat = Catalog(tmp_path / "lake")
    log = DeltaLog(cat, "C.T", (), SCHEMA)
    # keys arrive in order, so each compacted file holds a key range: later updates of a range are clustered
    log.append("upsert", [_rows(np.arange(0, 600), rng, 1)])
    opts: dict[str, Any] = {"hash_bucket_count": int(rng.integers(1, 4)), "rows_per_compacted_file": 100, "executor": "in-process"}
    run_compact(cat, "C.T", PKS, SORT, **opts)
    carried_total = 0
    for step in range(6):
        low = int(rng.integers(0, 550))
        if step == 3:  # a delete of a whole key range: a compacted file disappears, later ones are renumbered
            log.append("delete", [_rows(np.arange(low - low % 100, low - low % 100 + 100), rng, 0).select(["k", "region"])])
        else:
            log.append("upsert", [_rows(rng.integers(low, low + 40, int(rng.integers(1, 30))), rng, 2 + step)])
        res = run_compact(cat, "C.T", PKS, SORT, **opts)
        part = res.partitions[0]
        cv = cat.latest_compacted("C.T", ())
        own = [f for files in cv.index.buckets for f in files if f"/{cv.version:010d}-" in f.key]
        carried = [f for files in cv.index.buckets for f in files if f not in own]
        assert part.index_bytes_carried == sum(f.bytes for f in carried)
        assert part.index_bytes_written == sum(f.bytes for f in own)
        carried_total += len(carried)
        _check(cat, log)
        if step == 3:
            assert any(f.file_shift for f in carried), "a renumbered compacted file's index file was not carried"
    assert carried_total > 0
    # an expired version's folder keeps the index files the retained versions carried from it
    retain(cat, "C.T", keep_last=1)
    _check(cat, log)
    log.append("upsert", [_rows(np.arange(10, 30), rng, 50)])
    run_compact(cat, "C.T", PKS, SORT, **opts)
    _check(cat, log)


@pytest.mark.parametrize("seed", range(5))
def test_spread_updates_with_vectors_carry_every_index_file_with_its_dead_entries(tmp_path: Any, monkeypatch: Any,
                                                                                 seed: int) -> None:
    """Issue 58 item 4: updates and deletes spread over every compacted file (each carried with a deletion vector)
    carry every index file too, the keys that lost left in its bytes as dead entries it records; only the new rows'
    index file is written. Later rounds probe past the dead entries (a deleted key inserted again with a lower sort
    key survives), and a round that rewrites a compacted file (past the dead fraction) folds the entries in."""
    monkeypatch.setattr(pk_index, "MIN_INDEX_FILE_ROWS", 8)
    rng = np.random.default_rng(100 + seed)
    cat = Catalog(tmp_path / "lake")
    log = DeltaLog(cat, "C.T", (), SCHEMA)
    log.append("upsert", [_rows(np.arange(0, 600), rng, 5)])
    opts: dict[str, Any] = {"hash_bucket_count": int(rng.integers(1, 4)), "rows_per_compacted_file": 100,
                            "executor": "in-process", "deletion_vectors": "on"}
    run_compact(cat, "C.T", PKS, SORT, **opts)
    carried_dead, deleted = 0, np.zeros(0, dtype=np.int64)
    for step in range(9):
        keys = rng.choice(600, int(rng.integers(2, 7)), replace=False)  # a few keys, spread over all files
        if step == 8:  # a fifth of the first compacted file's keys: past the dead fraction, that file is rewritten
            log.append("delete", [_rows(np.arange(0, 100, 5), rng, 0).select(["k", "region"])])
        elif step % 3 == 1:
            deleted = keys
            log.append("delete", [_rows(keys, rng, 0).select(["k", "region"])])
        elif step % 3 == 2:  # the keys deleted before come back, with a lower sort key than their dead entries'
            log.append("upsert", [_rows(deleted, rng, 1)])
        else:
            log.append("upsert", [_rows(keys, rng, 6 + step)])
        prior = cat.latest_compacted("C.T", ())
        res = run_compact(cat, "C.T", PKS, SORT, **opts)
        cv = cat.latest_compacted("C.T", ())
        own = [f for files in cv.index.buckets for f in files if f"/{cv.version:010d}-" in f.key]
        carried = [f for files in cv.index.buckets for f in files if f not in own]
        rewritten = {f.key for f in prior.files} - {f.key for f in cv.files}
        if step < 8:  # every compacted file carried with its vector: so is every prior index file
            assert not rewritten
            assert {f.key for f in carried} == {f.key for files in prior.index.buckets for f in files}
            assert res.partitions[0].index_bytes_written == sum(f.bytes for f in own)
            assert all(f.rows <= 6 for f in own), own  # the new rows only
            carried_dead += cv.index.dead_rows > 0
        else:  # the rewritten file's rows were in every bucket: those index files are read, their dead entries dropped
            assert rewritten and cv.index.dead_rows < prior.index.dead_rows
        _check(cat, log)
    assert carried_dead >= 6  # versions whose carried index files held dead entries
