"""The reader table of docs/readers.md, measured: one compacted table with upserts, deletes, deletion vectors, an
optimize and a rehash, read through every reader the docs name, each result compared with ``export``.

    .venv/bin/python tests/reader_table.py > docs/readers.md     (tests/catalog/test_reader_table.py checks it)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flash_pipeline import Catalog, CompactOptions, compact  # noqa: E402
from flash_pipeline.catalog.encoding import normalize_partition  # noqa: E402
from flash_pipeline.compactor.index.rehash import rehash  # noqa: E402
from flash_pipeline.optimize import optimize  # noqa: E402

TABLE, PART = "READERS", {"day": "d1"}
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64())])


def _quiet(_: str) -> None:
    pass


def build(lake: Path, vectors: bool) -> dict[str, Any]:
    """The table: 400 keys in 4 files, then two rounds of a few spread upserts and deletes (with vectors: carried
    files with deletion vectors), an optimize that purges nothing, a rehash, one more round. Returns where it is."""
    cat = Catalog(lake)
    options = CompactOptions(primary_keys=("id",), rows_per_compacted_file=100, deletion_vectors=vectors)

    def load(op: str, ids: list[int], step: int) -> None:
        rows = pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([step] * len(ids), pa.int64())})
        path = lake.parent / f"{'v' if vectors else 'c'}-{step}.parquet"
        pq.write_table(rows.select(["id"]) if op == "delete" else rows, path)
        cat.append(TABLE, PART, op, [str(path)])

    load("upsert", list(range(400)), 0)
    compact(TABLE, options, catalog=cat, progress=_quiet)
    for step in (1, 2):
        load("upsert", list(range(step, 400, 97)), step)
        load("delete", list(range(step + 40, 400, 131)), step)
        compact(TABLE, options, catalog=cat, progress=_quiet)
    optimize(cat, TABLE, min_file_size=1, max_file_size=1 << 21, progress=_quiet)
    rehash(cat, TABLE, 2, log=_quiet)
    load("upsert", [5, 205], 3)
    compact(TABLE, options, catalog=cat, progress=_quiet)
    keys = normalize_partition(PART)
    latest = cat.latest_compacted(TABLE, keys)
    return {"catalog": cat, "keys": keys, "latest": latest, "location": cat.deltalake_location(TABLE, keys),
            "vectors": any(f.deletion_vector is not None for n in cat.compacted_versions(TABLE, keys)
                           for f in cat.compacted_version(TABLE, keys, n).files)}


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    d = table.select(["id", "v"]).to_pydict()
    return sorted(zip(d["id"], d["v"]))


def _export(t: dict[str, Any], version: int) -> list[tuple[Any, ...]]:
    out = Path(tempfile.mkdtemp())
    files = t["catalog"].export(TABLE, out, PART, version=version, overwrite=True)
    return _rows(pa.concat_tables([pq.read_table(f) for f in files]))


def _deltalake_query(t: dict[str, Any], version: int) -> pa.Table:
    import deltalake

    dt = deltalake.DeltaTable(t["location"], version=version)
    return pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all())


def _deltalake_to_pyarrow(t: dict[str, Any], version: int) -> pa.Table:
    import deltalake

    return deltalake.DeltaTable(t["location"], version=version).to_pyarrow_table()


def _polars(t: dict[str, Any], version: int) -> pa.Table:
    import polars as pl

    return pl.read_delta(t["location"], version=version).to_arrow()


def _duckdb_delta(t: dict[str, Any], version: int) -> pa.Table:
    import lake_readers

    return lake_readers.delta_scan(t["location"], version)


def _duckdb_iceberg(t: dict[str, Any], version: int) -> pa.Table:
    import lake_readers

    cat = t["catalog"]
    return lake_readers.iceberg_scan(cat.iceberg_uri(cat.iceberg_metadata_key(TABLE, t["keys"], version)))


def _pyiceberg(t: dict[str, Any], version: int) -> pa.Table:
    import lake_readers

    cat = t["catalog"]
    return lake_readers.pyiceberg_rows(cat.iceberg_catalog_uri(), cat.iceberg_identifier(TABLE, t["keys"]), version)


def _pyspark_file_list(t: dict[str, Any], version: int) -> pa.Table:
    """Plain Spark (no Delta package) on the Parquet files deltalake lists for the version, as the docs show."""
    import deltalake
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    uris = deltalake.DeltaTable(t["location"], version=version).file_uris()
    return pa.Table.from_pylist([r.asDict() for r in spark.read.parquet(*uris).select("id", "v").collect()],
                                schema=SCHEMA)


READERS: list[tuple[str, Callable[[dict[str, Any], int], pa.Table]]] = [
    ("deltalake `QueryBuilder`", _deltalake_query),
    ("deltalake `DeltaTable.to_pyarrow_table()`", _deltalake_to_pyarrow),
    ("`polars.read_delta`", _polars),
    ("DuckDB `delta_scan` (duckdb-extension-delta 1.5.5)", _duckdb_delta),
    ("DuckDB `iceberg_scan` (duckdb-extension-iceberg 1.5.5)", _duckdb_iceberg),
    ("pyiceberg 0.12 `scan()` (the embedded SQL catalog)", _pyiceberg),
    ("PySpark on deltalake's file list (no Delta package)", _pyspark_file_list),
]


def _verdict(reader: Callable[[dict[str, Any], int], pa.Table], t: dict[str, Any]) -> str:
    """How the reader does on every retained version of the table: "right" (each equals export), "wrong rows",
    or "refuses" (an error) -- the first failure decides."""
    cat = t["catalog"]
    for n in cat.compacted_versions(TABLE, t["keys"]):
        try:
            got = _rows(reader(t, n))
        except Exception as exc:  # noqa: BLE001 - the reader's refusal is the finding
            return f"refuses ({type(exc).__name__})"
        if got != _export(t, n):
            return "wrong rows"
    return "right"


def measure() -> list[tuple[str, str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("cow", "dv"):
            (Path(tmp) / name).mkdir()
        plain = build(Path(tmp) / "cow" / "lake", vectors=False)
        with_vectors = build(Path(tmp) / "dv" / "lake", vectors=True)
        assert with_vectors["vectors"] and not plain["vectors"]
        return [(name, _verdict(reader, plain), _verdict(reader, with_vectors)) for name, reader in READERS]


def _versions() -> str:
    from importlib.metadata import version

    names = ("deltalake", "polars", "duckdb", "pyiceberg", "pyspark")
    return ", ".join(f"{n} {version(n)}" for n in names)


def markdown(rows: list[tuple[str, str, str]]) -> str:
    lines = [
        "# Which readers read a compacted table right",
        "",
        "Generated by `tests/reader_table.py` (`.venv/bin/python tests/reader_table.py > docs/readers.md`) and "
        "checked by",
        "`tests/catalog/test_reader_table.py`: one partition stream with upserts, deletes, an optimize and a rehash, "
        "compacted",
        "with deletion vectors off and on, every retained version read through each reader (time travel by version or",
        "snapshot id) and compared with `flash-compactor export` of that version. \"right\": every version equal; "
        "\"wrong",
        "rows\": some version differs; \"refuses\": the reader raises.",
        "",
        f"Versions: {_versions()}.",
        "",
        "| reader | deletion vectors off | deletion vectors on |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {off} | {on} |" for name, off, on in rows]
    return "\n".join(lines) + "\n" + TYPE_NOTES


# what some readers refuse by column type (found by a black-box check on 2026-11-30 with the versions above; not
# measured by this script: its table has one schema)
TYPE_NOTES = """
## Column types some readers refuse

Every type below is stored, compacted and read back exactly by `flash-compactor export`, `read` and the Python
API; the limits are the readers' own:

- **pyiceberg 0.12** refuses a timestamp column whose time zone is not UTC (`timestamp[us, tz=Europe/Paris]`:
  `UnsupportedPyArrowTypeException`) and a `decimal256` column of any precision. DuckDB's `iceberg_scan` reads
  both. To read them with pyiceberg, load such columns in UTC, or as `decimal128`.
- **`polars.read_delta`** panics on a fixed-offset time zone such as `+05:30` (a Rust `PanicException`, which
  `except Exception` does not catch; `+00:00` and named zones work), and refuses a `date64` column (from Feather or
  Arrow input; Parquet input reads dates as `date32`). Cast to `date32` in the loads.
- A type Iceberg does not have leaves the version without an Iceberg snapshot, with the reason in `show --json`
  (docs/catalog-layout.md lists them).
"""


if __name__ == "__main__":
    sys.stdout.write(markdown(measure()))
