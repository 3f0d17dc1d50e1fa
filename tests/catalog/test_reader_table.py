"""docs/readers.md is the reader table measured now (tests/reader_table.py): every reader the docs name reads a
table with upserts, deletes, deletion vectors, an optimize and a rehash as the docs say it does."""

from __future__ import annotations

from pathlib import Path

import reader_table

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_reader_table_is_what_the_readers_do_now() -> None:
    rows = reader_table.measure()
    by_name = {name: (off, on) for name, off, on in rows}
    # the readers the docs send users to read both tables right
    for name in ("deltalake `QueryBuilder`", "`polars.read_delta`", "DuckDB `delta_scan` (duckdb-extension-delta 1.5.5)",
                 "DuckDB `iceberg_scan` (duckdb-extension-iceberg 1.5.5)", "pyiceberg 0.12 `scan()` (the embedded SQL catalog)"):
        assert by_name[name] == ("right", "right"), (name, by_name[name])
    assert (REPO / "docs" / "readers.md").read_text(encoding="utf-8") == reader_table.markdown(rows), \
        "docs/readers.md is out of date: .venv/bin/python tests/reader_table.py > docs/readers.md"
