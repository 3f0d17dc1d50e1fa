"""Schema evolution (catalog/schema_evolution.py, catalog/schema_history.py): the rules, keys that keep their
digests across a widening, refusals that leave the lake byte-identical, and a differential test of random
evolving streams (added, left-out, narrower and wider columns, renamed and dropped ones, refused changes) interleaved with upserts,
deletes, compactions, optimize and rehash, against a plain union-by-name model in Python."""

from __future__ import annotations

import decimal
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from compaction_helpers import fresh_lake, read_compacted, rows_of, run_compact  # noqa: F401
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.schema_edits import rename_and_drop
from flash_pipeline.catalog.schema_evolution import WIDER, converts, evolve
from flash_pipeline.catalog.schema_history import history, latest_entry
from flash_pipeline.compactor.index.rehash import rehash
from flash_pipeline.compactor.kernels.digest import primary_key_digests
from flash_pipeline.errors import FlashError, SchemaConflict
from flash_pipeline.merge_on_read import read as merge_on_read
from flash_pipeline.optimize import optimize

PART = {"day": "d1"}
PART_T = (("day", "d1"),)


def _lake_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ----- the rules ------------------------------------------------------------------------------------------------
def _type(text: str) -> pa.DataType:
    return getattr(pa, text if text != "double" else "float64")() if text not in ("float", "halffloat") else {
        "float": pa.float32(), "halffloat": pa.float16()}[text]


@pytest.mark.parametrize(("narrow", "wide"), sorted(WIDER))
def test_every_widening_converts_one_way_and_keys_keep_their_digests(narrow: str, wide: str) -> None:
    """Each (narrower, wider) pair converts without loss one way only, and a key column's values digest the same
    in either type: an index built before a widening stays valid (kernels/digest.py frames by value)."""
    a, b = _type(narrow), _type(wide)
    assert converts(a, b) and not converts(b, a)
    values = [0, 1, 3, 100, None] if pa.types.is_integer(a) else [0.5, -1.25, 3.0, None]
    narrow_keys = pa.table({"k": pa.array(values, pa.int64() if pa.types.is_integer(a) else pa.float64()).cast(a)})
    wide_keys = narrow_keys.cast(pa.schema([pa.field("k", b)]))
    assert (primary_key_digests(narrow_keys, ["k"]) == primary_key_digests(wide_keys, ["k"])).all()


@pytest.mark.parametrize(("a", "b"), [
    (pa.string(), pa.large_string()), (pa.binary(), pa.large_binary()),
    (pa.dictionary(pa.int32(), pa.string()), pa.string()), (pa.decimal128(10, 2), pa.decimal128(20, 2)),
])
def test_the_same_values_in_another_form_convert_and_keep_their_digests(a: pa.DataType, b: pa.DataType) -> None:
    assert converts(a, b)
    values: list[Any] = ([decimal.Decimal("1.50"), decimal.Decimal("-3.25"), None] if pa.types.is_decimal(a)
                         else [b"x", b"", None] if "binary" in str(a) else ["x", "", None])
    src = pa.table({"k": pa.array(values, a if not pa.types.is_dictionary(a) else a.value_type)})
    if pa.types.is_dictionary(a):
        src = pa.table({"k": src.column("k").dictionary_encode()})
    assert (primary_key_digests(src, ["k"]) == primary_key_digests(src.cast(pa.schema([pa.field("k", b)])), ["k"])).all()


@pytest.mark.parametrize(("a", "b"), [
    (pa.string(), pa.int64()), (pa.int64(), pa.uint64()), (pa.float64(), pa.int64()), (pa.int64(), pa.float64()),
    (pa.decimal128(10, 2), pa.decimal128(10, 3)), (pa.timestamp("us"), pa.int64()), (pa.uint64(), pa.int64()),
])
def test_changes_that_lose_values_or_meaning_are_refused(a: pa.DataType, b: pa.DataType) -> None:
    assert not converts(a, b)
    current = pa.schema([pa.field("k", pa.int64()), pa.field("v", b)])
    with pytest.raises(SchemaConflict, match=r"'v'.*new-stream --schema-from"):
        evolve(current, pa.schema([pa.field("k", pa.int64()), pa.field("v", a)]), upsert=True, source="f.parquet", where="table 'T'")


def test_evolve_adds_omits_narrows_widens_and_keeps_order() -> None:
    current = pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.int32()), pa.field("n", pa.string())])
    incoming = pa.schema([pa.field("x", pa.float64()), pa.field("k", pa.int16()), pa.field("v", pa.int64())])
    evo = evolve(current, incoming, upsert=True, source="f", where="t")
    assert evo.added == ["x"] and evo.widened == [("v", "int32", "int64")]
    assert [(f.name, f.type, f.nullable) for f in evo.schema] == [
        ("k", pa.int64(), True), ("v", pa.int64(), True), ("n", pa.string(), True), ("x", pa.float64(), True)]
    # a delete never adds or widens: its unknown columns are the caller's refusal, a wider key is refused
    assert not evolve(current, pa.schema([pa.field("k", pa.int8())]), upsert=False, source="f", where="t").changed
    with pytest.raises(SchemaConflict):
        evolve(pa.schema([pa.field("k", pa.int32())]), pa.schema([pa.field("k", pa.int64())]), upsert=False, source="f", where="t")
    # a required column may be neither left out nor given nulls; a sort key may not widen
    required = pa.schema([pa.field("k", pa.int64()), pa.field("r", pa.int64(), nullable=False)])
    with pytest.raises(SchemaConflict, match="'r'"):
        evolve(required, pa.schema([pa.field("k", pa.int64())]), upsert=True, source="f", where="t")
    with pytest.raises(SchemaConflict, match="holds nulls"):
        evolve(required, required, upsert=True, source="f", where="t", nulls=frozenset({"r"}))
    with pytest.raises(SchemaConflict, match="sort key"):
        evolve(current, incoming, upsert=True, source="f", where="t", sort_keys=["v"])


# ----- through the catalog -------------------------------------------------------------------------------------
def test_refused_changes_leave_the_lake_byte_identical_and_off_keeps_todays_checks(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    cat = Catalog(root)
    cat.append("T", PART, "upsert", [pa.table({"k": pa.array([1], pa.int64()), "ts": pa.array([1], pa.int32()), "v": ["a"]})])
    run_compact(cat, "T", ["k"], [("ts", "ascending")])
    before = _lake_bytes(root)
    refused = {
        "a string into an integer column": pa.table({"k": pa.array([2], pa.int64()), "ts": pa.array(["x"])}),
        "a sort key widened": pa.table({"k": [2], "ts": pa.array([2], pa.int64())}),
        "a key left out": pa.table({"ts": pa.array([2], pa.int32()), "v": ["b"]}),
        "the sort key left out": pa.table({"k": pa.array([2], pa.int64()), "v": ["b"]}),
    }
    for what, table in refused.items():
        with pytest.raises(SchemaConflict) as info:
            cat.append("T", PART, "upsert", [table])
        assert info.value.exit_code == 2 and "\n" not in str(info.value), what
        assert _lake_bytes(root) == before, what
    from flash_pipeline.catalog.schema_history import set_schema_evolution

    set_schema_evolution(cat, "T", False)
    before = _lake_bytes(root)
    with pytest.raises(SchemaConflict, match="does not match the columns"):
        cat.append("T", PART, "upsert", [pa.table({"k": pa.array([2], pa.int64()), "ts": pa.array([2], pa.int32()), "v": ["b"], "w": [1]})])
    assert _lake_bytes(root) == before
    # one append may still ask for evolution; the change is then recorded as the stream's next schema entry
    cat.append("T", PART, "upsert", [pa.table({"k": pa.array([2], pa.int64()), "ts": pa.array([2], pa.int32()), "w": [1]})],
               schema_evolution=True)
    entries = history(cat, cat.active_stream("T", PART_T))
    assert [e["entry"] for e in entries] == [0, 1] and entries[1]["changes"] == "added 'w'"


def test_a_widened_key_compacts_incrementally_with_the_index_it_had(tmp_path: Path) -> None:
    """int32 keys compacted, then int64 keys (one of them an update of an int32 key) compacted incrementally:
    the update replaces the old row (the index found it by digest) and the version holds int64 keys."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "upsert", [pa.table({"k": pa.array([1, 2, 3], pa.int32()), "v": ["a", "b", "c"]})])
    run_compact(cat, "T", ["k"], None)
    cat.append("T", PART, "upsert", [pa.table({"k": pa.array([2, 2**40], pa.int64()), "v": ["B", "big"]})])
    result = run_compact(cat, "T", ["k"], None)
    assert result.partitions[0].prior_rows == 3 and result.partitions[0].duplicates_dropped == 1
    out = read_compacted(cat, "T", PART)
    assert out.schema.field("k").type == pa.int64()
    assert rows_of(out, ["k", "v"]) == sorted([(1, "a"), (2, "B"), (3, "c"), (2**40, "big")], key=repr)


# ----- differential: random evolving streams against a union-by-name model --------------------------------------
FAMILIES: dict[str, list[pa.DataType]] = {
    "int": [pa.int8(), pa.int16(), pa.int32(), pa.int64()],
    "float": [pa.float32(), pa.float64()],
    "text": [pa.string(), pa.large_string(), pa.dictionary(pa.int32(), pa.string())],
}
VALUE_COLUMNS = {"a": "int", "b": "float", "c": "text", "d": "int", "e": "text"}
KEYS = list(range(8))


def _value(family: str, key: int, step: int) -> Any:
    if family == "int":
        return (key * 7 + step) % 100 - 50  # fits int8
    if family == "float":
        return (key + step) / 4  # exact in float32
    return f"{key}-{step}"


@st.composite
def evolving_streams(draw: st.DrawFn) -> dict[str, Any]:
    steps: list[tuple[Any, ...]] = []
    for i in range(draw(st.integers(2, 9))):
        kind = "upsert" if i == 0 else draw(st.sampled_from(["upsert", "upsert", "upsert", "delete", "compact", "compact", "optimize",
                                                             "rehash", "refused", "rename", "rename", "drop"]))
        if kind == "upsert":  # the first with a value column at least, so that every stream has one to rename or drop
            cols = draw(st.lists(st.sampled_from(sorted(VALUE_COLUMNS)), unique=True, min_size=1 if i == 0 else 0, max_size=5))
            types = {c: draw(st.integers(0, len(FAMILIES[VALUE_COLUMNS[c]]) - 1)) for c in cols}
            keys = draw(st.lists(st.sampled_from(KEYS), unique=True, min_size=1, max_size=5))
            steps.append(("upsert", draw(st.permutations(cols)), types, keys, draw(st.sampled_from([2, 3]))))
        elif kind == "delete":
            steps.append(("delete", draw(st.lists(st.sampled_from(KEYS), unique=True, min_size=1, max_size=3)), draw(st.sampled_from([0, 1, 2, 3]))))
        elif kind == "rehash":
            steps.append(("rehash", draw(st.integers(1, 3))))
        elif kind in ("rename", "drop"):
            steps.append((kind, draw(st.integers(0, 4))))  # which of the stream's value columns
        else:
            steps.append((kind,))
    fmt = draw(st.sampled_from(["parquet", "feather", "orc", "csv"]))
    return {"steps": steps, "format": fmt}


def family(column: str) -> str:
    """A value column's type family: its first letter's (a renamed column is named ``a1``, ``a2``, ...)."""
    return VALUE_COLUMNS[column[0]]


class Model:
    """Union by name: the stream's columns are every column any accepted upsert had, in first-seen order, each of
    the widest type seen; a row is what its upsert gave, null in the columns its delta left out. A rename keeps
    the column's place and values under the new name; a drop forgets it (a later upsert may add it anew)."""

    def __init__(self) -> None:
        self.columns: dict[str, int] = {}  # value column -> index of its widest type in its family
        self.key_type = -1
        self.rows: dict[int, dict[str, Any]] = {}
        self.aliases: dict[str, str] = {}  # the generator's name (a..e) -> the column's name after renames
        self.renames = 0

    def name(self, drawn: str) -> str:
        return self.aliases.get(drawn, drawn)

    def upsert(self, cols: list[str], types: dict[str, int], keys: list[int], key_type: int, step: int) -> None:
        for c in cols:
            self.columns[c] = max(self.columns.get(c, -1), types[c]) if family(c) != "text" else 0
        self.key_type = max(self.key_type, key_type)
        for k in keys:
            self.rows[k] = {c: _value(family(c), k, step) for c in cols}

    def rename(self, old: str) -> str:
        self.renames += 1
        new = f"{old[0]}{self.renames}"
        self.columns = {new if c == old else c: t for c, t in self.columns.items()}
        self.rows = {k: {new if c == old else c: v for c, v in r.items()} for k, r in self.rows.items()}
        self.aliases[old[0]] = new
        return new

    def drop(self, column: str) -> None:
        del self.columns[column]
        for r in self.rows.values():
            r.pop(column, None)
        self.aliases.pop(column[0], None)

    def table_rows(self) -> list[tuple[Any, ...]]:
        names = list(self.columns)
        return sorted(((k, *(r.get(c) for c in names)) for k, r in self.rows.items()), key=repr)


def _delta(cols: list[str], types: dict[str, int], keys: list[int], key_type: int, step: int) -> pa.Table:
    arrays = {"k": pa.array(keys, FAMILIES["int"][key_type])}
    for c in cols:
        t = FAMILIES[family(c)][types[c]]
        values = [_value(family(c), k, step) for k in keys]
        arrays[c] = pa.array(values, t.value_type).dictionary_encode() if pa.types.is_dictionary(t) else pa.array(values, t)
    return pa.table(arrays)


def _check(cat: Catalog, model: Model, compacted: bool) -> None:
    names = ["k", *model.columns]
    merged = merge_on_read(cat, "T", primary_keys=["k"])
    assert sorted(merged.column_names) == sorted(names)
    assert rows_of(merged, names) == model.table_rows()
    if compacted:
        version = cat.latest_compacted("T", PART_T)
        assert version is not None
        recorded = version.pa_schema() if version.arrow_schema else None  # CSV files keep no types of their own
        files = [cat.read_committed(version, f, None, recorded) for f in sorted(version.files, key=lambda f: f.file_number)]
        assert rows_of(pa.concat_tables(files) if files else None, names) == model.table_rows()
        if version.rows:  # the version records the stream's columns in their widest types (an empty one: its keys)
            schema = version.pa_schema()
            assert set(schema.names) == set(names), schema
            assert schema.field("k").type == FAMILIES["int"][model.key_type]
            for c, widest in model.columns.items():
                if family(c) != "text":
                    assert schema.field(c).type == FAMILIES[family(c)][widest], (c, schema)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(evolving_streams())
def test_random_evolving_streams_match_a_union_by_name_model(stream: dict[str, Any]) -> None:
    """Every step's outcome against the model: merge-on-read after each step, the compacted version (columns,
    widest types, rows) after each compaction, and each refused change leaves the lake byte-identical."""
    _run_against_model(stream)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(evolving_streams())
def test_a_few_random_evolving_streams_match_the_model(stream: dict[str, Any]) -> None:
    """The differential test above at a fast tier's size (15 examples)."""
    _run_against_model(stream)


def _renaming_stream(seed: int) -> dict[str, Any]:
    """Upserts, compactions and renames/drops in turn (seeded), so that every stream renames or drops columns
    of a compacted version with deltas pending on both sides of the change."""
    import random

    rng = random.Random(seed)
    steps: list[tuple[Any, ...]] = []
    for _ in range(rng.randint(2, 4)):
        for _ in range(rng.randint(1, 2)):
            cols = rng.sample(sorted(VALUE_COLUMNS), rng.randint(1, 4))
            types = {c: rng.randrange(len(FAMILIES[VALUE_COLUMNS[c]])) for c in cols}
            steps.append(("upsert", cols, types, rng.sample(KEYS, rng.randint(1, 5)), rng.choice([2, 3])))
        steps.append(rng.choice([("compact",), ("compact",), ("optimize",), ("rehash", rng.randint(1, 3))]))
        if rng.random() < 0.3:
            steps.append(("delete", rng.sample(KEYS, 2), rng.randint(0, 3)))
        steps.append((rng.choice(["rename", "rename", "drop"]), rng.randint(0, 4)))
    return {"steps": steps, "format": rng.choice(["parquet", "feather", "orc", "csv"]), "hypothesis": False}


@pytest.mark.parametrize("seed", [s if s < 3 else pytest.param(s, marks=pytest.mark.slow) for s in range(40)])
def test_renames_and_drops_across_compacted_versions_match_the_model(seed: int) -> None:
    """The model test on streams that rename or drop a column after every compaction (the random streams above
    reach that state in few examples): merge-on-read right after the change, the rewrite at the next compaction."""
    _run_against_model(_renaming_stream(seed))


def _run_against_model(stream: dict[str, Any]) -> None:
    with fresh_lake() as cat:
        model = Model()
        compacted = False
        for step, op in enumerate(stream["steps"], 1):
            kind = op[0]
            if kind == "upsert":
                _, drawn, drawn_types, keys, key_type = op
                cols, types = [model.name(c) for c in drawn], {model.name(c): t for c, t in drawn_types.items()}
                cat.append("T", PART, "upsert", [_delta(cols, types, keys, key_type, step)])
                model.upsert(cols, types, keys, key_type, step)
            elif kind in ("rename", "drop") and model.columns:
                column = list(model.columns)[op[1] % len(model.columns)]
                if stream.get("hypothesis", True):
                    event(f"{kind} {'after' if compacted else 'before'} a compaction")
                if kind == "rename":
                    rename_and_drop(cat, "T", {column: f"{column[0]}{model.renames + 1}"})
                    model.rename(column)
                else:
                    rename_and_drop(cat, "T", drops=[column])
                    model.drop(column)
                if compacted:  # the key is recorded now: renaming or dropping it is refused, the lake unchanged
                    before = _lake_bytes(Path(cat.uri))
                    with pytest.raises(SchemaConflict, match="'k' .*primary key.*new-stream --schema-from"):
                        rename_and_drop(cat, "T", {"k": "key"} if kind == "rename" else None, [] if kind == "rename" else ["k"])
                    assert _lake_bytes(Path(cat.uri)) == before
            elif kind == "delete" and model.key_type >= 0:
                _, keys, key_type = op
                key_type = min(key_type, model.key_type)  # a delete never widens the key: narrower is cast
                cat.append("T", PART, "delete", [pa.table({"k": pa.array(keys, FAMILIES["int"][key_type])})])
                for k in keys:
                    model.rows.pop(k, None)
            elif kind == "compact" and model.key_type >= 0:
                run_compact(cat, "T", ["k"], None, compacted_file_content_type=stream["format"], executor="in-process")
                compacted = True
            elif kind == "optimize" and compacted:
                run_compact(cat, "T", ["k"], None, executor="in-process")
                optimize(cat, "T", progress=lambda m: None)
            elif kind == "rehash" and compacted:
                run_compact(cat, "T", ["k"], None, executor="in-process")
                rehash(cat, "T", op[1], log=lambda m: None)
            elif kind == "refused" and model.columns:
                column = next(iter(model.columns))
                bad = "x" if family(column) != "text" else 1.5
                before = _lake_bytes(Path(cat.uri))
                with pytest.raises(SchemaConflict, match=repr(column)):
                    cat.append("T", PART, "upsert", [pa.table({"k": pa.array([0], pa.int64()), column: [bad]})])
                assert _lake_bytes(Path(cat.uri)) == before
            if model.key_type >= 0:
                _check(cat, model, compacted and kind in ("compact", "optimize", "rehash"))
        if model.key_type >= 0:
            run_compact(cat, "T", ["k"], None, compacted_file_content_type=stream["format"], executor="in-process")
            _check(cat, model, True)
            entry = latest_entry(cat, cat.active_stream("T", PART_T))
            assert entry is not None and set(entry[1].names) == {"k", *model.columns}
            if stream["format"] == "parquet":  # the same stream through the Delta readers (a Delta table holds Parquet)
                with tempfile.TemporaryDirectory() as exports:
                    _delta_readers_match_export(cat, Path(exports))


# ----- Delta readers across a change ----------------------------------------------------------------------------
def _by_name(table: pa.Table) -> list[tuple[Any, ...]]:
    names = sorted(table.column_names)
    return sorted((tuple(r[n] for n in names) for r in table.select(names).to_pylist()), key=repr) if table.num_rows else []


@pytest.mark.parametrize("seed", [s if s < 3 else pytest.param(s, marks=pytest.mark.slow) for s in range(12)])
def test_every_delta_version_of_an_evolving_stream_reads_like_export_in_deltalake_polars_and_duckdb(tmp_path: Path, seed: int) -> None:
    """A stream that gains columns, leaves some out, widens, renames and drops others, compacted after every
    delta: each version (a Delta version with a metaData action where the schema changed) reads through
    deltalake's QueryBuilder, polars.read_delta and DuckDB's Delta extension (``delta_scan``), by time travel,
    as ``export --version`` gives it: the same columns and rows."""
    import random

    rng = random.Random(seed)
    cat = Catalog(tmp_path / "lake")
    model = Model()
    for step in range(1, 7):
        if step > 1 and rng.random() < 0.25:
            keys = rng.sample(KEYS, 2)
            cat.append("T", PART, "delete", [pa.table({"k": pa.array(keys, FAMILIES["int"][model.key_type])})])
        elif step > 2 and model.columns and rng.random() < 0.25:  # evolve --rename / --drop
            column = rng.choice(list(model.columns))
            if rng.random() < 0.6:
                rename_and_drop(cat, "T", {column: f"{column[0]}{model.renames + 1}"})
                model.rename(column)
            else:
                rename_and_drop(cat, "T", drops=[column])
                model.drop(column)
        else:
            cols = [model.name(c) for c in rng.sample(sorted(VALUE_COLUMNS), rng.randint(0, 3))]
            types = {c: rng.randrange(len(FAMILIES[family(c)])) for c in cols}
            key_type = rng.choice([2, 3])
            cat.append("T", PART, "upsert", [_delta(cols, types, rng.sample(KEYS, 3), key_type, step)])
            model.upsert(cols, types, [], key_type, step)
        run_compact(cat, "T", ["k"], None, executor="in-process")
    latest = cat.latest_compacted("T", PART_T)
    assert latest is not None
    if latest.rows:
        assert set(latest.pa_schema().names) == {"k", *model.columns}  # renamed and dropped columns included
    _delta_readers_match_export(cat, tmp_path)


def _delta_readers_match_export(cat: Catalog, tmp_path: Path) -> None:
    """Every retained version of the stream, read through deltalake's QueryBuilder, polars.read_delta and DuckDB's
    delta_scan by time travel, has the rows and columns ``export --version`` gives (Parquet exports: any
    compacted file format)."""
    import deltalake
    import polars as pl
    import pyarrow.parquet as pq
    from duckdb_delta import delta_scan

    location = cat.deltalake_location("T", PART_T)
    latest = cat.latest_compacted("T", PART_T)
    assert latest is not None
    for version in cat.compacted_versions("T", PART_T):
        out = tmp_path / f"export-{version}"
        files = cat.export("T", out, PART, version=version)
        exported = [pq.read_table(f) for f in files]
        expected = _by_name(pa.concat_tables(exported)) if files else []
        dt = deltalake.DeltaTable(location, version=version)
        through_delta = pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all())
        assert _by_name(through_delta) == expected, version
        assert _by_name(pl.read_delta(location, version=version).to_arrow()) == expected, version
        through_duckdb = delta_scan(location, version)
        assert _by_name(through_duckdb) == expected, version
        if files:
            assert sorted(through_duckdb.column_names) == sorted(exported[0].column_names), version
            assert sorted(through_delta.column_names) == sorted(exported[0].column_names), version
        _iceberg_readers_match(cat, version, expected, exported)


def _iceberg_readers_match(cat: Catalog, version: int, expected: list[Any], exported: list[pa.Table]) -> None:
    """The version's Iceberg snapshot, through pyiceberg (time travel by snapshot id) and DuckDB's iceberg_scan of
    its metadata file, has the rows and columns export gives: field ids kept across renames, added columns null
    in older files, widened types read as the version's."""
    import lake_readers

    if cat.iceberg_blocker(cat.compacted_version("T", PART_T, version)) is not None:
        return
    through_pyiceberg = lake_readers.pyiceberg_rows(cat.iceberg_catalog_uri(), cat.iceberg_identifier("T", PART_T),
                                                    version)
    assert _by_name(through_pyiceberg) == expected, f"pyiceberg, version {version}"
    through_duckdb = lake_readers.iceberg_scan(cat.iceberg_uri(cat.iceberg_metadata_key("T", PART_T, version)))
    assert _by_name(through_duckdb) == expected, f"DuckDB iceberg_scan, version {version}"
    if exported:
        assert sorted(through_pyiceberg.column_names) == sorted(exported[0].column_names), version
    if exported and sum(t.num_rows for t in exported):  # filters prune by manifest bounds: widened ones too
        import random

        table = lake_readers.pyiceberg_table(cat.iceberg_catalog_uri(), cat.iceberg_identifier("T", PART_T))
        lake_readers.filtered_reads_match(table, version, pa.concat_tables(exported), random.Random(version))


def test_the_commands_evolve_refuse_switch_off_and_show_the_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the CLI: an append that adds a column and widens another is recorded and shown by ``show --json``;
    a string into the widened column exits 2 naming it; ``evolve --schema-evolution off`` makes the next
    differing append fail with today's check, while one that matches still goes in."""
    import json

    import pyarrow.parquet as pq

    from flash_pipeline.cli import main

    lake = str(tmp_path / "lake")
    files = {name: tmp_path / f"{name}.parquet" for name in ("first", "wider", "text", "extra")}
    pq.write_table(pa.table({"k": [1], "v": pa.array([1], pa.int32())}), files["first"])
    pq.write_table(pa.table({"k": [2], "v": pa.array([2], pa.int64()), "w": ["x"]}), files["wider"])
    pq.write_table(pa.table({"k": [3], "v": ["text"]}), files["text"])
    pq.write_table(pa.table({"k": [4], "v": pa.array([4], pa.int64()), "w": ["y"], "z": [1.5]}), files["extra"])
    base = ["append", "--catalog", lake, "--table", "T", "--partition", "day=d1", "--op", "upsert"]
    assert main(base + [str(files["first"])]) == 0 and main(base + [str(files["wider"])]) == 0
    capsys.readouterr()
    assert main(base + [str(files["text"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'v'" in err and "string" in err and "int64" in err and "new-stream --schema-from" in err
    assert main(["show", "--catalog", lake, "--table", "T", "--json"]) == 0
    (stream,) = json.loads(capsys.readouterr().out)["tables"][0]["partitions"][0]["streams"]
    assert [c["changes"] for c in stream["schema_changes"]] == ["added 'w', widened 'v' from int32 to int64"]
    assert main(["evolve", "--catalog", lake, "--table", "T", "--schema-evolution", "off"]) == 0
    capsys.readouterr()
    assert main(base + [str(files["extra"])]) == 2 and "unexpected ['z']" in capsys.readouterr().err
    assert main(base + [str(files["wider"])]) == 0  # the stream's own columns: accepted either way
    assert main(base + ["--schema-evolution", "on", str(files["extra"])]) == 0  # one append may still evolve
    merged = merge_on_read(Catalog(lake), "T", primary_keys=["k"])
    assert merged.schema.names == ["k", "v", "w", "z"] and merged.schema.field("v").type == pa.int64()
    assert rows_of(merged, ["k", "v", "w", "z"]) == sorted([(1, 1, None, None), (2, 2, "x", None), (4, 4, "y", 1.5)], key=repr)


def test_evolve_renames_and_drops_through_the_cli_and_refuses_keys_and_unknown_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``evolve --rename v=w --drop s`` on every partition: one line per stream, ``show --json`` lists the change,
    merge-on-read has the new names at once, the next compaction reports the change and rewrites every file
    (verify passes), and refusals (a key, an unknown column, a clash) exit 2 with one line and change nothing."""
    import json

    from flash_pipeline.cli import main

    lake = str(tmp_path / "lake")
    cat = Catalog(lake)
    for day in ("d1", "d2"):
        cat.append("T", {"day": day}, "upsert", [pa.table({"k": [1, 2], "v": [10, 20], "s": ["a", "b"], "u": [1.0, 2.0]})])
    run_compact(cat, "T", ["k"], None, executor="in-process")
    base = ["evolve", "--catalog", lake, "--table", "T"]
    before = _lake_bytes(Path(lake))
    for args, words in [(["--rename", "k=key"], "primary key"), (["--drop", "nope"], "no column 'nope'"),
                        (["--rename", "v=u"], "two columns named 'u'"), (["--rename", "v"], "OLD=NEW")]:
        capsys.readouterr()
        assert main(base + args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, (args, err)
    assert _lake_bytes(Path(lake)) == before
    assert main(base + ["--rename", "v=w", "--drop", "s"]) == 0
    out = capsys.readouterr().out
    assert out.count("renamed 'v' to 'w', dropped 's'") == 2, out
    assert main(["show", "--catalog", lake, "--table", "T", "--json"]) == 0
    parts = json.loads(capsys.readouterr().out)["tables"][0]["partitions"]
    assert [p["streams"][0]["schema_changes"][-1]["changes"] for p in parts] == ["renamed 'v' to 'w', dropped 's'"] * 2
    merged = merge_on_read(cat, "T", primary_keys=["k"])
    assert sorted(merged.column_names) == ["k", "u", "w"] and sorted(merged.column("w").to_pylist()) == [10, 10, 20, 20]
    result = run_compact(cat, "T", ["k"], None, executor="in-process")
    assert all(p.schema_changes == ["renamed 'v' to 'w'", "dropped 's'"] and p.files_carried == 0 for p in result.partitions)
    for day in ("d1", "d2"):
        assert sorted(rows_of(read_compacted(cat, "T", {"day": day}), ["k", "w", "u"])) == [(1, 10, 1.0), (2, 20, 2.0)]
    assert main(["verify", "--catalog", lake, "--all-versions"]) == 0


def test_delta_column_mapping_is_read_by_deltalake_and_duckdb_but_refused_by_polars(tmp_path: Path) -> None:
    """Why a rename rewrites the files instead of using Delta column mapping (docs/schema-evolution.md): a
    two-version table written by hand in name mode, version 1 renaming ``v`` to ``w`` over the same file, reads
    renamed through deltalake's QueryBuilder and DuckDB's delta_scan, and polars.read_delta refuses it (reader
    version 2). When this fails, Polars may have learned column mapping and renames could stop rewriting."""
    import json
    import time
    import uuid

    import deltalake
    import polars as pl
    import pyarrow.parquet as pq
    from duckdb_delta import delta_scan

    root = tmp_path / "mapped"
    (root / "_delta_log").mkdir(parents=True)
    pq.write_table(pa.table({"col-1": pa.array([1, 2], pa.int64()), "col-2": pa.array([10, 20], pa.int64())}), root / "part-0.parquet")

    def metadata(name: str) -> dict[str, Any]:
        fields = [{"name": logical, "type": "long", "nullable": True,
                   "metadata": {"delta.columnMapping.id": i, "delta.columnMapping.physicalName": f"col-{i}"}}
                  for i, logical in ((1, "k"), (2, name))]
        return {"metaData": {"id": table_id, "format": {"provider": "parquet", "options": {}}, "partitionColumns": [],
                             "schemaString": json.dumps({"type": "struct", "fields": fields}), "createdTime": now,
                             "configuration": {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "2"}}}

    table_id, now = str(uuid.uuid4()), int(time.time() * 1000)
    add = {"add": {"path": "part-0.parquet", "partitionValues": {}, "size": (root / "part-0.parquet").stat().st_size,
                   "modificationTime": now, "dataChange": True}}
    versions = [[{"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}}, metadata("v"), add], [metadata("w")]]
    for n, actions in enumerate(versions):
        (root / "_delta_log" / f"{n:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    for version, name in ((0, "v"), (1, "w")):
        want = [{"k": 1, name: 10}, {"k": 2, name: 20}]
        dt = deltalake.DeltaTable(str(root), version=version)
        assert pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all()).to_pylist() == want
        assert sorted(delta_scan(str(root), version).to_pylist(), key=lambda r: r["k"]) == want
        with pytest.raises(Exception, match="column mapping"):
            pl.read_delta(str(root), version=version)


def test_an_added_column_carries_the_untouched_files_and_a_widened_one_rewrites_them(tmp_path: Path) -> None:
    """Ten files compacted; a delta adding a column touches one key: nine files are carried as they were (their
    manifest entry names the columns they have), and every reader gives the new column as null for their rows:
    read, export, verify, deltalake, Polars, DuckDB's delta_scan. A delta widening a column then rewrites every file (each version's
    files share its types, which Delta readers without type widening need)."""
    import subprocess

    import deltalake
    import polars as pl
    import pyarrow.parquet as pq

    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "upsert", [pa.table({"k": pa.array(range(100), pa.int64()), "v": pa.array(range(100), pa.int32())})])
    # copy-on-write: the touched file is rewritten (with deletion vectors it would be carried too)
    run_compact(cat, "T", ["k"], None, rows_per_compacted_file=10, executor="in-process", deletion_vectors=False)
    cat.append("T", PART, "upsert", [pa.table({"k": pa.array([5], pa.int64()), "v": pa.array([-5], pa.int32()), "w": ["new"]})])
    added = run_compact(cat, "T", ["k"], None, executor="in-process").partitions[0]
    assert added.schema_changes == ["added 'w'"] and added.files_carried == 9  # all but the file of key 5
    version = cat.latest_compacted("T", PART_T)
    assert sorted(f.columns for f in version.files) == [()] * added.files_written + [("k", "v")] * 9
    expected = sorted([(k, -5 if k == 5 else k, "new" if k == 5 else None) for k in range(100)], key=repr)
    names = ["k", "v", "w"]
    assert rows_of(merge_on_read(cat, "T", primary_keys=["k"]), names) == expected
    exported = cat.export("T", tmp_path / "out", PART)
    assert rows_of(pa.concat_tables([pq.read_table(f) for f in exported]), names) == expected
    location = cat.deltalake_location("T", PART_T)
    dt = deltalake.DeltaTable(location)
    assert rows_of(pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all()), names) == expected
    assert rows_of(pl.read_delta(location).to_arrow(), names) == expected
    from duckdb_delta import delta_scan

    assert rows_of(delta_scan(location), names) == expected
    verify = subprocess.run([str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "flash-compactor"), "verify",
                             "--catalog", cat.uri, "--all-versions"], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    cat.append("T", PART, "upsert", [pa.table({"k": pa.array([6], pa.int64()), "v": pa.array([2**40], pa.int64())})])
    widened = run_compact(cat, "T", ["k"], None, executor="in-process").partitions[0]
    assert widened.schema_changes == ["widened 'v' from int32 to int64"] and widened.files_carried == 0
    assert all(not f.columns for f in cat.latest_compacted("T", PART_T).files)
    assert rows_of(merge_on_read(cat, "T", primary_keys=["k"]), names) == sorted(
        [(k, 2**40, None) if k == 6 else r for k, *_ in expected for r in [next(e for e in expected if e[0] == k)]], key=repr)


# ----- columns with no value yet (Arrow's null type) and CSV text --------------------------------------------
@pytest.mark.parametrize("other", [pa.int64(), pa.string(), pa.float64(), pa.bool_(), pa.timestamp("us"),
                                   pa.decimal128(10, 2), pa.list_(pa.int32())])
def test_a_null_column_converts_to_every_type_and_nothing_converts_to_null(other: pa.DataType) -> None:
    assert converts(pa.null(), other) and not converts(other, pa.null())
    assert pa.nulls(3, pa.null()).cast(other).null_count == 3  # what reading it in the stream's type does


def test_empty_csv_columns_and_digit_strings_append_in_the_streams_types(tmp_path: Path) -> None:
    """A CSV column empty in every row is guessed as Arrow's null type, digits in a string column as int64: both
    are appended in the stream's types (the empty column's rows null, "02134" kept as text), a stream whose first
    delta had the empty column takes the first real type, and compaction, read and export agree with a model.
    Before: 'column ts of x.csv is null but ... has int64: cast it to int64', and a stuck stream ('cast it to
    null'). Text that does not parse as the stream's type is still refused, naming the column."""
    import pyarrow.parquet as pq

    files = {"a.csv": "id,zip,ts\n1,ab1,10\n2,x22,20\n", "b.csv": "id,zip,ts\n3,02134,\n4,00001,\n",
             "c.csv": "id,zip,ts\n2,,30\n", "bad.csv": "id,zip,ts\n5,z,abc\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cat = Catalog(tmp_path / "lake")
    for name in ("a.csv", "b.csv", "c.csv"):
        cat.append("T", PART, "upsert", [tmp_path / name])
    before = _lake_bytes(tmp_path / "lake")
    with pytest.raises(SchemaConflict, match=r"column 'ts' of .*bad.csv is string but .* has int64"):
        cat.append("T", PART, "upsert", [tmp_path / "bad.csv"])
    assert _lake_bytes(tmp_path / "lake") == before
    model = {1: ("ab1", 10), 2: (None, 30), 3: ("02134", None), 4: ("00001", None)}
    expected = sorted((k, z, t) for k, (z, t) in model.items())
    got = merge_on_read(cat, "T", primary_keys=["id"])
    assert got.schema.field("zip").type == pa.string() and got.schema.field("ts").type == pa.int64()
    assert sorted(zip(*got.select(["id", "zip", "ts"]).to_pydict().values())) == expected
    run_compact(cat, "T", ["id"], None, executor="in-process")
    out = pq.read_table(cat.export("T", tmp_path / "out")[0])
    assert sorted(zip(*out.select(["id", "zip", "ts"]).to_pydict().values())) == expected

    first = Catalog(tmp_path / "lake2")  # the empty column comes first: the stream records null, then widens
    (tmp_path / "empty_ts.csv").write_text("id,ts\n3,\n4,\n")
    first.append("T", PART, "upsert", [tmp_path / "empty_ts.csv"])
    run_compact(first, "T", ["id"], None, executor="in-process")
    assert merge_on_read(first, "T").schema.field("ts").type == pa.null()
    first.append("T", PART, "upsert", [tmp_path / "a.csv"])
    got = merge_on_read(first, "T")
    assert got.schema.field("ts").type == pa.int64()
    assert sorted(zip(*got.select(["id", "ts"]).to_pydict().values())) == [(1, 10), (2, 20), (3, None), (4, None)]
    run_compact(first, "T", ["id"], None, executor="in-process")
    assert sorted(zip(*pq.read_table(first.export("T", tmp_path / "out2")[0]).select(["id", "ts"]).to_pydict().values())) == [
        (1, 10), (2, 20), (3, None), (4, None)]


def test_a_version_with_a_null_column_is_not_published_to_delta_and_the_next_one_is(tmp_path: Path) -> None:
    """deltalake would declare a null column 'void', no Delta protocol type, which DuckDB's delta_scan refuses
    for the whole table: such a version is left unpublished with the reason (as other types Delta cannot hold),
    and once a delta gives the column values the next version is published and read right by deltalake and
    DuckDB."""
    import deltalake
    from duckdb_delta import delta_scan

    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "upsert", [pa.table({"id": pa.array([1, 2], pa.int64()), "note": pa.nulls(2)})])
    run_compact(cat, "T", ["id"], None, executor="in-process")
    v1 = cat.latest_compacted("T", PART_T)
    assert v1 is not None
    reason = cat.deltalake_blocker(v1)
    assert reason is not None and "'note' is null" in reason
    cat.append("T", PART, "upsert", [pa.table({"id": pa.array([3], pa.int64()), "note": ["hello"]})])
    run_compact(cat, "T", ["id"], None, executor="in-process")
    v2 = cat.latest_compacted("T", PART_T)
    assert v2 is not None and cat.deltalake_blocker(v2) is None
    location = cat.deltalake_location("T", PART_T)
    expected = [(1, None), (2, None), (3, "hello")]
    for table in (deltalake.QueryBuilder().register("t", deltalake.DeltaTable(location)).execute("SELECT * FROM t").read_all(),
                  delta_scan(location, 2)):
        assert sorted(zip(*pa.table(table).select(["id", "note"]).to_pydict().values()), key=str) == sorted(expected, key=str)


@pytest.mark.parametrize(("narrow", "wide", "low", "high"), [
    (pa.int32(), pa.int64(), 10, 20), (pa.int8(), pa.int16(), 1, 2), (pa.float32(), pa.float64(), 1.0, 2.0),
    (pa.decimal128(5, 2), pa.decimal128(10, 2), decimal.Decimal("1.00"), decimal.Decimal("2.00")),
    (pa.null(), pa.int64(), None, 2)])
def test_a_sort_key_widened_before_the_first_compaction_compacts(tmp_path: Path, narrow: pa.DataType, wide: pa.DataType,
                                                                  low: Any, high: Any) -> None:
    """A sort key keeps its width once an index records it; before the first compaction no index does, so a
    delta that widened the column (accepted by the append) compacts like read() merges it. Before: compact
    refused it as a widened sort key, and new-stream (no compacted version yet) could not help: only skip-delta,
    dropping the delta. Once compacted, a further widening is still refused."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "upsert", [pa.table({"id": pa.array([1, 2], pa.int64()), "s": pa.array([low, low], narrow),
                                               "v": ["old-1", "old-2"]})])
    cat.append("T", PART, "upsert", [pa.table({"id": pa.array([1], pa.int64()), "s": pa.array([high], wide), "v": ["new-1"]})])
    expected = [(1, high, "new-1"), (2, low, "old-2")]
    merged = merge_on_read(cat, "T", primary_keys=["id"], sort_keys=[("s", "ascending")])
    assert sorted(zip(*merged.select(["id", "s", "v"]).to_pydict().values())) == expected
    run_compact(cat, "T", ["id"], [("s", "ascending")], executor="in-process")
    compacted = read_compacted(cat, "T", PART_T)
    assert compacted is not None and compacted.schema.field("s").type == wide
    assert sorted(zip(*compacted.select(["id", "s", "v"]).to_pydict().values())) == expected
    if pa.types.is_integer(wide) and wide.bit_width < 64:  # the index now records the width: wider still is refused
        wider = {16: pa.int32(), 32: pa.int64()}[wide.bit_width]
        with pytest.raises(SchemaConflict, match="sort key"):
            cat.append("T", PART, "upsert", [pa.table({"id": pa.array([3], pa.int64()), "s": pa.array([5], wider), "v": ["x"]})])


def test_a_first_append_that_died_after_claiming_the_schema_is_undone_by_new_stream(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream's first append claims its schema, then uploads and commits its delta. Killed in between (Ctrl-C
    exits 130 there too), it left the claim and no delta: appends of other types were refused, naming
    new-stream, which refused a stream with no compacted version. Now new-stream starts an empty stream in its
    place, whose next append claims the schema afresh."""
    cat = Catalog(tmp_path / "lake")
    died = pa.table({"id": pa.array([1], pa.int64()), "v": ["a"]})

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(type(cat), "_upload_staged", interrupted)
        with pytest.raises(KeyboardInterrupt):
            cat.append("T", PART, "upsert", [died])
    later = pa.table({"id": pa.array([2], pa.int64()), "v": pa.array([7], pa.int64())})
    with pytest.raises(SchemaConflict, match="new-stream"):
        cat.append("T", PART, "upsert", [later])
    fresh = cat.new_stream_from_compacted("T", PART)
    assert fresh.compacted is None and fresh.delta is None and (fresh.previous.version, fresh.stream.version) == (1, 2)
    cat.append("T", PART, "upsert", [later])
    run_compact(cat, "T", ["id"], None, executor="in-process")
    got = read_compacted(cat, "T", PART_T)
    assert got is not None and got.schema.field("v").type == pa.int64() and got.column("id").to_pylist() == [2]


def test_an_evolve_that_died_between_entry_and_delta_is_completed_by_running_it_again(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """evolve records each stream's entry, then appends its empty delta under the new names (readers take names
    from the deltas). Killed between the two (here: the second stream's delta), readers kept the old names and
    running the same command again was refused ('has no column v'), stream by stream. Now the rerun appends the
    missing delta and counts the finished streams as done: every stream reads the new names."""
    cat = Catalog(tmp_path / "lake")
    for day in ("d1", "d2"):
        cat.append("T", {"day": day}, "upsert", [pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})])
    real_append = Catalog.append
    calls = []

    def dies_on_the_second(self: Catalog, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_append(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(Catalog, "append", dies_on_the_second)
        with pytest.raises(KeyboardInterrupt):
            rename_and_drop(cat, "T", {"v": "w"})
    assert merge_on_read(cat, "T", [{"day": "d1"}], primary_keys=["id"]).column_names == ["id", "w"]
    assert merge_on_read(cat, "T", [{"day": "d2"}], primary_keys=["id"]).column_names == ["id", "v"]  # its delta died
    edits = rename_and_drop(cat, "T", {"v": "w"})
    assert [e.changes for e in edits] == ["renamed 'v' to 'w'"] * 2
    for day in ("d1", "d2"):
        got = merge_on_read(cat, "T", [{"day": day}], primary_keys=["id"])
        assert got.column_names == ["id", "w"] and sorted(got.column("w").to_pylist()) == ["a", "b"]
    assert len(cat.deltas("T", (("day", "d2"),))) == 2  # the one missing delta, appended once
    with pytest.raises(SchemaConflict, match="has no column 'v'"):  # a different change is checked as before
        rename_and_drop(cat, "T", {"v": "x"})


@pytest.mark.parametrize("schema_from", [False, True])
def test_new_stream_after_a_rename_and_drop_carries_the_rows_under_the_new_names(tmp_path: Path,
                                                                                 schema_from: bool) -> None:
    """new-stream carries the latest compacted rows; an ``evolve --rename/--drop`` since that compaction lives in
    the old stream's schema entries, so the carried rows came back under the old names: the dropped column's
    values visible again, the renamed column split in two by later appends (found by a black-box check)."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "upsert", [pa.table({"id": [1, 2], "a": ["x", "y"], "secret": ["s1", "s2"]})])
    run_compact(cat, "T", ["id"], None, executor="in-process")
    rename_and_drop(cat, "T", {"a": "alpha"}, ["secret"])
    new_schema = pa.schema([("id", pa.int64()), ("alpha", pa.large_string())]) if schema_from else None
    done = cat.new_stream_from_compacted("T", PART, schema=new_schema)
    assert done.not_carried == []  # evolve's empty delta holds no rows to append again (it was named "not carried")
    assert merge_on_read(cat, "T", primary_keys=["id"]).column_names == ["id", "alpha"]
    cat.append("T", PART, "upsert", [pa.table({"id": [3], "alpha": ["z"]})])
    run_compact(cat, "T", ["id"], None, executor="in-process")
    got = read_compacted(cat, "T", PART_T)
    assert got is not None and got.column_names == ["id", "alpha"]
    assert sorted(zip(got.column("id").to_pylist(), got.column("alpha").to_pylist())) == [(1, "x"), (2, "y"), (3, "z")]


def test_a_sort_key_column_a_later_upsert_added_is_null_in_the_earlier_ones(tmp_path: Path) -> None:
    """Schema evolution reads a column an upsert added as null in the earlier deltas, and a null sort key ranks
    below every value (docs/compaction.md); compact and read refused it as 'missing from the upsert delta at
    position 1', offering skip-delta of a delta holding live rows."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "upsert", [pa.table({"id": [1, 2, 3], "v": [10, 20, 30]})])
    cat.append("T", PART, "upsert", [pa.table({"id": [1, 3], "v": [11, 31], "ts": pa.array([5, None], pa.int32())})])
    cat.append("T", PART, "upsert", [pa.table({"id": [3], "v": [32]})])  # null again: the later position wins the tie
    # the model: the greatest (ts, position) per key, a null ts below every value
    expected = [(1, 11, 5), (2, 20, None), (3, 32, None)]
    got = merge_on_read(cat, "T", primary_keys=["id"], sort_keys=[("ts", "ascending")])
    assert sorted(zip(*(got.column(n).to_pylist() for n in ("id", "v", "ts")))) == expected
    run_compact(cat, "T", ["id"], [("ts", "ascending")], executor="in-process")
    got = read_compacted(cat, "T", PART_T)
    assert got is not None and sorted(zip(*(got.column(n).to_pylist() for n in ("id", "v", "ts")))) == expected


def test_a_new_partition_without_the_tables_sort_key_column_is_told_how_to_compact(tmp_path: Path) -> None:
    """A new partition takes the table's keys from a keyed one; when none of its deltas has the sort key column,
    the line said the keys were unknown and offered skip-delta (its rows lost). It now names the partition the
    keys came from and a fix that keeps the table's keys (a delta with the column: an empty one), which works;
    keys of its own would be taken up by later new partitions (found by a review)."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", {"p": "b"}, "upsert", [pa.table({"id": [1, 2], "ts": [1, 1], "v": [1, 2]})])
    run_compact(cat, "T", ["id"], [("ts", "ascending")], executor="in-process")
    cat.append("T", {"p": "a"}, "upsert", [pa.table({"id": [7, 7], "v": [5, 6]})])
    before = _lake_bytes(tmp_path / "lake")
    with pytest.raises(FlashError) as info:
        run_compact(cat, "T", None, None, executor="in-process")
    message = str(info.value)
    assert "[p=a] takes the table's keys from T [p=b]" in message and "['ts']" in message
    assert "skip-delta" not in message and "append a delta that has them (an empty one will do" in message
    assert _lake_bytes(tmp_path / "lake") == before
    empty = pa.table({n: pa.array([], pa.int64()) for n in ("id", "v", "ts")})
    cat.append("T", {"p": "a"}, "upsert", [empty])
    run_compact(cat, "T", None, None, executor="in-process")
    got = read_compacted(cat, "T", (("p", "a"),))
    assert got is not None and got.to_pylist() == [{"id": 7, "v": 6, "ts": None}]
    assert cat.latest_compacted("T", (("p", "a"),)).sort_keys == (("ts", "ascending"),)
    # a later new partition still merges by the table's sort key
    cat.append("T", {"p": "c"}, "upsert", [pa.table({"id": [7, 7], "ts": [9, 1], "v": [100, 200]})])
    assert merge_on_read(cat, "T", partitions=[{"p": "c"}]).to_pylist() == [{"id": 7, "ts": 9, "v": 100}]


def test_a_deletes_only_streams_first_upsert_may_widen_the_key(tmp_path: Path) -> None:
    """A stream of deletes only takes its schema from its first upsert (docs); with evolution on, that upsert's
    key may be of a type that holds the deletes' keys (int32 deletes, int64 upserts), where it was refused with
    the strict message. A type that cannot hold them is still refused, the lake unchanged."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "delete", [pa.table({"id": pa.array([1], pa.int32())})])
    before = _lake_bytes(tmp_path / "lake")
    with pytest.raises(SchemaConflict, match="int32 keys it cannot hold"):
        cat.append("T", PART, "upsert", [pa.table({"id": pa.array([1, 2], pa.int16()), "v": [1, 2]})])
    assert _lake_bytes(tmp_path / "lake") == before
    cat.append("T", PART, "upsert", [pa.table({"id": pa.array([1, 2], pa.int64()), "v": [10, 20]})])
    cat.append("T", PART, "delete", [pa.table({"id": pa.array([1], pa.int32())})])
    cat.append("T", PART, "upsert", [pa.table({"id": pa.array([3], pa.int64()), "v": [30]})])
    expected = [(2, 20), (3, 30)]  # the first delete came before id 1 existed; the second removed it
    got = merge_on_read(cat, "T", primary_keys=["id"])
    assert sorted(zip(got.column("id").to_pylist(), got.column("v").to_pylist())) == expected
    run_compact(cat, "T", ["id"], None, executor="in-process")
    got = read_compacted(cat, "T", PART_T)
    assert got is not None and got.schema.field("id").type == pa.int64()
    assert sorted(zip(got.column("id").to_pylist(), got.column("v").to_pylist())) == expected


def test_integer_csv_text_a_float_column_would_round_is_refused_and_exact_text_is_taken(tmp_path: Path) -> None:
    """CSV text is read in the stream's types; integer text that a float column rounds (16777217 as float32,
    2**53 + 1 as float64) was stored rounded, silently, where Parquet's int64 into a float column is refused as
    lossy. It is refused the same way now, the lake unchanged; integers the type holds exactly still go in."""
    cat = Catalog(tmp_path / "lake")
    schema = pa.schema([("id", pa.int64()), ("f32", pa.float32()), ("f64", pa.float64())])
    cat.append("T", PART, "upsert", [pa.table({"id": [1], "f32": [0.5], "f64": [0.5]}, schema=schema)])
    for name, text in (("f32", "16777217"), ("f64", str(2**53 + 1))):
        path = tmp_path / f"{name}.csv"
        other = "f64" if name == "f32" else "f32"
        path.write_text(f"id,{name},{other}\n2,{text},1\n")
        before = _lake_bytes(tmp_path / "lake")
        with pytest.raises(SchemaConflict, match=f"column '{name}' of .* is int64 .* without loss"):
            cat.append("T", PART, "upsert", [str(path)])
        assert _lake_bytes(tmp_path / "lake") == before
    exact = tmp_path / "exact.csv"
    exact.write_text(f"id,f32,f64\n3,16777216,{2**53}\n")
    cat.append("T", PART, "upsert", [str(exact)])
    got = merge_on_read(cat, "T", primary_keys=["id"])
    assert got.schema.field("f32").type == pa.float32() and got.schema.field("f64").type == pa.float64()
    assert sorted(zip(*(got.column(n).to_pylist() for n in ("id", "f32", "f64")))) == [(1, 0.5, 0.5),
                                                                                     (3, 16777216.0, float(2**53))]


def test_a_whole_number_float32_would_round_among_decimals_widens_the_column(tmp_path: Path) -> None:
    """Beside 0.5 the text 16777217 is read as double; into a float32 column it was rounded to 16777216 (a review
    of the integer-only check). The column keeps its double reading and widens the stream's, as Parquet would."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "upsert", [pa.table({"id": [1], "f": pa.array([0.25], pa.float32())})])
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("id,f\n2,16777217\n3,0.5\n")
    cat.append("T", PART, "upsert", [str(mixed)])
    got = merge_on_read(cat, "T", primary_keys=["id"])
    assert got.schema.field("f").type == pa.float64()
    assert sorted(zip(got.column("id").to_pylist(), got.column("f").to_pylist())) == [(1, 0.25), (2, 16777217.0),
                                                                                     (3, 0.5)]
    fine = tmp_path / "fine.csv"  # every whole number fits float32: read as the stream's float (no widening)
    fine.write_text("id,f\n4,16777216\n5,0.5\n")
    other = Catalog(tmp_path / "lake2")
    other.append("T", PART, "upsert", [pa.table({"id": [1], "f": pa.array([0.25], pa.float32())})])
    other.append("T", PART, "upsert", [str(fine)])
    assert merge_on_read(other, "T", primary_keys=["id"]).schema.field("f").type == pa.float32()


def test_a_deletes_only_stream_takes_a_wider_decimal_key(tmp_path: Path) -> None:
    """The deletes-only check compares type texts; decimals were left out of it, so decimal128(20, 2) upserts
    after decimal128(10, 2) deletes were refused as unable to hold them (found by a review)."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "delete", [pa.table({"id": pa.array([decimal.Decimal("1.00")], pa.decimal128(10, 2))})])
    cat.append("T", PART, "upsert", [pa.table({"id": pa.array([decimal.Decimal("2.50")], pa.decimal128(20, 2)),
                                               "v": [1]})])
    assert merge_on_read(cat, "T", primary_keys=["id"]).column("v").to_pylist() == [1]
    cat.append("U", PART, "delete", [pa.table({"id": pa.array([decimal.Decimal("1.00")], pa.decimal128(10, 2))})])
    with pytest.raises(SchemaConflict, match="keys it cannot hold"):  # another scale: not the same values
        cat.append("U", PART, "upsert", [pa.table({"id": pa.array([decimal.Decimal("2.5")], pa.decimal128(20, 1)),
                                                   "v": [1]})])


def test_the_schema_changes_a_result_names_after_an_emptied_version_and_in_a_rebuild(tmp_path: Path) -> None:
    """A compaction says what it changed in the columns (Dagster's "schema changes" metadata). It said nothing when
    the version before held no rows (every key deleted) or when it rebuilt from scratch, though the columns had
    changed (found by a black-box check of the Dagster layer); a deletes-only version still has no columns to
    compare with."""
    cat = Catalog(tmp_path / "lake")
    narrow = pa.table({"id": pa.array([1, 2], pa.int64()), "v": pa.array([1, 2], pa.int32())})
    cat.append("T", PART, "upsert", [narrow])
    run_compact(cat, "T", ["id"], None, executor="in-process")
    cat.append("T", PART, "delete", [pa.table({"id": pa.array([1, 2], pa.int64())})])
    assert run_compact(cat, "T", ["id"], None, executor="in-process").partitions[0].schema_changes == []
    cat.append("T", PART, "upsert", [pa.table({"id": pa.array([3], pa.int64()), "v": pa.array([3], pa.int64()),
                                               "w": ["x"]})])
    changes = run_compact(cat, "T", ["id"], None, executor="in-process").partitions[0].schema_changes
    assert changes == ["widened 'v' from int32 to int64", "added 'w'"]
    cat.append("T", PART, "upsert", [pa.table({"id": pa.array([4], pa.int64()), "v": pa.array([4], pa.int64()),
                                               "w": ["y"], "z": [1.5]})])
    rebuilt = run_compact(cat, "T", ["id"], None, executor="in-process", rebuild=True).partitions[0]
    assert rebuilt.schema_changes == ["added 'z'"]
    other = Catalog(tmp_path / "lake2")  # deletes only, then the first upsert: no columns before it
    other.append("T", PART, "delete", [pa.table({"id": pa.array([1], pa.int64())})])
    run_compact(other, "T", ["id"], None, executor="in-process")
    other.append("T", PART, "upsert", [narrow])
    assert run_compact(other, "T", ["id"], None, executor="in-process").partitions[0].schema_changes == []


def test_a_sort_key_given_that_no_delta_has_names_the_fix_that_keeps_it(tmp_path: Path) -> None:
    """Keys given (tables.yaml, --sort-key) that a partition's deltas all lack: the line offered skip-delta or
    new-stream (its rows lost, or a restart); for a sort key, a delta with the column (an empty one) is enough, and
    the compaction then runs with the key (found by a black-box check of the Dagster layer)."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "upsert", [pa.table({"id": [1, 1], "v": [1, 2]})])
    with pytest.raises(FlashError, match=r"\['ts'\] are not columns .* append a delta that has them"):
        run_compact(cat, "T", ["id"], [("ts", "ascending")], executor="in-process")
    cat.append("T", PART, "upsert", [pa.table({n: pa.array([], pa.int64()) for n in ("id", "v", "ts")})])
    run_compact(cat, "T", ["id"], [("ts", "ascending")], executor="in-process")
    got = read_compacted(cat, "T", PART_T)
    assert got is not None and got.to_pylist() == [{"id": 1, "v": 2, "ts": None}]


def test_a_new_streams_first_compaction_names_its_changes_as_they_are(tmp_path: Path) -> None:
    """A new stream (new-stream --schema-from) may change types any way; its first compaction is told against the
    old stream's latest version, and called an int64 -> int32 change "widened" (found by a review); a narrowing or
    another kind is "changed", a column left out "dropped"."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "upsert", [pa.table({"id": [1], "v": pa.array([1], pa.int64()), "gone": ["x"]})])
    run_compact(cat, "T", ["id"], None, executor="in-process")
    cat.new_stream_from_compacted("T", PART, schema=pa.schema([("id", pa.int64()), ("v", pa.int32()),
                                                               ("w", pa.string())]))
    cat.append("T", PART, "upsert", [pa.table({"id": [2], "v": pa.array([2], pa.int32()), "w": ["y"]})])
    changes = run_compact(cat, "T", ["id"], None, executor="in-process").partitions[0].schema_changes
    assert changes == ["changed 'v' from int64 to int32", "added 'w'", "dropped 'gone'"]


def test_csv_files_of_one_append_agree_on_a_float_column_one_of_them_widens(tmp_path: Path) -> None:
    """One file's whole number that float32 would round keeps that file's double reading; the other files of the
    same append were read as float32, so the delta's files differed and the append was refused (found by a
    review). They are all read as double now, and the column widens."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", PART, "upsert", [pa.table({"id": [1], "x": pa.array([0.125], pa.float32())})])
    (tmp_path / "a.csv").write_text("id,x\n2,0.25\n")
    (tmp_path / "b.csv").write_text("id,x\n3,0.5\n4,16777217\n")
    cat.append("T", PART, "upsert", [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")])
    got = merge_on_read(cat, "T", primary_keys=["id"])
    assert got.schema.field("x").type == pa.float64()
    assert sorted(zip(got.column("id").to_pylist(), got.column("x").to_pylist())) == [
        (1, 0.125), (2, 0.25), (3, 0.5), (4, 16777217.0)]
