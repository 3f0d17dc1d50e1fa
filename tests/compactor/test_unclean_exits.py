"""Inputs that once exited 1 with a traceback (or hung) now exit 2 with one line naming the thing and the fix,
leaving the lake byte-identical (issue 13, acceptance item 6; the missing S3 bucket and ';' CSV are elsewhere).

Every case compares the lake's full listing and every file's bytes before and after. Compaction runs in-process
(one Ray start for the module); the real entry point is exercised once, in a subprocess, for the exit codes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compaction_helpers import quiet, read_compacted, run_compact
from flash_pipeline import Catalog, compact
from flash_pipeline.cli import main
from flash_pipeline.compactor.model.options import MAX_HASH_BUCKETS
from flash_pipeline.compactor.index.rehash import rehash
from flash_pipeline.errors import FlashError

SRC = "ACME.ORDERS.V1"
DST = "ACME.ORDERS_COMPACTED.V1"
P1, P2 = "day=1", "day=2"
PART1, PART2 = (("day", "1"),), (("day", "2"),)


def orders(ids: list[int], status: str = "NEW") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "status": [f"{status}-{i}" for i in ids]})


def snapshot(cat: Catalog) -> dict[str, bytes]:
    """The whole lake: every key and its bytes."""
    return {key: cat.storage.read(key) for key in cat.listing()}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(capsys: pytest.CaptureFixture[str], cat: Catalog, argv: list[str], *needles: str) -> str:
    """Exit 2, exactly one stderr line containing every needle, nothing on stdout, the lake byte-identical."""
    before = snapshot(cat)
    code, out, err = run(capsys, *argv)
    lines = err.splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("flash-compactor: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in err and out == ""
    assert snapshot(cat) == before
    return lines[0]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake with two partitions compacted into DST (several files, an index) and one pending delta."""
    root = tmp_path_factory.mktemp("template") / "lake"
    cat = Catalog(root)
    cat.append(SRC, PART1, "upsert", [orders([1, 2, 3])])
    cat.append(SRC, PART2, "upsert", [orders([7, 8])])
    run_compact(cat, SRC, ["id"], None, destination_compacted_table_id=DST, hash_bucket_count=2, rows_per_compacted_file=1, num_cpus=2)
    cat.append(SRC, PART1, "upsert", [orders([4], "LATER")])
    return root


@pytest.fixture
def lake(template: Path, tmp_path: Path) -> Catalog:
    shutil.copytree(template, tmp_path / "lake")
    return Catalog(tmp_path / "lake")


# ----- nested primary keys ------------------------------------------------------------------------------------
NESTED = {
    "struct": pa.array([{"a": 1}, {"a": 2}], pa.struct([("a", pa.int64())])),
    "list": pa.array([[1], [2, 3]], pa.list_(pa.int64())),
    "map": pa.array([[("x", 1)], [("y", 2)]], pa.map_(pa.string(), pa.int64())),
}


@pytest.mark.parametrize("kind", sorted(NESTED))
def test_nested_primary_key_is_refused_at_compact(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    path = tmp_path / "nested.parquet"
    pq.write_table(pa.table({"nk": NESTED[kind], "v": [1, 2]}), path)
    assert run(capsys, "append", "--catalog", lake.uri, "--table", "N.T", "--op", "upsert", str(path))[0] == 0  # keys not known yet
    line = assert_refused(capsys, lake, ["compact", "--catalog", lake.uri, "--table", "N.T", "--primary-key", "nk"], "'nk'", kind, "cannot be a primary key")
    assert "position 1" in line
    assert "skip-delta" not in line  # the key chosen is the fault, not the delta: skipping it would not help


def test_nested_primary_key_is_refused_at_append_once_keys_are_known(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The compaction into DST recorded primary key "id"; a new stream version has no schema yet, so only the
    key check stands between a struct "id" and the next compaction's failure."""
    lake.new_stream_version(SRC, PART2)
    path = tmp_path / "struct_id.parquet"
    pq.write_table(pa.table({"id": NESTED["struct"], "status": ["a", "b"]}), path)
    assert_refused(capsys, lake, ["append", "--catalog", lake.uri, "--table", SRC, "--partition", P2, "--op", "upsert", str(path)],
                   "'id'", "struct_id.parquet", "cannot be a primary key")


def test_nested_primary_key_is_refused_at_append_to_a_new_partition_of_a_keyed_table(lake: Catalog, tmp_path: Path,
                                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Keys are the table's: a partition never compacted takes them from another partition (as compact and read
    do), so a struct "k" is refused at append there too (it was accepted, and the stream blocked at compact)."""
    lake.append("N.KEYED", {"a": "1"}, "upsert", [pa.table({"k": [1, 2], "v": [1, 2]})])
    assert run(capsys, "compact", "--catalog", lake.uri, "--table", "N.KEYED", "--primary-key", "k")[0] == 0
    path = tmp_path / "struct_k.parquet"
    pq.write_table(pa.table({"k": NESTED["struct"], "v": [1, 2]}), path)
    assert_refused(capsys, lake, ["append", "--catalog", lake.uri, "--table", "N.KEYED", "--partition", "a=2", "--op", "upsert", str(path)],
                   "'k'", "struct_k.parquet", "cannot be a primary key")


# ----- --catalog naming a file, export --out naming a file ----------------------------------------------------
@pytest.mark.parametrize("command", ["show", "append", "compact", "export"])
def test_catalog_naming_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    not_a_lake = tmp_path / "notes.txt"
    not_a_lake.write_bytes(b"not a lake\n")
    good = tmp_path / "good.parquet"
    pq.write_table(orders([1]), good)
    argv = {
        "show": ["show", "--catalog", str(not_a_lake)],
        "append": ["append", "--catalog", str(not_a_lake), "--table", SRC, "--op", "upsert", str(good)],
        "compact": ["compact", "--catalog", str(not_a_lake), "--table", SRC, "--primary-key", "id"],
        "export": ["export", "--catalog", str(not_a_lake / "below"), "--table", SRC, "--out", str(tmp_path / "o")],
    }[command]
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run(capsys, *argv)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{not_a_lake} is a file, not a directory" in err and "use a directory" in err
    assert not_a_lake.read_bytes() == b"not a lake\n" and sorted(p.name for p in tmp_path.iterdir()) == before


def test_export_out_naming_an_existing_file(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "export.txt"
    target.write_bytes(b"keep me")
    assert_refused(capsys, lake, ["export", "--catalog", lake.uri, "--table", DST, "--out", str(target)], str(target), "is a file")
    assert target.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.txt", "lake"]  # no temporary directory left


# ----- corrupt catalog documents ------------------------------------------------------------------------------
def _doc(cat: Catalog, kind: str) -> str:
    return {
        "table.json": f"{cat.table_prefix(DST)}/table.json",
        "partition.json": f"{cat.partition_prefix(SRC, PART1)}/partition.json",
        "stream.json": f"{cat.stream_prefix(SRC, PART1, 1)}/stream.json",
        "delta manifest": f"{cat.stream_prefix(SRC, PART1, 1)}/deltas/{2:020d}.json",  # the pending one: every command reads it
        "compacted version manifest": cat.version_key(DST, PART1, 1),
    }[kind]


# which commands read each document (a command that never opens a document is not affected by it)
READERS = {
    "table.json": ["show", "compact"],  # compact: at its commit, after writing its files (they were left behind)
    "partition.json": ["show", "compact", "read"],
    "stream.json": ["show", "compact", "read", "append"],
    "delta manifest": ["show", "compact", "read"],
    "compacted version manifest": ["show", "compact", "read", "export"],
}
CORRUPTIONS = {"truncated": lambda b: b[: len(b) // 2], "not an object": lambda b: b"[1, 2]\n", "missing fields": lambda b: b"{}\n"}


@pytest.mark.parametrize("kind", sorted(READERS))
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_catalog_document(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, corruption: str) -> None:
    key = _doc(lake, kind)
    lake.storage.write(key, CORRUPTIONS[corruption](lake.storage.read(key)))
    extra = tmp_path / "extra.parquet"
    pq.write_table(orders([5]), extra)
    argv = {
        "show": ["show", "--catalog", lake.uri],
        "compact": ["compact", "--catalog", lake.uri, "--table", SRC, "--destination", DST],
        "read": ["read", "--catalog", lake.uri, "--table", SRC, "--compacted-table", DST],
        "export": ["export", "--catalog", lake.uri, "--table", DST, "--out", str(tmp_path / "out")],
        "append": ["append", "--catalog", lake.uri, "--table", SRC, "--partition", P1, "--op", "upsert", str(extra)],
    }
    for command in READERS[kind]:
        assert_refused(capsys, lake, argv[command], key, "is corrupt", "restore it")
    assert not (tmp_path / "out").exists()


def _edited(change: Any) -> Any:
    """A corruption that edits the document's JSON (a hand edit, another tool's writer) instead of its bytes."""
    def edit(body: bytes) -> bytes:
        doc = json.loads(body)
        change(doc)
        return json.dumps(doc).encode()
    return edit


# fields of the wrong shape: before, some crashed with an 'unexpected TypeError' naming no document, and a delta
# whose files were an object instead of a list compacted as empty (its rows silently gone)
SHAPES = {
    ("delta manifest", "files an object"): (_edited(lambda d: d.update(files={})), "'files' is dict, not a list"),
    ("delta manifest", "a file key a number"): (_edited(lambda d: d["files"][0].update(key=5)), "'key' is int"),
    ("delta manifest", "an unknown operation"): (_edited(lambda d: d.update(operation="merge")), "'operation' is 'merge'"),
    ("delta manifest", "arrow_schema a number"): (_edited(lambda d: d.update(arrow_schema=123)), "'arrow_schema' is int"),
    ("delta manifest", "schema an object"): (_edited(lambda d: d.update(schema={"id": "int64"})), "'schema' is dict"),
    ("compacted version manifest", "a file key null"): (_edited(lambda d: d["files"][0].update(key=None)), "'key' is NoneType"),
    ("compacted version manifest", "primary keys a string"): (_edited(lambda d: d.update(primary_keys="id")),
                                                              "'primary_keys' is str, not a list"),
}


@pytest.mark.parametrize(("kind", "shape"), sorted(SHAPES))
def test_catalog_document_fields_of_the_wrong_shape(lake: Catalog, capsys: pytest.CaptureFixture[str], kind: str, shape: str) -> None:
    key = _doc(lake, kind)
    edit, reason = SHAPES[(kind, shape)]
    lake.storage.write(key, edit(lake.storage.read(key)))
    argv = {"show": ["show", "--catalog", lake.uri],
            "compact": ["compact", "--catalog", lake.uri, "--table", SRC, "--destination", DST],
            "read": ["read", "--catalog", lake.uri, "--table", SRC, "--compacted-table", DST]}
    for command in READERS[kind][:3]:
        assert_refused(capsys, lake, argv[command], key, "is corrupt", reason, "restore it")


def test_a_delta_manifest_without_its_arrow_schema_blocks_its_stream_in_one_line(lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    key = _doc(lake, "delta manifest")
    lake.storage.write(key, _edited(lambda d: d.pop("arrow_schema"))(lake.storage.read(key)))
    assert_refused(capsys, lake, ["compact", "--catalog", lake.uri, "--table", SRC, "--destination", DST],
                   "position 2", "records no Arrow schema", "skip-delta")


# ----- the hash bucket bound ----------------------------------------------------------------------------------
def test_hash_bucket_count_above_the_bound(lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """A million buckets on a ten-row table once ran for hours: refused at once, CLI and Python API alike."""
    too_many = str(MAX_HASH_BUCKETS + 1)
    for argv in (
        ["compact", "--catalog", lake.uri, "--table", SRC, "--destination", DST, "--hash-buckets", "1000000"],
        ["compact", "--catalog", lake.uri, "--table", SRC, "--destination", DST, "--hash-buckets", too_many],
        ["rehash", "--catalog", lake.uri, "--table", DST, "--hash-buckets", "1000000"],
    ):
        assert_refused(capsys, lake, argv, "--hash-buckets", argv[-1], f"use 1 to {MAX_HASH_BUCKETS}")
    before = snapshot(lake)
    with pytest.raises(FlashError, match=f"hash bucket count 1000000 is out of range: use 1 to {MAX_HASH_BUCKETS}"):
        compact(SRC, ["id"], catalog=lake, destination_compacted_table_id=DST, hash_bucket_count=1_000_000, num_cpus=2, progress=quiet)
    with pytest.raises(FlashError, match="out of range"):
        rehash(lake, DST, 1_000_000, log=quiet)
    assert snapshot(lake) == before
    assert run(capsys, "rehash", "--catalog", lake.uri, "--table", DST, "--hash-buckets", str(MAX_HASH_BUCKETS))[0] == 0  # the bound itself is fine


# ----- export into a non-empty directory ----------------------------------------------------------------------
def _export_tree(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_export_into_a_non_empty_directory_is_refused_without_overwrite(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(capsys, "export", "--catalog", lake.uri, "--table", DST, "--out", str(out))[0] == 0
    (out / "notes.txt").write_text("mine")
    tree = _export_tree(out)
    assert_refused(capsys, lake, ["export", "--catalog", lake.uri, "--table", DST, "--out", str(out)], str(out), "not empty", "--overwrite")
    assert _export_tree(out) == tree
    with pytest.raises(FlashError, match="overwrite=True"):
        lake.export(DST, out)
    assert _export_tree(out) == tree and sorted(p.name for p in tmp_path.iterdir()) == ["lake", "out"]


@pytest.mark.parametrize("command", ["export", "read"])
@pytest.mark.parametrize("where", ["the lake", "inside the lake", "holding the lake"])
def test_an_out_dir_overlapping_the_lake_is_refused_even_with_overwrite(lake: Catalog, tmp_path: Path, command: str, where: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """--overwrite replaces the destination's contents: into the lake itself, a folder of it or the folder holding
    it, that would delete the lake (every delta and compacted version). Refused, the lake byte-identical."""
    lake_dir = Path(lake.uri)
    out = {"the lake": lake_dir, "inside the lake": lake_dir / "tables", "holding the lake": tmp_path}[where]
    expected = {"the lake": "is the lake", "inside the lake": "lies inside the lake", "holding the lake": "holds the lake"}[where]
    argv = [command, "--catalog", lake.uri, "--table", DST, "--out", str(out), "--overwrite"]
    assert_refused(capsys, lake, argv, str(out), expected, "outside the lake")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lake"]  # no temporary left beside it
    if command == "export":
        with pytest.raises(FlashError, match="outside the lake"):
            lake.export(DST, out, overwrite=True)
    code, _, err = run(capsys, command, "--catalog", lake.uri, "--table", DST, "--out", str(tmp_path / "elsewhere"))
    assert (code, err) == (0, "")


@pytest.mark.parametrize("command", ["export", "read"])
def test_an_out_uri_is_refused_not_made_a_relative_folder(lake: Catalog, tmp_path: Path, command: str,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """--out s3://b/p failed with "unexpected ArrowInvalid" (exit 1) and left an empty ./s3:/b/p folder tree, the
    URI taken as a relative path: refused in one line (exit 2), nothing written in the working directory."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = [command, "--catalog", lake.uri, "--table", DST, "--out", "s3://bucket/exported"]
    assert_refused(capsys, lake, argv, "s3://bucket/exported", "is a URI", "local directory")
    assert list(work.iterdir()) == []
    if command == "export":
        with pytest.raises(FlashError, match="is a URI"):
            lake.export(DST, "s3://bucket/exported")
    code, _, err = run(capsys, command, "--catalog", lake.uri, "--table", DST, "--out", "./backup:/2026")  # a folder
    assert (code, err) == (0, "") and (work / "backup:" / "2026").is_dir()


def test_export_overwrite_swaps_in_one_step_so_a_crash_never_leaves_the_dir_missing(lake: Catalog, tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """--overwrite replaced DIR with two renames (DIR aside, the new one in): a crash between them left no DIR,
    and both exports in hidden folders. Now the two directories are exchanged in one step (Linux renameat2): a
    crash right after it leaves DIR with the new export and the old one in the hidden .DIR.export-* folder (the
    one leftover docs/cli.md names); without the exchange the two renames remain, with the same result."""
    from flash_pipeline.catalog import export_files

    out = tmp_path / "out"
    lake.export(DST, out)
    (out / "old-marker").write_text("old")
    real_rmtree = export_files.shutil.rmtree

    def crash(path: Any, *args: Any, **kwargs: Any) -> None:
        if ".out.export-" in str(path):
            raise KeyboardInterrupt  # the process dies before removing the old export
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(export_files.shutil, "rmtree", crash)
    with pytest.raises(KeyboardInterrupt):
        lake.export(DST, out, overwrite=True)
    assert out.is_dir() and not (out / "old-marker").exists() and any(out.rglob("*.parquet"))
    hidden = [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert len(hidden) == 1 and hidden[0].name.startswith(".out.export-") and (hidden[0] / "old-marker").exists()
    monkeypatch.setattr(export_files.shutil, "rmtree", real_rmtree)
    real_rmtree(hidden[0])
    monkeypatch.setattr(export_files, "_exchange", lambda a, b: False)  # a system without renameat2
    (out / "old-marker").write_text("old")
    lake.export(DST, out, overwrite=True)
    assert not (out / "old-marker").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["lake", "out"]


def test_export_overwrite_leaves_no_stale_file_so_deleted_rows_stay_deleted(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Export, delete rows (a whole partition and part of another), compact, export --overwrite: a reader of the
    directory (DuckDB over every Parquet file in it) sees exactly the compacted rows, none of the deleted ones."""
    out = tmp_path / "out"
    assert run(capsys, "export", "--catalog", lake.uri, "--table", DST, "--out", str(out))[0] == 0
    before_files = set(_export_tree(out))
    assert len(before_files) == 5  # one row per file: ids 1 2 3 and 7 8
    lake.append(SRC, PART1, "delete", [pa.table({"id": pa.array([1, 2], pa.int64())})])
    lake.append(SRC, PART2, "delete", [pa.table({"id": pa.array([7, 8], pa.int64())})])
    run_compact(lake, SRC, None, None, destination_compacted_table_id=DST, num_cpus=2)
    code, printed, err = run(capsys, "export", "--catalog", lake.uri, "--table", DST, "--out", str(out), "--overwrite")
    assert (code, err) == (0, "")
    assert sorted(printed.split()) == sorted(str(out / name) for name in _export_tree(out))
    compacted = [read_compacted(lake, DST, p) for p in (PART1, PART2)]
    expected = sorted((r["id"], r["status"]) for t in compacted if t is not None for r in t.select(["id", "status"]).to_pylist())
    assert [i for i, _ in expected] == [3, 4]
    got = duckdb.sql(f"SELECT id, status FROM read_parquet('{out}/**/*.parquet') ORDER BY id").fetchall()
    assert got == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lake", "out"]  # the old export and the temporary are gone


# ----- the real entry point -----------------------------------------------------------------------------------
def test_exit_codes_through_the_installed_command(lake: Catalog, tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "flash-compactor"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flash_pipeline.cli"]
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    key = _doc(lake, "compacted version manifest")
    lake.storage.write(key, b"{\"version\": 1, ")
    before = snapshot(lake)
    for argv, needle in [
        (["show", "--catalog", str(a_file)], "is a file"),
        (["export", "--catalog", lake.uri, "--table", DST, "--out", str(a_file)], "is a file"),
        (["show", "--catalog", lake.uri, "--table", DST], key),
        (["compact", "--catalog", lake.uri, "--table", SRC, "--primary-key", "id", "--hash-buckets", "1000000"], "1000000"),
    ]:
        proc = subprocess.run(cmd + argv, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert snapshot(lake) == before and a_file.read_text() == "x"


def test_a_delete_without_the_key_columns_is_refused_at_append_to_a_new_partition_of_a_keyed_table(
        lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Keys are the table's: such a delete was accepted in a partition never compacted, then stopped every
    compaction of the table (exit 2 for each partition) while read printed 0 rows. Refused at the door now, as in a
    compacted partition, naming the partition that records the keys."""
    lake.append("N.DEL", {"a": "1"}, "upsert", [pa.table({"k": [1, 2], "v": [1, 2]})])
    assert run(capsys, "compact", "--catalog", lake.uri, "--table", "N.DEL", "--primary-key", "k")[0] == 0
    path = tmp_path / "del_v.parquet"
    pq.write_table(pa.table({"v": [1]}), path)
    assert_refused(capsys, lake, ["append", "--catalog", lake.uri, "--table", "N.DEL", "--partition", "a=2", "--op", "delete", str(path)],
                   "del_v.parquet", "lacks primary key column(s) ['k']", "[a=1]")
    lake.append("N.DEL", {"a": "2"}, "upsert", [pa.table({"k": [5], "v": [5]})])
    assert run(capsys, "compact", "--catalog", lake.uri, "--table", "N.DEL")[0] == 0


def test_a_delete_in_a_new_partition_needs_the_keys_of_one_of_the_tables_compactions(lake: Catalog) -> None:
    """Partitions compacted into two destinations with different keys: a delete in a new partition carrying one
    destination's keys is accepted (the first version of the check refused it for lacking the other's)."""
    lake.append("S", {"p": "a"}, "upsert", [pa.table({"k1": [1], "k2": [1]})])
    lake.append("S", {"p": "b"}, "upsert", [pa.table({"k1": [1], "k2": [1]})])
    compact("S", ["k1"], catalog=lake, partitions=[{"p": "a"}], destination_compacted_table_id="D1", progress=lambda m: None)
    compact("S", ["k2"], catalog=lake, partitions=[{"p": "b"}], destination_compacted_table_id="D2", progress=lambda m: None)
    assert lake.append("S", {"p": "c"}, "delete", [pa.table({"k2": [1]})]).position == 1
    with pytest.raises(FlashError, match=r"lacks primary key column\(s\)"):
        lake.append("S", {"p": "d"}, "delete", [pa.table({"v": [1]})])


def test_the_delete_key_check_finds_keys_recorded_past_the_first_partitions(lake: Catalog) -> None:
    """The second review: the bounded scan of the check asked 4 partitions and let a delete lacking the key into
    a new partition when only a later partition was compacted (then every compaction of the table stopped).
    Every partition's compaction in place is asked now (one listing each)."""
    for p in "abcde":
        lake.append("S", {"p": p}, "upsert", [pa.table({"k": [1], "v": [p]})])
    compact("S", ["k"], catalog=lake, partitions=[{"p": "e"}], progress=lambda m: None)
    with pytest.raises(FlashError, match=r"lacks primary key column\(s\) \['k'\].*\[p=e\]"):
        lake.append("S", {"p": "f"}, "delete", [pa.table({"v": ["x"]})])


def test_the_delete_key_check_finds_a_compaction_elsewhere_past_the_first_partitions(lake: Catalog) -> None:
    """The third review: with only the fifth partition compacted (into D), a delete lacking the key got into a new
    partition (then every compaction of the table stopped)."""
    for p in "abcde":
        lake.append("S", {"p": p}, "upsert", [pa.table({"k": [1], "v": [p]})])
    compact("S", ["k"], catalog=lake, partitions=[{"p": "e"}], destination_compacted_table_id="D", progress=lambda m: None)
    with pytest.raises(FlashError, match=r"lacks primary key column\(s\) \['k'\].*'D' \[p=e\]"):
        lake.append("S", {"p": "f"}, "delete", [pa.table({"v": ["x"]})])
    assert lake.append("S", {"p": "f"}, "delete", [pa.table({"k": [1]})]).position == 1
