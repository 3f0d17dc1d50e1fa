"""The ``flash-compactor`` command line: the happy paths and every bad-input case of the contract.

A bad input exits with code 2, prints exactly one line on stderr naming the thing, and leaves the catalog
unchanged (its full listing is compared before and after).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from conftest import catalog_env
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.model import CompactedVersion, DataFile, schema_to_b64
from flash_pipeline.catalog.files import schema_to_json
from flash_pipeline.cli import main

TABLE = "ACME.CUSTOMER_ORDERS.V1"
DAY = "Order Day=1995-04-03"


def orders(ids: list[int], status: str = "SUBMITTED") -> pa.Table:
    return pa.table(
        {
            "Order ID": pa.array(ids, pa.int64()),
            "Order Status": pa.array([status] * len(ids), pa.string()),
            "Last Updated": pa.array([1000 + i for i in ids], pa.int64()),
        }
    )


def parquet(tmp: Path, name: str, table: pa.Table) -> Path:
    path = tmp / name
    pq.write_table(table, path)
    return path


@pytest.fixture
def cli_lake(any_lake: Catalog, monkeypatch: pytest.MonkeyPatch) -> Catalog:
    endpoint = getattr(any_lake.storage, "endpoint_url", None)
    if endpoint:
        monkeypatch.setenv("FLASH_S3_ENDPOINT_URL", endpoint)
    return any_lake


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def populated(cli_lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Catalog:
    code, out, err = run(capsys, "append", "--catalog", cli_lake.uri, "--table", TABLE, "--partition", DAY,
                         "--op", "upsert", str(parquet(tmp_path, "first.parquet", orders([1, 2, 3]))))
    assert (code, out.strip(), err) == (0, "1", "")
    return cli_lake


# ----- happy paths ------------------------------------------------------------------------------------------
def test_append_prints_positions_and_show_reports_them(populated: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = populated.uri
    f2 = parquet(tmp_path, "second.parquet", orders([3, 4], "PACKED"))
    csv = tmp_path / "third.csv"
    pacsv.write_csv(orders([5]), csv)
    assert run(capsys, "append", "--catalog", uri, "--table", TABLE, "--partition", DAY, "--op", "upsert", str(f2), str(csv))[:2] == (0, "2\n")
    dels = parquet(tmp_path, "del.parquet", orders([1]).select(["Order ID"]))
    assert run(capsys, "append", "--catalog", uri, "--table", TABLE, "--partition", DAY, "--op", "delete", str(dels))[:2] == (0, "3\n")
    assert run(capsys, "append", "--catalog", uri, "--table", "OTHER.T", "--op", "upsert", str(f2))[:2] == (0, "1\n")

    code, out, err = run(capsys, "show", "--catalog", uri, "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert [t["table_id"] for t in data["tables"]] == ["ACME.CUSTOMER_ORDERS.V1", "OTHER.T"]
    (part,) = data["tables"][0]["partitions"]
    assert part["partition"] == [["Order Day", "1995-04-03"]]
    (stream,) = part["streams"]
    assert (stream["version"], stream["state"]) == (1, "active")
    got = [(d["position"], d["operation"], d["files"], d["rows"]) for d in stream["deltas"]]
    assert got == [(1, "upsert", 1, 3), (2, "upsert", 2, 3), (3, "delete", 1, 1)]
    sizes = [f.bytes for d in populated.deltas(TABLE, (("Order Day", "1995-04-03"),)) for f in d.files]
    stored = [populated.storage.size(k) for k in populated.storage.list(populated.table_prefix(TABLE)) if "/files/" in k]
    assert sum(d["bytes"] for d in stream["deltas"]) == sum(sizes) == sum(stored)
    assert part["compaction"] is None and part["compacted_into"] == []
    assert data["tables"][1]["partitions"][0]["partition"] == []

    code, out, err = run(capsys, "show", "--catalog", uri, "--table", TABLE)
    assert code == 0 and err == ""
    assert "table ACME.CUSTOMER_ORDERS.V1" in out and "OTHER.T" not in out
    assert "partition Order Day=1995-04-03" in out
    assert "stream version 1 active: 3 deltas" in out
    assert "position 3 delete: 1 files, 1 rows" in out
    assert "not compacted" in out


def test_export_without_compaction_gives_empty_dir(populated: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    assert run(capsys, "export", "--catalog", populated.uri, "--table", TABLE, "--out", str(out_dir)) == (0, "", "")
    assert out_dir.is_dir() and list(out_dir.iterdir()) == []


def commit_fake_compaction(catalog: Catalog, table: str, source: str, part: tuple, rows: pa.Table, last_position: int) -> CompactedVersion:
    """A compacted version written by hand, the way docs/catalog-layout.md describes it."""
    prefix = f"{catalog.compacted_prefix(table, part)}/data/{uuid.uuid4().hex}"
    files = []
    user_schema = rows.schema
    with_pos = rows.append_column("__stream_position__", pa.array([last_position] * rows.num_rows, pa.int64()))
    for n, start in enumerate(range(0, rows.num_rows, 2), start=1):
        chunk = with_pos.slice(start, 2)
        key = f"{prefix}/{n:06d}.parquet"
        size = catalog.storage.write_arrow(key, lambda sink, c=chunk: pq.write_table(c, sink))
        files.append(DataFile(n, key, chunk.num_rows, size, ContentType.PARQUET))
    version = CompactedVersion(
        table, part, 1, source, 1, last_position, ("Order ID",), (("Last Updated", "ascending"),), ContentType.PARQUET,
        tuple(files), None, tuple(schema_to_json(user_schema)), uuid.uuid4().hex, time.time(), arrow_schema=schema_to_b64(user_schema),
    )
    assert catalog.commit_compacted(version)
    return version


def test_export_and_show_compacted_table(populated: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    part = (("Order Day", "1995-04-03"),)
    populated.append(TABLE, part, "upsert", [orders([9])])  # position 2, pending after the fake round
    rows = orders([1, 2, 3])
    dest = "ACME.CUSTOMER_ORDERS_COMPACTED.V1"
    commit_fake_compaction(populated, dest, TABLE, part, rows, last_position=1)
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, "export", "--catalog", populated.uri, "--table", dest, "--out", str(out_dir))
    assert (code, err) == (0, "")
    written = sorted(out_dir.rglob("*.parquet"))
    assert [str(p) for p in written] == sorted(out.split())
    assert len(written) == 2
    exported = pa.concat_tables([pq.read_table(p) for p in written])
    assert exported.column_names == ["Order ID", "Order Status", "Last Updated"]  # user columns only
    assert exported.sort_by("Order ID").equals(rows)
    # one partition only, by name
    out2 = tmp_path / "out2"
    assert run(capsys, "export", "--catalog", populated.uri, "--table", dest, "--partition", DAY, "--out", str(out2))[0] == 0
    assert len(list(out2.rglob("*.parquet"))) == 2

    data = json.loads(run(capsys, "show", "--catalog", populated.uri, "--json")[1])
    by_id = {t["table_id"]: t for t in data["tables"]}
    c = by_id[dest]["partitions"][0]["compaction"]
    assert (c["latest_version"], c["last_position"], c["rows"], c["files"], c["pending_deltas"]) == (1, 1, 3, 2, 1)
    (into,) = by_id[TABLE]["partitions"][0]["compacted_into"]
    assert (into["table_id"], into["pending_deltas"]) == (dest, 1)
    text = run(capsys, "show", "--catalog", populated.uri)[1]
    assert f"compacted {dest} version 1 from {TABLE} stream 1 up to position 1: 3 rows in 2 files" in text
    assert "1 pending deltas" in text


def test_show_empty_catalog(cli_lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    if "://" not in cli_lake.uri:  # an empty lake directory (one that does not exist is refused)
        Path(cli_lake.uri).mkdir(parents=True, exist_ok=True)
    code, out, err = run(capsys, "show", "--catalog", cli_lake.uri, "--json")
    assert (code, err) == (0, "") and json.loads(out)["tables"] == []


def test_show_changes_since_lists_what_changed_after_a_position(populated: Catalog, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """``show --changes-since N``: the commits after record N of the table's feed, from the feed alone (one listing
    and the new records), in commit order; an unknown table or a missing --table is one line, exit 2."""
    cat = populated
    code, out, _ = run(capsys, "show", "--catalog", cat.uri, "--table", TABLE, "--changes-since", "0", "--json")
    first = json.loads(out)
    assert code == 0 and first["complete"] and [(c["kind"], c["position"]) for c in first["changes"]] == [("delta", 1)]
    head = first["head"]
    for day, ids in (("2024-01-02", [4]), (DAY.split("=")[1], [5, 6])):
        assert run(capsys, "append", "--catalog", cat.uri, "--table", TABLE, "--partition", f"Order Day={day}", "--op", "upsert",
                   str(parquet(tmp_path, f"{day}-{ids[0]}.parquet", orders(ids))))[0] == 0
    assert run(capsys, "compact", "--catalog", cat.uri, "--table", TABLE, "--primary-key", "Order ID")[0] == 0
    code, out, _ = run(capsys, "show", "--catalog", cat.uri, "--table", TABLE, "--changes-since", str(head), "--json")
    changes = json.loads(out)["changes"]
    assert [c["seq"] for c in changes] == list(range(head + 1, head + 1 + len(changes)))
    deltas = [(c["partition"][0][1], c["position"], c["rows"]) for c in changes if c["kind"] == "delta"]
    assert deltas == [("2024-01-02", 1, 1), (DAY.split("=")[1], 2, 2)]
    compacted = sorted((c["partition"][0][1], c["position"]) for c in changes if c["kind"] == "compacted")
    assert compacted == sorted([("2024-01-02", 1), (DAY.split("=")[1], 2)])
    code, out, _ = run(capsys, "show", "--catalog", cat.uri, "--table", TABLE, "--changes-since", str(head + len(changes)))
    assert code == 0 and "0 change(s)" in out and f"head {head + len(changes)}" in out
    # a position past the head (another lake's, a typo) was echoed back as the head: a poller following it skipped
    # every record written until the feed reached it
    for command in ("show", "auto"):
        code, out, err = run(capsys, command, "--catalog", cat.uri, "--table", TABLE, "--changes-since", str(head + len(changes) + 50))
        assert code == 2 and out == "" and err.count("\n") == 1, (command, err)
        assert f"past its head {head + len(changes)}" in err
    code, _, err = run(capsys, "show", "--catalog", cat.uri, "--changes-since", "0")
    assert code == 2 and "needs --table" in err and err.count("\n") == 1


def test_auto_changes_since_evaluates_only_the_partitions_that_changed(populated: Catalog, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``auto --changes-since N`` evaluates the partitions with deltas recorded after feed record N (the same
    decisions a full ``auto`` makes for them), none of the others, and prints the head to pass next time."""
    cat = populated
    base = ["--catalog", cat.uri, "--table", TABLE, "--policy", "immediate", "--json"]
    assert run(capsys, "compact", "--catalog", cat.uri, "--table", TABLE, "--primary-key", "Order ID")[0] == 0
    head = cat.changes.head(TABLE)
    for day in ("2024-02-01", "2024-02-02"):
        assert run(capsys, "append", "--catalog", cat.uri, "--table", TABLE, "--partition", f"Order Day={day}", "--op", "upsert",
                   str(parquet(tmp_path, f"{day}.parquet", orders([9]))))[0] == 0
    code, out, _ = run(capsys, "auto", *base, "--changes-since", str(head), "--dry-run")
    since = json.loads(out)
    assert code == 0 and since["feed_head"] == cat.changes.head(TABLE)
    changed = {p["partition"][0][1]: p["action"] for p in since["partitions"]}
    assert changed == {"2024-02-01": "would-compact", "2024-02-02": "would-compact"}
    code, out, _ = run(capsys, "auto", *base, "--dry-run")
    full = {p["partition"][0][1]: p["action"] for p in json.loads(out)["partitions"]}
    assert {d for d, a in full.items() if a == "would-compact"} == set(changed) and len(full) == 3
    code, out, _ = run(capsys, "auto", *base, "--changes-since", str(since["feed_head"]))
    assert code == 0 and json.loads(out)["partitions"] == []
    code, _, err = run(capsys, "auto", *base, "--changes-since", "0", "--partition", DAY)
    assert code == 2 and "not both" in err


# ----- bad input --------------------------------------------------------------------------------------------
def bad_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (argv after --catalog URI is inserted at {cat}, text the error line must contain)."""
    good1 = parquet(tmp, "good1.parquet", orders([7]))
    good2 = parquet(tmp, "good2.parquet", orders([8]))
    corrupt = tmp / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet at all")
    truncated = tmp / "truncated.parquet"
    truncated.write_bytes(good1.read_bytes()[:-20])
    unknown_ext = tmp / "rows.txt"
    unknown_ext.write_text("a,b\n1,2\n")
    empty_csv = tmp / "empty.csv"
    empty_csv.write_text("")
    wrong_type = parquet(tmp, "wrong_type.parquet", orders([1]).set_column(0, "Order ID", pa.array(["1"], pa.string())))
    missing_col = parquet(tmp, "missing_col.parquet", orders([1]).select(["Order ID", "Order Status"]))
    text_int = parquet(tmp, "text_int.parquet", orders([1]).set_column(2, "Last Updated", pa.array(["1001"], pa.string())))
    other_schema = parquet(tmp, "other_schema.parquet", pa.table({"x": [1]}))
    bad_delete = parquet(tmp, "bad_delete.parquet", pa.table({"Order ID": [1], "nope": [1]}))
    a = ["append", "--catalog", "{cat}", "--table", TABLE, "--partition", DAY, "--op", "upsert"]
    return {
        "export unknown table": (["export", "--catalog", "{cat}", "--table", "NO.SUCH.TABLE", "--out", str(tmp / "o")], "NO.SUCH.TABLE"),
        "show unknown table": (["show", "--catalog", "{cat}", "--table", "NO.SUCH.TABLE"], "NO.SUCH.TABLE"),
        "compact unknown table": (["compact", "--catalog", "{cat}", "--table", "NO.SUCH.TABLE", "--primary-key", "Order ID"], "NO.SUCH.TABLE"),
        "export unknown partition": (["export", "--catalog", "{cat}", "--table", TABLE, "--partition", "Order Day=2001-01-01", "--out", str(tmp / "o")], "2001-01-01"),
        "compact unknown partition": (["compact", "--catalog", "{cat}", "--table", TABLE, "--primary-key", "Order ID", "--partition", "Order Day=2001-01-01"], "2001-01-01"),
        "corrupt file": (a + [str(corrupt)], "corrupt.parquet"),
        "truncated file": (a + [str(good1), str(truncated)], "truncated.parquet"),
        "unknown file type": (a + [str(unknown_ext)], "rows.txt"),
        "empty csv": (a + [str(empty_csv)], "empty.csv"),
        "missing file among several": (a + [str(good1), str(tmp / "missing.parquet"), str(good2)], "missing.parquet"),
        "schema conflict: type": (a + [str(wrong_type)], "Order ID"),
        "schema conflict: missing column, evolution off": (a + ["--schema-evolution", "off", str(missing_col)], "Last Updated"),
        "schema conflict: a string into an integer column": (a + [str(text_int)], "Last Updated"),
        "schema conflict inside one delta": (a + [str(good1), str(other_schema)], "other_schema.parquet"),
        "delete with unknown column": (["append", "--catalog", "{cat}", "--table", TABLE, "--partition", DAY, "--op", "delete", str(bad_delete)], "nope"),
        "unknown op": (["append", "--catalog", "{cat}", "--table", TABLE, "--op", "foo", str(good1)], "foo"),
        "unknown format": (["compact", "--catalog", "{cat}", "--table", TABLE, "--primary-key", "Order ID", "--format", "xml"], "xml"),
        "unknown sort order": (["compact", "--catalog", "{cat}", "--table", TABLE, "--primary-key", "Order ID", "--sort-key", "Last Updated:sideways"], "sideways"),
        "bad bucket count": (["compact", "--catalog", "{cat}", "--table", TABLE, "--primary-key", "Order ID", "--hash-buckets", "0"], "'0'"),
        "bad rows per file": (["compact", "--catalog", "{cat}", "--table", TABLE, "--primary-key", "Order ID", "--rows-per-file", "many"], "many"),
        "partition without =": (["append", "--catalog", "{cat}", "--table", TABLE, "--partition", "novalue", "--op", "upsert", str(good1)], "novalue"),
        "unknown primary key column": (["compact", "--catalog", "{cat}", "--table", TABLE, "--primary-key", "nope_pk"], "nope_pk"),
        "unknown sort key column": (["compact", "--catalog", "{cat}", "--table", TABLE, "--primary-key", "Order ID", "--sort-key", "nope_sk"], "nope_sk"),
        "missing primary key": (["compact", "--catalog", "{cat}", "--table", TABLE], "--primary-key"),
        "unknown command": (["frobnicate", "--catalog", "{cat}"], "frobnicate"),
        "empty table id": (["append", "--catalog", "{cat}", "--table", "", "--op", "upsert", str(good1)], "table ID"),
    }


with tempfile.TemporaryDirectory() as _tmp:
    CASES = list(bad_cases(Path(_tmp)).keys())


@pytest.mark.parametrize("case", CASES)
def test_bad_input(populated: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    argv, needle = bad_cases(tmp_path)[case]
    argv = [populated.uri if a == "{cat}" else a for a in argv]
    before = populated.listing()
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("flash-compactor: error: ")
    assert needle in lines[0]
    assert populated.listing() == before
    # and the stream still reads back as before
    assert [d.position for d in populated.deltas(TABLE, (("Order Day", "1995-04-03"),))] == [1]


def test_bad_input_through_the_installed_command(lake: Catalog, tmp_path: Path) -> None:
    """The real entry point: exit status 2 and one stderr line, no traceback, nothing written."""
    good = parquet(tmp_path, "good.parquet", orders([1]))
    Catalog(lake.uri).append(TABLE, (("Order Day", "1995-04-03"),), "upsert", [good])
    before = lake.listing()
    exe = Path(sys.executable).parent / "flash-compactor"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flash_pipeline.cli"]
    for argv, needle in [
        (["append", "--catalog", lake.uri, "--table", TABLE, "--partition", DAY, "--op", "upsert", str(good), str(tmp_path / "gone.csv")], "gone.csv"),
        (["export", "--catalog", lake.uri, "--table", "NOPE", "--out", str(tmp_path / "o")], "NOPE"),
        (["append", "--catalog", lake.uri, "--table", TABLE, "--op", "upsertt", str(good)], "upsertt"),
    ]:
        proc = subprocess.run(cmd + argv, capture_output=True, text=True, env=catalog_env(lake), timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and needle in proc.stderr, proc.stderr
    assert lake.listing() == before


def test_delta_file_replaced_after_commit_fails_compaction_in_one_line(tmp_path: Path) -> None:
    """A failure inside a Ray task reaches the user as the task's one-line message, exit 2, the lake untouched."""
    lake = Catalog(tmp_path / "lake")
    delta = lake.append(TABLE, (("Order Day", "1995-04-03"),), "upsert", [parquet(tmp_path, "d.parquet", orders([1, 2, 3]))])
    key = delta.files[0].key
    pq.write_table(orders([1, 2]), lake.storage.arrow_source(key))  # replaced behind the catalog's back
    before = lake.listing()
    exe = Path(sys.executable).parent / "flash-compactor"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flash_pipeline.cli"]
    proc = subprocess.run(cmd + ["compact", "--catalog", str(tmp_path / "lake"), "--table", TABLE, "--primary-key", "Order ID"],
                          capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("flash-compactor: error:")]
    assert proc.returncode == 2, proc.stderr
    assert len(errors) == 1 and key in errors[0] and "holds 2 rows" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "RayTaskError" not in proc.stderr, proc.stderr
    assert lake.listing() == before


# ----- the demo (needs the compaction engine) ---------------------------------------------------------------
PAPER_RESULT = {
    "1995-04-03": {12390127: "PACKED", 83475997: "SHIPPED", 62865095: "SUBMITTED", 29683967: "SUBMITTED", 95283672: "SUBMITTED"},
    "1995-04-04": {58392460: "PACKED", 78010912: "DELIVERED", 38925648: "CANCELLED"},
}


def test_demo_twice_gives_the_papers_result(tmp_path: Path) -> None:
    pytest.importorskip("flash_pipeline.compactor.job")
    duckdb = pytest.importorskip("duckdb")
    lake_dir = tmp_path / "demo_lake"
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "flash_pipeline.cli", "demo", "--lake", str(lake_dir)],
                              capture_output=True, text=True, timeout=300, env=catalog_env(Catalog(lake_dir)))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "AMZN.CUSTOMER_ORDER_STATUS_COMPACTED.V1" in proc.stdout
    catalog = Catalog(lake_dir)
    assert sum(len(catalog.deltas("AMZN.CUSTOMER_ORDER_STATUS.V1", p)) for p in catalog.partitions("AMZN.CUSTOMER_ORDER_STATUS.V1")) == 4
    out = tmp_path / "export"
    assert main(["export", "--catalog", str(lake_dir), "--table", "AMZN.CUSTOMER_ORDER_STATUS_COMPACTED.V1", "--out", str(out)]) == 0
    rows = duckdb.sql(
        f"select \"Order Day\", \"Order ID\", \"Order Status\" from read_parquet('{out}/*/*.parquet')"
    ).fetchall()
    got: dict[str, dict[int, str]] = {}
    for day, oid, status in rows:
        assert oid not in got.setdefault(day, {}), f"duplicate primary key {oid}"
        got[day][oid] = status
    assert got == PAPER_RESULT


def test_compact_passes_the_contract_options(populated: Catalog, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI hands every option to the engine as one CompactOptions under the API's names (engine replaced by a
    recorder)."""
    api = pytest.importorskip("flash_pipeline.compactor.job")
    from flash_pipeline.compactor.model.options import CompactOptions
    from flash_pipeline.compactor.model.results import CompactionResult, PartitionResult

    calls = []

    def fake_compact(source, options, catalog, on_step=None):  # noqa: ANN001, ANN202
        assert on_step is None  # captured stderr is no terminal: progress lines, no bars
        calls.append((source, options, catalog))
        part = PartitionResult((("Order Day", "1995-04-03"),), rows_in=3, rows_out=3, compacted_version=1, last_position=1)
        return CompactionResult(source, options.destination_compacted_table_id or source, [part])

    monkeypatch.setattr(api, "compact", fake_compact)
    code, out, err = run(
        capsys, "compact", "--catalog", populated.uri, "--table", TABLE, "--primary-key", "Order ID", "--primary-key", "Order Day",
        "--sort-key", "Last Updated:descending", "--sort-key", "Order Status", "--destination", "D.V1", "--hash-buckets", "4",
        "--rows-per-file", "2", "--rows-per-index-file", "3", "--format", "ORC", "--partition", DAY, "--num-cpus", "2",
        "--ray-address", "auto", "--rebuild", "--json",
    )
    assert (code, err) == (0, "")
    ((source, options, catalog),) = calls
    assert isinstance(options, CompactOptions) and source == TABLE
    assert options.primary_keys == ("Order Day", "Order ID")  # the recorded key order: by name
    assert options.sort_keys == (("Last Updated", "descending"), ("Order Status", "ascending"))
    assert options.destination_compacted_table_id == "D.V1"
    assert (options.hash_bucket_count, options.rows_per_compacted_file, options.rows_per_primary_key_index_file) == (4, 2, 3)
    assert options.compacted_file_content_type is ContentType.ORC
    assert options.partitions == ((("Order Day", "1995-04-03"),),)
    assert (options.num_cpus, options.ray_address, options.rebuild) == (2, "auto", True)
    assert catalog.uri == populated.uri
    data = json.loads(out)
    assert data["destination_table_id"] == "D.V1" and data["partitions"][0]["rows_out"] == 3

    calls.clear()
    code, out, err = run(capsys, "compact", "--catalog", populated.uri, "--table", TABLE, "--primary-key", "Order ID")
    assert code == 0 and calls[0][1].sort_keys is None and calls[0][1].partitions is None
    assert out.splitlines()[1].startswith("Order Day=1995-04-03: 3 rows in")


def test_a_compaction_without_keys_names_the_table_that_records_them_and_show_prints_buckets(
        populated: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """`compact --rebuild` into a table never compacted, with no --primary-key, after the source was compacted
    into another table: the error names that table; `show` prints the index's hash bucket count."""
    uri = populated.uri
    code, _, err = run(capsys, "compact", "--catalog", uri, "--table", TABLE, "--primary-key", "Order ID",
                       "--destination", "ACME.COMPACTED.V1", "--hash-buckets", "3")
    assert code == 0, err
    code, out, err = run(capsys, "compact", "--catalog", uri, "--table", TABLE, "--rebuild")
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "--primary-key" in err and "--destination ACME.COMPACTED.V1" in err, err
    assert Catalog(uri).compacted_versions(TABLE, (("Order Day", "1995-04-03"),)) == []  # nothing written there
    code, out, err = run(capsys, "show", "--catalog", uri, "--json")
    (part,) = next(t for t in json.loads(out)["tables"] if t["table_id"] == TABLE)["partitions"]
    (into,) = part["compacted_into"]
    assert (into["table_id"], into["hash_bucket_count"]) == ("ACME.COMPACTED.V1", 3)
    assert into["index_rows"] == into["rows"] == 3
    code, out, err = run(capsys, "show", "--catalog", uri, "--table", TABLE)
    assert "primary key index in 3 hash buckets" in out, out


def test_rehash_of_a_table_never_compacted_says_so(populated: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """A rehash with nothing to rehash printed nothing at all; it says why (exit 0: a no-op, not a failure) and
    writes nothing."""
    listing = populated.listing()
    code, out, err = run(capsys, "rehash", "--catalog", populated.uri, "--table", TABLE, "--hash-buckets", "4")
    assert code == 0 and err == ""
    assert out.strip().splitlines() == [f"{TABLE}: no partition has a compacted version to rehash; compact the table first"]
    assert populated.listing() == listing


@pytest.mark.parametrize("argv", [["verify"], ["show"], ["show", "--json"], ["read", "--table", "T"], ["compact", "--table", "T"],
                                  ["export", "--table", "T", "--out", "OUT"], ["retain", "--table", "T", "--keep-last", "1"]])
def test_a_mistyped_lake_directory_is_named_not_read_as_an_empty_lake(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """verify printed "verified 0 table(s) ... ok" and show "(no tables)", exit 0, for a lake path that does not
    exist (a CI check passed on a typo); every command but append and demo now refuses it in one line, creating
    nothing."""
    missing = tmp_path / "no-such-lake"
    argv = [str(tmp_path / a) if a == "OUT" else a for a in argv]
    for uri in (str(missing), f"file://{missing}"):
        code, out, err = run(capsys, argv[0], "--catalog", uri, *argv[1:])
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (out, err)
        assert f"the lake directory {uri} does not exist" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    not_a_lake = tmp_path / "project"  # an existing directory that holds no lake: the same, naming it
    (not_a_lake / "src").mkdir(parents=True)
    code, out, err = run(capsys, argv[0], "--catalog", str(not_a_lake), *argv[1:])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and f"the directory {not_a_lake} holds no lake" in err, (out, err)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["project", "project/src"]
    shutil.rmtree(not_a_lake)
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": [1]}), table)
    assert run(capsys, "append", "--catalog", str(missing), "--table", "T", "--op", "upsert", str(table))[0] == 0  # append creates the lake


def test_export_and_retain_of_a_source_compacted_elsewhere_say_where_its_versions_are(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """export wrote an empty directory and retain printed nothing, exit 0, for a source whose compaction lives in
    its --destination: a note on stderr names that table (exit 0 and the outputs as before)."""
    lake = Catalog(tmp_path / "lake")
    lake.append("S", {"p": "a"}, "upsert", [pa.table({"k": [1, 2]})])
    assert run(capsys, "compact", "--catalog", lake.uri, "--table", "S", "--primary-key", "k", "--destination", "D")[0] == 0
    code, out, err = run(capsys, "export", "--catalog", lake.uri, "--table", "S", "--out", str(tmp_path / "out"))
    assert (code, out) == (0, "") and "it is compacted into D (use --table D)" in err
    code, out, err = run(capsys, "retain", "--catalog", lake.uri, "--table", "S", "--keep-last", "1")
    assert (code, out) == (0, "") and "it is compacted into D (use --table D)" in err
    code, out, err = run(capsys, "export", "--catalog", lake.uri, "--table", "D", "--out", str(tmp_path / "out2"))
    assert code == 0 and out and err == ""


@pytest.mark.parametrize("argv", [["--help"], ["compact", "--help"]])
def test_main_returns_zero_for_help_as_it_returns_every_exit_code(argv: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """main(argv) is the API other tools call in process (docs/cli.md): --help raised SystemExit(0) out of it."""
    assert main(argv) == 0
    assert "usage:" in capsys.readouterr().out
