"""Content checksums recorded at commit, `verify`, and the carried-file size check (issue 13, item 8).

One compacted lake is built per test process (two deltas compacted into 4-5 files and a 2-bucket index, plus one
delta left uncompacted); each damage test works on its own copy, damages it one way, and checks that
`flash-compactor verify` exits 4 with a line naming the damaged file (and that the healthy copy passes).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flash_pipeline import Catalog, compact
from flash_pipeline.catalog.model import DataFile, IndexFile
from flash_pipeline.catalog.checksums import checksum_of
from flash_pipeline.cli import main
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.errors import IntegrityError
from flash_pipeline.verify import verify

SRC, DST = "T.SRC", "T.DST"
PART = {"day": "d1"}
P = (("day", "d1"),)


def rows(ids: list[int], ts: int, value: str = "v") -> pa.Table:
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "ts": pa.array([ts] * len(ids), pa.int64()),
        "v": pa.array([f"{value}{i}" for i in ids]),
    })


def quiet(_message: str) -> None:
    pass


def build_lake(cat: Catalog) -> None:
    cat.append(SRC, PART, "upsert", [rows(list(range(0, 60)), 1), rows(list(range(60, 90)), 1)])
    cat.append(SRC, PART, "upsert", [rows(list(range(30, 50)), 2, "w")])
    compact(SRC, ["id"], sort_keys=[("ts", "ascending")], catalog=cat, destination_compacted_table_id=DST,
            hash_bucket_count=2, rows_per_compacted_file=25, num_cpus=2, progress=quiet)
    cat.append(SRC, PART, "upsert", [rows([5, 95], 3, "x")])  # left uncompacted


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> Path:
    # moto_endpoint first: it sets the AWS environment that the Ray workers this compaction starts inherit
    root = tmp_path_factory.mktemp("verify") / "lake"
    build_lake(Catalog(root))
    return root


@pytest.fixture
def lake_copy(built: Path, tmp_path: Path) -> Catalog:
    dst = tmp_path / "lake"
    shutil.copytree(built, dst)
    return Catalog(dst)


def run_verify(cat: Catalog, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["verify", "--catalog", cat.uri, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def path(cat: Catalog, key: str) -> Path:
    return Path(cat.uri) / key


def latest(cat: Catalog):  # noqa: ANN201 - CompactedVersion
    v = cat.latest_compacted(DST, P)
    assert v is not None
    return v


# ----- checksums recorded and a healthy lake -------------------------------------------------------------------
def test_every_committed_file_records_its_content_checksum(built: Path) -> None:
    cat = Catalog(built)
    v = latest(cat)
    assert len(v.files) >= 4 and v.index is not None and v.index.hash_bucket_count == 2
    refs: list[DataFile | IndexFile] = [*v.files, *(f for b in v.index.buckets for f in b)]
    refs += [f for d in cat.deltas(SRC, P) for f in d.files]
    for f in refs:
        data = cat.storage.read(f.key)
        assert f.checksum == "sha256:" + hashlib.sha256(data).hexdigest(), f.key
    # appended from a local file too (the upload path)
    local = built.parent / "extra.parquet"
    pq.write_table(rows([1000], 9), local)
    other = Catalog(built.parent / "other")
    delta = other.append("T.X", {}, "upsert", [local])
    assert delta.files[0].checksum == "sha256:" + hashlib.sha256(local.read_bytes()).hexdigest()
    assert DataFile.from_json(delta.files[0].to_json()) == delta.files[0]


def test_documents_without_checksums_still_load_and_verify(lake_copy: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """Manifests written before checksums existed: the field is optional (size and rows are still checked)."""
    old = {"file_number": 1, "key": "k", "rows": 2, "bytes": 3, "content_type": "parquet"}
    assert DataFile.from_json(old).checksum == "" and "checksum" not in DataFile.from_json(old).to_json()
    assert IndexFile.from_json({"key": "k", "rows": 1, "bytes": 2}).checksum == ""
    v = latest(lake_copy)
    key = lake_copy.version_key(DST, P, v.version)
    doc = json.loads(lake_copy.storage.read(key))
    for f in doc["files"]:
        del f["checksum"]
    for bucket in doc["index"]["buckets"]:
        for f in bucket:
            del f["checksum"]
    path(lake_copy, key).write_text(json.dumps(doc))
    result = verify(lake_copy, DST)
    assert result.ok and result.unchecksummed == len(v.files) + sum(len(b) for b in v.index.buckets)
    # without a checksum a same-size replacement goes unseen, but a lost file does not
    path(lake_copy, v.files[0].key).unlink()
    code, _, err = run_verify(lake_copy, capsys, "--table", DST)
    assert code == 4 and v.files[0].key in err and "missing" in err


def test_healthy_lake_verifies_clean(any_lake: Catalog, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    build_lake(any_lake)
    result = verify(any_lake)
    assert result.ok, [p.line() for p in result.problems]
    assert result.tables == 2 and result.versions == 1 and result.deltas == 1  # the delta after the compaction
    assert result.unchecksummed == 0 and result.files == len(latest(any_lake).files) + 2 + 1
    all_versions = verify(any_lake, DST, [P], all_versions=True)
    assert all_versions.ok and all_versions.versions == 1
    endpoint = getattr(any_lake.storage, "endpoint_url", None)
    if endpoint:
        monkeypatch.setenv("FLASH_S3_ENDPOINT_URL", endpoint)
    code, out, err = run_verify(any_lake, capsys)
    assert code == 0 and err == "" and out.strip().endswith(": ok") and len(out.strip().splitlines()) == 1
    # the same lake, one file lost: found on either store
    doomed = latest(any_lake).files[1].key
    any_lake.storage.delete(doomed)
    code, out, err = run_verify(any_lake, capsys, "--table", DST, "--partition", "day=d1")
    lines = err.strip().splitlines()
    assert code == 4 and len(lines) == 1
    assert lines[0].startswith("flash-compactor: error: T.DST [day=d1] compacted version 1: " + doomed + ": data file 2: missing")
    assert "1 problem(s)" in out


# ----- each damage detected --------------------------------------------------------------------------------
def test_replaced_data_file_with_same_row_count_is_detected(lake_copy: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    f = latest(lake_copy).files[2]
    p = path(lake_copy, f.key)
    table = pq.read_table(p)
    forged = table.set_column(table.schema.get_field_index("v"), "v", pa.array(["forged"] * table.num_rows))
    pq.write_table(forged, p)
    assert pq.ParquetFile(p).metadata.num_rows == f.rows  # the row count alone would not tell
    code, _, err = run_verify(lake_copy, capsys)
    assert code == 4
    (line,) = err.strip().splitlines()
    assert f.key in line and "compacted version 1:" in line and "content checksum" in line and "rows, the manifest" not in line


def test_truncated_index_file_is_detected(lake_copy: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    v = latest(lake_copy)
    f = next(f for b in v.index.buckets for f in b if f.rows > 2)
    p = path(lake_copy, f.key)
    os.truncate(p, f.bytes - (f.bytes // f.rows - 4))  # most of one row: not a whole number of rows
    code, _, err = run_verify(lake_copy, capsys)
    assert code == 4
    lines = err.strip().splitlines()
    assert any(f.key in line and "compacted version 1 index" in line and "not a multiple" in line for line in lines), lines
    assert any(f"the index holds {v.rows - 1} rows, the version's files {v.rows}" in line for line in lines), lines


def test_deleted_delta_file_is_detected(lake_copy: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    compacted, _, pending = lake_copy.deltas(SRC, P)
    path(lake_copy, pending.files[0].key).unlink()
    # a compacted delta's files are not checked: the compacted version holds their rows
    path(lake_copy, compacted.files[0].key).unlink()
    code, _, err = run_verify(lake_copy, capsys, "--table", SRC)
    assert code == 4
    (line,) = err.strip().splitlines()
    assert line.startswith(f"flash-compactor: error: T.SRC [day=d1] stream 1 delta 3: {pending.files[0].key}: data file 1: missing")
    assert verify(lake_copy, DST).ok


def test_index_pointer_out_of_range_is_detected(lake_copy: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad index committed through the catalog API: checksums match (written by us), pointers do not."""
    v = latest(lake_copy)
    bucket = pk_index.read_bucket(lake_copy.storage, v.index, 0).copy()
    bucket["file"][-1] = v.files[-1].file_number  # still in pointer order: the last file ...
    bucket["row"][-1] = v.files[-1].rows + 7  # ... but past its end
    prefix = f"{lake_copy.compacted_prefix(DST, P)}/index/bad"
    files0 = pk_index.write_bucket(lake_copy.storage, prefix, 0, bucket, 1_000_000, in_pointer_order=True)
    index = v.index.__class__(v.index.version + 1, 2, v.index.sort_key_width, (files0, v.index.buckets[1]))
    assert lake_copy.commit_compacted(v.replace(version=v.version + 1, index=index, commit_id="bad", data_change=False))
    code, _, err = run_verify(lake_copy, capsys, "--table", DST)
    assert code == 4
    (line,) = err.strip().splitlines()
    assert f"compacted version {v.version + 1} index: {files0[0].key}: bucket 0: 1 of" in line
    assert f"is beyond file {v.files[-1].file_number}'s {v.files[-1].rows} rows" in line
    # the version before it is still fine, and --all-versions reports the bad one too
    result = verify(lake_copy, DST, all_versions=True)
    assert result.versions == 2 and [p.where for p in result.problems] == [f"compacted version {v.version + 1} index"]


def test_optimize_records_checksums(lake_copy: Catalog) -> None:
    from flash_pipeline.optimize import optimize

    optimize(lake_copy, DST, min_file_size=1 << 30, max_file_size=1 << 30, progress=quiet)
    v = latest(lake_copy)
    assert v.version == 2 and len(v.files) == 1 and v.files[0].checksum == checksum_of(lake_copy.storage.read(v.files[0].key))
    assert all(f.checksum for b in v.index.buckets for f in b)
    assert verify(lake_copy, all_versions=True).ok


# ----- the compactor's check before committing -------------------------------------------------------------
def test_compaction_over_a_carried_file_whose_size_changed_stops(lake_copy: Catalog) -> None:
    v = latest(lake_copy)
    ids = {f.file_number: set(lake_copy.read_file(f, ["id"]).column("id").to_pylist()) for f in v.files}
    key = min(ids[v.files[-1].file_number])
    lake_copy.append(SRC, PART, "upsert", [rows([key], 9, "y")])
    # a healthy incremental compaction carries every file whose keys the pending deltas do not touch
    victim = next(f for f in v.files if not ids[f.file_number] & {5, 95, key})
    with open(path(lake_copy, victim.key), "ab") as fh:
        fh.write(b"\0" * 16)
    before = lake_copy.listing()
    with pytest.raises(IntegrityError) as info:
        compact(SRC, catalog=lake_copy, destination_compacted_table_id=DST, num_cpus=2, progress=quiet)
    message = str(info.value)
    assert victim.key in message and "carried by reference" in message and f"{victim.bytes + 16} B" in message
    assert lake_copy.listing() == before
    assert latest(lake_copy).version == v.version
    # restored, the same compaction carries the file (with its recorded checksum) and commits
    os.truncate(path(lake_copy, victim.key), victim.bytes)
    compact(SRC, catalog=lake_copy, destination_compacted_table_id=DST, num_cpus=2, progress=quiet)
    new = latest(lake_copy)
    assert new.version == v.version + 1 and new.stats.get("round") == 1
    carried = [f for f in new.files if f.key == victim.key]
    assert carried and carried[0].checksum == victim.checksum != ""
    assert verify(lake_copy).ok


def test_a_delta_log_that_disagrees_with_its_compacted_version_is_detected(lake_copy: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    v = latest(lake_copy)
    commit = path(lake_copy, lake_copy.deltalake_commit_key(DST, P, v.version))
    lines = commit.read_text().splitlines()
    dropped = next(line for line in lines if line.startswith('{"add"'))
    commit.write_text("\n".join(line for line in lines if line != dropped) + "\n")  # one file missing from Delta's view
    code, _, err = run_verify(lake_copy, capsys)
    assert code == 4
    (line,) = err.strip().splitlines()
    assert f"compacted version {v.version} Delta log" in line and "lacks 1 of its files" in line, line
