"""Dedupe's probe skips prior index files by key range (steps/dedupe.py stream_probe, catalog/key_ranges.py).

An index file whose compacted files all record a first-key range that misses the deltas' keys is not read.
The randomized test compacts clustered and spread updates, deletes, inserts past every range, nulls in the key
(no range then) and several key types, and compares every version with the DuckDB oracle; index files are made
small (MIN_INDEX_FILE_ROWS) so that a bucket has many and the skip has something to skip."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_helpers import DeltaLog, fresh_lake, oracle, read_compacted, rows_of, run_compact
from flash_pipeline.catalog.key_ranges import KeyRange
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.steps import dedupe
from flash_pipeline.verify import verify

COLUMNS = ["k", "r", "ts", "v"]
SORT = [("ts", "ascending")]


class ProbeReads:
    """The index files dedupe's probe reads, by key (the index writer's reads are not counted)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.keys: list[str] = []
        probe = dedupe.stream_probe

        def counting(storage: Any, plan: Any, bucket: int, digests: Any, key_range: Any = None) -> Any:
            original = pk_index.file_chunks

            def chunks(storage: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
                self.keys.append(f.key)
                return original(storage, f, *args, **kwargs)

            monkeypatch.setattr(pk_index, "file_chunks", chunks)
            try:
                return probe(storage, plan, bucket, digests, key_range)
            finally:
                monkeypatch.setattr(pk_index, "file_chunks", original)

        monkeypatch.setattr(dedupe, "stream_probe", counting)


def _table(k: Any, r: Any, ts: Any, key_type: pa.DataType) -> pa.Table:
    n = len(k)
    return pa.table({"k": pa.array(k, type=key_type), "r": pa.array(r, type=pa.int8()), "ts": pa.array(ts, type=pa.int64()),
                     "v": pa.array(np.arange(n, dtype=np.float64))})


def test_a_clustered_update_reads_only_the_index_files_of_its_compacted_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from flash_pipeline import Catalog

    monkeypatch.setattr(pk_index, "MIN_INDEX_FILE_ROWS", 50)
    reads = ProbeReads(monkeypatch)
    cat = Catalog(tmp_path / "lake")
    log = DeltaLog(cat, "KR.T", (), _table([], [], [], pa.int64()).schema)
    n = 2_000
    log.append("upsert", [_table(np.arange(n), np.arange(n) % 2, np.zeros(n, dtype=np.int64), pa.int64())])
    run_compact(cat, "KR.T", ["k", "r"], SORT, hash_bucket_count=2, rows_per_compacted_file=200, executor="in-process")
    v1 = cat.latest_compacted("KR.T", ())
    assert all(f.key_range is not None for f in v1.files)
    assert sorted((f.key_range.low, f.key_range.high) for f in v1.files) == [(i, i + 199) for i in range(0, n, 200)]
    index_files = sum(len(b) for b in v1.index.buckets)
    assert index_files >= 20
    # keys 1000..1049 live in one compacted file; a delete in the same file
    keys = np.arange(1000, 1050)
    log.append("upsert", [_table(keys, keys % 2, np.ones(50, dtype=np.int64), pa.int64())])
    log.append("delete", [_table([1100], [0], [0], pa.int64()).select(["k", "r"])])
    reads.keys.clear()
    res = run_compact(cat, "KR.T", ["k", "r"], SORT, executor="in-process").partitions[0]
    read_files = set(reads.keys)
    assert 0 < len(read_files) <= 4, f"the probe read {len(read_files)} of {index_files} index files"
    assert res.index_bytes_skipped > 0 and res.index_bytes_skipped + sum(
        f.bytes for b in v1.index.buckets for f in b if f.key in read_files) == v1.index.bytes
    assert rows_of(read_compacted(cat, "KR.T", ()), COLUMNS) == rows_of(oracle(log.log_table(), ["k", "r"], SORT, COLUMNS), COLUMNS)
    # inserts past every file's range skip the whole index
    reads.keys.clear()
    log.append("upsert", [_table(np.arange(5000, 5010), np.zeros(10), np.ones(10, dtype=np.int64), pa.int64())])
    run_compact(cat, "KR.T", ["k", "r"], SORT, executor="in-process")
    assert reads.keys == []
    assert rows_of(read_compacted(cat, "KR.T", ()), COLUMNS) == rows_of(oracle(log.log_table(), ["k", "r"], SORT, COLUMNS), COLUMNS)
    assert verify(cat).ok


def test_on_ray_the_key_range_reaches_dedupe_beside_coalesced_units(tmp_path: Any) -> None:
    """Ray's hash bucket tasks return the range after the buckets and before the small units read whole
    (runtime/tasks.py): with both, the skip happens on the workers (index bytes skipped) and the rows are right.
    Index files are cut at compacted files only past 65,536 rows, hence the 300,000-row base."""
    from flash_pipeline import Catalog

    cat = Catalog(tmp_path / "lake")
    n = 300_000
    base = _table(np.arange(n), np.arange(n) % 2, np.zeros(n, dtype=np.int64), pa.int64())
    cat.append("KR.R", (), "upsert", [base])
    run_compact(cat, "KR.R", ["k", "r"], SORT, hash_bucket_count=2, rows_per_compacted_file=25_000, executor="ray")
    v1 = cat.latest_compacted("KR.R", ())
    assert sum(len(b) for b in v1.index.buckets) >= 4
    keys = np.arange(100_000, 100_040)
    upd = _table(keys, keys % 2, np.ones(40, dtype=np.int64), pa.int64())
    cat.append("KR.R", (), "upsert", [upd.slice(0, 20), upd.slice(20)])  # two small units: coalesced (planning/rounds.py)
    cat.append("KR.R", (), "delete", [_table([100_100], [0], [0], pa.int64()).select(["k", "r"])])
    res = run_compact(cat, "KR.R", ["k", "r"], SORT, executor="ray").partitions[0]
    assert 0 < res.index_bytes_skipped < v1.index.bytes
    got = read_compacted(cat, "KR.R", ())
    expected = pa.concat_tables([base.filter(pa.compute.invert(pa.compute.is_in(base["k"], pa.array(np.append(keys, 100_100))))), upd])
    assert rows_of(got, COLUMNS) == rows_of(expected, COLUMNS)


def test_verify_names_a_recorded_key_range_the_file_does_not_hold(tmp_path: Any) -> None:
    import json

    from flash_pipeline import Catalog

    cat = Catalog(tmp_path / "lake")
    cat.append("KR.V", (), "upsert", [_table(np.arange(100), np.zeros(100), np.zeros(100, dtype=np.int64), pa.int64())])
    run_compact(cat, "KR.V", ["k", "r"], SORT, executor="in-process")
    v = cat.latest_compacted("KR.V", ())
    assert [f.key_range for f in v.files] == [KeyRange("k", 0, 99)]
    assert verify(cat).ok
    key = cat.version_key("KR.V", (), v.version)
    doc = json.loads(cat.storage.read(key))
    doc["files"][0]["key_range"]["max"] = 50  # a manifest claiming less than the file holds
    (tmp_path / "lake" / key).write_text(json.dumps(doc))
    result = verify(cat)
    assert not result.ok
    assert any("k holds values 0 to 99, outside the recorded key range [0, 50]" in p.problem for p in result.problems), result.problems


@pytest.mark.parametrize("fmt", ["orc", "csv", "parquet"])
def test_verify_reads_the_key_column_in_its_recorded_type(tmp_path: Any, fmt: str) -> None:
    """ORC stores uint64 as int64 (the same bits) and CSV has no types: verify read the key column as stored and
    called a healthy table's range wrong (values below 0, or not integers). It reads it in the recorded type."""
    from flash_pipeline import Catalog

    cat = Catalog(tmp_path / "lake")
    keys = [(1 << 63) + 1, (1 << 63), (1 << 64) - 1]
    cat.append("KR.U", (), "upsert", [pa.table({"k": pa.array(keys, pa.uint64()), "v": [1.0, 2.0, 3.0]})])
    run_compact(cat, "KR.U", ["k"], None, executor="in-process", compacted_file_content_type=fmt)
    assert [f.key_range for f in cat.latest_compacted("KR.U", ()).files] == [KeyRange("k", 1 << 63, (1 << 64) - 1)]
    result = verify(cat)
    assert result.ok, [p.line() for p in result.problems]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    key_type = draw(st.sampled_from([pa.int64(), pa.uint64(), pa.int16()]))
    offset = {pa.int64(): -(1 << 62), pa.uint64(): (1 << 64) - 100_000, pa.int16(): -300}[key_type]
    n = draw(st.integers(20, 300))
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        deltas = []
        for _ in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["clustered", "clustered", "spread", "inserts", "delete", "null"]))
            lo = draw(st.integers(0, n))
            width = draw(st.integers(1, 30))
            deltas.append((kind, lo, width, draw(st.integers(0, 2**32))))
        steps.append(deltas)
    return {"key_type": key_type, "offset": offset, "n": n, "buckets": draw(st.integers(1, 3)),
            "rows_per_file": draw(st.integers(5, 60)), "base_nulls": draw(st.booleans()), "steps": steps}


def _delta(kind: str, lo: int, width: int, seed: int, n: int, offset: int, key_type: pa.DataType) -> tuple[str, pa.Table]:
    rng = np.random.default_rng(seed)
    if kind == "spread":
        k = rng.integers(0, n + 50, width)
    elif kind == "inserts":
        k = np.arange(n + 100 + lo, n + 100 + lo + width)
    else:
        k = lo + rng.integers(0, width, width)
    ks: list[Any] = [int(x) + offset for x in k]
    if kind == "null":
        ks[0] = None
    table = _table(ks, rng.integers(0, 2, len(ks)), rng.integers(0, 5, len(ks)), key_type)
    if kind == "delete":
        return "delete", table.select(["k", "r"])
    return "upsert", table


@settings(max_examples=15, deadline=None)
@given(scenarios())
def test_every_version_matches_the_oracle_whatever_the_probe_skips(case: dict[str, Any]) -> None:
    n, offset, key_type = case["n"], case["offset"], case["key_type"]
    with pytest.MonkeyPatch.context() as mp, fresh_lake() as cat:
        mp.setattr(pk_index, "MIN_INDEX_FILE_ROWS", 4)
        log = DeltaLog(cat, "KR.F", (), _table([], [], [], key_type).schema)
        k: list[Any] = [i + offset for i in range(n)]
        if case["base_nulls"]:
            k[n // 2] = None
        log.append("upsert", [_table(k, np.arange(n) % 2, np.zeros(n, dtype=np.int64), key_type)])
        kwargs = {"hash_bucket_count": case["buckets"], "rows_per_compacted_file": case["rows_per_file"], "executor": "in-process"}
        run_compact(cat, "KR.F", ["k", "r"], SORT, **kwargs)
        for deltas in case["steps"]:
            for kind, lo, width, seed in deltas:
                op, table = _delta(kind, lo, width, seed, n, offset, key_type)
                log.append(op, [table])
            run_compact(cat, "KR.F", ["k", "r"], SORT, **kwargs)
            got = rows_of(read_compacted(cat, "KR.F", ()), COLUMNS)
            assert got == rows_of(oracle(log.log_table(), ["k", "r"], SORT, COLUMNS), COLUMNS)
        assert verify(cat).ok
