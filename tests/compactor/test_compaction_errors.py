"""Bad compaction requests fail with a one-line FlashError before anything is written (the lake is unchanged)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

from compaction_helpers import DeltaLog, fresh_lake, oracle, read_compacted, rows_of, run_compact
from flash_pipeline import Catalog, FlashError
from flash_pipeline.catalog.model import schema_to_b64

TABLE = "ACME.ERRORS.V1"
PART = {"day": "d1"}
PART_T = (("day", "d1"),)
SCHEMA = pa.schema(
    [
        ("k1", pa.string()),
        ("k2", pa.int64()),
        ("name", pa.string()),
        ("a", pa.int64()),
        ("b", pa.int64()),
        ("c", pa.int64()),
        ("d", pa.int64()),
        ("e", pa.int64()),
        ("f", pa.float64()),
    ]
)
PKS = ["k1", "k2"]


def _rows(start: int, n: int) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"k1": "xy"[i % 2], "k2": i % 3, "name": f"n{i}", "a": i, "b": -i, "c": i % 2, "d": 7, "e": None, "f": i / 2}
            for i in range(start, start + n)
        ],
        schema=SCHEMA,
    )


def _stream(cat: Catalog) -> DeltaLog:
    log = DeltaLog(cat, TABLE, PART, SCHEMA)
    log.append("upsert", [_rows(0, 5), _rows(5, 3)])
    log.append("delete", [pa.Table.from_pylist([{"k1": "x", "k2": 0}], schema=pa.schema([SCHEMA.field(c) for c in PKS]))])
    log.append("upsert", [_rows(8, 4)])
    return log


def assert_refused(cat: Catalog, action: Callable[[], Any], *fragments: str, one_line: bool = True) -> str:
    """``action`` raises a one-line FlashError mentioning ``fragments`` and leaves every key of the lake as it was."""
    before = sorted(cat.listing())
    with pytest.raises(FlashError) as info:
        action()
    message = str(info.value)
    assert message and message == message.strip(), repr(message)
    if one_line:
        assert "\n" not in message, repr(message)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert sorted(cat.listing()) == before
    return message


def _compact(cat: Catalog, pks: Any = PKS, sort_keys: Any = None, **kw: Any) -> Any:
    return lambda: run_compact(cat, TABLE, pks, sort_keys, hash_bucket_count=2, rows_per_compacted_file=3, **kw)


@pytest.mark.parametrize(
    ("sort_keys", "fragment"),
    [
        ([("name", "ascending")], "name"),  # a string has no fixed width
        ([(c, "ascending") for c in "abcde"], "32"),  # 5 x int64 = 40 bytes > 32
        ([("a", "ascending"), ("a", "descending")], "a"),  # duplicate name
        ([("a", "ascending"), ("f", "descending"), ("a", "ascending")], "a"),  # duplicate name, same direction
        ([("nope", "ascending")], "nope"),  # unknown column
        ([("a", "upwards")], "upwards"),  # unknown direction
    ],
)
def test_invalid_sort_keys_are_refused_before_any_write(sort_keys: Any, fragment: str) -> None:
    with fresh_lake() as cat:
        _stream(cat)
        assert_refused(cat, _compact(cat, sort_keys=sort_keys), fragment)
        assert cat.latest_compacted(TABLE, PART_T) is None


def test_missing_primary_key_column_in_an_upsert_delta_is_refused() -> None:
    with fresh_lake() as cat:
        _stream(cat)
        assert_refused(cat, _compact(cat, pks=["k1", "missing"]), "missing")


@pytest.mark.parametrize(("pks", "sort_keys", "typo"), [(["k1", "K2"], None, "K2"), (PKS, [("aa", "ascending")], "aa")])
def test_a_key_no_delta_has_is_called_a_key_name_not_a_bad_delta(pks: Any, sort_keys: Any, typo: str) -> None:
    """A key column that no pending delta and not the compacted version has is a mistyped key: the line says so
    and names the table's columns. Before, it blamed the first delta and offered to skip it (good data) or to
    start a new stream (an adversarial run's find)."""
    with fresh_lake() as cat:
        _stream(cat)
        message = assert_refused(cat, _compact(cat, pks=pks, sort_keys=sort_keys), repr([typo]), "not columns of",
                                 "'k2'", "case-sensitive")
        assert message.startswith(f"key column(s) {[typo]!r}") and "missing from the upsert delta" not in message, message
        run_compact(cat, TABLE, PKS, None, hash_bucket_count=2)  # the right names compact the same deltas
        cat.append(TABLE, PART, "upsert", [_rows(20, 2)])
        message = assert_refused(cat, _compact(cat, sort_keys=[("a", "ascending"), ("zz", "ascending")], rebuild=True),
                                 "['zz'] are not columns of", "case-sensitive")  # a rebuild's new keys too


def test_a_delta_lacking_the_keys_an_empty_compacted_version_recorded_is_a_bad_delta() -> None:
    """Keys recorded by a compacted version (even an empty one, of deletes only) are the table's: an upsert
    without them is a bad delta, named with the commands that unblock the stream, not a mistyped key name (the
    review of the mistyped-key message found it said so here)."""
    with fresh_lake() as cat:
        keys = pa.schema([SCHEMA.field(c) for c in PKS])
        cat.append(TABLE, PART, "delete", [pa.Table.from_pylist([{"k1": "x", "k2": 0}], schema=keys)])
        run_compact(cat, TABLE, PKS, None, hash_bucket_count=2)  # an empty version that records the keys
        cat.append(TABLE, PART, "upsert", [pa.table({"K1": ["a"], "k2": pa.array([1], pa.int64())})])
        message = assert_refused(cat, lambda: run_compact(cat, TABLE, None, None), "missing from the upsert delta at position 2",
                                 "skip-delta")
        assert "not columns of" not in message, message


def test_missing_primary_key_column_in_a_delete_delta_is_refused() -> None:
    with fresh_lake() as cat:
        _stream(cat)
        # delete deltas need only the primary key columns -- but all of them
        cat.append(TABLE, PART, "delete", [pa.Table.from_pylist([{"k1": "y"}], schema=pa.schema([SCHEMA.field(c) for c in ["k1"]]))])
        assert_refused(cat, _compact(cat), "k2", "delete")
        assert cat.latest_compacted(TABLE, PART_T) is None


def _forge_delta(cat: Catalog, schema: pa.Schema) -> None:
    """Commit a delta manifest the way a foreign (older, buggy) writer might: same files, conflicting schema.

    The catalog's own append refuses such a delta, so the manifest is written through the storage layer.
    """
    last = cat.deltas(TABLE, PART_T)[-1]
    doc = last.to_json()
    doc["position"] = last.position + 1
    doc["operation"] = "upsert"
    doc["arrow_schema"] = schema_to_b64(schema)
    doc["schema"] = [{"name": f.name, "type": str(f.type)} for f in schema]
    manifests = [k for k in cat.listing() if "/deltas/" in k and k.endswith(".json")]
    key = next(k for k in manifests if int(k.rsplit("/", 1)[1][: -len(".json")]) == last.position)
    folder, name = key.rsplit("/", 1)
    digits = len(name) - len(".json")
    cat.storage.write(f"{folder}/{last.position + 1:0{digits}d}.json", json.dumps(doc).encode())


CONFLICTING = pa.schema([(f.name, pa.string() if f.name == "a" else f.type) for f in SCHEMA])


def test_catalog_refuses_an_upsert_with_conflicting_columns() -> None:
    with fresh_lake() as cat:
        _stream(cat)
        bad = _rows(20, 2).set_column(3, "a", pa.array(["1", "2"]))
        assert_refused(cat, lambda: cat.append(TABLE, PART, "upsert", [bad]), "a")


def test_schema_conflict_between_deltas_is_refused_before_any_write() -> None:
    with fresh_lake() as cat:
        _stream(cat)
        _forge_delta(cat, CONFLICTING)
        assert [d.position for d in cat.deltas(TABLE, PART_T)] == [1, 2, 3, 4]
        assert_refused(cat, _compact(cat))
        assert cat.latest_compacted(TABLE, PART_T) is None


def test_schema_conflict_with_the_compacted_table_is_refused_before_any_write() -> None:
    with fresh_lake() as cat:
        _stream(cat)
        _compact(cat, sort_keys=[("a", "ascending")])()
        version = cat.latest_compacted(TABLE, PART_T).version
        _forge_delta(cat, CONFLICTING)
        assert_refused(cat, _compact(cat, pks=None, sort_keys=None), one_line=False)
        assert cat.latest_compacted(TABLE, PART_T).version == version


def test_schema_conflict_message_is_one_line() -> None:
    with fresh_lake() as cat:
        _stream(cat)
        _forge_delta(cat, CONFLICTING)
        assert_refused(cat, _compact(cat), "position 4")


def test_second_compaction_with_different_keys_is_refused_unless_rebuild() -> None:
    with fresh_lake() as cat:
        log = _stream(cat)
        _compact(cat, sort_keys=[("a", "ascending")])()
        first = cat.latest_compacted(TABLE, PART_T)
        assert first.primary_keys == ("k1", "k2") and first.sort_keys == (("a", "ascending"),)
        log.append("upsert", [_rows(30, 3)])
        assert_refused(cat, _compact(cat, pks=["k1"], sort_keys=[("a", "ascending")]), "rebuild")
        assert_refused(cat, _compact(cat, sort_keys=[("a", "descending")]), "rebuild")
        assert_refused(cat, _compact(cat, sort_keys=[("b", "ascending")]), "rebuild")
        assert_refused(cat, _compact(cat, sort_keys=[]), "rebuild")  # explicitly "stream position only"
        assert cat.latest_compacted(TABLE, PART_T).version == first.version


def test_rebuild_with_new_keys_replaces_the_compacted_table() -> None:
    with fresh_lake() as cat:
        log = _stream(cat)
        _compact(cat, sort_keys=[("a", "ascending")])()
        first = cat.latest_compacted(TABLE, PART_T)
        log.append("upsert", [_rows(30, 3)])
        _compact(cat, pks=["k1"], sort_keys=[("b", "descending")], rebuild=True)()
        rebuilt = cat.latest_compacted(TABLE, PART_T)
        assert rebuilt.version > first.version
        assert rebuilt.primary_keys == ("k1",) and rebuilt.sort_keys == (("b", "descending"),)
        want = oracle(log.log_table(), ["k1"], [("b", "descending")], SCHEMA.names)
        assert rows_of(read_compacted(cat, TABLE, PART), SCHEMA.names) == rows_of(want, SCHEMA.names)


def test_a_bad_delta_among_many_of_one_schema_is_still_refused() -> None:
    """Planning checks a schema shared by many deltas once: a delta that differs (columns, operation) after
    many that share one is still checked and refused, naming its position."""
    with fresh_lake() as cat:
        _stream(cat)
        for i in range(6):
            cat.append(TABLE, PART, "upsert", [_rows(100 + 10 * i, 3)])
        _forge_delta(cat, CONFLICTING)
        bad = cat.deltas(TABLE, PART_T)[-1].position
        assert_refused(cat, _compact(cat), f"position {bad}")
        assert cat.latest_compacted(TABLE, PART_T) is None


def test_a_manifest_naming_other_columns_than_its_recorded_schema_is_still_checked() -> None:
    """The once-per-schema shortcut keys on the manifest's column names too: a foreign writer's manifest that
    keeps an earlier delta's recorded schema but lists no ``k2`` is refused for the missing key column."""
    with fresh_lake() as cat:
        _stream(cat)
        last = cat.deltas(TABLE, PART_T)[-1]
        doc = last.to_json()
        doc["position"] = last.position + 1
        doc["schema"] = [c for c in doc["schema"] if c["name"] != "k2"]
        key = next(k for k in cat.listing() if "/deltas/" in k and k.endswith(".json") and int(k.rsplit("/", 1)[1][:-5]) == last.position)
        folder, name = key.rsplit("/", 1)
        cat.storage.write(f"{folder}/{last.position + 1:0{len(name) - 5}d}.json", json.dumps(doc).encode())
        assert_refused(cat, _compact(cat), "k2", f"position {last.position + 1}")
        assert cat.latest_compacted(TABLE, PART_T) is None


def test_a_second_source_compacted_into_a_destination_is_refused_unless_rebuilt(tmp_path: Path) -> None:
    """A destination holds one source's compaction: compacting another source into it committed that source's
    rows alone as the next version (the first source's rows gone from the latest version, exit 0). Now refused
    with one line naming both tables, the lake as it was; ``rebuild=True`` replaces them on purpose."""
    from flash_pipeline import compact

    cat = Catalog(tmp_path / "lake")
    part = {"p": "a"}
    cat.append("A", part, "upsert", [pa.table({"k": [1, 2], "v": ["a1", "a2"]})])
    cat.append("B", part, "upsert", [pa.table({"k": [3], "v": ["b3"]})])
    compact("A", ["k"], catalog=cat, destination_compacted_table_id="OUT", progress=lambda m: None)
    before = cat.listing()
    with pytest.raises(FlashError, match=r"'OUT' \[p=a\] holds the compaction of 'A' \(version 1\), not of 'B'.*--rebuild"):
        compact("B", ["k"], catalog=cat, destination_compacted_table_id="OUT", progress=lambda m: None)
    assert cat.listing() == before
    compact("B", ["k"], catalog=cat, destination_compacted_table_id="OUT", rebuild=True, progress=lambda m: None)
    latest = cat.latest_compacted("OUT", (("p", "a"),))
    assert latest.source_table_id == "B" and latest.rows == 1


@pytest.mark.parametrize("case", ["other primary key", "no sort key column"])
def test_given_primary_keys_take_no_recorded_sort_keys_that_do_not_apply(tmp_path: Path, case: str) -> None:
    """The recorded sort keys are inherited by primary keys given alone only when they are the recorded primary
    keys and the data has the sort key columns: otherwise the stream position decides, as before they were
    inherited (the review found such compactions refused, the line blaming key names nobody gave)."""
    from flash_pipeline import compact

    cat = Catalog(tmp_path / "lake")
    cat.append("T", {"p": "a"}, "upsert", [pa.table({"k": [1], "id": [1], "ts": [1], "v": ["x"]})])
    compact("T", ["k"], sort_keys=[("ts", "ascending")], catalog=cat, progress=lambda m: None)
    if case == "other primary key":
        rows = [pa.table({"k": [1], "id": [7], "ts": [9], "v": ["first"]}), pa.table({"k": [2], "id": [7], "ts": [1], "v": ["second"]})]
        keys = ["id"]
    else:
        rows = [pa.table({"k": [7], "v": ["first"]}), pa.table({"k": [7], "v": ["second"]})]
        keys = ["k"]
    for t in rows:
        cat.append("T", {"p": "b"}, "upsert", [t])
    compact("T", keys, catalog=cat, partitions=[{"p": "b"}], progress=lambda m: None)
    latest = cat.latest_compacted("T", (("p", "b"),))
    assert list(latest.sort_keys) == [] and [r["v"] for r in read_compacted(cat, "T", {"p": "b"}).to_pylist()] == ["second"]


def test_with_failures_reported_a_blocked_stream_fails_alone_and_the_others_commit() -> None:
    """``compact(..., failures="report")`` (what a Dagster batch run uses): a stream blocked by a bad delta is a
    ``failed`` result with the engine's one line, while the other streams of the job commit what a plain model of
    their deltas says; by default the job stops before any work, as the CLI does."""
    with fresh_lake() as cat:
        keys = pa.schema([SCHEMA.field(c) for c in PKS])
        cat.append(TABLE, PART, "delete", [pa.Table.from_pylist([{"k1": "x", "k2": 0}], schema=keys)])
        run_compact(cat, TABLE, PKS, None, hash_bucket_count=2)
        cat.append(TABLE, PART, "upsert", [pa.table({"K1": ["a"], "k2": pa.array([1], pa.int64())})])  # blocks d1
        good = DeltaLog(cat, TABLE, {"day": "d2"}, SCHEMA)
        good.append("upsert", [_rows(0, 6)])
        good.append("upsert", [_rows(3, 6)])
        assert_refused(cat, lambda: run_compact(cat, TABLE, None, None), "missing from the upsert delta")
        blocked_before = cat.latest_compacted(TABLE, PART_T)
        result = run_compact(cat, TABLE, None, None, failures="report")
        by_day = {dict(p.partition)["day"]: p for p in result.partitions}
        assert by_day["d1"].status == "failed" and "skip-delta" in by_day["d1"].error and "\n" not in by_day["d1"].error
        assert isinstance(by_day["d1"].failure, FlashError) and "failure" not in by_day["d1"].to_json()
        assert by_day["d2"].status == "compacted"
        assert cat.latest_compacted(TABLE, PART_T) == blocked_before
        columns = list(SCHEMA.names)
        assert rows_of(read_compacted(cat, TABLE, {"day": "d2"}), columns) == rows_of(oracle(good.log_table(), PKS, None, columns), columns)
        with pytest.raises(FlashError, match="failures must be"):
            run_compact(cat, TABLE, None, None, failures="ignore")
