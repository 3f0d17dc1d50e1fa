"""Issue 13, items 4 and 5: poison refused at the door, and recovery of a blocked stream without editing files.

Append refuses (exit 2, one line, lake unchanged) deletes without the recorded primary keys, duplicate column
names, internal column names and CSV files split with the wrong delimiter; the first upsert of a stream decides
its schema atomically. A stream blocked by a bad delta is unblocked with ``skip-delta`` (reversible until a
compaction covers it) or restarted from its compacted rows with ``new-stream``; results are compared with the
independent DuckDB oracle of compaction_helpers.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from compaction_helpers import FILE, OP, POS, ROW, DeltaLog, oracle, read_compacted, rows_of, run_compact
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.files import ContentType, schema_to_json
from flash_pipeline.catalog.model import CompactedVersion, DataFile, schema_to_b64
from flash_pipeline.cli import main
from flash_pipeline.errors import FlashError, SchemaConflict
from flash_pipeline.merge_on_read import read as merge_on_read
from flash_pipeline.triggers import pending_stats

T = "ACME.POISON.V1"
PART = {"day": "d1"}
PART_T = (("day", "d1"),)
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("s", pa.string())])
PKS = ["k"]
SKS = [("v", "ascending")]


def rows(keys: list[int], v: int, tag: str) -> pa.Table:
    return pa.table({"k": keys, "v": [v + k % 3 for k in keys], "s": [f"{tag}{k}" for k in keys]}, schema=SCHEMA)


def keys_only(keys: list[int]) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64())})


def snapshot(cat: Catalog) -> dict[str, bytes]:
    """Every key of the lake with its bytes (a refused command must leave them all as they were)."""
    return {k: cat.storage.read(k) for k in cat.listing()}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(cat: Catalog, action: Any, *fragments: str) -> str:
    """``action`` raises a one-line FlashError naming ``fragments``; the lake is byte-identical afterwards."""
    before = snapshot(cat)
    with pytest.raises(FlashError) as info:
        action()
    message = str(info.value)
    assert message and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert snapshot(cat) == before
    return message


def assert_cli_refused(cat: Catalog, capsys: pytest.CaptureFixture[str], argv: list[str], *fragments: str) -> str:
    """The CLI contract: exit 2, exactly one stderr line naming ``fragments``, nothing on stdout, lake unchanged."""
    before = snapshot(cat)
    code, out, err = cli(capsys, *argv)
    assert (code, out) == (2, ""), (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flash-compactor: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert snapshot(cat) == before
    return lines[0]


def fake_compaction(cat: Catalog, dest: str, source: str, part: tuple, table: pa.Table, last_position: int, pks: tuple[str, ...]) -> CompactedVersion:
    """A compacted version committed by hand as docs/catalog-layout.md describes it (no Ray), with the internal
    stream position column in its file, as older versions wrote it."""
    key = f"{cat.compacted_prefix(dest, part)}/data/{uuid.uuid4().hex}/000001.parquet"
    with_pos = table.append_column("__stream_position__", pa.array([last_position] * table.num_rows, pa.int64()))
    size = cat.storage.write_arrow(key, lambda sink: pq.write_table(with_pos, sink))
    version = CompactedVersion(
        dest, part, 1, source, 1, last_position, pks, (), ContentType.PARQUET,
        (DataFile(1, key, table.num_rows, size, ContentType.PARQUET),), None, tuple(schema_to_json(table.schema)),
        uuid.uuid4().hex, time.time(), arrow_schema=schema_to_b64(table.schema),
    )
    assert cat.commit_compacted(version)
    return version


# ----- item 4: poison refused at the door ---------------------------------------------------------------------
def test_delete_without_recorded_keys_is_refused_also_for_a_destination_table(any_lake: Catalog) -> None:
    cat = any_lake
    cat.append(T, PART, "upsert", [rows([1, 2, 3], 0, "a")])
    cat.append(T, PART, "delete", [pa.table({"s": ["a1"]})])  # before any compaction the keys are unknown: accepted
    fake_compaction(cat, "ACME.POISON_COMPACTED.V1", T, PART_T, rows([1, 2, 3], 0, "a"), 1, ("k",))
    assert_refused(cat, lambda: cat.append(T, PART, "delete", [pa.table({"s": ["a1"]})]), "['k']", T, "ACME.POISON_COMPACTED.V1", "delete")
    assert cat.append(T, PART, "delete", [keys_only([2])]).position == 3  # with the key column it goes in


@pytest.mark.parametrize("fmt", ["parquet", "feather", "csv"])
def test_duplicate_column_names_are_refused(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    lake.append(T, PART, "upsert", [rows([1], 0, "a")])
    dup = pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array(["x"])], names=["k", "v", "k"])
    path = tmp_path / f"dup.{fmt}"
    if fmt == "parquet":
        pq.write_table(dup, path)
    elif fmt == "feather":
        feather.write_feather(dup, path)
    else:
        path.write_text("k,v,k\n1,2,x\n")
    assert_cli_refused(lake, capsys, ["append", "--catalog", lake.uri, "--table", T, "--partition", "day=d1", "--op", "upsert", str(path)],
                       str(path), "duplicate column names ['k']")
    assert_refused(lake, lambda: lake.append("NEW.T", (), "upsert", [dup]), "duplicate column names ['k']")


@pytest.mark.parametrize("kind", ["string_view", "binary_view", "run_end_encoded", "struct<string_view>"])
def test_column_types_arrow_cannot_take_rows_of_are_refused_at_append(lake: Catalog, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str], kind: str) -> None:
    """Accepted before, such a column blocked its stream: every compaction and read failed with Arrow's "no kernel
    matching input types" (exit 1, no fix named). Refused at the door now, naming the column and the cast."""
    values = {
        "string_view": pa.array(["a", "b"], pa.string_view()),
        "binary_view": pa.array([b"a", b"b"], pa.binary_view()),
        "run_end_encoded": pa.RunEndEncodedArray.from_arrays([1, 2], pa.array(["x", "y"])),
        "struct<string_view>": pa.StructArray.from_arrays([pa.array(["a", "b"], pa.string_view())], ["x"]),
    }[kind]
    bad = pa.table({"k": pa.array([1, 2], pa.int64()), "v": values})
    path = tmp_path / "view.feather"
    feather.write_feather(bad, path)
    assert_cli_refused(lake, capsys, ["append", "--catalog", lake.uri, "--table", T, "--partition", "day=d1", "--op", "upsert", str(path)],
                       str(path), "'v'", "cannot select rows", "cast them")
    assert_refused(lake, lambda: lake.append("NEW.T", (), "upsert", [bad]), "'v'", "cannot select rows")
    # a plain column of the same values goes in and compacts
    lake.append("NEW.T", (), "upsert", [bad.set_column(1, "v", pa.array(["a", "b"]))])
    assert run_compact(lake, "NEW.T", ["k"], None).partitions[0].rows_out == 2


class _Point(pa.ExtensionType):
    """A Python extension type (not hashable, as pyarrow's base class defines __eq__ only)."""

    def __init__(self) -> None:
        super().__init__(pa.struct([("x", pa.int64()), ("y", pa.int64())]), "test.point")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> "_Point":
        return cls()


@pytest.mark.parametrize("kind", ["list<uuid>", "struct<json>", "python extension type"])
def test_columns_arrow_can_take_but_not_build_empty_are_accepted(lake: Catalog, kind: str) -> None:
    """The take probe of append must not refuse what works: nested canonical extension types (Arrow cannot
    build an empty array of them from Python) and an unhashable Python extension type (a cached probe raised
    TypeError) were refused or crashed append, where the code before the probe compacted them (found by the
    review of the probe)."""
    import uuid as _uuid

    if kind == "list<uuid>":
        values = pa.array([[_uuid.uuid4().bytes], []], pa.list_(pa.binary(16))).cast(pa.list_(pa.uuid()))
    elif kind == "struct<json>":
        values = pa.StructArray.from_arrays([pa.array(['{"a":1}', "[]"]).cast(pa.json_())], ["j"])
    else:
        storage = pa.StructArray.from_arrays([pa.array([1, 2]), pa.array([3, 4])], ["x", "y"])
        values = pa.ExtensionArray.from_storage(_Point(), storage)
    table = pa.table({"k": pa.array([1, 2], pa.int64()), "v": values})
    lake.append("EXT.T", (), "upsert", [table, table.slice(1)])  # one delta of two files: key 2 twice
    res = run_compact(lake, "EXT.T", ["k"], None)
    assert res.partitions[0].rows_out == 2


def test_internal_column_names_are_refused(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake.append(T, PART, "upsert", [rows([1], 0, "a")])
    bad = rows([2], 0, "b").append_column("__stream_position__", pa.array([7], pa.int64()))
    path = tmp_path / "internal.parquet"
    pq.write_table(bad, path)
    assert_cli_refused(lake, capsys, ["append", "--catalog", lake.uri, "--table", "NEW.T", "--op", "upsert", str(path)],
                       str(path), "__stream_position__", "reserved")
    assert_refused(lake, lambda: lake.append(T, PART, "delete", [keys_only([1]).append_column("__stream_position__", pa.array([1]))]), "__stream_position__")


def test_csv_delimiter(lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    semi = tmp_path / "semi.csv"
    semi.write_text("k;v;s\n1;10;x\n2;20;y\n")
    base = ["append", "--catalog", lake.uri, "--table", T, "--partition", "day=d1", "--op", "upsert"]
    # a new table whose CSV parses as the single column "k;v;s" is the bug: refused, naming the likely delimiter
    assert_cli_refused(lake, capsys, base + [str(semi)], str(semi), "--csv-delimiter ';'")
    assert not lake.table_exists(T)
    assert cli(capsys, *base, "--csv-delimiter", ";", str(semi))[:2] == (0, "1\n")
    (delta,) = lake.deltas(T, PART_T)
    got = lake.read_file(delta.files[0])
    assert got.to_pylist() == [{"k": 1, "v": 10, "s": "x"}, {"k": 2, "v": 20, "s": "y"}]
    assert delta.files[0].content_type is ContentType.PARQUET  # stored CSV is always comma-separated: kept as Parquet
    # the table has several columns: a tab-separated file read with commas is refused, and read with a tab accepted
    tabs = tmp_path / "tabs.csv"
    tabs.write_text("k\tv\ts\n3\t30\tz\n")
    assert_cli_refused(lake, capsys, base + [str(tabs)], "--csv-delimiter '\\t'")
    assert cli(capsys, *base, "--csv-delimiter", "\\t", str(tabs))[:2] == (0, "2\n")
    pipes = tmp_path / "pipes.csv"
    pipes.write_text("k|v|s\n4|40|w\n")
    assert_refused(lake, lambda: lake.append(T, PART, "upsert", [pipes]), "'|'", "csv_delimiter")
    assert lake.append(T, PART, "upsert", [pipes], csv_delimiter="|").position == 3
    # a genuinely one-column table keeps taking one-column CSV files, even with a ';' in its header
    one = tmp_path / "one.csv"
    one.write_text("a;b\nx\n")
    lake.append("ONE.T", (), "upsert", [pa.table({"a;b": ["w"]})])
    assert lake.append("ONE.T", (), "upsert", [one]).position == 2
    assert_cli_refused(lake, capsys, base + ["--csv-delimiter", "ab", str(pipes)], "--csv-delimiter")


def _race_first_appends(cat: Catalog, backend: str, table_id: str, schemas: list[pa.Table], evolution: bool) -> list[Any]:
    """Append each of ``schemas`` as the first upsert of ``table_id`` at once (a barrier), each from its own
    catalog object; the outcome of each (its Delta or the exception)."""
    barrier = threading.Barrier(len(schemas))
    outcomes: list[Any] = [None] * len(schemas)

    def racer(i: int) -> None:
        mine = Catalog(cat.storage) if backend == "local" else Catalog(cat.uri, endpoint_url=cat.storage.endpoint_url)
        barrier.wait()
        try:
            outcomes[i] = mine.append(table_id, PART, "upsert", [schemas[i]], schema_evolution=evolution)
        except Exception as exc:  # noqa: BLE001 - recorded and checked below
            outcomes[i] = exc

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(len(schemas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def _race_trials(cat: Catalog, backend: str, prefix: str, trials: int, evolution: bool) -> Any:
    """For each trial, a new table raced by :func:`_race_first_appends`: (table id, accepted indexes, refusals)."""
    for trial in range(trials):
        table_id = f"RACE.{prefix}{trial}"
        outcomes = _race_first_appends(cat, backend, table_id, RACING_SCHEMAS, evolution=evolution)
        yield (table_id, [i for i, o in enumerate(outcomes) if not isinstance(o, Exception)],
               [o for o in outcomes if isinstance(o, Exception)])


RACING_SCHEMAS = [
    pa.table({"k": [1, 2], "v": [1, 2]}),
    pa.table({"k": [1, 2], "v": ["a", "b"]}),
    pa.table({"k": [1, 2], "w": [1.5, 2.5]}),
]


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_concurrent_first_appends_decide_one_schema(request: pytest.FixtureRequest, backend: str, moto_endpoint: str) -> None:
    """Schema evolution off: 20 trials of 3 concurrent first appends with different schemas: exactly one wins,
    the others get a SchemaConflict, the stream holds only the winner's columns, and compacting it succeeds.
    (The moto fixture also sets the AWS environment before Ray's workers start, which S3 compaction needs.)"""
    cat: Catalog = request.getfixturevalue("lake" if backend == "local" else "s3_lake")
    inconsistent = []
    tables = []
    for table_id, winners, losers in _race_trials(cat, backend, "T", 20, evolution=False):
        deltas = cat.deltas(table_id, PART_T)
        ok = (
            len(winners) == 1
            and all(isinstance(o, SchemaConflict) and o.exit_code == 2 for o in losers)
            and [d.pa_schema() for d in deltas] == [RACING_SCHEMAS[winners[0]].schema]
            and cat.stream_schema(table_id, PART_T, 1) == RACING_SCHEMAS[winners[0]].schema
        )
        if not ok:
            inconsistent.append((table_id, winners, losers, [d.schema for d in deltas]))
        tables.append(table_id)
    assert inconsistent == []
    # every stream merges (merge-on-read validates like compaction, without Ray); one is compacted for real
    for table_id in tables:
        assert merge_on_read(cat, table_id, primary_keys=["k"]).num_rows == 2
    run_compact(cat, tables[0], ["k"], None, hash_bucket_count=1)
    assert read_compacted(cat, tables[0], PART).num_rows == 2


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_concurrent_first_appends_evolve_one_schema(request: pytest.FixtureRequest, backend: str, moto_endpoint: str) -> None:
    """Schema evolution on: 10 trials (5 on S3, where each costs more) of the same 3 racing first appends. The two whose ``v`` types conflict
    (int64, string): exactly one is accepted, the other gets a SchemaConflict naming ``v``; the one adding ``w``
    is always accepted (it evolves whichever schema won). The stream's newest schema entry holds every accepted
    column, and reading the stream gives each accepted row with the others' columns null."""
    cat: Catalog = request.getfixturevalue("lake" if backend == "local" else "s3_lake")
    from flash_pipeline.catalog.schema_history import latest_entry

    inconsistent = []
    for table_id, accepted, refused in _race_trials(cat, backend, "E", 10 if backend == "local" else 5, evolution=True):
        v_type = pa.int64() if 0 in accepted else pa.string()
        entry = latest_entry(cat, cat.active_stream(table_id, PART_T))
        merged = merge_on_read(cat, table_id, primary_keys=["k"])
        ok = (
            2 in accepted and len([i for i in accepted if i < 2]) == 1
            and len(refused) == 1 and isinstance(refused[0], SchemaConflict) and "'v'" in str(refused[0])
            and entry is not None and {f.name: f.type for f in entry[1]} == {"k": pa.int64(), "v": v_type, "w": pa.float64()}
            and merged.num_rows == 2 and merged.schema.field("v").type == v_type
        )
        if not ok:
            inconsistent.append((table_id, accepted, refused, entry))
    assert inconsistent == []


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_appends_racing_a_rename_land_on_one_side_of_it(request: pytest.FixtureRequest, backend: str, moto_endpoint: str) -> None:
    """``evolve --rename v=w`` raced by two appends that still say ``v`` (one of them also adding ``x``), 8 trials
    (4 on S3). Every call succeeds; each append lands on one side of the rename: recorded under an entry before
    it, its ``v`` is the renamed column ``w``; checked after it, its ``v`` is a new column. Nothing is lost:
    merge-on-read and then the compacted version give every row's value in the column that side names."""
    from flash_pipeline.catalog.schema_edits import rename_and_drop

    cat: Catalog = request.getfixturevalue("lake" if backend == "local" else "s3_lake")
    inconsistent = []
    for trial in range(8 if backend == "local" else 4):
        table_id = f"RACE.R{trial}"
        cat.append(table_id, PART, "upsert", [pa.table({"k": [0], "v": [0]})])
        barrier = threading.Barrier(3)
        outcomes: list[Any] = [None] * 3
        batches = [pa.table({"k": [1], "v": [1]}), pa.table({"k": [2], "v": [2], "x": [2.5]})]

        def racer(i: int) -> None:
            mine = Catalog(cat.storage) if backend == "local" else Catalog(cat.uri, endpoint_url=cat.storage.endpoint_url)
            barrier.wait()
            try:
                outcomes[i] = (rename_and_drop(mine, table_id, {"v": "w"}) if i == 2
                               else mine.append(table_id, PART, "upsert", [batches[i]]))
            except Exception as exc:  # noqa: BLE001 - recorded and checked below
                outcomes[i] = exc

        threads = [threading.Thread(target=racer, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if any(isinstance(o, Exception) for o in outcomes):
            inconsistent.append((table_id, outcomes))
            continue
        renamed_at = outcomes[2][0].entry
        expected = {0: {"w": 0, "v": None, "x": None}}
        for i, delta in enumerate(outcomes[:2]):
            value = {"k": i + 1, **batches[i].to_pylist()[0]}.get("v")
            side = "w" if delta.schema_entry < renamed_at else "v"
            expected[i + 1] = {"w": value if side == "w" else None, "v": value if side == "v" else None, "x": 2.5 if i == 1 else None}
        want = sorted((k, r["w"], r["v"], r["x"]) for k, r in expected.items())
        merged = merge_on_read(cat, table_id, primary_keys=["k"])
        got = sorted((r["k"], r.get("w"), r.get("v"), r.get("x")) for r in merged.to_pylist())
        run_compact(cat, table_id, ["k"], None, hash_bucket_count=1, executor="in-process")
        compacted = read_compacted(cat, table_id, PART)
        got_compacted = sorted((r["k"], r.get("w"), r.get("v"), r.get("x")) for r in compacted.to_pylist())
        if got != want or got_compacted != want:
            inconsistent.append((table_id, [d.schema_entry for d in outcomes[:2]], renamed_at, got, got_compacted, want))
    assert inconsistent == []


# ----- item 5: recovery without editing files -----------------------------------------------------------------
def _poison_upsert(cat: Catalog, monkeypatch: pytest.MonkeyPatch, table: pa.Table) -> int:
    """Commit an upsert whose columns differ from the stream's, the way a writer racing the first append could
    before schemas were claimed atomically (the checks that now refuse it are switched off for this one call)."""
    with monkeypatch.context() as m:
        m.setattr(Catalog, "_check_schemas", lambda *a, **k: None)
        m.setattr(Catalog, "_claim_stream_schema", lambda *a, **k: None)
        return cat.append(T, PART, "upsert", [table]).position


def _oracle_rows(log: DeltaLog, schema: pa.Schema) -> list[tuple[Any, ...]]:
    return rows_of(oracle(log.log_table(), PKS, SKS, schema.names), schema.names)


def test_skip_delta_unblocks_a_poisoned_stream_and_new_stream_takes_a_new_schema(
    lake: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cat = lake
    log = DeltaLog(cat, T, PART, SCHEMA)  # the oracle's log holds only the deltas that are not skipped
    log.append("upsert", [rows([1, 2, 3, 4], 0, "a"), rows([5, 6], 0, "a")])
    bad_delete = cat.append(T, PART, "delete", [pa.table({"s": ["a1"]})]).position  # keys not known yet: accepted
    log.append("upsert", [rows([2, 7], 5, "b")])
    bad_upsert = _poison_upsert(cat, monkeypatch, pa.table({"k": [1], "v": ["text"], "s": ["c"]}))
    log.append("delete", [keys_only([3])])
    log.append("upsert", [rows([4, 8], 9, "d")])
    assert (bad_delete, bad_upsert) == (2, 4)
    place = ["--catalog", cat.uri, "--table", T, "--partition", "day=d1"]
    compact = lambda: run_compact(cat, T, PKS, SKS, hash_bucket_count=2)  # noqa: E731

    # blocked, with the command to run in the one line
    msg = assert_refused(cat, compact, "position 2", "['k']", "flash-compactor skip-delta", "--position 2", "--table ACME.POISON.V1",
                         "--partition day=d1")
    # never compacted: no compacted rows to start a new stream version from, so new-stream (which refuses) is not offered
    assert "--catalog" in msg and "new-stream" not in msg
    assert cli(capsys, "skip-delta", *place, "--position", "2") == (0, f"{T} [day=d1] position 2: skipped (undo with --undo until a compaction covers it)\n", "")
    assert_refused(cat, compact, "position 4", "'v'", "skip-delta", "--position 4")
    assert cat.skip_delta(T, PART, 4) is True
    assert cat.skip_delta(T, PART, 4) is False  # already skipped: nothing changes
    # --undo before compaction restores the block; skipping again lifts it
    assert cli(capsys, "skip-delta", *place, "--position", "4", "--undo")[0] == 0
    assert_refused(cat, compact, "position 4")
    assert cli(capsys, "skip-delta", *place, "--position", "4")[0] == 0

    # show (text and JSON) reports the skipped deltas
    shown = json.loads(cli(capsys, "show", "--catalog", cat.uri, "--table", T, "--json")[1])
    (stream,) = shown["tables"][0]["partitions"][0]["streams"]
    assert [(d["position"], d["skipped"]) for d in stream["deltas"]] == [(1, False), (2, True), (3, False), (4, True), (5, False), (6, False)]
    text = cli(capsys, "show", "--catalog", cat.uri, "--table", T)[1]
    assert [line.strip().split(":")[0] for line in text.splitlines() if "(skipped)" in line] == ["position 2 delete", "position 4 upsert"]

    # merge-on-read and the triggers ignore the skipped deltas too
    expected = _oracle_rows(log, SCHEMA)
    assert rows_of(merge_on_read(cat, T, primary_keys=PKS, sort_keys=SKS), SCHEMA.names) == expected
    assert pending_stats(cat, T, PART_T, time.time()).pending_deltas == 4

    compact()
    capsys.readouterr()  # Ray's start-up log lines
    assert rows_of(read_compacted(cat, T, PART), SCHEMA.names) == expected
    # undo (or a new skip) after a compaction covered the position is refused in one line
    assert_cli_refused(cat, capsys, ["skip-delta", *place, "--position", "2", "--undo"], "position 2", "compacted version 1")
    assert_cli_refused(cat, capsys, ["skip-delta", *place, "--position", "5"], "position 5", "compacted version 1")
    assert_cli_refused(cat, capsys, ["skip-delta", *place, "--position", "9"], "no delta at position 9")

    # new-stream with a new schema: v widened to float64, a new column; then append and compact in the new schema
    new_schema = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string()), ("note", pa.string())])
    sample = tmp_path / "new.parquet"
    pq.write_table(pa.table({"k": [2, 9], "v": [100.5, 3.0], "s": ["e2", "e9"], "note": ["n2", None]}, schema=new_schema), sample)
    assert_refused(cat, lambda: cat.append(T, PART, "upsert", [sample]), "start a new stream version")
    code, out, err = cli(capsys, "new-stream", *place, "--schema-from", str(sample))
    assert (code, err) == (0, ""), err
    assert "stream v2 active, v1 deprecated" in out and "--primary-key k --sort-key v:ascending" in out
    assert [(s.version, s.state) for s in cat.streams(T, PART_T)] == [(1, "deprecated"), (2, "active")]
    log2 = DeltaLog(cat, T, PART, new_schema)
    carried = oracle(log.log_table(), PKS, SKS, SCHEMA.names)  # what stream v1 compacted to, by the oracle
    for i, rec in enumerate(carried.to_pylist()):
        log2.records.append({**rec, "v": float(rec["v"]), "note": None, POS: 1, FILE: 1, ROW: i, OP: "upsert"})
    log2.append("upsert", [pq.read_table(sample)])
    log2.append("delete", [keys_only([5])])
    log2.append("upsert", [pa.table({"k": [6, 1], "v": [0.5, 50.0], "s": ["f6", "f1"], "note": ["x", "y"]}, schema=new_schema)])
    assert log2.positions == [2, 3, 4]
    run_compact(cat, T, PKS, SKS, hash_bucket_count=2)
    got = read_compacted(cat, T, PART)
    assert got is not None and got.schema.field("v").type == pa.float64()
    assert rows_of(got, new_schema.names) == rows_of(oracle(log2.log_table(), PKS, SKS, new_schema.names), new_schema.names)


def test_new_stream_copies_the_compacted_bytes_and_refuses_a_partition_never_compacted(
    any_lake: Catalog, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cat = any_lake
    endpoint = getattr(cat.storage, "endpoint_url", None)
    if endpoint:
        monkeypatch.setenv("FLASH_S3_ENDPOINT_URL", endpoint)
    cat.append(T, PART, "upsert", [rows([1, 2, 3], 0, "a")])
    place = ["--catalog", cat.uri, "--table", T, "--partition", "day=d1"]
    assert_cli_refused(cat, capsys, ["new-stream", *place], "no compacted version", "compact it first")
    # compacted into a destination whose file holds user columns only: the new stream gets the very bytes
    dest = "ACME.POISON_COMPACTED.V1"
    user = rows([1, 2, 3], 0, "a")
    key = f"{cat.compacted_prefix(dest, PART_T)}/data/{uuid.uuid4().hex}/000001.parquet"
    size = cat.storage.write_arrow(key, lambda sink: pq.write_table(user, sink))
    cv = CompactedVersion(dest, PART_T, 1, T, 1, 1, ("k",), (), ContentType.PARQUET, (DataFile(1, key, 3, size, ContentType.PARQUET),),
                          None, tuple(schema_to_json(user.schema)), uuid.uuid4().hex, time.time(), arrow_schema=schema_to_b64(user.schema))
    assert cat.commit_compacted(cv)
    cat.append(T, PART, "upsert", [rows([9], 0, "p")])  # pending after the compacted version: reported, not carried
    code, out, err = cli(capsys, "new-stream", *place)
    assert (code, err) == (0, ""), err
    assert "not carried: deltas [2]" in out and "--destination ACME.POISON_COMPACTED.V1" in out
    (delta,) = cat.deltas(T, PART_T)
    assert (delta.stream_version, delta.position, delta.operation) == (2, 1, "upsert")
    assert [cat.storage.read(f.key) for f in delta.files] == [cat.storage.read(key)]
    assert delta.files[0].key != key and "/streams/0000000002/" in delta.files[0].key
    assert_cli_refused(cat, capsys, ["new-stream", *place], "no compacted version of its active stream v2")
    # a version whose file still holds the internal column is rewritten without it
    cat.append("OLD.T", PART, "upsert", [rows([4, 5], 1, "o")])
    fake_compaction(cat, "OLD.T", "OLD.T", PART_T, rows([4, 5], 1, "o"), 1, ("k",))
    done = cat.new_stream_from_compacted("OLD.T", PART)
    assert done.rewritten and done.delta is not None
    assert cat.read_file(done.delta.files[0]).to_pylist() == rows([4, 5], 1, "o").to_pylist()


def _damage(cat: Catalog, key: str, how: str) -> None:
    """Corrupt a committed delta's file behind the catalog's back, as a bad copy or a stray writer would."""
    path = Path(cat.uri) / key
    if how == "zeroed":
        path.write_bytes(b"\0" * path.stat().st_size)
    elif how == "other schema":
        pq.write_table(pa.table({"k": ["x", "y"], "zz": [1.5, 2.5]}), path)
    elif how == "no key column":  # the same row count: Arrow reads it, and a step would miss the column
        pq.write_table(pa.table({"zz": [1.5, 2.5]}), path)
    elif how == "more rows":  # the delta's own schema, a row more than its manifest records (read took it)
        pq.write_table(pa.concat_tables([pq.read_table(path)] * 2), path)
    else:
        path.unlink()


@pytest.mark.parametrize(("how", "executor"), [("zeroed", "in-process"), ("other schema", "in-process"), ("missing", "in-process"),
                                               ("no key column", "in-process"), ("more rows", "in-process"), ("zeroed", "ray")])
def test_a_damaged_delta_file_blocks_with_the_fix_named_and_skip_delta_unblocks(lake: Catalog, how: str, executor: str) -> None:
    """A committed delta whose file cannot be read as its manifest says (zeroed, replaced by another schema,
    deleted) stops compaction and merge-on-read in one line naming the delta, the file and the commands that
    unblock it (it was Arrow's bare message, exit 1); nothing is added or changed; skipping the delta then
    compacts what the oracle gives without it. Several rounds (a tiny budget), in process and on Ray."""
    cat = lake
    log = DeltaLog(cat, T, PART, SCHEMA)
    log.append("upsert", [rows([1, 2, 3, 4], 0, "a")])
    log.append("upsert", [rows([2, 5], 5, "b")])
    bad = cat.append(T, PART, "upsert", [rows([1, 6], 9, "c")])
    log.append("delete", [keys_only([3])])
    _damage(cat, bad.files[0].key, how)
    compact = lambda: run_compact(cat, T, PKS, SKS, hash_bucket_count=2, max_round_bytes=1, executor=executor)  # noqa: E731
    fragments = (f"delta at position {bad.position} cannot be read", bad.files[0].key, "flash-compactor skip-delta",
                 f"--position {bad.position}")
    # never compacted: new-stream (which would refuse) is not offered
    assert "new-stream" not in assert_refused(cat, compact, *fragments)
    assert "new-stream" not in assert_refused(cat, lambda: merge_on_read(cat, T, primary_keys=PKS, sort_keys=SKS), *fragments)
    assert cat.skip_delta(T, PART, bad.position)
    expected = _oracle_rows(log, SCHEMA)
    assert rows_of(merge_on_read(cat, T, primary_keys=PKS, sort_keys=SKS), SCHEMA.names) == expected
    result = compact()
    assert result.partitions[0].rounds >= 2
    assert rows_of(read_compacted(cat, T, PART), SCHEMA.names) == expected


@pytest.mark.parametrize("rebuild", [False, True])
def test_a_missing_delta_file_whose_footer_the_round_plan_reads_blocks_with_the_fix_named(lake: Catalog,
                                                                                       rebuild: bool) -> None:
    """A delta file larger than a round's unit (small compacted files) has its footer read while the round is
    planned: a missing one there was a bare "... not found in lake" (found with ``--rebuild``), not the line naming
    the delta and the commands that unblock it; nothing is written."""
    cat = lake
    cat.append(T, PART, "upsert", [rows([1, 2, 3, 4], 0, "a")])
    bad = cat.append(T, PART, "upsert", [rows([2, 5, 6], 5, "b")])
    compact = lambda: run_compact(cat, T, PKS, SKS, rows_per_compacted_file=1, rebuild=rebuild)  # noqa: E731
    if rebuild:
        compact()  # compacted once; the rebuild reads every delta again
    _damage(cat, bad.files[0].key, "missing")
    assert_refused(cat, compact, f"delta at position {bad.position} cannot be read", bad.files[0].key,
                   "flash-compactor skip-delta", f"--position {bad.position}")


@pytest.mark.parametrize("how", ["zeroed", "missing"])
def test_a_damaged_compacted_file_is_damage_for_read_export_and_optimize_too(lake: Catalog, capsys: pytest.CaptureFixture[str],
                                                                            tmp_path: Path, how: str) -> None:
    """A file of the latest compacted version that cannot be read is damage (exit 4, verify named), for every
    reader of it as for compaction (docs/guarantees.md). ``read`` said "unexpected ArrowInvalid" (exit 1) or
    "not found" (exit 2), ``export``, ``optimize`` and ``new-stream`` likewise; nothing is written."""
    cat = lake
    cat.append(T, PART, "upsert", [rows([1, 2, 3], 0, "a")])
    run_compact(cat, T, PKS, SKS, rows_per_compacted_file=1)  # three small files: optimize packs (reads) them
    cat.append(T, PART, "upsert", [rows([2], 1, "b")])
    damaged = cat.latest_compacted(T, cat.partitions(T)[0]).files[0].key
    _damage(cat, damaged, how)
    before = snapshot(cat)
    place = ["--catalog", cat.uri, "--table", T]
    # (compaction's own refusal is test_a_damaged_delta_file_...'s and tests/test_verify.py's: a file it carries by
    # reference is checked for its size, not read)
    for argv in (["read", *place], ["export", *place, "--out", str(tmp_path / "out")], ["optimize", *place],
                 ["new-stream", *place, "--partition", "day=d1"]):
        code, _, err = cli(capsys, *argv)
        line = err.strip().splitlines()[-1]
        assert code == 4, (argv[0], err)
        assert damaged in line and "flash-compactor verify" in line and "--rebuild" in line, (argv[0], line)
        assert snapshot(cat) == before, argv[0]
    assert not (tmp_path / "out").exists()


def test_a_blocked_stream_offers_new_stream_only_when_it_can_restart(lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    """The line of a blocked stream names the commands that unblock it: new-stream only once a compacted version
    of the stream exists (it refused before, "compact it first", where the line had suggested it); then the
    command it gives runs."""
    cat = lake
    cat.append(T, PART, "upsert", [rows([1, 2], 0, "a")])
    bad = cat.append(T, PART, "upsert", [rows([3], 1, "b")])
    _damage(cat, bad.files[0].key, "zeroed")
    compact = lambda: run_compact(cat, T, PKS, SKS)  # noqa: E731
    assert "new-stream" not in assert_refused(cat, compact, "flash-compactor skip-delta")
    assert cat.skip_delta(T, PART, bad.position)
    compact()
    worse = cat.append(T, PART, "upsert", [rows([4], 2, "c")])
    _damage(cat, worse.files[0].key, "zeroed")
    message = assert_refused(cat, compact, "flash-compactor skip-delta", "or start a new stream version: flash-compactor new-stream")
    command = shlex.split(message[message.index("flash-compactor new-stream") + len("flash-compactor "):])
    assert main(command) == 0, capsys.readouterr().err
    compact()
    assert sorted(r["k"] for r in read_compacted(cat, T, PART).to_pylist()) == [1, 2]


@pytest.mark.parametrize("fmt", ["parquet", "orc", "feather"])
def test_new_stream_keeps_the_recorded_types_whatever_the_format_stores(lake: Catalog, fmt: str) -> None:
    """Parquet stores timestamp[s] as ms, date64 as date32 and gives dictionaries back decoded; ORC loses time
    zones, unsigned and durations. new-stream copied such files' bytes and the new stream recorded the stored
    types, so an append of the table's own schema was refused and reads changed types. Now a file whose stored
    types differ is rewritten (as Parquet, or Feather where Parquet would change a type too)."""
    cat = lake
    schema = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("us", tz="Europe/Paris")), ("d", pa.dictionary(pa.int8(), pa.string())),
                        ("s", pa.timestamp("s")), ("d64", pa.date64()), ("u", pa.uint64()), ("du", pa.duration("ms"))])

    def batch(k: int) -> pa.Table:
        return pa.table([pa.array([k]), pa.array([k * 1_000_000]).cast(schema.field("ts").type),
                         pa.array(["x"]).dictionary_encode().cast(schema.field("d").type), pa.array([k]).cast(pa.timestamp("s")),
                         pa.array([86_400_000 * k]).cast(pa.date64()), pa.array([(1 << 64) - k], pa.uint64()),
                         pa.array([k]).cast(pa.duration("ms"))], schema=schema)

    cat.append(T, PART, "upsert", [batch(1)])
    run_compact(cat, T, PKS, None, compacted_file_content_type=fmt, executor="in-process")
    done = cat.new_stream_from_compacted(T, PART)
    assert done.delta is not None and done.delta.pa_schema() == schema
    cat.append(T, PART, "upsert", [batch(2)])  # the table's own schema: taken
    got = merge_on_read(cat, T)
    assert got.schema == schema
    assert sorted(got.to_pylist(), key=lambda r: r["k"]) == pa.concat_tables([batch(1), batch(2)]).to_pylist()


@pytest.mark.parametrize("how", ["packed by optimize", "rebuild"])
def test_new_stream_is_offered_whenever_a_compacted_version_of_the_stream_exists(lake: Catalog, how: str) -> None:
    """The review of this session's hint: a stream only packed by optimize, or compacted with --rebuild, can
    restart with new-stream, which the line of a blocked delta left out."""
    from flash_pipeline.optimize import optimize

    cat = lake
    cat.append(T, PART, "upsert", [rows([1, 2], 0, "a")])
    cat.append(T, PART, "upsert", [rows([3], 1, "b")])
    if how == "packed by optimize":
        optimize(cat, T, progress=lambda m: None)
    else:
        run_compact(cat, T, PKS, SKS)
    bad = cat.append(T, PART, "upsert", [rows([4], 2, "c")])
    _damage(cat, bad.files[0].key, "zeroed")
    compact = lambda: run_compact(cat, T, PKS, SKS, rebuild=how == "rebuild")  # noqa: E731
    assert_refused(cat, compact, "flash-compactor skip-delta", "or start a new stream version: flash-compactor new-stream")
