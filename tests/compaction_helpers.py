"""Shared helpers of the compaction acceptance tests: an independent DuckDB oracle and compacted-table readers.

The oracle is written from the issue's semantics only (never from the engine's code):

  For each key let D = position of the latest delete delta holding it. Among upsert rows of that key at
  positions > D keep the one with the greatest (sort key values in their direction, stream position, file
  number, row index in file). "descending" keeps the smallest value; a null sort key value ranks below every
  non-null value in either direction. Null in a key column equals only null.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb
import numpy as np
import pyarrow as pa

from flash_pipeline import Catalog, compact

POS, FILE, ROW, OP = "__pos", "__file", "__row", "__op"

# A tiny alphabet of key values whose concatenations collide ("ab"+"c" == "a"+"bc") and whose null / ""
# / "null" must stay three different values.
KEY_STRINGS: list[str | None] = ["", "null", None, "ab", "a", "bc", "c"]
KEY_INTS: list[int | None] = [None, 0, 1, -1]


def quiet(_message: str) -> None:
    """A progress callback that keeps test output clean."""


@contextlib.contextmanager
def kernel_form(form: str) -> Iterator[None]:
    """Run the compiled kernels as Numba's machine code ("compiled"), their Python source ("interpreted") or their
    NumPy forms where they have one ("numpy"),
    whatever this process has loaded (FLASH_KERNELS; see flash_pipeline/compactor/kernels/jit.py)."""
    saved = os.environ.get("FLASH_KERNELS")
    os.environ["FLASH_KERNELS"] = form
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("FLASH_KERNELS", None)
        else:
            os.environ["FLASH_KERNELS"] = saved


@contextlib.contextmanager
def fresh_lake() -> Iterator[Catalog]:
    """A brand-new local lake in its own temporary directory (one per hypothesis example)."""
    with tempfile.TemporaryDirectory(prefix="flash-lake-") as d:
        yield Catalog(Path(d) / "lake")


class DeltaLog:
    """Appends deltas to a catalog and records every row with its position, file number, row index and op."""

    def __init__(self, cat: Catalog, table_id: str, partition: Any, schema: pa.Schema) -> None:
        self.cat = cat
        self.table_id = table_id
        self.partition = partition
        self.schema = schema  # the full upsert schema; delete rows get nulls in non-key columns
        self.records: list[dict[str, Any]] = []
        self.positions: list[int] = []

    def append(self, op: str, files: Sequence[pa.Table]) -> int:
        delta = self.cat.append(self.table_id, self.partition, op, list(files))
        assert [f.file_number for f in delta.files] == list(range(1, len(files) + 1))
        for file_number, t in enumerate(files, 1):
            for row_index, row in enumerate(t.to_pylist()):
                rec = {name: row.get(name) for name in self.schema.names}
                rec.update({POS: delta.position, FILE: file_number, ROW: row_index, OP: op})
                self.records.append(rec)
        self.positions.append(delta.position)
        return delta.position

    def log_table(self, up_to_position: int | None = None) -> pa.Table:
        recs = [r for r in self.records if up_to_position is None or r[POS] <= up_to_position]
        fields = list(self.schema) + [
            pa.field(POS, pa.int64()),
            pa.field(FILE, pa.int64()),
            pa.field(ROW, pa.int64()),
            pa.field(OP, pa.string()),
        ]
        return pa.Table.from_pylist(recs, schema=pa.schema(fields))


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def oracle(log: pa.Table, primary_keys: Sequence[str], sort_keys: Sequence[tuple[str, str]] | None, columns: Sequence[str]) -> pa.Table:
    """The surviving rows according to the issue's semantics, computed by DuckDB SQL (NULL-safe key equality)."""
    pks = sorted(set(primary_keys))
    on = " AND ".join(f"u.{_q(k)} IS NOT DISTINCT FROM d.{_q(k)}" for k in pks)
    # "greatest wins" -> order descending; a "descending" key keeps the smallest value -> ascending order.
    # A null sort value ranks below every value in either direction -> always NULLS LAST in this window.
    order = [f"u.{_q(c)} {'DESC' if d == 'ascending' else 'ASC'} NULLS LAST" for c, d in (sort_keys or [])]
    order += [f"u.{POS} DESC", f"u.{FILE} DESC", f"u.{ROW} DESC"]
    sql = f"""
        WITH d AS (
            SELECT {', '.join(_q(k) for k in pks)}, max({POS}) AS dpos
            FROM log WHERE {OP} = 'delete'
            GROUP BY {', '.join(_q(k) for k in pks)}
        ),
        live AS (
            SELECT u.*, row_number() OVER (
                PARTITION BY {', '.join('u.' + _q(k) for k in pks)} ORDER BY {', '.join(order)}
            ) AS rn
            FROM log u LEFT JOIN d ON {on}
            WHERE u.{OP} = 'upsert' AND (d.dpos IS NULL OR u.{POS} > d.dpos)
        )
        SELECT {', '.join(_q(c) for c in columns)} FROM live WHERE rn = 1
    """
    con = duckdb.connect()
    try:
        con.register("log", log)
        return con.sql(sql).fetch_arrow_table()
    finally:
        con.close()


def read_compacted(cat: Catalog, table_id: str, partition: Any) -> pa.Table | None:
    """All rows of the latest compacted version of one partition, file by file in file-number order."""
    from flash_pipeline.catalog.encoding import normalize_partition

    cv = cat.latest_compacted(table_id, normalize_partition(partition))
    if cv is None:
        return None
    tables = [cat.read_live(f) for f in sorted(cv.files, key=lambda f: f.file_number)]
    if not tables:
        return None
    return pa.concat_tables(tables)


def rows_of(table: pa.Table | None, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows as tuples in ``columns`` order, sorted canonically (a multiset comparison)."""
    if table is None or table.num_rows == 0:
        return []
    data = table.select(list(columns)).to_pylist()
    return sorted((tuple(r[c] for c in columns) for r in data), key=repr)


def assert_same_rows(got: pa.Table | None, expected: pa.Table | None, columns: Sequence[str]) -> None:
    """``rows_of(got) == rows_of(expected)`` for tables of a million rows: both sorted by every column with Arrow
    and compared column by column (rows_of's per-row sort took 20 s of a test at 1.15M rows). On a difference,
    the first differing row of each is named."""
    import pyarrow.compute as pc

    def canonical(t: pa.Table | None) -> pa.Table:
        if t is None:
            return pa.table({c: pa.array([], expected.schema.field(c).type if expected is not None else pa.null()) for c in columns})
        t = t.select(list(columns))
        return t.take(pc.sort_indices(t, sort_keys=[(c, "ascending") for c in columns], null_placement="at_end"))

    a, b = canonical(got), canonical(expected)
    assert a.num_rows == b.num_rows, f"{a.num_rows} rows, expected {b.num_rows}"
    for c in columns:
        x, y = a.column(c).combine_chunks(), b.column(c).cast(a.schema.field(c).type).combine_chunks()
        if not x.equals(y):
            same = pc.fill_null(pc.equal(x, y), False).to_numpy(zero_copy_only=False) | (pc.is_null(x).to_numpy(zero_copy_only=False) & pc.is_null(y).to_numpy(zero_copy_only=False))
            i = int((~same).argmax())
            raise AssertionError(f"column {c!r} differs first at sorted row {i}: {a.slice(i, 1).to_pylist()} != {b.slice(i, 1).to_pylist()}")


def live_index_rows(cat: Catalog, cv: Any) -> int:
    """The index rows of ``cv`` that point at a live row (not in its data file's deletion vector), counted from
    the index files' bytes; asserts that each file's recorded ``dead_rows`` counts the others."""
    from flash_pipeline.compactor.index import pk_index

    dead = {f.file_number: cat.dead_rows(f).astype(np.int64) for f in cv.files}
    live = 0
    for files in cv.index.buckets:
        for ix in files:
            rows = pk_index.file_rows(cat.storage.read(ix.key), ix, cv.index.sort_key_width)
            numbers, at = rows["file"].astype(np.int64), rows["row"].astype(np.int64)
            is_dead = np.zeros(len(rows), dtype=bool)
            for n in np.unique(numbers):
                sel = numbers == n
                is_dead[sel] = np.isin(at[sel], dead.get(int(n), np.zeros(0, dtype=np.int64)))
            assert int(is_dead.sum()) == ix.dead_rows, (ix, int(is_dead.sum()))
            live += len(rows) - int(is_dead.sum())
    return live


def assert_layout_invariants(cat: Catalog, table_id: str, partition: Any, rows_per_file: int, rows_per_index_file: int) -> None:
    """File numbers 1..n, at most rows_per_file rows each, index rows == compacted rows, index files bounded."""
    from flash_pipeline.catalog.encoding import normalize_partition

    cv = cat.latest_compacted(table_id, normalize_partition(partition))
    assert cv is not None
    numbers = sorted(f.file_number for f in cv.files)
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    for f in cv.files:
        assert f.rows <= rows_per_file, (f, rows_per_file)
        assert cat.read_file(f).num_rows == f.rows
    assert cv.index is not None
    assert live_index_rows(cat, cv) == cv.index.live_rows == cv.rows
    assert len(cv.index.buckets) == cv.index.hash_bucket_count
    for files in cv.index.buckets:
        for ix in files:
            assert 0 < ix.rows <= rows_per_index_file, (ix, rows_per_index_file)


def run_compact(cat: Catalog, table_id: str, primary_keys: Sequence[str] | None, sort_keys: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("progress", quiet)
    return compact(table_id, primary_keys, sort_keys=sort_keys, catalog=cat, **kwargs)


def assert_compact_command_refused(tmp_path: Path, env: dict[str, str], fragment: str) -> None:
    """A ``flash-compactor compact`` of a one-delta lake under ``env`` (extra variables) exits non-zero with one
    line on stderr containing ``fragment`` and leaves every file of the lake as it was."""
    lake = tmp_path / "lake"
    schema = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.string())])
    Catalog(lake).append("T", {"p": "a"}, "upsert", [pa.table({"k": [1, 2], "ts": [1, 1], "v": ["a", "b"]}, schema=schema)])
    before = sorted((p.relative_to(lake), p.stat().st_size) for p in lake.rglob("*"))
    done = subprocess.run([sys.executable, "-m", "flash_pipeline.cli", "compact", "--catalog", str(lake), "--table", "T",
                           "--primary-key", "k", "--sort-key", "ts"], capture_output=True, text=True,
                          env={**os.environ, "FLASH_EXECUTOR": "in-process", **env}, timeout=300)
    assert done.returncode == 2, done.stderr  # bad input: exit 2, the lake unchanged
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0], done.stderr
    assert sorted((p.relative_to(lake), p.stat().st_size) for p in lake.rglob("*")) == before


def counted_reads(monkeypatch: Any) -> list[str]:
    """The keys a local lake reads from now on (the real ``LocalStorage.read``, recorded on the way): for tests
    of what a command costs in requests."""
    from flash_pipeline.catalog.storage import LocalStorage

    reads: list[str] = []
    real = LocalStorage.read

    def counted(self: LocalStorage, key: str) -> bytes:
        reads.append(key)
        return real(self, key)

    monkeypatch.setattr(LocalStorage, "read", counted)
    return reads
