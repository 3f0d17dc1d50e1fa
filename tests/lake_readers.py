"""Readers of a compacted partition that share no code with the engine: Iceberg through pyiceberg's SQL catalog and
through DuckDB's Iceberg extension (loaded from its pip package, as tests/duckdb_delta.py loads the Delta one)."""

from __future__ import annotations

import functools
import os

import duckdb
import pyarrow as pa


def _extension_file(module: object, name: str) -> str:
    return os.path.join(os.path.dirname(module.__file__), "extensions", f"v{duckdb.__version__}",  # type: ignore[attr-defined]
                        f"{name}.duckdb_extension")


def duckdb_iceberg() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the Iceberg extension (and the Avro one it reads manifests with) loaded."""
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect()
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        con.execute(f"INSTALL '{_extension_file(module, name)}'; LOAD {name}")
    return con


@functools.lru_cache(maxsize=1)
def _shared() -> duckdb.DuckDBPyConnection:
    """One connection with the Iceberg and Delta extensions loaded, for the many reads of a randomized test
    (loading the extensions takes ~0.4 s a connection)."""
    import duckdb_delta

    con = duckdb_iceberg()
    con.execute(f"INSTALL '{duckdb_delta.delta_extension_file()}'; LOAD delta")
    return con


def iceberg_scan(metadata_location: str) -> pa.Table:
    """The rows of one Iceberg snapshot (its metadata file) as DuckDB's ``iceberg_scan`` reads them."""
    return _shared().cursor().sql(f"SELECT * FROM iceberg_scan('{metadata_location}')").to_arrow_table()


def delta_scan(location: str, version: int) -> pa.Table:
    """One version of a Delta table as DuckDB's ``delta_scan`` reads it (tests/duckdb_delta.py, on the shared
    connection)."""
    return _shared().cursor().sql(f"SELECT * FROM delta_scan('{location}', version => {int(version)})").to_arrow_table()


def pyiceberg_table(catalog_uri: str, identifier: list[str]):  # noqa: ANN201 - pyiceberg's Table
    """The table as pyiceberg's SQL catalog (the embedded one, or any on the same database) loads it."""
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("flash", uri=catalog_uri).load_table(tuple(identifier))


def pyiceberg_rows(catalog_uri: str, identifier: list[str], snapshot_id: int | None = None) -> pa.Table:
    """The rows of the table's current snapshot, or of ``snapshot_id`` (time travel), read by pyiceberg."""
    return pyiceberg_table(catalog_uri, identifier).scan(snapshot_id=snapshot_id).to_arrow()


def _pruned_columns(table: pa.Table) -> list[str]:
    """Columns whose manifest bounds a filtered Iceberg scan prunes by (the types iceberg_stats.py bounds)."""
    out = []
    for field in table.schema:
        t = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
        if (pa.types.is_integer(t) and pa.types.is_signed_integer(t)) or pa.types.is_string(t) \
                or pa.types.is_large_string(t) or pa.types.is_decimal(t) or pa.types.is_date32(t):
            out.append(field.name)
    return out


def filtered_reads_match(table, snapshot_id: int, expected: pa.Table, rng) -> int:  # noqa: ANN001 - pyiceberg's Table
    """For each bounded column of ``expected`` (the version's rows as export gives them), a pyiceberg scan of
    ``snapshot_id`` filtered by ``column >= value`` and ``column < value`` (a value of the column, drawn by ``rng``)
    returns exactly the rows pyarrow's filter keeps: a manifest bound that excluded a matching row would lose it.
    Returns how many filtered scans were compared."""
    import pyarrow.compute as pc
    from pyiceberg.expressions import GreaterThanOrEqual, LessThan

    def canonical(t: pa.Table) -> list[tuple]:
        names = sorted(expected.column_names)
        t = t.select(names)
        return sorted(map(tuple, zip(*(t.column(n).to_pylist() for n in names))), key=repr)

    compared = 0
    current = {f.name for f in table.schema().fields}  # pyiceberg binds a filter to the current schema's names
    for name in (n for n in _pruned_columns(expected) if n in current):
        values = expected.column(name).drop_null()
        if len(values) == 0:
            continue
        value = values[rng.randrange(len(values))].as_py()
        literal = value.isoformat() if hasattr(value, "isoformat") else value
        for expr, keep in ((GreaterThanOrEqual(name, literal), pc.greater_equal), (LessThan(name, literal), pc.less)):
            got = table.scan(snapshot_id=snapshot_id, row_filter=expr).to_arrow()
            want = expected.filter(keep(expected.column(name), pa.scalar(value, values.type)))
            assert canonical(got) == canonical(want), (name, value, str(expr))
            compared += 1
    return compared
