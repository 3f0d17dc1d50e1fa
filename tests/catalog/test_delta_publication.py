"""Delta Lake publication (catalog/deltalake_table.py): every compacted version of a partition is the same version of
a Delta table that ``deltalake`` and Polars read with no code of ours.

Randomized streams (upserts, deletes, a sort key or none, two partitions, rehash, optimize, retain) are checked
version by version three ways: the Delta table read by deltalake (QueryBuilder, what the docs name), the
compacted version as ``Catalog.export(version=...)`` writes it, and a plain Python model of the semantics."""

from __future__ import annotations

import json
from datetime import datetime, timezone
import subprocess
import random
import re
from pathlib import Path
from typing import Any

import deltalake
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flash_pipeline import Catalog, CompactOptions, compact
from flash_pipeline.catalog.encoding import normalize_partition
from flash_pipeline.compactor.index.rehash import rehash
from flash_pipeline.optimize import optimize
from flash_pipeline.retention import retain
from flash_pipeline.verify import verify
from compaction_helpers import live_index_rows
from stream_model import Model

SOURCE, DEST = "LAKE.EVENTS", "LAKE.EVENTS_COMPACTED"
PARTS = [{"day": "d1"}, {"day": "d 2%"}]  # the second needs percent-encoding: its Delta root is under delta/
SEEDS = 200


def _quiet(_: str) -> None:
    pass


def _rows(table: pa.Table | pl.DataFrame) -> list[tuple[Any, ...]]:
    if isinstance(table, pl.DataFrame):
        table = table.to_arrow()
    if table.num_rows == 0:
        return []  # (a version of a stream of deletes only has the key column alone)
    assert sorted(table.column_names) == ["id", "s", "v"], table.column_names  # the user columns, nothing else
    d = table.select(["id", "s", "v"]).to_pydict()
    return sorted(zip(d["id"], d["s"], d["v"]))


def delta_rows(location: str, version: int) -> list[tuple[Any, ...]]:
    dt = deltalake.DeltaTable(location, version=version)
    return _rows(pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all()))


def export_rows(cat: Catalog, table_id: str, partition: dict[str, str], version: int, out: Path) -> list[tuple[Any, ...]]:
    files = cat.export(table_id, out, partition, version=version, overwrite=True)
    return _rows(pa.concat_tables([pq.read_table(f) for f in files])) if files else []


def run_scenario(seed: int, lake: Path, vectors: bool = False) -> int:
    """One random history (deletion vectors on or off); returns the number of (partition, version) pairs checked."""
    rng = random.Random(seed)
    cat = Catalog(lake)
    sort_key = rng.choice([None, "s"])
    models = {p["day"]: Model(sort_key) for p in PARTS}
    counter = iter(range(1, 10**6))
    compacted = False
    key_space, load_rows = rng.choice([(8, 6), (40, 12)])  # the wide one leaves big files losing few rows: vectors
    for step in range(rng.randint(3, 7)):
        action = rng.choice(["load", "load", "load", "compact", "compact", "optimize", "rehash", "retain"])
        if action == "load" or not compacted:
            part = rng.choice(PARTS)
            op = "delete" if rng.random() < 0.3 else "upsert"
            n = rng.randint(0, load_rows)
            rows = [{"id": rng.randint(1, key_space), "s": rng.choice([None, 1, 2, 3]), "v": next(counter)} for _ in range(n)]
            path = lake.parent / f"in-{seed}-{step}.parquet"
            schema = pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])
            data = pa.Table.from_pylist(rows, schema=schema)
            pq.write_table(data.select(["id"]) if op == "delete" and rng.random() < 0.5 else data, path)
            delta = cat.append(SOURCE, part, op, [str(path)])
            models[part["day"]].add(delta.position, op, rows)
            if rng.random() < 0.5:
                continue
        if action in ("load", "compact") or not compacted:
            compact(SOURCE, ["id"], sort_keys=[(sort_key, "ascending")] if sort_key else None, catalog=cat,
                    destination_compacted_table_id=DEST, hash_bucket_count=rng.choice([1, 2]),
                    rows_per_compacted_file=rng.choice([2, 3, 10, 100]), deletion_vectors=vectors, progress=_quiet)
            compacted = True
        elif action == "optimize":
            optimize(cat, DEST, min_file_size=1 << 20, max_file_size=1 << 21, progress=_quiet)
        elif action == "rehash":
            rehash(cat, DEST, rng.choice([1, 2, 4]), log=_quiet)
        elif action == "retain":
            retain(cat, DEST, keep_last=2)
    checked = 0
    for part in PARTS:
        keys = normalize_partition(part)
        if not cat.table_exists(DEST) or not cat.compacted_versions(DEST, keys):
            continue
        location = cat.deltalake_location(DEST, keys)
        latest = cat.latest_compacted(DEST, keys)
        assert deltalake.DeltaTable(location).version() == latest.version
        for v in cat.compacted_versions(DEST, keys):  # the retained versions: time travel works across them
            version = cat.compacted_version(DEST, keys, v)
            expected = models[part["day"]].rows_at(version.last_position)
            got = delta_rows(location, v)
            assert got == expected, f"seed {seed} {part} Delta version {v}"
            assert export_rows(cat, DEST, part, v, lake.parent / "export") == got, f"seed {seed} {part} export of version {v}"
            checked += 1
        assert _rows(pl.read_delta(location)) == models[part["day"]].rows_at(latest.last_position), f"seed {seed}: Polars"
    return checked


@pytest.mark.parametrize("vectors", [False, True], ids=["vectors-off", "vectors-on"])
def test_every_version_reads_the_same_through_delta_export_and_a_model(tmp_path: Path, vectors: bool) -> None:
    """SEEDS random histories in all (issue 17's acceptance: 200), half without deletion vectors and half with
    (seeds 0-99 and 100-199: each history is run once, the suite's time is spent on new ones)."""
    checked = 0
    half = SEEDS // 2
    for seed in range(half, SEEDS) if vectors else range(half):
        lake = tmp_path / f"s{seed}" / "lake"
        lake.parent.mkdir()
        checked += run_scenario(seed, lake, vectors)
    assert checked >= half  # most seeds end with several versions in both partitions
    if vectors:  # vectors were written (and read above): a vector file is left in some lake
        assert any("deletion_vector_" in str(p) for p in tmp_path.rglob("*.bin"))


def test_with_publication_off_the_catalog_reads_as_before_and_no_delta_log_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASH_DELTA_LOG", "0")
    for seed in range(10):
        lake = tmp_path / f"s{seed}" / "lake"
        lake.parent.mkdir()
        rng = random.Random(seed)
        cat = Catalog(lake)
        model = Model(None)
        for step in range(3):
            rows = [{"id": rng.randint(1, 5), "s": None, "v": seed * 100 + step * 10 + i} for i in range(rng.randint(1, 4))]
            path = lake.parent / f"in-{step}.parquet"
            pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])), path)
            model.add(cat.append(SOURCE, PARTS[0], "upsert", [str(path)]).position, "upsert", rows)
            compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, progress=_quiet)
        keys = normalize_partition(PARTS[0])
        latest = cat.latest_compacted(DEST, keys)
        assert latest is not None and latest.version == 3 and not latest.delta_log
        assert export_rows(cat, DEST, PARTS[0], 3, lake.parent / "export") == model.rows_at(latest.last_position)
        assert not Path(cat.deltalake_location(DEST, keys), "_delta_log").exists()


def test_a_lake_compacted_before_publication_gets_its_whole_history_on_the_next_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    model = Model(None)
    schema = pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])
    for step in range(4):
        if step == 3:
            monkeypatch.delenv("FLASH_DELTA_LOG", raising=False)  # publication from now on
        else:
            monkeypatch.setenv("FLASH_DELTA_LOG", "0")
        rows = [{"id": i % 3, "s": None, "v": step * 10 + i} for i in range(step + 2)]
        path = tmp_path / f"in-{step}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        model.add(cat.append(SOURCE, PARTS[0], "upsert", [str(path)]).position, "upsert", rows)
        compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, progress=_quiet)
    keys = normalize_partition(PARTS[0])
    location = cat.deltalake_location(DEST, keys)
    assert deltalake.DeltaTable(location).version() == 4
    for v in range(1, 5):
        assert delta_rows(location, v) == model.rows_at(cat.compacted_version(DEST, keys, v).last_position)
    log = sorted(p.name for p in Path(location, "_delta_log").iterdir())
    assert log == [f"{v:020d}.json" for v in range(5)]
    first = [json.loads(line) for line in Path(location, "_delta_log", f"{0:020d}.json").read_text().splitlines()]
    assert {"protocol", "metaData", "commitInfo"} == {k for a in first for k in a}


def _cli(argv: list[str], crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    import os
    import sys

    exe = Path(sys.executable).parent / "flash-compactor"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flash_pipeline.cli"]
    env = {k: v for k, v in os.environ.items() if k != "FLASH_CRASH_AT"}
    if crash_at:
        env["FLASH_CRASH_AT"] = crash_at
    return subprocess.run(cmd + argv, capture_output=True, text=True, timeout=300, env=env)


def _both_read_the_same(lake: Path, tmp: Path) -> int:
    """The version `export` (a fresh process) and deltalake read, asserted equal in number and rows."""
    keys = normalize_partition(PARTS[0])
    cat = Catalog(lake)
    out = tmp / "export"
    done = _cli(["export", "--catalog", str(lake), "--table", DEST, "--out", str(out), "--overwrite"])
    assert done.returncode == 0, done.stderr
    exported = _rows(pa.concat_tables([pq.read_table(f) for f in out.rglob("*.parquet")])) if any(out.rglob("*.parquet")) else []
    location = cat.deltalake_location(DEST, keys)
    version = deltalake.DeltaTable(location).version()
    assert delta_rows(location, version) == exported
    latest = cat.latest_compacted(DEST, keys)
    assert latest is not None and latest.version == version
    return version


KILL_POINTS = [("compact", p) for p in ("driver:before_commit", "commit:before_delta", "commit:after_delta", "driver:after_commit")] + [
    (w, p) for w in ("optimize", "rehash") for p in ("commit:before_delta", "commit:after_delta")]


@pytest.mark.parametrize(("writer", "point"), KILL_POINTS)
def test_kill_at_each_point_of_a_commit_leaves_export_and_delta_at_the_same_version(tmp_path: Path, writer: str, point: str) -> None:
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    schema = pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])
    model = Model(None)
    for step in range(2):
        rows = [{"id": i, "s": None, "v": step * 10 + i} for i in range(step, step + 3)]
        path = tmp_path / f"in-{step}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        model.add(cat.append(SOURCE, PARTS[0], "upsert", [str(path)]).position, "upsert", rows)
        compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, rows_per_compacted_file=2, progress=_quiet)
    assert _both_read_the_same(lake, tmp_path) == 2
    rows = [{"id": 1, "s": None, "v": 99}]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "in-2.parquet")
    model.add(cat.append(SOURCE, PARTS[0], "upsert", [str(tmp_path / "in-2.parquet")]).position, "upsert", rows)
    common = ["--catalog", str(lake)]
    argv = {
        "compact": ["compact", *common, "--table", SOURCE, "--destination", DEST],
        "optimize": ["optimize", *common, "--table", DEST],
        "rehash": ["rehash", *common, "--table", DEST, "--hash-buckets", "2"],
    }[writer]
    killed = _cli(argv, crash_at=point)
    assert killed.returncode == -9, killed.stderr  # SIGKILL at the crash point
    after_kill = _both_read_the_same(lake, tmp_path)
    assert after_kill == (2 if point in ("driver:before_commit", "commit:before_delta") else 3)
    # the next writer completes a commit whose writer died, then commits its own
    again = _cli(["compact", *common, "--table", SOURCE, "--destination", DEST])
    assert again.returncode == 0, again.stderr
    final = _both_read_the_same(lake, tmp_path)
    assert final >= 3
    keys = normalize_partition(PARTS[0])
    expected = model.rows_at(cat.latest_compacted(DEST, keys).last_position)
    assert delta_rows(cat.deltalake_location(DEST, keys), final) == expected
    assert model.rows_at(10**9) == expected  # every delta compacted in the end


def _doc_blocks(language: str) -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "catalog-layout.md").read_text()
    section = text[text.index("### Queries that run as written"): text.index("## Iceberg tables")]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def _run_doc_sql(sql: str, values: dict[str, str]) -> pa.Table:
    """One of the documentation's DuckDB blocks, as written but for its placeholders, on a fresh connection; the
    placeholder ``EXTENSION`` is the Delta extension file the pip package installed."""
    import duckdb

    from duckdb_delta import delta_extension_file

    for name, value in {**values, "EXTENSION": delta_extension_file()}.items():
        sql = sql.replace(f"'{name}'", f"'{value}'")
    con = duckdb.connect()
    try:
        statements = [s for s in sql.split(";") if s.strip()]
        for statement in statements[:-1]:
            con.execute(statement)
        return con.sql(statements[-1]).to_arrow_table()
    finally:
        con.close()


def test_the_documented_duckdb_polars_deltalake_and_pyspark_queries_run_as_written(tmp_path: Path) -> None:
    """docs/catalog-layout.md's queries (DuckDB's Delta extension and the hand-written fallback, Polars, deltalake,
    PySpark), text unchanged but for their placeholders, read the model's rows."""
    seed = next(s for s in range(200) if _has_several_files(s, tmp_path / f"probe{s}" / "lake"))
    lake = tmp_path / "main" / "lake"
    lake.parent.mkdir()
    run_scenario(seed, lake)
    cat = Catalog(lake)
    keys = normalize_partition(PARTS[0])
    location = cat.deltalake_location(DEST, keys)
    shown = json.loads(_cli(["show", "--catalog", str(lake), "--table", DEST, "--json"]).stdout)
    [part] = [p for p in shown["tables"][0]["partitions"] if p["partition"] == [["day", "d1"]]]
    assert part["compaction"]["delta"]["location"] == location and part["compaction"]["delta"]["published"]
    expected = _rows(pa.concat_tables([pq.read_table(f) for f in cat.export(DEST, tmp_path / "x", PARTS[0])]))

    python_blocks = _doc_blocks("python")
    assert len(python_blocks) == 3  # Polars, deltalake, PySpark
    for block in python_blocks[:2]:
        scope: dict[str, Any] = {"LOCATION": location}
        exec(block, scope)  # noqa: S102 - the documentation's code, as written
        assert _rows(scope["rows"]) == expected, block

    extension_sql, fallback_sql = _doc_blocks("sql")
    for part_ in PARTS:  # the second partition's Delta root is relocated (its keys contain '%')
        where = cat.deltalake_location(DEST, normalize_partition(part_))
        want = _rows(pa.concat_tables([pq.read_table(f) for f in cat.export(DEST, tmp_path / "x", part_, overwrite=True)]))
        for sql in (extension_sql, fallback_sql):
            assert _rows(_run_doc_sql(sql, {"LOCATION": where})) == want, (where, sql)

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    try:
        scope = {"LOCATION": location, "spark": spark}
        exec(python_blocks[2], scope)  # noqa: S102
        assert _rows(pa.Table.from_pylist([r.asDict() for r in scope["rows"].collect()])) == expected
    finally:
        spark.stop()


def _has_several_files(seed: int, lake: Path) -> bool:
    """A seed whose first partition ends with several compacted files, its second with rows, no expired version in the way."""
    lake.parent.mkdir()
    run_scenario(seed, lake)
    cat = Catalog(lake)
    if not cat.table_exists(DEST):
        return False
    latest = [cat.latest_compacted(DEST, normalize_partition(p)) for p in PARTS]
    return all(v is not None and len(v.files) > 1 - i and v.rows > 2 - i for i, v in enumerate(latest))


def test_delta_tables_on_a_local_and_an_s3_lake_read_like_export(any_lake: Catalog, tmp_path: Path) -> None:
    """The same publication through boto3 on a moto S3 endpoint: deltalake and Polars read every version there."""
    cat = any_lake
    model = Model("s")
    schema = pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])
    rng = random.Random(7)
    for step in range(4):
        op = "delete" if step == 2 else "upsert"
        rows = [{"id": rng.randint(1, 6), "s": rng.randint(0, 3), "v": step * 10 + i} for i in range(5)]
        path = tmp_path / f"in-{step}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        model.add(cat.append(SOURCE, PARTS[1], op, [str(path)]).position, op, rows)
        compact(SOURCE, ["id"], sort_keys=[("s", "ascending")], catalog=cat, destination_compacted_table_id=DEST,
                rows_per_compacted_file=2, progress=_quiet)
    keys = normalize_partition(PARTS[1])
    location, options = cat.deltalake_location(DEST, keys), cat.deltalake_storage_options()
    assert location.startswith("s3://") == cat.uri.startswith("s3://")
    assert "%" not in location and "/delta/" in location  # 'd 2%' needs encoding: the root is relocated
    assert deltalake.DeltaTable(location, storage_options=options).version() == 4
    for v in range(1, 5):
        dt = deltalake.DeltaTable(location, version=v, storage_options=options)
        got = _rows(pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all()))
        assert got == model.rows_at(cat.compacted_version(DEST, keys, v).last_position)
        assert got == export_rows(cat, DEST, PARTS[1], v, tmp_path / "export")
    assert _rows(pl.read_delta(location, storage_options=options)) == model.rows_at(10**9)


def test_every_tenth_version_is_checkpointed_and_time_travel_still_reads_older_versions(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    model = Model(None)
    schema = pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])
    for step in range(12):
        rows = [{"id": step % 4, "s": None, "v": step}]
        path = tmp_path / f"in-{step}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        model.add(cat.append(SOURCE, PARTS[0], "upsert", [str(path)]).position, "upsert", rows)
        compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, progress=_quiet)
    keys = normalize_partition(PARTS[0])
    location = cat.deltalake_location(DEST, keys)
    log = Path(location, "_delta_log")
    assert (log / f"{10:020d}.checkpoint.parquet").exists()
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 10
    for v in (3, 10, 12):
        assert delta_rows(location, v) == model.rows_at(cat.compacted_version(DEST, keys, v).last_position)


def run_vector_scenario(seed: int, lake: Path, vectors: bool) -> tuple[int, int]:
    """A base of up to 200 keys, then small upserts and deletes compacted one by one (most prior files lose a few
    rows: deletion vectors), with optimize (purging vectors), rehash and retain between; every retained version
    is read through deltalake, export and the model. Returns (versions checked, versions with vectors)."""
    rng = random.Random(10_000 + seed)
    cat = Catalog(lake)
    part = PARTS[seed % 2]
    sort_key = rng.choice([None, "s"])
    model = Model(sort_key)
    counter = iter(range(1, 10**6))
    schema = pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])
    options = {"deletion_vectors": vectors, "rows_per_compacted_file": rng.choice([20, 50, 1000])}
    keys = rng.randint(30, 200)

    def load(op: str, n: int) -> None:
        rows = [{"id": rng.randint(1, keys), "s": rng.choice([None, 1, 2]), "v": next(counter)} for _ in range(n)]
        path = lake.parent / f"in-{next(counter)}.parquet"
        data = pa.Table.from_pylist(rows, schema=schema)
        pq.write_table(data.select(["id"]) if op == "delete" else data, path)
        model.add(cat.append(SOURCE, part, op, [str(path)]).position, op, rows)

    def run_compact() -> None:
        compact(SOURCE, CompactOptions(primary_keys=("id",), sort_keys=((sort_key, "ascending"),) if sort_key else None,
                                       destination_compacted_table_id=DEST, hash_bucket_count=rng.choice([1, 3]), **options),
                catalog=cat, progress=_quiet)

    load("upsert", keys)
    run_compact()
    for _ in range(rng.randint(3, 6)):
        action = rng.choice(["change", "change", "change", "optimize", "rehash", "retain"])
        if action == "change":
            for _ in range(rng.randint(1, 2)):
                load(rng.choice(["upsert", "upsert", "delete"]), rng.randint(1, max(1, keys // 15)))
            run_compact()
        elif action == "optimize":
            optimize(cat, DEST, min_file_size=rng.choice([1, 1 << 20]), max_file_size=1 << 21, progress=_quiet)
        elif action == "rehash":
            rehash(cat, DEST, rng.choice([2, 4]), log=_quiet)
        else:
            retain(cat, DEST, keep_last=2)
            # retention deletes the vector files only expired versions used, and keeps every other
            keys_ = normalize_partition(part)
            live = {f.deletion_vector.key for n in cat.compacted_versions(DEST, keys_)
                    for f in cat.compacted_version(DEST, keys_, n).files if f.deletion_vector is not None}
            stored = {k for k in cat.storage.list(cat.deltalake_root(DEST, keys_)) if "/deletion_vector_" in k}
            assert stored == live, f"seed {seed}: vector files {sorted(stored ^ live)}"
    keys_ = normalize_partition(part)
    location = cat.deltalake_location(DEST, keys_)
    checked = with_vectors = 0
    for v in cat.compacted_versions(DEST, keys_):
        version = cat.compacted_version(DEST, keys_, v)
        expected = model.rows_at(version.last_position)
        assert delta_rows(location, v) == expected, f"seed {seed} Delta version {v}"
        assert export_rows(cat, DEST, part, v, lake.parent / "export") == expected, f"seed {seed} export of version {v}"
        assert version.rows == len(expected) == live_index_rows(cat, version), f"seed {seed} version {v} counts"
        checked += 1
        with_vectors += any(f.deletion_vector is not None for f in version.files)
    assert _rows(pl.read_delta(location)) == model.rows_at(10**9), f"seed {seed}: Polars"
    assert verify(cat, DEST).ok, f"seed {seed}: verify"
    if not vectors:
        assert with_vectors == 0
    return checked, with_vectors


@pytest.mark.parametrize("vectors", [True, False], ids=["vectors-on", "vectors-off"])
def test_spread_changes_with_and_without_deletion_vectors_read_right_everywhere(tmp_path: Path, vectors: bool) -> None:
    checked = with_vectors = 0
    for seed in range(60):
        lake = tmp_path / f"s{seed}" / "lake"
        lake.parent.mkdir()
        c, w = run_vector_scenario(seed, lake, vectors)
        checked, with_vectors = checked + c, with_vectors + w
    assert checked >= 120
    if vectors:
        assert with_vectors >= checked // 4, (with_vectors, checked)  # most histories exercise vectors


def test_the_docs_reader_table_for_deletion_vectors_is_true(tmp_path: Path) -> None:
    """docs/catalog-layout.md, "Deletion vectors": deltalake's QueryBuilder, Polars and DuckDB's delta_scan apply
    them, to_pyarrow_table refuses the table, and the documented DuckDB fallback query (it reads the files as
    listed) misses the files re-added with a vector."""
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    model = Model(None)
    schema = pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])
    for step, ids in enumerate([range(1, 101), [3, 77]]):
        rows = [{"id": i, "s": None, "v": step * 1000 + i} for i in ids]
        path = tmp_path / f"in-{step}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        model.add(cat.append(SOURCE, PARTS[0], "upsert", [str(path)]).position, "upsert", rows)
        compact(SOURCE, CompactOptions(primary_keys=("id",), destination_compacted_table_id=DEST,
                                       rows_per_compacted_file=50, deletion_vectors=True), catalog=cat, progress=_quiet)
    keys = normalize_partition(PARTS[0])
    latest = cat.latest_compacted(DEST, keys)
    assert sum(f.deletion_vector is not None for f in latest.files) == 2  # both base files carried with a vector
    location, expected = cat.deltalake_location(DEST, keys), model.rows_at(10**9)
    assert delta_rows(location, 2) == expected
    assert _rows(pl.read_delta(location)) == expected
    with pytest.raises(Exception, match="(?i)deletion"):
        deltalake.DeltaTable(location).to_pyarrow_table()
    extension_sql, fallback_sql = _doc_blocks("sql")
    assert _rows(_run_doc_sql(extension_sql, {"LOCATION": location})) == expected  # delta_scan applies the vectors
    duck = _rows(_run_doc_sql(fallback_sql, {"LOCATION": location}))
    assert duck == [r for r in expected if r[0] in (3, 77)]  # the log query drops the files re-added with a vector
    scope: dict[str, Any] = {"LOCATION": location}
    exec(_doc_blocks("python")[0], scope)  # noqa: S102 - Polars as documented
    assert _rows(scope["rows"]) == expected


def test_timestamps_without_a_time_zone_declare_the_timestamp_ntz_feature(tmp_path: Path) -> None:
    """The paper's example has timestamps without a time zone (Delta's timestamp_ntz): readers refuse such a
    table unless the protocol names the timestampNtz feature, from version 0 on; a later deletion vector adds
    its own feature beside it."""
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    schema = pa.schema([("id", pa.int64()), ("at", pa.timestamp("us")), ("v", pa.int64())])
    expected: dict[int, tuple[Any, ...]] = {}
    for step, ids in enumerate([range(1, 41), [5, 6]]):
        rows = [{"id": i, "at": datetime(2024, 1, 1 + step, 12, i % 60), "v": step * 100 + i} for i in ids]
        path = tmp_path / f"in-{step}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        cat.append(SOURCE, PARTS[1], "upsert", [str(path)])
        expected.update({r["id"]: (r["id"], r["at"], r["v"]) for r in rows})
        compact(SOURCE, CompactOptions(primary_keys=("id",), destination_compacted_table_id=DEST, rows_per_compacted_file=20,
                                       deletion_vectors=True), catalog=cat, progress=_quiet)
        location = cat.deltalake_location(DEST, normalize_partition(PARTS[1]))
        dt = deltalake.DeltaTable(location)
        got = pa.table(deltalake.QueryBuilder().register("t", dt).execute("select id, at, v from t").read_all()).to_pylist()
        assert sorted((r["id"], r["at"], r["v"]) for r in got) == sorted(expected.values())
        assert sorted(pl.read_delta(location).select(["id", "at", "v"]).rows()) == sorted(expected.values())
    protocol = dt.protocol()
    assert protocol.min_reader_version == 3 and set(protocol.reader_features) == {"timestampNtz", "deletionVectors"}
    v0 = json.loads((Path(location) / "_delta_log" / f"{0:020d}.json").read_text().splitlines()[1])
    assert v0["protocol"]["readerFeatures"] == ["timestampNtz"]


def test_the_cost_model_carries_a_file_with_a_vector_up_to_the_dead_fraction_then_rewrites_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One base file of 100 rows: 4 updated keys leave it 4% dead (carried with a vector); 10 more make it 14% dead,
    past MAX_DEAD_FRACTION (rewritten, no vector); FLASH_DV_MAX_DEAD_FRACTION=1 forces the vector instead."""
    from flash_pipeline.catalog.deletion_vectors import MAX_DEAD_FRACTION

    assert 0.04 <= MAX_DEAD_FRACTION < 0.14
    for forced in (False, True):
        if forced:
            monkeypatch.setenv("FLASH_DV_MAX_DEAD_FRACTION", "1")
        lake = tmp_path / f"lake-{forced}"
        cat = Catalog(lake)
        schema = pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])
        base_key = None
        for step, ids in enumerate([range(1, 101), range(1, 5), range(11, 21)]):
            path = tmp_path / f"in-{forced}-{step}.parquet"
            pq.write_table(pa.Table.from_pylist([{"id": i, "s": None, "v": step} for i in ids], schema=schema), path)
            cat.append(SOURCE, PARTS[0], "upsert", [str(path)])
            compact(SOURCE, CompactOptions(primary_keys=("id",), destination_compacted_table_id=DEST, rows_per_compacted_file=1000,
                                           deletion_vectors=True), catalog=cat, progress=_quiet)
            latest = cat.latest_compacted(DEST, normalize_partition(PARTS[0]))
            base = [f for f in latest.files if f.rows == 100]
            if step == 0:
                base_key = base[0].key
            elif step == 1 or forced:
                assert [f.key for f in base] == [base_key] and base[0].deletion_vector.cardinality == 4 + (10 if step == 2 else 0)
            else:
                assert base_key not in {f.key for f in latest.files}  # rewritten
                assert all(f.deletion_vector is None for f in latest.files)
            assert delta_rows(cat.deltalake_location(DEST, normalize_partition(PARTS[0])), step + 1) == export_rows(cat, DEST, PARTS[0], step + 1, tmp_path / "x")


@pytest.mark.parametrize("value", ["lots", "1.5", "-0.1"])
def test_a_bad_dead_fraction_setting_is_refused_in_one_line_and_the_lake_is_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from flash_pipeline.errors import FlashError

    lake = tmp_path / "lake"
    cat = Catalog(lake)
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1, 2], "s": [None, None], "v": [1, 2]}), path)
    cat.append(SOURCE, PARTS[0], "upsert", [str(path)])
    before = sorted(p.relative_to(lake) for p in lake.rglob("*"))
    monkeypatch.setenv("FLASH_DV_MAX_DEAD_FRACTION", value)
    with pytest.raises(FlashError, match="FLASH_DV_MAX_DEAD_FRACTION must be a fraction between 0 and 1") as err:
        compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, progress=_quiet)
    assert "\n" not in str(err.value)
    assert sorted(p.relative_to(lake) for p in lake.rglob("*")) == before


def test_a_lake_whose_path_holds_a_percent_sign_verifies_and_reads_through_deltalake(tmp_path) -> None:
    """deltalake returns a table's file URIs percent-encoded, its location included: under a lake at ``.../p%lake``
    they come back as ``.../p%25lake/...``. verify compares them with the compacted version's files, so it must
    decode the location too (it reported every file as missing before)."""
    import numpy as np
    from deltalake import DeltaTable

    from compaction_helpers import DeltaLog, oracle, rows_of, run_compact

    cat = Catalog(str(tmp_path / "p%lake"))
    schema = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.float64())])
    rng = np.random.default_rng(3)
    log = DeltaLog(cat, "P.T", {"Order Day": "1995-04-03"}, schema)
    for step in range(2):
        n = 20
        log.append("upsert", [pa.table({"k": rng.integers(0, 15, n), "ts": np.full(n, step), "v": rng.random(n)}, schema=schema)])
        run_compact(cat, "P.T", ["k"], [("ts", "ascending")], hash_bucket_count=2)
    result = verify(cat, "P.T")
    assert result.ok, result
    part = next(iter(cat.partitions("P.T")))
    table = DeltaTable(cat.deltalake_location("P.T", part)).to_pyarrow_table()
    want = oracle(log.log_table(), ["k"], [("ts", "ascending")], ["k", "ts", "v"])
    assert rows_of(table, ["k", "ts", "v"]) == rows_of(want, ["k", "ts", "v"])


def test_unsigned_columns_are_declared_wide_enough_for_every_value(tmp_path: Path) -> None:
    """Delta has no unsigned integers: each is declared as the next wider type (uint8 short, uint16 integer,
    uint32 long, uint64 decimal(20,0): Spark's reading of unsigned Parquet), nested ones too, so values above
    the signed range read back whole (a uint32 declared integer failed every Delta read). Checked at each type's
    maximum, over two versions, against export; Polars too for the types it can cast (not uint64 to decimal)."""
    from decimal import Decimal

    cat = Catalog(tmp_path / "lake")
    schema = pa.schema([("id", pa.int64()), ("u8", pa.uint8()), ("u16", pa.uint16()), ("u32", pa.uint32()),
                        ("u64", pa.uint64()), ("l", pa.list_(pa.uint32())), ("s", pa.struct([("a", pa.uint64())]))])
    top = {"u8": 2**8 - 1, "u16": 2**16 - 1, "u32": 2**32 - 1, "u64": 2**64 - 1}
    expected: dict[int, dict[str, Any]] = {}
    for step in range(2):
        rows = [{"id": i, **{c: m - i - step for c, m in top.items()}, "l": [top["u32"] - step, i], "s": {"a": top["u64"] - i}}
                for i in range(step, 6 + step)]
        cat.append(SOURCE, PARTS[0], "upsert", [pa.Table.from_pylist(rows, schema=schema)])
        expected.update({r["id"]: r for r in rows})
        compact(SOURCE, CompactOptions(primary_keys=("id",), destination_compacted_table_id=DEST), catalog=cat, progress=_quiet)
        location = cat.deltalake_location(DEST, normalize_partition(PARTS[0]))
        got = deltalake.DeltaTable(location).to_pyarrow_table().to_pylist()
        as_ints = [{**r, "u64": int(r["u64"]), "s": {"a": int(r["s"]["a"])}} for r in got]
        assert all(isinstance(r["u64"], Decimal) for r in got)
        assert sorted(as_ints, key=lambda r: r["id"]) == [expected[k] for k in sorted(expected)]
        exported = tmp_path / f"export-{step}"
        cat.export(DEST, str(exported))
        assert sorted(pq.read_table(next(exported.rglob("*.parquet"))).to_pylist(), key=lambda r: r["id"]) == [expected[k] for k in sorted(expected)]
        narrow = pl.read_delta(location, columns=["id", "u8", "u16", "u32", "l"]).sort("id").to_dicts()
        assert narrow == [{c: expected[k][c] for c in ("id", "u8", "u16", "u32", "l")} for k in sorted(expected)]
    assert verify(cat, DEST).ok


@pytest.mark.parametrize("ns_type", [pa.timestamp("ns"), pa.timestamp("ns", tz="UTC"), pa.list_(pa.timestamp("ns"))])
def test_nanosecond_timestamps_leave_the_version_unpublished_with_a_reason(tmp_path: Path, ns_type: pa.DataType) -> None:
    """Delta timestamps are microseconds. A nanosecond column (pandas' default) without a time zone was declared
    timestamp_ntz, and every Delta reader then refused the table (its files hold TIMESTAMP_NANOS) and verify failed
    on a healthy lake: such a version now has no Delta version, with a reason naming the column and the fix;
    export, verify and a microsecond table beside it are unaffected."""
    cat = Catalog(tmp_path / "lake")
    at = datetime(2024, 1, 1, 12, 0, 0)
    for table, t in (("NS.T", ns_type), ("US.T", pa.timestamp("us"))):
        value = [at] if pa.types.is_list(t) else at
        schema = pa.schema([("id", pa.int64()), ("t", t)])
        cat.append(table, PARTS[0], "upsert", [pa.Table.from_pylist([{"id": 1, "t": value}, {"id": 2, "t": None}], schema=schema)])
        compact(table, CompactOptions(primary_keys=("id",)), catalog=cat, progress=_quiet)
    part = normalize_partition(PARTS[0])
    ns_version = cat.latest_compacted("NS.T", part)
    reason = cat.deltalake_blocker(ns_version)
    assert reason is not None and "'t'" in reason and "timestamp('us')" in reason
    assert not ns_version.delta_log
    assert cat.deltalake_blocker(cat.latest_compacted("US.T", part)) is None
    assert deltalake.DeltaTable(cat.deltalake_location("US.T", part)).to_pyarrow_table().num_rows == 2
    out = tmp_path / "export"
    cat.export("NS.T", str(out))
    got = pa.concat_tables([pq.read_table(p) for p in sorted(out.rglob("*.parquet"))])
    assert got.schema.field("t").type == ns_type and got.num_rows == 2
    assert verify(cat, "NS.T").ok and verify(cat, "US.T").ok


def _instants(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """A column's values as comparable instants: zoned timestamps in UTC microseconds, naive ones in microseconds
    (lists of them element-wise), decimals as they are."""
    t = column.type
    inner = t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else t
    if pa.types.is_timestamp(inner):
        target = pa.timestamp("us", tz=None if inner.tz is None else "UTC")
        column = column.cast(pa.list_(target) if inner is not t else target)
    return column.to_pylist()


@pytest.mark.parametrize("column_type", [
    pa.timestamp("us", tz="Europe/Paris"), pa.timestamp("us", tz="+00:00"), pa.timestamp("ms", tz="Etc/UTC"),
    pa.timestamp("s", tz="UTC"), pa.timestamp("s"), pa.timestamp("ms"), pa.list_(pa.timestamp("ms", tz="America/New_York")),
    pa.decimal256(20, 2), pa.decimal256(38, 3)], ids=str)
def test_zoned_second_and_wide_decimal_columns_are_published_and_read_back_as_loaded(tmp_path: Path, column_type: pa.DataType) -> None:
    """Parquet stores every zoned timestamp as UTC instants and seconds as milliseconds, and a decimal by its
    precision, so Delta's timestamp / timestamp_ntz / decimal(p, s) declare what the files hold. deltalake only
    converts the zone "UTC", units ms/us and decimal128, so such versions had no Delta version at all. Read back
    by deltalake and Polars, each version equals the loaded rows (timestamps compared as instants)."""
    from decimal import Decimal

    cat = Catalog(tmp_path / "lake")
    inner = column_type.value_type if pa.types.is_list(column_type) else column_type
    value = (lambda i: Decimal(f"{10 ** 17 + i}.{i:0{inner.scale}d}")) if pa.types.is_decimal(inner) else \
        (lambda i: datetime(2024, 3, 31, 1, 30, i) if inner.tz is None else datetime(2024, 3, 31, 1, 30, i, tzinfo=timezone.utc))
    loaded: dict[int, Any] = {}
    for step in range(2):
        ids = range(step * 3, step * 3 + 4)
        data = [[value(i), None] if inner is not column_type else (value(i) if i % 3 else None) for i in ids]
        table = pa.table({"id": pa.array(ids, pa.int64()), "c": pa.array(data, column_type)})
        cat.append(SOURCE, PARTS[0], "upsert", [table])
        loaded.update(zip(table.column("id").to_pylist(), _instants(table.column("c"))))
        compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, progress=_quiet)
        version = cat.latest_compacted(DEST, normalize_partition(PARTS[0]))
        assert cat.deltalake_blocker(version) is None and version.delta_log
        location = cat.deltalake_location(DEST, normalize_partition(PARTS[0]))
        for read in (lambda: pa.table(deltalake.QueryBuilder().register("t", deltalake.DeltaTable(location)).execute("select id, c from t").read_all()),
                     lambda: pl.read_delta(location).select(["id", "c"]).to_arrow()):
            got = read().sort_by("id")
            assert dict(zip(got.column("id").to_pylist(), _instants(got.column("c")))) == loaded, read
    assert verify(cat, DEST).ok


@pytest.mark.parametrize("columns, reason", [
    ({"c": pa.array([1], pa.time64("us"))}, "Time64"), ({"c": pa.array([1], pa.duration("us"))}, "Duration"),
    ({"c": pa.array(np.array([1.5], np.float16))}, "Float16"), ({"c": pa.array([1], pa.decimal256(40, 0))}, "Decimal256(40, 0)"),
    ({"A": pa.array([1]), "a": pa.array([2])}, "Duplicate field name (case-insensitive)")], ids=["time", "duration", "float16", "decimal256-40", "case"])
def test_the_column_types_the_docs_list_as_unpublishable_are_unpublished_with_that_reason(tmp_path: Path, columns: dict[str, pa.Array], reason: str) -> None:
    """docs/catalog-layout.md's table of columns that get no Delta version, with the reason `show` gives."""
    cat = Catalog(tmp_path / "lake")
    cat.append(SOURCE, PARTS[0], "upsert", [pa.table({"id": pa.array([1], pa.int64()), **columns})])
    compact(SOURCE, ["id"], catalog=cat, progress=_quiet)
    shown = json.loads(_cli(["show", "--catalog", str(tmp_path / "lake"), "--table", SOURCE, "--json"]).stdout)
    [delta] = [p["compaction"]["delta"] for p in shown["tables"][0]["partitions"]]
    assert not delta["published"] and delta["reason"].startswith("its schema has no Delta equivalent") and reason in delta["reason"]
    assert "| column | reason `show` gives |" in (Path(__file__).resolve().parents[2] / "docs" / "catalog-layout.md").read_text()


def _history(location: str) -> dict[int, str]:
    return {h["version"]: h["operation"] for h in deltalake.DeltaTable(location).history()}


def test_a_publishable_version_after_unpublishable_ones_replaces_what_delta_readers_last_saw(tmp_path: Path) -> None:
    """One Feather compaction (and the Parquet one after it, which carries its Feather file) froze the Delta table
    forever: every later version was refused because an earlier one was. Now those versions get empty commits
    (they read as the last published version) and the next publishable version is published against the last
    published one; deltalake and Polars read the model's rows, verify agrees, the next writer rewrites the same
    bytes from the manifests, and later versions publish as usual."""
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    model = Model(None)
    keys = normalize_partition(PARTS[0])
    location = cat.deltalake_location(DEST, keys)
    schema = pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])
    reasons = {}
    for step, (fmt, rebuild) in enumerate([("parquet", False), ("feather", False), ("parquet", False), ("parquet", True), ("parquet", False)]):
        rows = [{"id": 2 * step + i, "s": None, "v": step * 10 + i} for i in range(2)]  # new keys: files are carried
        model.add(cat.append(SOURCE, PARTS[0], "upsert", [pa.Table.from_pylist(rows, schema=schema)]).position, "upsert", rows)
        compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, compacted_file_content_type=fmt,
                rebuild=rebuild, progress=_quiet)
        shown = json.loads(_cli(["show", "--catalog", str(lake), "--table", DEST, "--json"]).stdout)
        reasons[step + 1] = shown["tables"][0]["partitions"][0]["compaction"]["delta"]["reason"]
    assert reasons[1] is None and reasons[4] is None and reasons[5] is None
    assert "feather" in reasons[2] and "feather" in reasons[3]  # version 3 is Parquet but carries version 2's file
    assert deltalake.DeltaTable(location).version() == 5
    assert _history(location) == {0: "CREATE TABLE", 1: "WRITE", 2: "UNPUBLISHED", 3: "UNPUBLISHED", 4: "WRITE", 5: "WRITE"}
    for v in range(1, 6):
        shown_as = v if v not in (2, 3) else 1  # an unpublished version reads as the last published one
        assert delta_rows(location, v) == model.rows_at(cat.compacted_version(DEST, keys, shown_as).last_position), v
    assert _rows(pl.read_delta(location)) == model.rows_at(cat.latest_compacted(DEST, keys).last_position)
    assert verify(cat, DEST).ok
    # the bytes come from the manifests alone: the next writer writes the same commits again
    log = Path(location, "_delta_log")
    written = {v: (log / f"{v:020d}.json").read_bytes() for v in range(6)}
    for v in (2, 3, 4, 5):
        (log / f"{v:020d}.json").unlink()
    Catalog(lake).settle_compacted(DEST, keys)
    assert {v: (log / f"{v:020d}.json").read_bytes() for v in range(6)} == written


def test_a_table_whose_first_version_is_unpublishable_is_created_by_the_first_publishable_one(tmp_path: Path) -> None:
    """The documented remedy for nanosecond timestamps (a new stream with the column cast to microseconds) never
    published anything: version 1 blocked every later one. Version 0 now declares the first publishable
    version's schema, version 1 is an empty commit (an empty table) and version 2 adds its rows."""
    cat = Catalog(tmp_path / "lake")
    keys = normalize_partition(PARTS[0])
    at = datetime(2024, 1, 1, 12)
    cat.append(SOURCE, PARTS[0], "upsert", [pa.table({"id": pa.array([1, 2], pa.int64()), "at": pa.array([at, at], pa.timestamp("ns"))})])
    compact(SOURCE, ["id"], catalog=cat, progress=_quiet)
    assert cat.deltalake_version(SOURCE, keys) is None
    cat.new_stream_from_compacted(SOURCE, PARTS[0], schema=pa.schema([("id", pa.int64()), ("at", pa.timestamp("us"))]))
    cat.append(SOURCE, PARTS[0], "upsert", [pa.table({"id": pa.array([3], pa.int64()), "at": pa.array([at], pa.timestamp("us"))})])
    compact(SOURCE, ["id"], catalog=cat, progress=_quiet)
    location = cat.deltalake_location(SOURCE, keys)
    assert cat.latest_compacted(SOURCE, keys).version == 2 and deltalake.DeltaTable(location).version() == 2
    assert deltalake.DeltaTable(location, version=1).to_pyarrow_table().num_rows == 0
    want = sorted((i, at) for i in (1, 2, 3))
    assert sorted(deltalake.DeltaTable(location).to_pyarrow_table().select(["id", "at"]).to_pylist(), key=lambda r: r["id"]) == [{"id": i, "at": t} for i, t in want]
    assert sorted(pl.read_delta(location).select(["id", "at"]).rows()) == want
    assert verify(cat, SOURCE).ok


def test_a_commit_after_empty_ones_has_the_same_bytes_whichever_earlier_entries_a_writer_found(tmp_path: Path) -> None:
    """Any writer must write the same bytes for Delta commit N (the loser of a race checks them, else exit 4): a
    writer that finds the empty commit of an unpublishable version already written computes commit N from the
    manifests alone, as the writer that wrote both did (it left out the skipped versions: a concurrent rehash on S3
    exited 4)."""
    cat = Catalog(tmp_path / "lake")
    for i, fmt in ((1, "feather"), (2, "parquet")):
        cat.append("T", (), "upsert", [pa.table({"id": pa.array([i, 100 + i], pa.int64())})])
        compact("T", ["id"], catalog=cat, executor="in-process", progress=lambda m: None, compacted_file_content_type=fmt, rebuild=True)
    entry = Path(cat.uri) / cat.deltalake_root("T", ()) / "_delta_log" / f"{2:020d}.json"
    first = entry.read_bytes()
    assert b'"unpublishedVersions":"1"' in first
    entry.unlink()  # what a racing writer sees once the empty commit 1 exists
    cat.settle_compacted("T", ())
    assert entry.read_bytes() == first


def test_a_column_added_without_a_delta_equivalent_is_still_converted_and_caught(tmp_path: Path) -> None:
    """A version whose base was published with the same schema skips deltalake's conversion (its manifest says
    the schema converted); one whose schema gained a column Delta cannot declare is converted and left
    unpublished with the reason, while the published versions before it stay readable."""
    cat = Catalog(tmp_path / "lake")
    part = normalize_partition(PARTS[0])
    cat.append(SOURCE, PARTS[0], "upsert", [pa.table({"id": pa.array([1, 2], pa.int64()), "v": pa.array([1, 2])})])
    compact(SOURCE, ["id"], catalog=cat, progress=_quiet)
    cat.append(SOURCE, PARTS[0], "upsert", [pa.table({"id": pa.array([2], pa.int64()), "v": pa.array([5])})])
    compact(SOURCE, ["id"], catalog=cat, progress=_quiet)
    assert [cat.compacted_version(SOURCE, part, n).delta_log for n in (1, 2)] == [True, True]
    cat.append(SOURCE, PARTS[0], "upsert", [pa.table({"id": pa.array([3], pa.int64()), "v": pa.array([7]),
                                                      "t": pa.array([1], pa.time64("us"))})])
    compact(SOURCE, ["id"], catalog=cat, progress=_quiet)
    third = cat.compacted_version(SOURCE, part, 3)
    assert not third.delta_log
    assert (cat.deltalake_blocker(third) or "").startswith("its schema has no Delta equivalent")
    got = deltalake.DeltaTable(cat.deltalake_location(SOURCE, part)).to_pyarrow_table().sort_by("id")
    assert got.select(["id", "v"]).to_pylist() == [{"id": 1, "v": 1}, {"id": 2, "v": 5}]  # version 2's rows


@pytest.mark.parametrize("destination", [False, True])
def test_skip_delta_counts_a_version_whose_delta_commit_died_as_covering(tmp_path: Path, destination: bool) -> None:
    """A compaction SIGKILLed between its manifest and its Delta commit has committed: the next writer publishes
    it. skip-delta of a position it covers was accepted (it looked only at visible versions), so the next
    compaction published the version with the 'skipped' delta's rows in it, and the undo was refused. Now
    skip-delta settles first and refuses, as it does once the version is visible."""
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    target = ["--destination", DEST] if destination else []
    table = DEST if destination else SOURCE
    cat.append(SOURCE, PARTS[0], "upsert", [pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})])
    assert _cli(["compact", "--catalog", str(lake), "--table", SOURCE, "--primary-key", "id", *target]).returncode == 0
    bad = cat.append(SOURCE, PARTS[0], "upsert", [pa.table({"id": pa.array([2], pa.int64()), "v": ["BAD"]})])
    killed = _cli(["compact", "--catalog", str(lake), "--table", SOURCE, *target], crash_at="commit:before_delta")
    assert killed.returncode == -9, killed.stderr
    from flash_pipeline.errors import FlashError

    keys = normalize_partition(PARTS[0])
    assert cat.latest_compacted(table, keys).version == 1  # not visible yet: its Delta commit is missing
    with pytest.raises(FlashError, match=r"compacted version 2 .* already covers position 2"):
        cat.skip_delta(SOURCE, PARTS[0], bad.position)
    assert cat.latest_compacted(table, keys).version == 2  # settled: visible, as the next writer would make it
    skip = _cli(["skip-delta", "--catalog", str(lake), "--table", SOURCE, *sum((["--partition", f"{n}={v}"] for n, v in keys), []),
                 "--position", str(bad.position)])
    assert skip.returncode == 2 and "already covers position 2" in skip.stderr
    assert not any("skipped" in p.parts for p in lake.rglob("*.json"))
