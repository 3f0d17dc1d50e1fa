"""A commit's housekeeping is proportional to the change; the full sweep of attempt folders is retention's.

After committing version n, a compaction deletes the attempt folders of number n that its manifest does not
reference (attempts that raced for n and lost, or died): it reads no other manifest, so a partition with a long
history pays nothing more per compaction. Folders of older taken numbers wait for the full sweep
(``remove_orphan_attempts``, run by retention), and folders of numbers nobody holds yet are never touched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from compaction_helpers import DeltaLog, oracle, read_compacted, rows_of, run_compact
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.commits import attempt_roots, remove_orphan_attempts
from flash_pipeline.catalog.validation import VERSION_DIGITS

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.float64())])
COLUMNS = ["k", "ts", "v"]
TABLE = "CLEAN.T"


def _delta(rng: np.random.Generator, step: int) -> pa.Table:
    n = int(rng.integers(3, 12))
    return pa.table({"k": rng.integers(0, 30, n), "ts": np.full(n, step), "v": rng.random(n)}, schema=SCHEMA)


def _compact_counting_manifest_reads(cat: Catalog, monkeypatch: Any) -> int:
    """Run one compaction; how many version manifests it read (the real reads, counted on the way through)."""
    reads = []
    real = Catalog.compacted_version

    def counted(self: Catalog, table_id: str, partition: Any, version: int) -> Any:
        reads.append(version)
        return real(self, table_id, partition, version)

    monkeypatch.setattr(Catalog, "compacted_version", counted)
    try:
        run_compact(cat, TABLE, None, None)
    finally:
        monkeypatch.setattr(Catalog, "compacted_version", real)
    return len(reads)


def _plant(cat: Catalog, kind: str, version: int, tag: str) -> str:
    """An attempt folder of ``version`` holding one file, as a writer that never committed leaves it."""
    root = attempt_roots(cat, TABLE, ())[kind]
    folder = f"{root}/{version:0{VERSION_DIGITS}d}-{tag * 12}"
    cat.storage.write(f"{folder}/000001.parquet", b"not committed")
    return folder


def _present(cat: Catalog, folder: str) -> bool:
    return bool(cat.storage.list(folder))


def test_a_commit_removes_its_numbers_losers_and_reads_no_older_manifest(any_lake: Catalog, monkeypatch: Any) -> None:
    cat = any_lake
    rng = np.random.default_rng(11)
    log = DeltaLog(cat, TABLE, (), SCHEMA)
    log.append("upsert", [_delta(rng, 0)])
    run_compact(cat, TABLE, ["k"], [("ts", "ascending")], hash_bucket_count=2, rows_per_compacted_file=8)
    log.append("upsert", [_delta(rng, 1)])
    early = _compact_counting_manifest_reads(cat, monkeypatch)  # commits version 2
    for step in range(2, 9):
        log.append("upsert" if step % 4 else "delete", [_delta(rng, step) if step % 4 else _delta(rng, step).select(["k"])])
        run_compact(cat, TABLE, None, None)
    latest = cat.latest_compacted(TABLE, ())
    assert latest is not None and latest.version == 9
    n = latest.version + 1  # the number the next compaction commits
    losers = [_plant(cat, kind, n, tag) for kind, tag in (("data", "a"), ("index", "b"), ("state", "c"))]
    old_orphan = _plant(cat, "data", 5, "d")  # an attempt at a number taken long ago
    untaken = _plant(cat, "data", n + 3, "e")  # a number nobody holds yet: maybe a live writer's
    log.append("upsert", [_delta(rng, 9)])

    late = _compact_counting_manifest_reads(cat, monkeypatch)  # commits version n, 10 versions of history
    assert cat.latest_compacted(TABLE, ()).version == n
    # the same manifest reads whatever the history: none of the older versions is read to decide the clean-up
    assert late == early, f"a compaction read {late} manifests after {n - 1} versions, {early} after 1"
    assert not any(_present(cat, f) for f in losers), "the losers of the committed number must be removed"
    assert _present(cat, old_orphan) and _present(cat, untaken)
    assert rows_of(read_compacted(cat, TABLE, ()), COLUMNS) == rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], COLUMNS), COLUMNS)

    # the full sweep (retention's) reads every live manifest and removes the old orphan; the untaken number stays
    removed = remove_orphan_attempts(cat, TABLE, ())
    assert removed == [f"data/{old_orphan.rsplit('/', 1)[1]}"]
    assert not _present(cat, old_orphan) and _present(cat, untaken)
    for v in cat.compacted_versions(TABLE, ()):  # nothing a version references was touched
        for f in cat.compacted_version(TABLE, (), v).files:
            assert cat.storage.exists(f.key), f.key
