"""Rehashing the primary key index (N -> M buckets, from the index alone) and incremental runs around it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flash_pipeline import Catalog
from flash_pipeline.verify import verify
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.kernels.digest import hash_buckets, primary_key_digests
from flash_pipeline.compactor.index.rehash import rehash
from tests.compaction_helpers import DeltaLog, oracle, quiet, read_compacted, rows_of, run_compact

SCHEMA = pa.schema([("k", pa.int64()), ("region", pa.string()), ("ts", pa.int64()), ("v", pa.float64())])
COLUMNS = SCHEMA.names
PKS = ["k", "region"]
SORT = [("ts", "ascending")]


def _upsert(rng: np.random.Generator, n: int, key_space: int) -> pa.Table:
    keys = rng.integers(0, key_space, n)
    return pa.table({"k": keys, "region": np.array(["n", "s", "e"])[keys % 3], "ts": rng.integers(0, 20, n), "v": rng.random(n)}, schema=SCHEMA)


def _delete(rng: np.random.Generator, n: int, key_space: int) -> pa.Table:
    keys = rng.integers(0, key_space, n)
    return pa.table({"k": keys, "region": np.array(["n", "s", "e"])[keys % 3]})


def check_index_resolves(cat: Catalog, table_id: str) -> None:
    """Every index row sits in its digest's bucket and points at a row with that digest; the rows pointing at a
    live row (not in its file's deletion vector) are one per row of the version, the others are the dead entries
    each index file records."""
    cv = cat.latest_compacted(table_id, ())
    assert cv is not None and cv.index is not None
    files = {f.file_number: cat.read_file(f) for f in cv.files}
    dead_by_file = {f.file_number: set(cat.dead_rows(f).tolist()) for f in cv.files}
    digests_by_file = {n: primary_key_digests(t, PKS) for n, t in files.items()}
    total = 0
    for b in range(cv.index.hash_bucket_count):
        for f in cv.index.buckets[b]:
            entries = pk_index.read_bucket(cat.storage, replace(cv.index, buckets=((f,),)), 0)
            dead = sum(int(r) in dead_by_file[int(n)] for n, r in zip(entries["file"], entries["row"]))
            assert dead == f.dead_rows, f"bucket {b}, {f.key}: {dead} dead entries, {f.dead_rows} recorded"
            total += len(entries) - dead
        rows = pk_index.read_bucket(cat.storage, cv.index, b)
        digests = np.ascontiguousarray(rows["digest"]).view(np.uint8).reshape(-1, 20)
        assert (hash_buckets(digests, cv.index.hash_bucket_count) == b).all()
        for fn in np.unique(rows["file"]):
            sel = rows["file"] == fn
            target = digests_by_file[int(fn)][rows["row"][sel].astype(np.int64)]
            assert (target == digests[sel]).all(), f"bucket {b}: pointers into file {fn} do not resolve"
    assert total == cv.rows


@pytest.mark.parametrize("start,target", [(3, 7), (5, 2), (1, 4), (4, 1)])
def test_rehash_then_incremental_stays_correct(lake: Catalog, start: int, target: int) -> None:
    rng = np.random.default_rng(start * 10 + target)
    log = DeltaLog(lake, "H.T", (), SCHEMA)
    for _ in range(3):
        log.append("upsert", [_upsert(rng, 400, 600)])
    log.append("delete", [_delete(rng, 60, 600)])
    run_compact(lake, "H.T", PKS, SORT, hash_bucket_count=start, rows_per_compacted_file=250)
    before = lake.latest_compacted("H.T", ())
    [after] = rehash(lake, "H.T", target)
    assert after.index is not None and after.index.hash_bucket_count == target
    assert after.files == before.files and not after.data_change, "rehash rewrites the index only"
    check_index_resolves(lake, "H.T")
    log.append("upsert", [_upsert(rng, 200, 800)])
    log.append("delete", [_delete(rng, 40, 800)])
    result = run_compact(lake, "H.T", None, None)
    assert result.partitions[0].hash_bucket_count == target
    expected = oracle(log.log_table(), PKS, SORT, COLUMNS)
    assert rows_of(read_compacted(lake, "H.T", ()), COLUMNS) == rows_of(expected, COLUMNS)
    check_index_resolves(lake, "H.T")


def test_compaction_with_a_new_bucket_count_rehashes_first(lake: Catalog) -> None:
    rng = np.random.default_rng(3)
    log = DeltaLog(lake, "H.U", (), SCHEMA)
    log.append("upsert", [_upsert(rng, 500, 700)])
    run_compact(lake, "H.U", PKS, SORT, hash_bucket_count=2)
    log.append("upsert", [_upsert(rng, 100, 700)])
    messages: list[str] = []
    result = run_compact(lake, "H.U", PKS, SORT, hash_bucket_count=5, progress=messages.append)
    assert result.partitions[0].hash_bucket_count == 5
    assert any("rehash" in m for m in messages)
    versions = [lake.compacted_version("H.U", (), n) for n in lake.compacted_versions("H.U", ())]
    assert [v.data_change for v in versions] == [True, False, True]
    expected = oracle(log.log_table(), PKS, SORT, COLUMNS)
    assert rows_of(read_compacted(lake, "H.U", ()), COLUMNS) == rows_of(expected, COLUMNS)
    check_index_resolves(lake, "H.U")


def test_incremental_run_carries_untouched_files_by_reference(lake: Catalog) -> None:
    """Updates clustered in one compacted file rewrite that file only; the others are carried unchanged."""
    log = DeltaLog(lake, "H.C", (), SCHEMA)
    base = pa.table({"k": np.arange(1000), "region": ["n"] * 1000, "ts": np.zeros(1000, dtype=np.int64), "v": np.zeros(1000)}, schema=SCHEMA)
    log.append("upsert", [base])
    run_compact(lake, "H.C", PKS, SORT, hash_bucket_count=3, rows_per_compacted_file=100)
    before = lake.latest_compacted("H.C", ())
    assert before is not None and len(before.files) == 10
    # keys of compacted file 4 only
    file4 = lake.read_file(next(f for f in before.files if f.file_number == 4))
    keys = file4.column("k").to_numpy()[:30]
    log.append("upsert", [pa.table({"k": keys, "region": ["n"] * 30, "ts": np.ones(30, dtype=np.int64), "v": np.ones(30)}, schema=SCHEMA)])
    result = run_compact(lake, "H.C", None, None).partitions[0]
    after = lake.latest_compacted("H.C", ())
    # rows per file (100) is remembered from the first run: file 4's 70 survivors and the 30 new rows may
    # land in one file or two, never beyond 100 rows
    assert result.files_carried == 9 and result.files_written in (1, 2)
    assert max(f.rows for f in after.files) <= 100 and after.options["rows_per_compacted_file"] == 100
    carried_keys = {f.key for f in before.files if f.file_number != 4}
    assert carried_keys <= {f.key for f in after.files}, "carried files are referenced, not rewritten"
    assert result.bytes_carried == sum(f.bytes for f in before.files if f.file_number != 4)
    expected = oracle(log.log_table(), PKS, SORT, COLUMNS)
    assert rows_of(read_compacted(lake, "H.C", ()), COLUMNS) == rows_of(expected, COLUMNS)
    check_index_resolves(lake, "H.C")


def test_incremental_run_reads_an_index_not_in_pointer_order(lake: Catalog) -> None:
    """The index layout does not promise row order: an index written by another tool (here: our files with their
    rows reversed) must give the same incremental result."""
    rng = np.random.default_rng(12)
    log = DeltaLog(lake, "H.R", (), SCHEMA)
    log.append("upsert", [_upsert(rng, 400, 600)])
    run_compact(lake, "H.R", PKS, SORT, hash_bucket_count=2, rows_per_compacted_file=150)
    index = lake.latest_compacted("H.R", ()).index
    width = 28 + index.sort_key_width
    for bucket in index.buckets:
        for f in bucket:
            rows = np.frombuffer(lake.storage.read(f.key), dtype=np.uint8).reshape(-1, width)
            lake.storage.write(f.key, rows[::-1].tobytes())
    log.append("upsert", [_upsert(rng, 120, 600)])
    log.append("delete", [_upsert(rng, 30, 600).select(PKS)])
    run_compact(lake, "H.R", None, None)
    expected = oracle(log.log_table(), PKS, SORT, COLUMNS)
    assert rows_of(read_compacted(lake, "H.R", ()), COLUMNS) == rows_of(expected, COLUMNS)
    check_index_resolves(lake, "H.R")


def test_one_bucket_incremental_keeps_the_previous_table(lake: Catalog) -> None:
    """deltacat 2.0 loses the prior compacted table with one bucket; here prior rows must survive."""
    rng = np.random.default_rng(11)
    log = DeltaLog(lake, "H.1", (), SCHEMA)
    log.append("upsert", [_upsert(rng, 300, 1000)])
    run_compact(lake, "H.1", PKS, SORT, hash_bucket_count=1)
    log.append("upsert", [_upsert(rng, 50, 1000)])
    run_compact(lake, "H.1", None, None)
    expected = oracle(log.log_table(), PKS, SORT, COLUMNS)
    got = rows_of(read_compacted(lake, "H.1", ()), COLUMNS)
    assert len(got) > 250 and got == rows_of(expected, COLUMNS)


def test_rehash_of_a_table_never_compacted_is_refused(lake: Catalog) -> None:
    from flash_pipeline.errors import FlashError

    lake.append("H.N", (), "upsert", [_upsert(np.random.default_rng(1), 10, 10)])
    with pytest.raises(FlashError, match="never been compacted|nothing to rehash"):
        rehash(lake, "H.N", 4, partitions=[()])
    _ = quiet


@pytest.mark.parametrize("recorded", [True, False], ids=["row-groups-recorded", "manifests-before-row-groups"])
def test_incremental_runs_over_files_split_into_units(lake: Catalog, monkeypatch: pytest.MonkeyPatch, recorded: bool) -> None:
    """Compacted files read as several units (runs of row groups): a unit that lost rows is rewritten with its
    remaining rows in their old order, units that lost none keep theirs, and every run matches the oracle.

    A round that rewrites one file's units gives them to several materialize tasks (MIN_TASK_ROWS lowered to
    the scale), whether the units come from the row group size the manifest records or, for manifests written
    before it was recorded, from the file's footer."""
    from flash_pipeline.catalog.model import DataFile
    from flash_pipeline.compactor.planning import rounds

    monkeypatch.setattr(rounds, "MIN_UNIT_ROWS", 50)
    monkeypatch.setattr(rounds, "MATERIALIZE_MIN_ROWS", 150)
    monkeypatch.setattr(rounds, "COMPACTED_ROW_GROUP_ROWS", 60)
    monkeypatch.setattr(rounds, "MIN_TASK_ROWS", 60)
    if not recorded:
        from_json = DataFile.from_json.__func__  # type: ignore[attr-defined]
        monkeypatch.setattr(DataFile, "from_json", classmethod(lambda cls, d: from_json(cls, {k: v for k, v in d.items() if k != "row_group_rows"})))
    rng = np.random.default_rng(21)
    log = DeltaLog(lake, "H.S", (), SCHEMA)
    log.append("upsert", [_upsert(rng, 3000, 2400)])
    run_compact(lake, "H.S", PKS, SORT, hash_bucket_count=3, rows_per_compacted_file=400)
    for step in range(4):
        before = lake.latest_compacted("H.S", ())
        old = {f.file_number: lake.read_file(f) for f in before.files}
        assert max(pq.ParquetFile(lake.storage.arrow_source(f.key)).metadata.num_row_groups for f in before.files) >= 3
        if step % 2:  # updates and deletes clustered in one file
            hit = old[1 + step % len(old)]
            keys = hit.column("k").to_numpy()[rng.choice(hit.num_rows, 40, replace=False)]
            regions = np.array(["n", "s", "e"])[keys % 3]
            log.append("upsert", [pa.table({"k": keys[:25], "region": regions[:25], "ts": np.full(25, 30 + step), "v": rng.random(25)}, schema=SCHEMA)])
            log.append("delete", [pa.table({"k": keys[25:], "region": regions[25:]})])
        else:
            log.append("upsert", [_upsert(rng, 200, 2600)])
            log.append("delete", [_delete(rng, 40, 2600)])
        result = run_compact(lake, "H.S", None, None).partitions[0]
        after = lake.latest_compacted("H.S", ())
        expected = oracle(log.log_table(), PKS, SORT, COLUMNS)
        assert rows_of(read_compacted(lake, "H.S", ()), COLUMNS) == rows_of(expected, COLUMNS), f"step {step}"
        check_index_resolves(lake, "H.S")
        assert result.files_carried == len({f.key for f in before.files} & {f.key for f in after.files})
        if step % 2:
            assert result.files_carried >= len(old) - 2, "clustered changes rewrite the touched file only"
            written = [f for f in after.files if f.key not in {g.key for g in before.files}]
            # recorded: one unit per row group; from the footer: runs of row groups of about the plan's unit rows
            assert len(written) >= (3 if recorded else 2), "the rewritten file's units and the new rows went to several materialize tasks"
        assert all(f.row_group_rows == (60 if recorded else 0) for f in after.files if f.key not in {g.key for g in before.files})
        assert verify(lake).ok
        # the rewritten previous rows appear in their old order (v is unique per row with probability 1)
        new_v = pa.concat_tables([lake.read_file(f) for f in sorted(after.files, key=lambda f: f.file_number)]).column("v").to_numpy()
        old_v = pa.concat_tables([old[n] for n in sorted(old)]).column("v").to_numpy()
        at = {v: i for i, v in enumerate(new_v)}
        kept_old_positions = [at[v] for v in old_v if v in at]
        carried_first = [i for i in kept_old_positions if i < sum(f.rows for f in after.files if f.key in {g.key for g in before.files})]
        rest = [i for i in kept_old_positions if i not in set(carried_first)]
        assert rest == sorted(rest), "a rewritten file keeps its remaining rows in their old order"


@pytest.mark.parametrize("vectors", [False, True], ids=["copy-on-write", "deletion-vectors"])
def test_compacted_file_replaced_after_commit_stops_the_round_and_leaves_the_lake(lake: Catalog, vectors: bool) -> None:
    """Prior rows are addressed by row index: a compacted file rewritten behind the catalog's back must stop an
    incremental round with one message naming the file, and nothing may be committed -- whether the round
    rewrites the file (copy-on-write: its rows are counted) or carries it with a deletion vector (its size is
    checked)."""
    from flash_pipeline.errors import FlashError

    rng = np.random.default_rng(5)
    log = DeltaLog(lake, "H.X", (), SCHEMA)
    log.append("upsert", [_upsert(rng, 600, 600)])
    run_compact(lake, "H.X", PKS, SORT, hash_bucket_count=2, rows_per_compacted_file=200, deletion_vectors=vectors)
    before = lake.latest_compacted("H.X", ())
    victim = before.files[0]
    table = lake.read_file(victim)
    pq.write_table(table.slice(0, table.num_rows - 1), lake.storage.arrow_source(victim.key))
    hit = table.column("k").to_numpy()[:5]  # keys of that file, so the round rewrites it
    log.append("upsert", [pa.table({"k": hit, "region": np.array(["n", "s", "e"])[hit % 3], "ts": np.full(5, 99), "v": rng.random(5)}, schema=SCHEMA)])
    listing = lake.listing()
    expected = (f"compacted file {victim.key} \\(file 1\\), carried by reference into the new version, holds \\d+ B but "
                f"its version recorded {victim.bytes} B: it was changed after its commit; nothing was committed") if vectors \
        else f"{victim.key}: holds {table.num_rows - 1} rows but its compacted version manifest says {table.num_rows}"
    with pytest.raises(FlashError, match=expected):
        run_compact(lake, "H.X", None, None)
    assert lake.listing() == listing
    assert lake.latest_compacted("H.X", ()).version == before.version


def test_settings_of_the_first_compaction_are_remembered_by_later_runs_and_rehash(lake: Catalog) -> None:
    """Rows per compacted file and per index file given once apply to later compactions and to rehash."""
    from flash_pipeline.compactor.index.rehash import rehash

    rng = np.random.default_rng(21)
    log = DeltaLog(lake, "H.OPT", (), SCHEMA)
    log.append("upsert", [_upsert(rng, 400, 1000)])
    run_compact(lake, "H.OPT", PKS, SORT, hash_bucket_count=2, rows_per_compacted_file=50, rows_per_primary_key_index_file=7,
                deletion_vectors=False)
    log.append("upsert", [_upsert(rng, 200, 1000)])
    run_compact(lake, "H.OPT", None, None)  # no settings given: the recorded ones apply
    (rehashed,) = rehash(lake, "H.OPT", 3, log=lambda message: None)
    for cv in (lake.compacted_version("H.OPT", (), rehashed.version - 1), rehashed):
        assert cv.options == {"rows_per_compacted_file": 50, "rows_per_primary_key_index_file": 7, "deletion_vectors": False}
        assert max(f.rows for f in cv.files) <= 50
        assert max(f.rows for files in cv.index.buckets for f in files) <= 7
    assert rehashed.index.hash_bucket_count == 3 and rehashed.index.live_rows == rehashed.rows
    check_index_resolves(lake, "H.OPT")
    assert rows_of(read_compacted(lake, "H.OPT", ()), COLUMNS) == rows_of(oracle(log.log_table(), PKS, SORT, COLUMNS), COLUMNS)


def _to_legacy_layout(cat: Catalog, table_id: str) -> None:
    """Rewrite the latest version's index as the first layout wrote it (row index uint64, 32 + k bytes a row),
    with the manifest's recorded sizes and checksums to match: a lake compacted before the 28-byte rows."""
    import json

    from flash_pipeline.catalog.checksums import checksum_of

    cv = cat.latest_compacted(table_id, ())
    width = cv.index.sort_key_width
    sizes = {}
    for bucket in cv.index.buckets:
        for f in bucket:
            rows = pk_index.read_bucket(cat.storage, pk_index.IndexVersion(1, 1, width, ((f,),)), 0)
            data = rows.astype(pk_index.legacy_index_dtype(width)).tobytes()
            cat.storage.write(f.key, data)
            sizes[f.key] = (len(data), checksum_of(data))
    key = next(k for k in cat.listing() if k.endswith(f"/compacted/versions/{cv.version:010d}.json"))
    doc = json.loads(cat.storage.read(key))

    def patch(node):  # the index files' records, wherever the manifest nests them
        if isinstance(node, dict):
            if node.get("key") in sizes:
                node["bytes"], node["checksum"] = sizes[node["key"]]
            for value in node.values():
                patch(value)
        elif isinstance(node, list):
            for value in node:
                patch(value)

    patch(doc)
    cat.storage.write(key, json.dumps(doc).encode())
    assert all(f.bytes == f.rows * (32 + width) for b in cat.latest_compacted(table_id, ()).index.buckets for f in b)


def test_an_index_in_the_first_layout_is_still_read(tmp_path) -> None:
    """Lakes compacted before the index row shrank to 28 + k bytes keep working: verify passes, and the next
    incremental compaction (which probes and re-points the legacy rows) equals the model, writing the new layout."""
    from flash_pipeline.verify import verify

    rng = np.random.default_rng(3)
    lake = Catalog(tmp_path / "lake")
    log = DeltaLog(lake, "L.T", (), SCHEMA)
    log.append("upsert", [_upsert(rng, 500, 700)])
    run_compact(lake, "L.T", PKS, SORT, hash_bucket_count=3, rows_per_compacted_file=200)
    _to_legacy_layout(lake, "L.T")
    assert verify(lake, "L.T").ok
    check_index_resolves(lake, "L.T")
    log.append("upsert", [_upsert(rng, 150, 700)])
    log.append("delete", [_delete(rng, 40, 700)])
    run_compact(lake, "L.T", PKS, SORT)
    expected = oracle(log.log_table(), PKS, SORT, COLUMNS)
    assert rows_of(read_compacted(lake, "L.T", ()), COLUMNS) == rows_of(expected, COLUMNS)
    check_index_resolves(lake, "L.T")
    assert verify(lake, "L.T").ok
    new = lake.latest_compacted("L.T", ())
    assert all(f.bytes == f.rows * (28 + new.index.sort_key_width) for b in new.index.buckets for f in b)


def test_rehash_refuses_to_carry_a_data_file_that_no_longer_has_its_recorded_size(tmp_path) -> None:  # noqa: ANN001
    """Rehash carries the data files unread, as a compaction carries untouched ones: a file damaged since its
    commit (another size) fails it with IntegrityError naming the file, and no version is committed, where
    before it committed a new version referencing the damaged file."""
    from flash_pipeline.errors import IntegrityError

    cat = Catalog(tmp_path / "lake")
    cat.append("T", {"p": "1"}, "upsert", [pa.table({"k": np.arange(100), "v": np.arange(100)})])
    run_compact(cat, "T", ["k"], None)
    part = (("p", "1"),)
    version = cat.latest_compacted("T", part)
    assert version is not None
    damaged = version.files[0]
    cat.storage.write(damaged.key, cat.storage.read(damaged.key)[:-7])
    listing = cat.listing()
    with pytest.raises(IntegrityError, match=damaged.key.rsplit("/", 1)[-1]):
        rehash(cat, "T", 4)
    assert cat.listing() == listing and cat.latest_compacted("T", part).version == version.version
