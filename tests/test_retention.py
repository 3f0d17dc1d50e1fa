"""Retention of compacted stream versions: never the current or previous version, never a file a kept version
still references (carried files are shared across versions), only keys under compacted/."""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest

from compaction_helpers import rows_of, run_compact
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import normalize_partition
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.model import CompactedVersion, DataFile, IndexFile, IndexVersion
from flash_pipeline.cli import main
from flash_pipeline.catalog.commits import remove_orphan_attempts
from flash_pipeline.retention import retain, retain_versions
from flash_pipeline.errors import FlashError
from flash_pipeline.merge_on_read import read
from flash_pipeline.verify import verify

P = normalize_partition({"day": "1"})
T0 = 1_700_000_000.0


def synthetic(cat: Catalog, table: str, layout: list[list[str]], step: float = 100.0) -> dict[str, str]:
    """Versions 1..n; version i holds the files named in layout[i-1] (a name reused = a carried file)."""
    cat._ensure_active_stream(table, P)
    base = cat.compacted_prefix(table, P)
    keys: dict[str, str] = {}
    for i, names in enumerate(layout, 1):
        attempt = f"{i:010d}-{uuid.uuid4().hex[:12]}"
        files = []
        for n, name in enumerate(names, 1):
            if name not in keys:
                keys[name] = f"{base}/data/{attempt}/{name}.parquet"
                cat.storage.write(keys[name], name.encode())
            files.append(DataFile(n, keys[name], 1, len(name), ContentType.PARQUET))
        ikey = f"{base}/index/{attempt}/bucket-000000/000000.pki"
        cat.storage.write(ikey, b"x" * 32)
        index = IndexVersion(i, 1, 0, ((IndexFile(ikey, 1, 32),),))
        cv = CompactedVersion(table, P, i, table, 1, i, ("k",), (), ContentType.PARQUET, tuple(files), index, (),
                              uuid.uuid4().hex, T0 + i * step)
        assert cat.commit_compacted(cv)
    return keys


LAYOUT = [["a", "b"], ["a", "c"], ["a", "d"], ["a", "e"], ["a", "f"]]


def test_keep_last_deletes_old_versions_but_not_shared_files(lake: Catalog) -> None:
    keys = synthetic(lake, "T", LAYOUT)
    res = retain_versions(lake, "T", P, keep_last=2)
    assert res.deleted_versions == [1, 2, 3] and res.kept_versions == [4, 5]
    assert res.deleted_index_versions == [1, 2, 3]
    assert sorted(lake.compacted_versions("T", P)) == [4, 5]
    for name in "bcd":
        assert not lake.storage.exists(keys[name])
    for name in "aef":  # "a" is carried by every version
        assert lake.storage.exists(keys[name])
    for v in (4, 5):
        cv = lake.compacted_version("T", P, v)
        assert all(lake.storage.exists(f.key) for f in cv.files)
        assert all(lake.storage.exists(f.key) for b in cv.index.buckets for f in b)
    # nothing of the deleted versions is left: orphan gc finds nothing more
    assert remove_orphan_attempts(lake, "T", P) == []
    again = retain_versions(lake, "T", P, keep_last=2)
    assert again.deleted_versions == [] and again.kept_versions == [4, 5]
    for form in ({"day": "1"}, ["day=1"], "day=1"):  # the partition forms Catalog.append takes (a dict failed)
        assert retain_versions(lake, "T", form, keep_last=2, dry_run=True).kept_versions == [4, 5]


def test_current_and_previous_are_always_kept(lake: Catalog) -> None:
    synthetic(lake, "T", LAYOUT)
    assert retain_versions(lake, "T", P, keep_last=1).kept_versions == [4, 5]
    synthetic(lake, "U", LAYOUT[:2])
    assert retain_versions(lake, "U", P, max_age_seconds=0, now=T0 + 10_000).deleted_versions == []


def test_age_retention_and_the_union_with_a_count(lake: Catalog) -> None:
    synthetic(lake, "T", LAYOUT)  # version i committed at T0 + 100 i
    now = T0 + 1000
    dry = retain_versions(lake, "T", P, max_age_seconds=750, now=now, dry_run=True)  # keeps 3, 4, 5 (age <= 750)
    assert dry.deleted_versions == [1, 2] and dry.dry_run and len(lake.compacted_versions("T", P)) == 5
    assert retain_versions(lake, "T", P, keep_last=4, max_age_seconds=750, now=now).deleted_versions == [1]
    assert retain_versions(lake, "T", P, max_age_seconds=750, now=now).deleted_versions == [2]


def test_refuses_a_missing_or_bad_retention(lake: Catalog) -> None:
    synthetic(lake, "T", LAYOUT[:1])
    with pytest.raises(FlashError):
        retain_versions(lake, "T", P)
    with pytest.raises(FlashError):
        retain_versions(lake, "T", P, keep_last=0)


def test_retention_after_real_compactions_and_optimize_keeps_the_table_readable(lake: Catalog) -> None:
    from flash_pipeline.optimize import optimize

    for i in range(4):
        lake.append("T.REAL", {"day": "1"}, "upsert", [pa.table({"k": [i, i + 1, 100 + i], "v": [i] * 3})])
        run_compact(lake, "T.REAL", ["k"], None, hash_bucket_count=2, rows_per_compacted_file=2)
    optimize(lake, "T.REAL", min_file_size=1 << 40, max_file_size=1 << 40, progress=lambda m: None)
    lake.append("T.REAL", {"day": "1"}, "upsert", [pa.table({"k": [0], "v": [9]})])
    before = rows_of(read(lake, "T.REAL"), ["k", "v"])
    (res,) = retain(lake, "T.REAL", keep_last=2)
    assert res.deleted_versions == [1, 2, 3] and res.deleted_files
    assert rows_of(read(lake, "T.REAL"), ["k", "v"]) == before
    run_compact(lake, "T.REAL", None, None)  # incremental compaction still works on the kept versions
    assert rows_of(read(lake, "T.REAL"), ["k", "v"]) == before
    # delta files are never touched
    assert all(lake.storage.exists(f.key) for d in lake.deltas("T.REAL", P) for f in d.files)


def test_unkeyed_optimize_versions_never_delete_delta_files(lake: Catalog) -> None:
    from flash_pipeline.optimize import optimize

    big = 1 << 40
    for i in range(3):
        lake.append("T.LOG", {"day": "1"}, "upsert", [pa.table({"x": [i]}), pa.table({"x": [10 + i]})])
        optimize(lake, "T.LOG", min_file_size=200 if i == 1 else big, max_file_size=big, progress=lambda m: None)
    lake.append("T.LOG", {"day": "1"}, "upsert", [pa.table({"x": [99]})])
    optimize(lake, "T.LOG", min_file_size=big, max_file_size=big, progress=lambda m: None)
    before = sorted(read(lake, "T.LOG").column("x").to_pylist())
    retain(lake, "T.LOG", keep_last=1)
    assert sorted(read(lake, "T.LOG").column("x").to_pylist()) == before
    assert all(lake.storage.exists(f.key) for d in lake.deltas("T.LOG", P) for f in d.files)


def test_cli_retain_and_vacuum(lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    synthetic(lake, "T", LAYOUT)
    assert main(["retain", "--catalog", lake.uri, "--table", "T", "--keep-last", "3", "--dry-run", "--json"]) == 0
    (out,) = json.loads(capsys.readouterr().out)
    assert out["deleted_versions"] == [1, 2] and out["dry_run"] and len(lake.compacted_versions("T", P)) == 5
    assert main(["vacuum", "--catalog", lake.uri, "--table", "T", "--partition", "day=1", "--keep-last", "3"]) == 0
    assert "deleted versions [1, 2]" in capsys.readouterr().out
    snapshot = lake.listing()
    assert main(["retain", "--catalog", lake.uri, "--table", "T"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flash-compactor: error: ") and err.count("\n") == 1
    assert main(["retain", "--catalog", lake.uri, "--table", "T", "--keep-last", "0"]) == 2
    capsys.readouterr()
    assert lake.listing() == snapshot


@pytest.mark.parametrize("point", ["retain:after_expire", "retain:during_delete"])
def test_a_retention_killed_before_its_deletes_finish_is_finished_by_the_next(lake: Catalog, point: str) -> None:
    """flash-compactor retain SIGKILLed after marking versions expired (before or during the deletes of their
    files): the next retention deletes the files only those versions referenced (it never looked at expired
    versions again, so they stayed on storage for good), keeps every file a kept version references, and the
    table reads as before."""
    import os
    import subprocess
    import sys

    from compaction_helpers import DeltaLog, oracle
    from flash_pipeline.verify import verify

    schema = pa.schema([("k", pa.int64()), ("ts", pa.int64())])
    log = DeltaLog(lake, "R.KILL", {"day": "1"}, schema)
    log.append("upsert", [pa.table({"k": list(range(400)), "ts": [0] * 400}, schema=schema)])
    # copy-on-write: with deletion vectors the one-key updates below would carry every data and index file
    run_compact(lake, "R.KILL", ["k"], [("ts", "ascending")], hash_bucket_count=1, rows_per_compacted_file=50,
                deletion_vectors=False)
    for step in range(1, 5):  # each rewrites one file of 50 rows and carries the others
        log.append("upsert", [pa.table({"k": [step * 60], "ts": [step]}, schema=schema)])
        run_compact(lake, "R.KILL", None, None)
    versions = {n: lake.compacted_version("R.KILL", P, n) for n in lake.compacted_versions("R.KILL", P)}
    keys = {n: {f.key for f in v.files} | {f.key for b in v.index.buckets for f in b} for n, v in versions.items()}
    kept = keys[4] | keys[5]
    only_expired = (keys[1] | keys[2] | keys[3]) - kept
    assert only_expired
    env = {**os.environ, "FLASH_CRASH_AT": point}
    done = subprocess.run([sys.executable, "-m", "flash_pipeline.cli", "retain", "--catalog", lake.uri, "--table", "R.KILL",
                           "--keep-last", "2"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    assert lake.compacted_versions("R.KILL", P) == [4, 5]
    assert any(lake.storage.exists(k) for k in only_expired)  # the kill left some of them
    (res,) = retain(lake, "R.KILL", keep_last=2)
    assert res.deleted_versions == [] and set(res.deleted_files) <= only_expired
    assert not [k for k in only_expired if lake.storage.exists(k)], "files only expired versions referenced remain"
    assert all(lake.storage.exists(k) for k in kept)
    assert verify(lake, "R.KILL").ok
    want = rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], schema.names), schema.names)
    assert rows_of(read(lake, "R.KILL"), schema.names) == want
    (again,) = retain(lake, "R.KILL", keep_last=2)  # finished: nothing is re-read or deleted any more
    assert again.deleted_files == [] and lake.expired_unvacuumed("R.KILL", P) == []


def test_retention_keeps_the_version_delta_readers_hold_while_newer_ones_are_unpublishable(lake: Catalog) -> None:
    """Feather versions get no Delta version (empty commits): the partition's Delta table still holds the last
    Parquet version. Retention keeps that version's files, so a Delta read of the latest version keeps working
    (it failed on files retention deleted under it); the next Parquet version then replaces it for Delta readers."""
    import deltalake

    def step(i: int, fmt: str) -> None:
        lake.append("T.DH", {}, "upsert", [pa.table({"k": [i, 100], "v": [i, i]})])
        run_compact(lake, "T.DH", ["k"], None, compacted_file_content_type=fmt, rebuild=i > 1, executor="in-process")

    step(1, "parquet")
    for i in (2, 3, 4):
        step(i, "feather")
    (res,) = retain(lake, "T.DH", keep_last=1)
    assert 1 in res.kept_versions and res.deleted_versions == [2]
    location = lake.deltalake_location("T.DH", ())
    assert rows_of(deltalake.DeltaTable(location).to_pyarrow_table(), ["k", "v"]) == [(1, 1), (100, 1)]
    step(5, "parquet")
    (res,) = retain(lake, "T.DH", keep_last=1)
    assert 1 in res.deleted_versions and res.kept_versions == [4, 5]
    want = rows_of(read(lake, "T.DH"), ["k", "v"])
    assert rows_of(deltalake.DeltaTable(location).to_pyarrow_table(), ["k", "v"]) == want and len(want) == 6


def test_retain_removes_dead_writers_temporary_files_idle_an_hour(lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """A local write goes to ``.tmp-<uuid>`` beside its key and is renamed into place; a writer killed in between
    leaves it. Retention removes those idle TEMP_IDLE_SECONDS (in the partition's streams, compacted versions and
    Delta table), keeps a fresh one (a live writer's), and touches nothing else; --dry-run only counts them."""
    import os
    import time
    from pathlib import Path

    from flash_pipeline.retention import TEMP_IDLE_SECONDS

    for i in range(3):
        lake.append("T.TMP", {"day": "1"}, "upsert", [pa.table({"k": [i, 10 + i], "v": [i, i]})])
        run_compact(lake, "T.TMP", ["k"], None)
    root = Path(lake.uri)
    folders = [root / lake.compacted_prefix("T.TMP", P) / "versions", root / lake.deltalake_root("T.TMP", P) / "_delta_log",
               root / lake.stream_prefix("T.TMP", P, 1) / "deltas"]
    old = time.time() - TEMP_IDLE_SECONDS - 60
    stale = []
    for folder in folders:
        assert folder.is_dir(), folder
        path = folder / f".tmp-{uuid.uuid4().hex}"
        path.write_bytes(b"half a manifest")
        os.utime(path, (old, old))
        stale.append(path)
    fresh = folders[0] / f".tmp-{uuid.uuid4().hex}"
    fresh.write_bytes(b"a live writer's")
    before = rows_of(read(lake, "T.TMP"), ["k", "v"])
    listing = lake.listing()

    assert main(["retain", "--catalog", lake.uri, "--table", "T.TMP", "--keep-last", "5", "--dry-run", "--json"]) == 0
    (out,) = json.loads(capsys.readouterr().out)
    assert out["removed_temp_files"] == 3, out
    assert all(p.exists() for p in stale)
    assert main(["retain", "--catalog", lake.uri, "--table", "T.TMP", "--keep-last", "5"]) == 0
    assert "removed 3 temporary file(s) of dead writers" in capsys.readouterr().out
    assert not any(p.exists() for p in stale) and fresh.exists()
    assert lake.listing() == listing  # nothing a listing shows (committed or not) was touched
    assert rows_of(read(lake, "T.TMP"), ["k", "v"]) == before


def test_retain_does_not_call_the_folders_it_emptied_orphans(lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """The attempt folders of the versions a retention deletes are emptied by it; on a local lake they were then
    reported as "orphaned attempt folder(s)" (writers that died or lost a race), which no writer had done (an S3
    lake, with no folders, said nothing)."""
    for i in range(3):
        lake.append("T.OWN", {"day": "1"}, "upsert", [pa.table({"k": [0, 1], "v": [i, i]})])  # rewrites every file
        run_compact(lake, "T.OWN", ["k"], None)
    assert main(["retain", "--catalog", lake.uri, "--table", "T.OWN", "--keep-last", "1", "--json"]) == 0
    (out,) = json.loads(capsys.readouterr().out)
    assert out["deleted_versions"] == [1] and out["removed_attempts"] == 0, out
    index = lake.storage.root / lake.compacted_prefix("T.OWN", P) / "index"
    assert not [d.name for d in index.iterdir() if d.name.startswith("0000000001-")]  # its folder is gone all the same


def test_a_compaction_committing_while_retain_expires_iceberg_keeps_its_iceberg_files(lake: Catalog,
                                                                                     monkeypatch: pytest.MonkeyPatch
                                                                                     ) -> None:
    """retain decides what it keeps, then expires Iceberg's files. A compaction (deletion vectors on) that commits
    in between wrote position delete files (and metadata) that no kept version named, and retain deleted them:
    the latest Iceberg snapshot could not be read by pyiceberg or DuckDB, for good (found by a black-box race).
    Now the folders are listed before the versions, and every live version's files are kept."""
    import lake_readers

    rows = lambda ids, v: pa.table({"k": pa.array(ids, pa.int64()), "v": pa.array([v] * len(ids), pa.int64())})  # noqa: E731
    lake.append("T", P, "upsert", [rows(list(range(200)), 0)])
    options = dict(rows_per_compacted_file=20, deletion_vectors=True, executor="in-process")
    run_compact(lake, "T", ["k"], None, **options)
    for i in range(3):
        lake.append("T", P, "upsert", [rows(list(range(i, 200, 37)), i + 1)])
        run_compact(lake, "T", ["k"], None, **options)
    real = Catalog.expire_iceberg

    def racing(self: Catalog, table_id: str, partition: object, keep: set[int]) -> list[str]:
        lake.append("T", P, "upsert", [rows(list(range(5, 200, 41)), 9)])
        run_compact(lake, "T", ["k"], None, **options)  # another writer commits the next version now
        return real(self, table_id, partition, keep)

    monkeypatch.setattr(Catalog, "expire_iceberg", racing)
    retain(lake, "T", keep_last=1)
    monkeypatch.setattr(Catalog, "expire_iceberg", real)
    latest = lake.latest_compacted("T", P)
    assert latest.version == 5 and any(f.deletion_vector is not None for f in latest.files)
    expected = sorted(read(lake, "T", primary_keys=["k"]).to_pylist(), key=lambda r: r["k"])
    metadata = lake.iceberg_uri(lake.iceberg_metadata_key("T", P, latest.version))
    assert sorted(lake_readers.iceberg_scan(metadata).to_pylist(), key=lambda r: r["k"]) == expected
    assert verify(lake, "T").ok
    from flash_pipeline.catalog.iceberg_table import _delete_key

    vector = next(f for f in latest.files if f.deletion_vector is not None)
    lake.storage.delete(_delete_key(lake.iceberg_root("T", P), vector))
    problems = verify(lake, "T").problems  # verify said ok with the files gone
    assert [(p.where, p.problem) for p in problems] == [("compacted version 5 Iceberg snapshot", "missing")]
