"""DuckDB's own Delta reader (``delta_scan``), loaded from the ``duckdb-extension-delta`` pip package.

The package ships the extension binary for exactly one DuckDB version (pinned together in pyproject.toml), so
it loads with no network: ``INSTALL '<file>'; LOAD delta``.
"""

from __future__ import annotations

import os

import duckdb
import pyarrow as pa


def delta_extension_file() -> str:
    """The extension binary the pip package installed, for the DuckDB version it was built for."""
    import duckdb_extension_delta

    return os.path.join(os.path.dirname(duckdb_extension_delta.__file__), "extensions",
                        f"v{duckdb.__version__}", "delta.duckdb_extension")


def connect() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the Delta extension loaded."""
    con = duckdb.connect()
    con.execute(f"INSTALL '{delta_extension_file()}'; LOAD delta")
    return con


def delta_scan(location: str, version: int | None = None) -> pa.Table:
    """The rows of a Delta table (one version of it: time travel) as DuckDB's ``delta_scan`` reads them."""
    con = connect()
    try:
        at = "" if version is None else f", version => {int(version)}"
        return con.sql(f"SELECT * FROM delta_scan('{location}'{at})").to_arrow_table()
    finally:
        con.close()
