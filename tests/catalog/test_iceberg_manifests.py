"""A snapshot lists the previous snapshot's data manifests again when their files are all live (iceberg_manifests.py):
spread updates with deletion vectors write a manifest of the new file only, retention keeps the manifests a kept
snapshot lists again, and past MAX_DATA_MANIFESTS one manifest of every live file is written. Every version is
read through pyiceberg and DuckDB's iceberg_scan against export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lake_readers
from flash_pipeline import Catalog, CompactOptions, compact
from flash_pipeline.catalog import iceberg_manifests
from flash_pipeline.retention import retain

KEYS = ()


def _quiet(_: str) -> None:
    pass


def _rows(t: pa.Table) -> list[tuple[Any, ...]]:
    d = t.select(["k", "ts", "v"]).to_pydict()
    return sorted(zip(d["k"], d["ts"], d["v"]))


def _update(cat: Catalog, keys: list[int], step: int, first: bool = False) -> None:
    cat.append("S", {}, "upsert", [pa.table({"k": pa.array(keys, pa.int64()), "ts": pa.array([step] * len(keys), pa.int64()),
                                             "v": pa.array([k * 100 + step for k in keys], pa.int64())})])
    options = CompactOptions(primary_keys=("k",), sort_keys=(("ts", "ascending"),), rows_per_compacted_file=100,
                             deletion_vectors=True) if first else CompactOptions()
    compact("S", options, catalog=cat, progress=_quiet)


def _data_manifests(table: Any, v: int) -> list[tuple[str, int, int]]:
    """(file name, added files, existing files) of snapshot ``v``'s data manifests."""
    return sorted((m.manifest_path.rsplit("/", 1)[-1], m.added_files_count, m.existing_files_count)
                  for m in table.snapshot_by_id(v).manifests(table.io) if int(m.content) == 0)


def _reads_match(cat: Catalog, tmp: Path) -> int:
    table = lake_readers.pyiceberg_table(cat.iceberg_catalog_uri(), cat.iceberg_identifier("S", KEYS))
    checked = 0
    for v in cat.compacted_versions("S", KEYS):
        files = cat.export("S", tmp / "export", {}, version=v, overwrite=True)
        expected = _rows(pa.concat_tables([pq.read_table(f) for f in files]))
        assert _rows(table.scan(snapshot_id=v).to_arrow()) == expected, v
        assert _rows(lake_readers.iceberg_scan(cat.iceberg_uri(cat.iceberg_metadata_key("S", KEYS, v)))) == expected, v
        checked += 1
    return checked


def test_spread_updates_with_vectors_write_a_manifest_of_the_new_file_and_retention_keeps_the_reused_ones(
        tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "lake")
    _update(cat, list(range(1000)), 0, first=True)
    for step in range(1, 5):
        _update(cat, [step * 7, 500 + step * 11, 990 - step], step)
    table = lake_readers.pyiceberg_table(cat.iceberg_catalog_uri(), cat.iceberg_identifier("S", KEYS))
    versions = cat.compacted_versions("S", KEYS)
    for before, after in zip(versions, versions[1:]):
        was = {f.key for f in cat.compacted_version("S", KEYS, before).files}
        now = {f.key for f in cat.compacted_version("S", KEYS, after).files}
        assert was <= now, "the test's premise: every file carried (with a vector where it lost rows)"
        old, new = _data_manifests(table, before), _data_manifests(table, after)
        assert set(old) <= set(new), (before, after)  # every earlier manifest listed again, as it was
        [written] = set(new) - set(old)  # and one more: the new files alone
        assert written[0].startswith(f"{after}-data-") and written[1:] == (len(now - was), 0), written
    assert _reads_match(cat, tmp_path) == len(versions)
    retain(cat, "S", keep_last=2)
    assert len(cat.compacted_versions("S", KEYS)) == 2
    assert _reads_match(cat, tmp_path) == 2  # the first version's manifest is still listed, so still there


def test_past_the_limit_one_manifest_of_every_live_file_is_written(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iceberg_manifests, "MAX_DATA_MANIFESTS", 3)
    cat = Catalog(tmp_path / "lake")
    _update(cat, list(range(500)), 0, first=True)
    for step in range(1, 5):
        _update(cat, [step * 3, 250 + step], step)
    table = lake_readers.pyiceberg_table(cat.iceberg_catalog_uri(), cat.iceberg_identifier("S", KEYS))
    counts = [len(_data_manifests(table, v)) for v in cat.compacted_versions("S", KEYS)]
    assert counts == [1, 2, 3, 1, 2], counts  # the fourth commit would list a fourth: one of all instead
    latest = cat.latest_compacted("S", KEYS)
    [(_, added, existing)] = _data_manifests(table, latest.version - 1)
    assert added + existing == len(cat.compacted_version("S", KEYS, latest.version - 1).files)
    assert _reads_match(cat, tmp_path) == 5


def test_retention_that_finds_a_kept_snapshots_sidecar_gone_keeps_every_data_manifest(tmp_path: Path) -> None:
    """A kept snapshot whose members sidecar is gone (a racing writer built it on a snapshot a retention pass had
    just expired: tests/catalog/test_races.py) cannot say which manifests it lists: retention then deletes no data
    manifest (it raised NotFound before, failing the retention), and every kept snapshot still reads right."""
    cat = Catalog(tmp_path / "lake")
    _update(cat, list(range(1000)), 0, first=True)
    for step in range(1, 5):
        _update(cat, [step * 7, 500 + step * 11, 990 - step], step)
    folder = tmp_path / "lake" / cat.iceberg_root("S", KEYS) / "metadata"
    last = max(cat.compacted_versions("S", KEYS))
    [sidecar] = folder.glob(f"{last}-members-*.json")
    sidecar.unlink()
    data_manifests = {p.name for p in folder.glob("*-data-*.avro")}
    retain(cat, "S", keep_last=2)
    assert len(cat.compacted_versions("S", KEYS)) == 2
    assert data_manifests <= {p.name for p in folder.glob("*-data-*.avro")}  # none deleted this pass
    assert _reads_match(cat, tmp_path) == 2
