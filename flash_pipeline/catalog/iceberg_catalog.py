"""The embedded Iceberg catalog of a local lake: ``iceberg/catalog.db``, a SQLite database in Iceberg's JDBC catalog
schema (the ``iceberg_tables`` table pyiceberg's ``SqlCatalog`` and Java's ``JdbcCatalog`` read), catalog name
``flash``. Written with ``sqlite3`` (importing pyiceberg's catalog costs 1.3 s a command, iceberg_table.py).

A table's row points at its newest metadata file; the pointer moves by a conditional UPDATE on the location read
(another writer's move makes it fail and the writer re-reads), and never backwards: ``v<N>.metadata.json`` orders
as (N, 0), a retention's rewrite ``v<N>-r<R>.metadata.json`` as (N, R).
"""

from __future__ import annotations

import os
import sqlite3

CATALOG_NAME = "flash"
ATTEMPTS = 100


def order_of(metadata_location: str) -> tuple[int, int]:
    """(compacted version, oldest retained version) of a metadata file (see above)."""
    name = metadata_location.rsplit("/", 1)[-1][1:-len(".metadata.json")]
    number, _, oldest = name.partition("-r")
    return int(number), int(oldest or 0)


def point(path: str, identifier: list[str], new: str) -> bool:
    """Point ``identifier``'s row at ``new`` (creating the row and its namespace), unless it points at ``new`` or a
    newer metadata file already. False when other writers kept moving it for ATTEMPTS tries."""
    with _connect(path) as con:
        for _ in range(ATTEMPTS):
            row = con.execute("SELECT metadata_location FROM iceberg_tables WHERE catalog_name=? AND "
                              "table_namespace=? AND table_name=?", (CATALOG_NAME, *identifier)).fetchone()
            if row is None:
                con.execute("INSERT OR IGNORE INTO iceberg_namespace_properties VALUES (?, ?, 'exists', 'true')",
                            (CATALOG_NAME, identifier[0]))
                done = con.execute("INSERT OR IGNORE INTO iceberg_tables (catalog_name, table_namespace, table_name, "
                                   "metadata_location, previous_metadata_location, iceberg_type) "
                                   "VALUES (?, ?, ?, ?, NULL, 'TABLE')", (CATALOG_NAME, *identifier, new))
            elif order_of(row[0]) >= order_of(new):
                return True
            else:
                done = con.execute("UPDATE iceberg_tables SET metadata_location=?, previous_metadata_location=? "
                                   "WHERE catalog_name=? AND table_namespace=? AND table_name=? AND "
                                   "metadata_location=?", (new, row[0], CATALOG_NAME, *identifier, row[0]))
            con.commit()
            if done.rowcount == 1:
                return True
    return False


def _connect(path: str) -> sqlite3.Connection:
    """The catalog, its tables created as pyiceberg's SqlCatalog creates them."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    con = sqlite3.connect(path, timeout=60)
    con.execute("CREATE TABLE IF NOT EXISTS iceberg_tables (catalog_name VARCHAR(255) NOT NULL, table_namespace "
                "VARCHAR(255) NOT NULL, table_name VARCHAR(255) NOT NULL, metadata_location VARCHAR(1000), "
                "previous_metadata_location VARCHAR(1000), iceberg_type VARCHAR(5), "
                "PRIMARY KEY (catalog_name, table_namespace, table_name))")
    con.execute("CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (catalog_name VARCHAR(255) NOT NULL, "
                "namespace VARCHAR(255) NOT NULL, property_key VARCHAR(255) NOT NULL, property_value VARCHAR(1000) "
                "NOT NULL, PRIMARY KEY (catalog_name, namespace, property_key))")
    return con
