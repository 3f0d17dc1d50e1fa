"""Iceberg publication (catalog/iceberg_table.py): every compacted version published to Delta is the same-numbered
snapshot of an Iceberg table that pyiceberg and DuckDB's Iceberg extension read with no code of ours.

Randomized histories (upserts, deletes, spread updates with deletion vectors on or off, two partitions, rehash,
optimize, retain) are checked version by version five ways: pyiceberg through the embedded SQL catalog (time
travel by snapshot id), DuckDB's ``iceberg_scan`` of the version's metadata file, DuckDB's ``delta_scan`` of the
Delta version, ``Catalog.export(version=...)``, and the plain Python model."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lake_readers
from flash_pipeline import Catalog, CompactOptions, compact
from flash_pipeline.catalog import avro_files
from flash_pipeline.catalog.encoding import normalize_partition
from flash_pipeline.cli.lake import describe_lake
from flash_pipeline.compactor.index.rehash import rehash
from flash_pipeline.optimize import optimize
from flash_pipeline.retention import retain
from stream_model import Model

SOURCE, DEST = "LAKE.EVENTS", "LAKE.EVENTS_COMPACTED"
PARTS = [{"day": "d1"}, {"day": "d 2%"}]  # the second needs percent-encoding in paths
SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.int64()), ("v", pa.int64())])


def _quiet(_: str) -> None:
    pass


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    if table.num_rows == 0:
        return []
    assert sorted(table.column_names) == ["id", "s", "v"], table.column_names  # the user columns, nothing else
    d = table.select(["id", "s", "v"]).to_pydict()
    return sorted(zip(d["id"], d["s"], d["v"]))


def _show(lake: Path, table: str = DEST, fresh_process: bool = True) -> dict[str, dict[str, Any]]:
    """``show --json`` (of a fresh process, or its function in this one): each partition's compaction entry by
    its "day" value."""
    if fresh_process:
        exe = Path(sys.executable).parent / "flash-compactor"
        done = subprocess.run([str(exe), "show", "--catalog", str(lake), "--table", table, "--json"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)
    else:
        shown = json.loads(json.dumps(describe_lake(Catalog(lake), table)))
    out = {}
    for p in shown["tables"][0]["partitions"]:
        day = dict(p["partition"])["day"] if isinstance(p["partition"], list) else p["partition"]["day"]
        out[day] = p["compaction"]
    return out


def run_history(seed: int, lake: Path) -> tuple[int, int]:
    """One random history; returns (versions checked, versions with deletion vectors)."""
    rng = random.Random(seed)
    cat = Catalog(lake)
    sort_key = rng.choice([None, "s"])
    models = {p["day"]: Model(sort_key) for p in PARTS}
    counter = iter(range(1, 10**6))
    keys = rng.randint(20, 120)

    def load(part: dict[str, str], op: str, n: int) -> None:
        rows = [{"id": rng.randint(1, keys), "s": rng.choice([None, 1, 2]), "v": next(counter)} for _ in range(n)]
        path = lake.parent / f"in-{next(counter)}.parquet"
        data = pa.Table.from_pylist(rows, schema=SCHEMA)
        pq.write_table(data.select(["id"]) if op == "delete" and rng.random() < 0.5 else data, path)
        models[part["day"]].add(cat.append(SOURCE, part, op, [str(path)]).position, op, rows)

    def run_compact() -> None:
        options = CompactOptions(
            primary_keys=("id",), sort_keys=((sort_key, "ascending"),) if sort_key else None,
            destination_compacted_table_id=DEST, hash_bucket_count=rng.choice([1, 2]),
            rows_per_compacted_file=rng.choice([10, 30, 1000]), deletion_vectors=rng.random() < 0.6)
        compact(SOURCE, options, catalog=cat, progress=_quiet)

    for part in PARTS:
        load(part, "upsert", keys)
    run_compact()
    for _ in range(rng.randint(2, 5)):
        action = rng.choice(["change", "change", "change", "optimize", "rehash", "retain"])
        if action == "change":  # spread: a few keys anywhere in the key space, in one or both partitions
            for part in rng.sample(PARTS, rng.randint(1, 2)):
                load(part, rng.choice(["upsert", "upsert", "delete"]), rng.randint(1, max(1, keys // 10)))
            run_compact()
        elif action == "optimize":
            optimize(cat, DEST, min_file_size=rng.choice([1, 1 << 20]), max_file_size=1 << 21, progress=_quiet)
        elif action == "rehash":
            rehash(cat, DEST, rng.choice([1, 2, 4]), log=_quiet)
        else:
            retain(cat, DEST, keep_last=2)
    return _check_every_version(seed, lake, cat, models)


def _check_every_version(seed: int, lake: Path, cat: Catalog, models: dict[str, Model]) -> tuple[int, int]:
    shown = _show(lake, fresh_process=seed % 20 == 0)  # the command's JSON now and then, its function otherwise
    checked = with_vectors = 0
    for part in PARTS:
        keys = normalize_partition(part)
        latest = cat.latest_compacted(DEST, keys)
        iceberg = shown[part["day"]]["iceberg"]
        assert iceberg["published"] and iceberg["version"] == latest.version, (seed, iceberg)
        table = lake_readers.pyiceberg_table(iceberg["catalog_uri"], iceberg["identifier"])
        assert table.current_snapshot().snapshot_id == latest.version
        expected_latest = models[part["day"]].rows_at(latest.last_position)
        assert _rows(table.scan().to_arrow()) == expected_latest, f"seed {seed} {part}: pyiceberg, current"
        retained = cat.compacted_versions(DEST, keys)
        # retention expired the snapshots of the versions it expired, and deleted the files only they used
        assert {s.snapshot_id for s in table.snapshots()} == set(retained), (seed, part)
        metadata = lake / cat.iceberg_root(DEST, keys) / "metadata"
        named = {int(p.name[1:].split(".")[0].split("-")[0]) for p in metadata.glob("v*.metadata.json")}
        assert named <= set(retained), (seed, part, named)
        for v in retained:
            version = cat.compacted_version(DEST, keys, v)
            expected = models[part["day"]].rows_at(version.last_position)
            where = f"seed {seed} {part} version {v}"
            assert _rows(table.scan(snapshot_id=v).to_arrow()) == expected, f"{where}: pyiceberg"
            metadata = cat.iceberg_uri(cat.iceberg_metadata_key(DEST, keys, v))
            assert _rows(lake_readers.iceberg_scan(metadata)) == expected, f"{where}: DuckDB iceberg_scan"
            location = cat.deltalake_location(DEST, keys)
            assert _rows(lake_readers.delta_scan(location, v)) == expected, f"{where}: DuckDB delta_scan"
            files = cat.export(DEST, lake.parent / "export", part, version=v, overwrite=True)
            exported = _rows(pa.concat_tables([pq.read_table(f) for f in files])) if files else []
            assert exported == expected, f"{where}: export"
            checked += 1
            with_vectors += any(f.deletion_vector is not None for f in version.files)
    return checked, with_vectors


def _histories(tmp_path: Path, seeds: range) -> tuple[int, int]:
    checked = with_vectors = 0
    for seed in seeds:
        lake = tmp_path / f"s{seed}" / "lake"
        lake.parent.mkdir()
        c, w = run_history(seed, lake)
        checked, with_vectors = checked + c, with_vectors + w
    return checked, with_vectors


def test_every_retained_version_reads_alike_in_pyiceberg_duckdb_iceberg_and_delta_export_and_a_model(
        tmp_path: Path) -> None:
    checked, with_vectors = _histories(tmp_path, range(6))
    assert checked >= 12 and with_vectors >= 1, (checked, with_vectors)
    # issue 57's acceptance, 200 seeds in all: seeds 6-105 and 106-205 in test_iceberg_histories_{a,b}.py (two
    # modules, so that the suite's workers share them)


def test_the_metadata_files_are_the_same_bytes_whichever_writer_derives_them(tmp_path: Path) -> None:
    """A second writer completing a publication (here: the files deleted and derived again from the manifests)
    writes byte-identical metadata, manifests and position delete files."""
    lake = tmp_path / "lake"
    run_history(3, lake)
    cat = Catalog(lake)
    keys = normalize_partition(PARTS[0])
    root = lake / cat.iceberg_root(DEST, keys)
    before = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    latest = cat.latest_compacted(DEST, keys)
    newest = root / "metadata" / f"v{latest.version}.metadata.json"
    newest.unlink()
    Catalog(lake).publish_iceberg(latest)
    after = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert after == before


KILL_POINTS = [("compact", p) for p in ("commit:before_delta", "commit:after_delta", "commit:after_iceberg")] + [
    (w, p) for w in ("optimize", "rehash") for p in ("commit:after_delta", "commit:after_iceberg")]


def _cli(argv: list[str], crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "flash-compactor"
    env = {k: v for k, v in os.environ.items() if k != "FLASH_CRASH_AT"}
    if crash_at:
        env["FLASH_CRASH_AT"] = crash_at
    return subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=300, env=env)


def _versions(lake: Path, tmp: Path) -> tuple[int, int, int, list[tuple[Any, ...]]]:
    """(export's version, the Delta table's, the Iceberg catalog's) and export's rows, each read independently."""
    cat = Catalog(lake)
    keys = normalize_partition(PARTS[0])
    out = tmp / "export"
    done = _cli(["export", "--catalog", str(lake), "--table", DEST, "--out", str(out), "--overwrite"])
    assert done.returncode == 0, done.stderr
    exported = _rows(pa.concat_tables([pq.read_table(f) for f in out.rglob("*.parquet")]))
    import deltalake

    delta = deltalake.DeltaTable(cat.deltalake_location(DEST, keys)).version()
    iceberg = _show(lake)[PARTS[0]["day"]]["iceberg"]
    table = lake_readers.pyiceberg_table(iceberg["catalog_uri"], iceberg["identifier"])
    return cat.latest_compacted(DEST, keys).version, delta, table.current_snapshot().snapshot_id, exported


@pytest.mark.parametrize(("writer", "point"), KILL_POINTS)
def test_kill_at_each_point_of_a_commit_then_the_next_command_leaves_delta_iceberg_and_export_on_one_version(
        tmp_path: Path, writer: str, point: str) -> None:
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    model = Model(None)
    for step in range(3):
        rows = [{"id": i, "s": None, "v": step * 10 + i} for i in range(step, step + 3)]
        path = tmp_path / f"in-{step}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
        model.add(cat.append(SOURCE, PARTS[0], "upsert", [str(path)]).position, "upsert", rows)
        if step < 2:
            compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, rows_per_compacted_file=2,
                    progress=_quiet)
    common = ["--catalog", str(lake)]
    argv = {"compact": ["compact", *common, "--table", SOURCE, "--destination", DEST],
            "optimize": ["optimize", *common, "--table", DEST],
            "rehash": ["rehash", *common, "--table", DEST, "--hash-buckets", "2"]}[writer]
    killed = _cli(argv, crash_at=point)
    assert killed.returncode == -9, killed.stderr
    exported_version, delta, iceberg, _ = _versions(lake, tmp_path)
    assert exported_version == delta  # the Delta commit is the visibility point
    # Iceberg is written after it: one version behind only when killed between the two
    assert iceberg == (delta - 1 if point == "commit:after_delta" else delta)
    again = _cli(["compact", *common, "--table", SOURCE, "--destination", DEST])  # completes, then compacts
    assert again.returncode == 0, again.stderr
    exported_version, delta, iceberg, rows = _versions(lake, tmp_path)
    assert exported_version == delta == iceberg >= 3
    assert rows == model.rows_at(10**9)
    iceberg_state = _show(lake)[PARTS[0]["day"]]["iceberg"]
    assert _rows(lake_readers.pyiceberg_rows(iceberg_state["catalog_uri"], iceberg_state["identifier"])) == rows


def test_with_iceberg_off_no_snapshot_is_written_and_show_says_why(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASH_ICEBERG", "0")
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": 1, "s": 1, "v": 1}], schema=SCHEMA), path)
    cat.append(SOURCE, PARTS[0], "upsert", [str(path)])
    compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, progress=_quiet)
    assert not (lake / "iceberg").exists()
    iceberg = _show(lake)[PARTS[0]["day"]]["iceberg"]
    assert iceberg["published"] is False and iceberg["reason"] == "FLASH_ICEBERG=0"
    assert iceberg["metadata_location"] is None


@pytest.mark.parametrize("column, reason", [
    (pa.array([1], pa.uint64()), "uint64"),
    (pa.array([2**32 - 1], pa.uint32()), "uint32"),  # published as long, pyiceberg's filtered scans lost it
    (pa.array([1], pa.timestamp("ms")), "timestamp[ms]"),
    (pa.array([[1]], pa.list_(pa.int64())), "list<element: int64>"),
])
def test_a_column_without_an_iceberg_type_leaves_the_version_unpublished_with_the_reason(
        tmp_path: Path, column: pa.Array, reason: str) -> None:
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "c": column}), path)
    cat.append(SOURCE, PARTS[0], "upsert", [str(path)])
    compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, progress=_quiet)
    iceberg = _show(lake)[PARTS[0]["day"]]["iceberg"]
    assert iceberg["published"] is False and f"column 'c' is {reason}" in iceberg["reason"], iceberg
    assert iceberg["metadata_location"] is None


def test_the_embedded_catalog_is_the_schema_pyiceberg_creates(tmp_path: Path) -> None:
    """Our catalog.db and one pyiceberg's SqlCatalog creates have the same tables and columns, so either opens the
    other's."""
    lake = tmp_path / "lake"
    run_history(1, lake)
    from pyiceberg.catalog.sql import SqlCatalog

    SqlCatalog("other", uri=f"sqlite:///{tmp_path / 'theirs.db'}")

    def columns(path: Path) -> dict[str, list[str]]:
        con = sqlite3.connect(path)
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: [r[1] for r in con.execute(f"PRAGMA table_info({n})")] for n in sorted(names)}

    assert columns(lake / "iceberg" / "catalog.db") == columns(tmp_path / "theirs.db")


def test_avro_container_files_read_back_through_pyiceberg_avro_reader(tmp_path: Path) -> None:
    """Our Avro writer against pyiceberg's reader, on random values of every type Iceberg's metadata uses."""
    from pyiceberg.avro.file import AvroFile
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.manifest import MANIFEST_LIST_FILE_SCHEMAS, ManifestFile

    from flash_pipeline.catalog import iceberg_metadata as im

    rng = random.Random(7)
    records = []
    for i in range(50):
        entries = [im.file_entry(f"/x/{rng.random()}", rng.randint(0, 1 << 40), rng.randint(1, 1 << 33),
                                 rng.random() < 0.5, i + 1, i + 1) for _ in range(rng.randint(0, 3))]
        records.append(im.manifest_list_entry(f"/m/{i}-{'é' * rng.randint(0, 3)}.avro", rng.randint(0, 1 << 40),
                                              entries, i + 1, rng.choice([0, 1])))
    path = tmp_path / "list.avro"
    path.write_bytes(avro_files.container(im.MANIFEST_FILE_SCHEMA, records, {"format-version": "2"}))
    read_schema = MANIFEST_LIST_FILE_SCHEMAS[2]
    with AvroFile[ManifestFile](PyArrowFileIO().new_input(str(path)), read_schema, read_types={-1: ManifestFile}) as f:
        got = list(f)
    assert [(m.manifest_path, m.manifest_length, int(m.content), m.added_files_count, m.existing_files_count,
             m.added_rows_count, m.existing_rows_count) for m in got] == [
        (r["manifest_path"], r["manifest_length"], r["content"], r["added_files_count"], r["existing_files_count"],
         r["added_rows_count"], r["existing_rows_count"]) for r in records]


def test_iceberg_tables_on_a_local_and_an_s3_lake_read_like_export(any_lake: Catalog, tmp_path: Path) -> None:
    """The same publication through the lake's storage on a moto S3 endpoint: pyiceberg opens the metadata file
    directly (an S3 lake has no embedded catalog) and reads every version as export gives it."""
    from pyiceberg.table import StaticTable

    cat = any_lake
    model = Model("s")
    rng = random.Random(11)
    for step in range(4):
        op = "delete" if step == 2 else "upsert"
        rows = [{"id": rng.randint(1, 8), "s": rng.randint(0, 3), "v": step * 10 + i} for i in range(6)]
        path = tmp_path / f"in-{step}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
        model.add(cat.append(SOURCE, PARTS[1], op, [str(path)]).position, op, rows)
        compact(SOURCE, ["id"], sort_keys=[("s", "ascending")], catalog=cat, destination_compacted_table_id=DEST,
                rows_per_compacted_file=2, deletion_vectors=step % 2 == 1, progress=_quiet)
    keys = normalize_partition(PARTS[1])
    s3 = cat.uri.startswith("s3://")
    assert (cat.iceberg_identifier(DEST, keys) is None) == s3 and (cat.iceberg_catalog_uri() is None) == s3
    properties = {}
    endpoint = getattr(cat.storage, "endpoint_url", None)
    if endpoint:
        properties = {"s3.endpoint": endpoint, "s3.access-key-id": os.environ["AWS_ACCESS_KEY_ID"],
                      "s3.secret-access-key": os.environ["AWS_SECRET_ACCESS_KEY"], "s3.region": "us-east-1"}
    for v in cat.compacted_versions(DEST, keys):
        location = cat.iceberg_uri(cat.iceberg_metadata_key(DEST, keys, v))
        assert location.startswith("s3://") == s3
        table = StaticTable.from_metadata(location, properties=properties)
        expected = model.rows_at(cat.compacted_version(DEST, keys, v).last_position)
        assert _rows(table.scan().to_arrow()) == expected, v
        files = cat.export(DEST, tmp_path / f"export-{v}", PARTS[1], version=v)
        assert _rows(pa.concat_tables([pq.read_table(f) for f in files])) == expected, v


def test_the_documented_iceberg_queries_run_as_written(tmp_path: Path) -> None:
    """docs/catalog-layout.md's "Iceberg tables" examples (pyiceberg through the embedded catalog, DuckDB's
    iceberg_scan), text unchanged but for their placeholders, read the model's rows."""
    import re

    import duckdb

    text = (Path(__file__).resolve().parents[2] / "docs" / "catalog-layout.md").read_text()
    section = text[text.index("## Iceberg tables"): text.index("## Encoding of table IDs")]
    (python,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    (sql,) = re.findall(r"```sql\n(.*?)```", section, flags=re.S)
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    model = Model(None)
    for step in range(3):
        rows = [{"id": i, "s": None, "v": step * 10 + i} for i in range(step, step + 4)]
        path = tmp_path / f"in-{step}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
        model.add(cat.append(SOURCE, PARTS[0], "upsert", [str(path)]).position, "upsert", rows)
        compact(SOURCE, ["id"], catalog=cat, destination_compacted_table_id=DEST, progress=_quiet)
    iceberg = _show(lake)[PARTS[0]["day"]]["iceberg"]
    scope: dict[str, Any] = {"ICEBERG": iceberg}
    exec(python, scope)  # noqa: S102
    assert _rows(scope["rows"]) == model.rows_at(10**9)
    assert _rows(scope["older"]) == model.rows_at(cat.compacted_version(DEST, normalize_partition(PARTS[0]), 2)
                                                  .last_position)
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    for name, value in {"AVRO": lake_readers._extension_file(duckdb_extension_avro, "avro"),
                        "ICEBERG_EXT": lake_readers._extension_file(duckdb_extension_iceberg, "iceberg"),
                        "METADATA_LOCATION": iceberg["metadata_location"]}.items():
        sql = sql.replace(f"'{name}'", f"'{value}'")
    con = duckdb.connect()
    statements = [x for x in sql.split(";") if x.strip()]
    for statement in statements[:-1]:
        con.execute(statement)
    assert _rows(con.sql(statements[-1]).to_arrow_table()) == model.rows_at(10**9)
