"""Small deltas are opened once per session: hash bucket reads them whole and materialize takes those rows
(planning/rounds.py coalesced_units). The result must be exactly what re-reading them gives, on both executors,
and match the DuckDB oracle."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from compaction_helpers import DeltaLog, fresh_lake, oracle, read_compacted, rows_of, run_compact
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.kernels.digest import primary_key_digests
from flash_pipeline.compactor.planning import rounds as rounds_mod
from flash_pipeline.compactor.steps import source_io

TABLE = "ACME.SMALL.V1"
PART = {"region": "eu"}
SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.string())])


def _small_deltas(log: DeltaLog, seed: int, deltas: int = 60) -> None:
    rng = np.random.default_rng(seed)
    for i in range(deltas):
        files = []
        for _ in range(int(rng.integers(1, 3))):
            n = int(rng.integers(0, 40))
            k = rng.integers(0, 300, n)
            if i % 7 == 6:  # a delete delta now and then
                files.append(pa.table({"k": pa.array(k, pa.int64())}))
            else:
                ts = rng.integers(0, 50, n)
                files.append(pa.table({"k": pa.array(k, pa.int64()), "ts": pa.array(ts, pa.int64()),
                                       "v": pa.array([f"d{i}-{x}" for x in range(n)])}, schema=SCHEMA))
        log.append("delete" if i % 7 == 6 else "upsert", files)


def _compact(cat: Any, dest: str, executor: str) -> Any:
    run_compact(cat, TABLE, ["k"], [("ts", "ascending")], destination_compacted_table_id=dest, executor=executor,
                hash_bucket_count=3, rows_per_compacted_file=500)
    (part,) = cat.partitions(dest)
    return cat.latest_compacted(dest, part)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_small_deltas_are_read_once_and_compact_as_if_read_twice(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with fresh_lake() as cat:
        log = DeltaLog(cat, TABLE, PART, SCHEMA)
        _small_deltas(log, seed)
        reads: Counter[str] = Counter()
        real_read_unit = source_io.read_unit

        def counting(storage: Any, source: Any, *args: Any) -> pa.Table:
            reads[source.key] += 1
            return real_read_unit(storage, source, *args)

        monkeypatch.setattr(source_io, "read_unit", counting)
        coalesced = _compact(cat, "ACME.SMALL_COALESCED.V1", "in-process")
        (source_part,) = cat.partitions(TABLE)
        delta_keys = {f.key for d in cat.deltas(TABLE, source_part) for f in d.files}
        assert delta_keys and set(reads) == delta_keys
        assert max(reads.values()) == 1, [k for k, n in reads.items() if n > 1]  # every delta file opened once

        monkeypatch.setattr(rounds_mod, "SMALL_UNIT_BYTES", -1)  # nothing coalesced: materialize re-reads
        reads.clear()
        reread = _compact(cat, "ACME.SMALL_REREAD.V1", "in-process")
        assert max(reads.values()) == 2  # the old path really was taken (upserts opened twice)
        monkeypatch.undo()
        on_ray = _compact(cat, "ACME.SMALL_RAY.V1", "ray")

        for other in (reread, on_ray):
            assert [(f.file_number, f.rows) for f in coalesced.files] == [(f.file_number, f.rows) for f in other.files]
            for fa, fb in zip(coalesced.files, other.files):
                assert cat.read_file(fa).equals(cat.read_file(fb))
            assert np.array_equal(pk_index.read_all(cat.storage, coalesced.index), pk_index.read_all(cat.storage, other.index))
        want = oracle(log.log_table(), ["k"], [("ts", "ascending")], SCHEMA.names)
        (part,) = cat.partitions("ACME.SMALL_COALESCED.V1")
        got = read_compacted(cat, "ACME.SMALL_COALESCED.V1", part)
        assert rows_of(got, SCHEMA.names) == rows_of(want, SCHEMA.names)
        _assert_pointers_resolve(cat, coalesced)

        # more small deltas, compacted incrementally: the index's pointers decide which prior rows lose
        _small_deltas(log, seed + 100, deltas=20)
        again = _compact(cat, "ACME.SMALL_COALESCED.V1", "in-process")
        assert again.version == coalesced.version + 1
        want = oracle(log.log_table(), ["k"], [("ts", "ascending")], SCHEMA.names)
        got = read_compacted(cat, "ACME.SMALL_COALESCED.V1", part)
        assert rows_of(got, SCHEMA.names) == rows_of(want, SCHEMA.names)
        _assert_pointers_resolve(cat, again)


def _assert_pointers_resolve(cat: Any, version: Any) -> None:
    """Every index row points at the compacted row whose primary key has the index row's digest (materialize
    writes each file's rows in the order the layout gave the index)."""
    rows = pk_index.read_all(cat.storage, version.index)
    by_number = {f.file_number: cat.read_file(f) for f in version.files}
    for number, table in by_number.items():
        mine = rows[rows["file"].astype(np.int64) == number]
        digests = primary_key_digests(table, ["k"]).view("S20").reshape(-1)
        assert np.array_equal(digests[mine["row"].astype(np.int64)], mine["digest"]), f"file {number}: pointers miss their rows"
