"""A catalog the user runs, configured by FLASH_ICEBERG_CATALOG (iceberg_external.py): pyiceberg's SQL catalog on its
own database, and AWS Glue (moto's server) for an S3 lake. Every retained version is read through the configured
catalog (time travel by snapshot id) and equals export and the model; retention's expiry reaches the catalog; a
catalog that cannot be reached leaves the version committed, says so, and the next compaction catches it up."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_iceberg_publication import DEST, PARTS, SCHEMA, SOURCE, _rows, run_history

from flash_pipeline import Catalog, compact
from flash_pipeline.catalog.encoding import normalize_partition, partition_component
from flash_pipeline.retention import retain
from stream_model import Model


def _load(config: dict[str, str]) -> Any:
    from pyiceberg.catalog import load_catalog

    props = dict(config)
    return load_catalog(props.pop("name", "flash"), **props)


def test_every_retained_version_reads_through_a_configured_sql_catalog(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Random histories (upserts, deletes, vectors, optimize, rehash, retain) with pyiceberg's SQL catalog on its
    own SQLite database configured: the catalog's table per partition has exactly the retained versions as
    snapshots, each reads like export, and its metadata files live apart from ours."""
    checked = 0
    for seed in (0, 4, 9):  # seed 0: show --json in a fresh process (run_history)
        lake = tmp_path / f"s{seed}" / "lake"
        lake.parent.mkdir()
        config = {"name": "theirs", "type": "sql", "uri": f"sqlite:///{lake.parent / 'theirs.db'}"}
        monkeypatch.setenv("FLASH_ICEBERG_CATALOG", json.dumps(config))
        run_history(seed, lake)
        cat = Catalog(lake)
        catalog = _load(config)
        for part in PARTS:
            keys = normalize_partition(part)
            table = catalog.load_table((DEST, partition_component(keys)))
            retained = cat.compacted_versions(DEST, keys)
            assert {s.snapshot_id for s in table.snapshots()} == set(retained), (seed, part)
            assert table.current_snapshot().snapshot_id == retained[-1]
            assert "/catalog-metadata/" in table.metadata_location or table.metadata_location.endswith(
                f"v{retained[-1]}.metadata.json")  # registered from ours, or written by the catalog apart
            for v in retained:
                files = cat.export(DEST, tmp_path / "export", part, version=v, overwrite=True)
                exported = _rows(pa.concat_tables([pq.read_table(f) for f in files])) if files else []
                assert _rows(table.scan(snapshot_id=v).to_arrow()) == exported, (seed, part, v)
                checked += 1
        assert not [p for p in (lake / "iceberg").rglob("metadata/*") if "-" in p.name and p.name[0].isdigit()
                    and p.name.endswith(".metadata.json")], "the catalog wrote into our metadata folder"
    assert checked >= 10


def test_a_table_of_another_lake_in_the_catalog_is_not_touched(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two lakes with the same table IDs and one configured catalog: the second lake's compaction does not commit
    onto the first lake's table (same identifier, other location); it is committed and says why it is not
    published there."""
    config = {"name": "theirs", "type": "sql", "uri": f"sqlite:///{tmp_path / 'theirs.db'}"}
    monkeypatch.setenv("FLASH_ICEBERG_CATALOG", json.dumps(config))
    model = Model(None)
    first, second = Catalog(tmp_path / "one"), Catalog(tmp_path / "two")
    for cat in (first, second):
        _load_and_compact(cat, tmp_path, model, 0)
    compact(SOURCE, ["id"], catalog=first, destination_compacted_table_id=DEST, progress=lambda _: None)
    with pytest.raises(Exception, match="is another table"):
        compact(SOURCE, ["id"], catalog=second, destination_compacted_table_id=DEST, progress=lambda _: None)
    assert second.latest_compacted(DEST, normalize_partition(PARTS[0])).version == 1  # committed all the same
    table = _load(config).load_table((DEST, partition_component(normalize_partition(PARTS[0]))))
    assert table.location() == first.iceberg_uri(first.iceberg_root(DEST, normalize_partition(PARTS[0])))


def _load_and_compact(cat: Catalog, tmp: Path, model: Model, step: int) -> None:
    rows = [{"id": i, "s": None, "v": step * 10 + i} for i in range(step, step + 4)]
    path = tmp / f"in-{step}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    model.add(cat.append(SOURCE, PARTS[0], "upsert", [str(path)]).position, "upsert", rows)


def test_an_unreachable_catalog_leaves_the_version_committed_and_the_next_compaction_catches_it_up(
        tmp_path: Path) -> None:
    """A fresh `compact` with a catalog it cannot reach exits non-zero naming the committed version; export has
    it. With the catalog reachable, the next compaction brings the catalog's table to both versions."""
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    model = Model(None)
    exe = Path(sys.executable).parent / "flash-compactor"
    argv = [str(exe), "compact", "--catalog", str(lake), "--table", SOURCE, "--destination", DEST,
            "--primary-key", "id"]
    good = {"name": "theirs", "type": "sql", "uri": f"sqlite:///{tmp_path / 'theirs.db'}"}
    bad = {"name": "theirs", "type": "sql", "uri": f"sqlite:///{tmp_path / 'missing' / 'dir' / 'theirs.db'}"}
    for step, config in enumerate((good, bad, good)):
        _load_and_compact(cat, tmp_path, model, step)
        env = {**os.environ, "FLASH_ICEBERG_CATALOG": json.dumps(config)}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        if config is bad:
            assert done.returncode == 1, done.stderr  # committed, so not exit 2 ("the lake is unchanged")
            assert "compacted version 2" in done.stderr and "is committed but its Iceberg snapshot failed" \
                in done.stderr, done.stderr
            files = cat.export(DEST, tmp_path / "export", PARTS[0], overwrite=True)
            assert _rows(pa.concat_tables([pq.read_table(f) for f in files])) == model.rows_at(10**9)
        else:
            assert done.returncode == 0, done.stderr
    table = _load(good).load_table((DEST, partition_component(normalize_partition(PARTS[0]))))
    assert [s.snapshot_id for s in table.snapshots()] == [1, 2, 3]
    assert _rows(table.scan().to_arrow()) == model.rows_at(10**9)


def test_glue_on_an_s3_lake(s3_lake: Catalog, moto_endpoint: str, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS Glue (moto's server) for an S3 lake, which has no embedded catalog: show names the identifier, Glue
    holds every retained version (retention's expiry included), each reads like export through pyiceberg."""
    cat = s3_lake
    aws = {"glue.endpoint": moto_endpoint, "glue.region": "us-east-1", "glue.access-key-id": "testing",
           "glue.secret-access-key": "testing", "s3.endpoint": moto_endpoint, "s3.region": "us-east-1",
           "s3.access-key-id": "testing", "s3.secret-access-key": "testing"}
    config = {"name": "glue", "type": "glue", **aws}
    monkeypatch.setenv("FLASH_ICEBERG_CATALOG", json.dumps(config))
    model = Model("s")
    rng = random.Random(5)
    for step in range(5):
        op = "delete" if step == 3 else "upsert"
        rows = [{"id": rng.randint(1, 9), "s": rng.randint(0, 3), "v": step * 10 + i} for i in range(6)]
        path = tmp_path / f"in-{step}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
        model.add(cat.append(SOURCE, PARTS[1], op, [str(path)]).position, op, rows)
        compact(SOURCE, ["id"], sort_keys=[("s", "ascending")], catalog=cat, destination_compacted_table_id=DEST,
                rows_per_compacted_file=2, deletion_vectors=step % 2 == 1, progress=lambda _: None)
    retain(cat, DEST, keep_last=3)
    keys = normalize_partition(PARTS[1])
    identifier = cat.iceberg_identifier(DEST, keys)
    assert identifier == [DEST, partition_component(keys)]
    table = _load(config).load_table(tuple(identifier))
    retained = cat.compacted_versions(DEST, keys)
    assert {s.snapshot_id for s in table.snapshots()} == set(retained) and len(retained) == 3
    for v in retained:
        expected = model.rows_at(cat.compacted_version(DEST, keys, v).last_position)
        assert _rows(table.scan(snapshot_id=v).to_arrow()) == expected, v


@pytest.mark.parametrize("value", ["{not json", "[1, 2]"])
def test_a_catalog_setting_that_is_not_json_properties_stops_compact_before_any_write(tmp_path: Path,
                                                                                      value: str) -> None:
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    _load_and_compact(cat, tmp_path, Model(None), 0)
    before = sorted(p.relative_to(lake) for p in lake.rglob("*"))
    exe = Path(sys.executable).parent / "flash-compactor"
    done = subprocess.run([str(exe), "compact", "--catalog", str(lake), "--table", SOURCE, "--destination", DEST,
                           "--primary-key", "id"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FLASH_ICEBERG_CATALOG": value})
    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()
    assert "FLASH_ICEBERG_CATALOG is not a JSON object" in line, line
    assert sorted(p.relative_to(lake) for p in lake.rglob("*")) == before  # the lake as it was


def test_a_namespace_another_writer_creates_between_pyicebergs_check_and_insert_is_taken_as_created(
        tmp_path: Path) -> None:
    """Two partitions' sessions publishing at once into a configured SQL catalog: pyiceberg checks that the namespace
    is missing, the other writer creates it, pyiceberg's insert then fails on the database's unique key. The
    publication reads the namespace back and goes on; a failure that leaves no namespace still raises."""
    from pyiceberg.catalog.sql import SqlCatalog

    from flash_pipeline.catalog import iceberg_external

    uri = f"sqlite:///{tmp_path / 'theirs.db'}"
    ours, racer = SqlCatalog("theirs", uri=uri), SqlCatalog("theirs", uri=uri)
    namespace = ("LAKE", "EVENTS")
    checks = []

    def exists_after_a_racer(ns: Any) -> bool:
        checks.append(ns)
        if len(checks) == 1:  # pyiceberg's own check: the racer creates it right after it
            racer.create_namespace(ns)
            return False
        return SqlCatalog.namespace_exists(ours, ns)

    ours.namespace_exists = exists_after_a_racer  # type: ignore[method-assign]
    iceberg_external._ensure_namespace(ours, namespace)
    assert len(checks) == 2 and racer.namespace_exists(namespace)

    def refuse(ns: Any) -> None:
        raise RuntimeError("the database refused the insert")

    other = ("LAKE", "OTHER")
    ours.create_namespace_if_not_exists = refuse  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="refused"):  # no namespace afterwards: the failure stands
        iceberg_external._ensure_namespace(ours, other)


def test_sessions_publishing_at_once_load_a_new_sql_catalog_once(tmp_path: Path) -> None:
    """Two partitions' sessions publishing at once each loaded a new SQL catalog, whose loading creates its tables
    (a check, then a create): one failed with "table iceberg_tables already exists", leaving its version
    unpublished (a full run found it once a publication failure was no longer retried as a failed create)."""
    import threading

    from flash_pipeline.catalog import iceberg_external

    errors: list[str] = []
    for trial in range(10):
        config = json.dumps({"name": "c", "type": "sql", "uri": f"sqlite:///{tmp_path / f'c{trial}.db'}"}, sort_keys=True)

        def load(cfg: str = config) -> None:
            try:
                iceberg_external._catalog(cfg)
            except Exception as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(repr(exc))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
