"""Small-file packing (Delta OPTIMIZE): bin plans, rows kept, fewer files, idempotence, dataChange=false,
remapped primary key index, concurrent appends and a concurrent compaction."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_helpers import oracle, rows_of, run_compact
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import normalize_partition
from flash_pipeline.cli import main
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.kernels.digest import primary_key_digests, sort_key_bytes
from flash_pipeline.errors import CommitConflict, FlashError
from flash_pipeline.merge_on_read import read
from flash_pipeline.index_remap import dead_row_keys, rows_after_purge
from flash_pipeline.optimize import optimize, plan_bins

PART = {"region": "eu"}
P = normalize_partition(PART)
BIG = 1 << 40


def quiet(_m: str) -> None:
    pass


# ----- the index remap of purged files --------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 60), st.booleans()), max_size=200), st.sampled_from([0, 1 << 31, (1 << 32) - 80]))
def test_a_purged_files_live_rows_move_up_by_the_dead_rows_before_them(cells: list[tuple[int, int, bool]], base: int) -> None:
    """rows_after_purge against a plain model: a live row's new index is the number of live rows before it in
    its file. Rows near the uint32 limit check that file and row stay apart in the packed keys."""
    state: dict[tuple[int, int], bool] = {}
    for file, row, is_dead in cells:
        state[(file, base + row)] = is_dead
    dead = {f: np.array(sorted(r for (g, r), d in state.items() if g == f and d), dtype=np.int64)
            for f in {f for (f, _), d in state.items() if d}}
    live = sorted(k for k, d in state.items() if not d)
    file = np.array([f for f, _ in live], dtype=np.int64)
    row = np.array([r for _, r in live], dtype=np.int64)
    expected = [r - sum(1 for (g, q), d in state.items() if g == f and d and q < r) for f, r in live]
    assert rows_after_purge(file, row, dead_row_keys(dead)).tolist() == expected


# ----- bin plans on hand-made size lists -----------------------------------------------------------------------
def test_plan_one_file_is_left_alone() -> None:
    plan = plan_bins([5], min_file_size=10, max_file_size=100)
    assert plan.bins == () and plan.considered == 1 and plan.candidates == 1 and plan.skipped == 1


def test_plan_all_large_files_are_skipped() -> None:
    plan = plan_bins([10, 20, 30], min_file_size=10, max_file_size=100)  # == minimum is not small
    assert plan.bins == () and plan.candidates == 0 and plan.skipped == 3


def test_plan_exact_boundary_fits_one_over_starts_a_new_bin() -> None:
    assert plan_bins([3, 3, 4], 100, 10).bins == ((0, 1, 2),)  # 10 == max: one bin
    plan = plan_bins([3, 3, 5], 100, 10)  # 11 > max: (3, 3) and a single 5 left alone
    assert plan.bins == ((0, 1),) and plan.removed == 2 and plan.skipped == 1


def test_plan_sorts_by_size_and_packs_greedily() -> None:
    # sorted: 1 (i1), 2 (i3), 4 (i2), 5 (i0), 6 (i4); max 6 -> [1, 2] | [4] | [5] | [6]: one bin of two
    assert plan_bins([5, 1, 4, 2, 6, 50], 20, 6).bins == ((1, 3),)
    # max 7 -> [1, 2, 4] | [5] | [6]
    assert plan_bins([5, 1, 4, 2, 6, 50], 20, 7).bins == ((1, 3, 2),)
    # equal sizes keep their order; 4 bins of 2
    assert plan_bins([1] * 8, 2, 2).bins == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert plan_bins([], 2, 2).bins == ()


def test_plan_second_pass_over_the_outputs_finds_nothing() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        sizes = [int(s) for s in rng.integers(1, 60, rng.integers(0, 30))]
        mn, mx = int(rng.integers(1, 80)), int(rng.integers(1, 120))
        plan = plan_bins(sizes, mn, mx)
        packed = {i for b in plan.bins for i in b}
        after = [s for i, s in enumerate(sizes) if i not in packed] + [sum(sizes[i] for i in b) for b in plan.bins]
        assert plan_bins(after, mn, mx).bins == ()
        assert all(sum(sizes[i] for i in b) <= mx for b in plan.bins)


@pytest.mark.parametrize("bad", [0, -1, 1.5, None])
def test_plan_refuses_bad_sizes(bad: Any) -> None:
    with pytest.raises(FlashError):
        plan_bins([1, 2], bad, 10)


# ----- tables without primary keys -----------------------------------------------------------------------------
def _append_small(cat: Catalog, table: str, deltas: int, files: int = 2, start: int = 0) -> list[int]:
    values = []
    for d in range(deltas):
        tables = []
        for f in range(files):
            v = list(range(start + 100 * (d * files + f), start + 100 * (d * files + f) + 5))
            values += v
            tables.append(pa.table({"v": pa.array(v, pa.int64()), "s": pa.array([str(x) for x in v])}))
        cat.append(table, PART, "upsert", tables)
    return values


def test_optimize_packs_an_unkeyed_stream_and_keeps_every_row(lake: Catalog) -> None:
    values = _append_small(lake, "T.PLAIN", deltas=5)
    before = sorted(read(lake, "T.PLAIN").column("v").to_pylist())
    assert before == sorted(values)
    listing = set(lake.listing())
    sizes = sorted(f.bytes for d in lake.deltas("T.PLAIN", P) for f in d.files)
    assert sizes[0] * 4 > sizes[-1] * 3  # near-equal sizes: exactly three files fit in 3 x the largest
    res = optimize(lake, "T.PLAIN", min_file_size=BIG, max_file_size=3 * sizes[-1], progress=quiet)
    out = res.to_json()
    assert out["partitions_optimized"] == 1 and out["num_bins"] == 3
    assert out["total_considered_files"] == 10 and out["num_files_removed"] == 9 and out["total_files_skipped"] == 1
    assert out["num_files_added"] == 3 and out["files_removed"]["total_size"] == sum(sizes) - sizes[-1]
    assert out["files_added"]["min"] <= out["files_added"]["avg"] <= out["files_added"]["max"]
    cv = lake.latest_compacted("T.PLAIN", P)
    assert cv is not None and cv.version == 1 and cv.data_change is True and cv.last_position == 5  # new rows
    assert cv.primary_keys == () and cv.index is None and len(cv.files) == 4 and cv.rows == len(values)
    assert sorted(read(lake, "T.PLAIN").column("v").to_pylist()) == before
    # nothing but the version manifest, its packed files and the version's change record was written; deltas untouched
    new = set(lake.listing()) - listing
    assert all("/compacted/" in k for k in new if "/changes/" not in k) and listing <= set(lake.listing())
    assert [r.kind for r in lake.changes.read("T.PLAIN", 5)] == ["compacted"]  # after the 5 deltas' records
    # second run: nothing to do, nothing written
    snapshot = lake.listing()
    res2 = optimize(lake, "T.PLAIN", min_file_size=BIG, max_file_size=3 * sizes[-1], progress=quiet)
    assert res2.partitions_optimized == 0 and res2.num_bins == 0 and lake.listing() == snapshot
    assert res2.total_files_skipped == res2.total_considered_files == 4


def test_optimize_absorbs_later_appends_and_leaves_large_files(lake: Catalog) -> None:
    values = _append_small(lake, "T.MORE", deltas=3, files=1)
    optimize(lake, "T.MORE", min_file_size=BIG, max_file_size=BIG, progress=quiet)
    values += _append_small(lake, "T.MORE", deltas=2, files=1, start=10_000)
    cv1 = lake.latest_compacted("T.MORE", P)
    assert cv1 is not None and cv1.last_position == 3
    small = max(f.bytes for f in cv1.files)  # the packed file counts as large now
    res = optimize(lake, "T.MORE", min_file_size=small, max_file_size=BIG, progress=quiet)
    cv2 = lake.latest_compacted("T.MORE", P)
    assert res.num_bins == 1 and res.total_files_skipped == 1 and res.num_files_removed == 2
    assert cv2.version == 2 and cv2.last_position == 5 and cv2.data_change is True and len(cv2.files) == 2
    assert cv1.files[0].key in {f.key for f in cv2.files}  # carried by reference
    assert sorted(read(lake, "T.MORE").column("v").to_pylist()) == sorted(values)


def _delta_commit(cat: Catalog, table: str, version: int) -> tuple[str, set[bool], int]:
    """Delta ``version`` as read outside this project: its operation and row count by deltalake, the dataChange
    flags of its add actions from the log file (the protocol's JSON; deltalake does not expose them)."""
    import json

    import deltalake

    location = cat.deltalake_location(table, P)
    [entry] = [h for h in deltalake.DeltaTable(location).history() if h["version"] == version]
    log = Path(location, "_delta_log", f"{version:020d}.json").read_text().splitlines()
    flags = {a["add"]["dataChange"] for a in map(json.loads, log) if "add" in a}
    return entry["operation"], flags, deltalake.DeltaTable(location, version=version).to_pyarrow_table().num_rows


def test_an_unkeyed_optimize_that_absorbs_deltas_is_a_data_change_and_a_pure_repack_is_not(lake: Catalog) -> None:
    """Delta's dataChange=false promises the added rows were already in the table (streaming readers skip such
    commits). An unkeyed optimize that absorbs pending deltas adds new rows, so its version and Delta commit are
    data changes (operation WRITE); repacking the packed files alone stays dataChange=false (OPTIMIZE)."""
    rows = len(_append_small(lake, "T.DC", deltas=4, files=1))
    largest = max(f.bytes for d in lake.deltas("T.DC", P) for f in d.files)
    res = optimize(lake, "T.DC", min_file_size=BIG, max_file_size=2 * largest, progress=quiet)  # two bins of two
    assert len(lake.latest_compacted("T.DC", P).files) == 2 and "data_change=true" in res.partitions[0].describe()
    optimize(lake, "T.DC", min_file_size=BIG, max_file_size=BIG, progress=quiet)  # the two packed files, no delta
    repacked = lake.compacted_version("T.DC", P, 2)
    assert len(repacked.files) == 1 and repacked.last_position == 4
    rows_after = rows + len(_append_small(lake, "T.DC", deltas=2, files=1, start=10_000))
    optimize(lake, "T.DC", min_file_size=BIG, max_file_size=BIG, progress=quiet)
    expected = {1: (True, "WRITE", rows), 2: (False, "OPTIMIZE", rows), 3: (True, "WRITE", rows_after)}
    for version, (change, operation, count) in expected.items():
        assert lake.compacted_version("T.DC", P, version).data_change is change
        assert _delta_commit(lake, "T.DC", version) == (operation, {change}, count)


def test_optimize_stops_before_a_delete_delta(lake: Catalog) -> None:
    values = _append_small(lake, "T.DEL", deltas=2)
    lake.append("T.DEL", PART, "delete", [pa.table({"v": pa.array([0], pa.int64())})])
    res = optimize(lake, "T.DEL", min_file_size=BIG, max_file_size=BIG, progress=quiet)
    assert res.partitions[0].status == "optimized" and "delete delta at position 3" in res.partitions[0].notes[0]
    assert lake.latest_compacted("T.DEL", P).last_position == 2
    with pytest.raises(FlashError, match="no primary keys"):
        read(lake, "T.DEL")
    got = read(lake, "T.DEL", primary_keys=["v"])  # keys given: the whole stream is merged
    assert sorted(got.column("v").to_pylist()) == sorted(set(values) - {0})


def test_concurrent_appends_during_optimize_are_never_lost(lake: Catalog) -> None:
    _append_small(lake, "T.RACE", deltas=2, files=1)
    appended: list[int] = [v for d in lake.deltas("T.RACE", P) for f in d.files for v in lake.read_file(f).column("v").to_pylist()]
    done = threading.Event()
    errors: list[BaseException] = []

    def appender() -> None:
        try:
            for i in range(25):
                v = [50_000 + 10 * i + j for j in range(3)]
                lake.append("T.RACE", PART, "upsert", [pa.table({"v": pa.array(v, pa.int64()), "s": [str(x) for x in v]})])
                appended.extend(v)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=appender)
    thread.start()
    runs = 0
    while not done.is_set() or runs < 2:
        optimize(lake, "T.RACE", min_file_size=BIG, max_file_size=BIG, progress=quiet)
        runs += 1
        known = list(appended)  # committed before this read started
        got = read(lake, "T.RACE").column("v").to_pylist()
        assert len(got) == len(set(got)) and set(known) <= set(got)  # nothing lost, nothing doubled
    thread.join()
    assert not errors
    optimize(lake, "T.RACE", min_file_size=BIG, max_file_size=BIG, progress=quiet)
    assert sorted(read(lake, "T.RACE").column("v").to_pylist()) == sorted(appended)
    assert len(lake.deltas("T.RACE", P)) == 27  # deltas are never rewritten away
    cv = lake.latest_compacted("T.RACE", P)
    assert cv.last_position == 27 and len(cv.files) == 1 and cv.rows == len(appended)


def test_append_between_planning_and_commit_stays_pending(lake: Catalog) -> None:
    values = _append_small(lake, "T.HOOK", deltas=3)

    def append_now(_part: Any) -> None:
        values.extend(_append_small(lake, "T.HOOK", deltas=1, start=90_000))

    optimize(lake, "T.HOOK", min_file_size=BIG, max_file_size=BIG, progress=quiet, _before_commit=append_now)
    cv = lake.latest_compacted("T.HOOK", P)
    assert cv.last_position == 3
    assert [d.position for d in lake.deltas("T.HOOK", P, after_position=cv.last_position)] == [4]
    assert sorted(read(lake, "T.HOOK").column("v").to_pylist()) == sorted(values)


# ----- compacted streams with a primary key index ---------------------------------------------------------------
SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.int64())])
COLS = SCHEMA.names


def _keyed(cat: Catalog, table: str, n: int, seed: int, log: list[dict]) -> None:
    rng = np.random.default_rng(seed)
    files = []
    for _ in range(2):
        rows = [{"k": int(k), "ts": int(t), "v": len(log) + i} for i, (k, t) in enumerate(zip(rng.integers(0, 60, n), rng.integers(0, 9, n)))]
        pos = len(cat.deltas(table, P)) + 1 if cat.table_exists(table) else 1
        for r in rows:
            log.append({**r, "__pos": pos, "__file": len(files) + 1, "__row": rows.index(r), "__op": "upsert"})
        files.append(pa.Table.from_pylist(rows, schema=SCHEMA))
    cat.append(table, PART, "upsert", files)


def _log_table(log: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(log, schema=pa.schema(list(SCHEMA) + [("__pos", pa.int64()), ("__file", pa.int64()), ("__row", pa.int64()), ("__op", pa.string())]))


def assert_index_resolves(cat: Catalog, table: str) -> None:
    cv = cat.latest_compacted(table, P)
    assert cv is not None and cv.index is not None
    rows = pk_index.read_all(cat.storage, cv.index)
    assert len(rows) == cv.rows
    assert sorted(f.file_number for f in cv.files) == list(range(1, len(cv.files) + 1))
    pointers = set()
    for f in cv.files:
        t = cat.read_file(f)
        assert t.num_rows == f.rows
        sel = rows[rows["file"].astype(np.int64) == f.file_number]
        if not len(sel):
            continue
        idx = sel["row"].astype(np.int64)
        assert idx.max() < t.num_rows
        at = t.take(pa.array(idx))
        assert (primary_key_digests(at, list(cv.primary_keys)).view("S20").ravel() == sel["digest"]).all()
        if cv.index.sort_key_width:
            sb = sort_key_bytes(at, list(cv.sort_keys))
            assert (sb.view(f"S{cv.index.sort_key_width}").ravel() == sel["sort"]).all()
        pointers.update(zip([f.file_number] * len(idx), idx.tolist()))
    assert len(pointers) == cv.rows  # every row is pointed at exactly once


def test_optimize_keyed_stream_remaps_the_index_and_compaction_continues(lake: Catalog) -> None:
    log: list[dict] = []
    for s in range(3):
        _keyed(lake, "T.KEYED", 20, s, log)
    run_compact(lake, "T.KEYED", ["k"], [("ts", "ascending")], hash_bucket_count=3, rows_per_compacted_file=4, rows_per_primary_key_index_file=5)
    cv1 = lake.latest_compacted("T.KEYED", P)
    expected = rows_of(oracle(_log_table(log), ["k"], [("ts", "ascending")], COLS), COLS)
    sizes = sorted(f.bytes for f in cv1.files)
    res = optimize(lake, "T.KEYED", min_file_size=BIG, max_file_size=sum(sizes[: len(sizes) // 2]), progress=quiet)
    cv2 = lake.latest_compacted("T.KEYED", P)
    assert res.num_bins >= 1 and cv2.version == cv1.version + 1 and cv2.data_change is False
    assert cv2.last_position == cv1.last_position and len(cv2.files) < len(cv1.files)
    assert cv2.index.version == cv1.index.version + 1 and cv2.index.hash_bucket_count == 3
    assert all(f.rows <= 5 for files in cv2.index.buckets for f in files)
    assert_index_resolves(lake, "T.KEYED")
    assert rows_of(read(lake, "T.KEYED"), COLS) == expected
    # idempotent
    snapshot = lake.listing()
    assert optimize(lake, "T.KEYED", min_file_size=BIG, max_file_size=sum(sizes[: len(sizes) // 2]), progress=quiet).num_bins == 0
    assert lake.listing() == snapshot
    # the optimized version is a valid prior for incremental compaction
    _keyed(lake, "T.KEYED", 20, 9, log)
    run_compact(lake, "T.KEYED", None, None)
    assert_index_resolves(lake, "T.KEYED")
    final = rows_of(oracle(_log_table(log), ["k"], [("ts", "ascending")], COLS), COLS)
    assert rows_of(read(lake, "T.KEYED"), COLS) == final
    assert rows_of(pa.concat_tables([lake.read_live(f) for f in lake.latest_compacted("T.KEYED", P).files]), COLS) == final


def test_optimize_racing_a_compaction_replans_on_the_winner_and_leaves_no_loser_files(lake: Catalog) -> None:
    log: list[dict] = []
    for s in range(2):
        _keyed(lake, "T.CONFLICT", 15, s, log)
    run_compact(lake, "T.CONFLICT", ["k"], None, hash_bucket_count=2, rows_per_compacted_file=3)
    _keyed(lake, "T.CONFLICT", 15, 5, log)
    before = set(lake.listing())
    raced: list[int] = []
    lines: list[str] = []

    def compact_meanwhile(_part: Any) -> None:
        if not raced:  # the first attempt loses to this compaction; the re-planned one meets no rival
            raced.append(run_compact(lake, "T.CONFLICT", None, None).partitions[0].compacted_version)

    res = optimize(lake, "T.CONFLICT", min_file_size=BIG, max_file_size=BIG, progress=lines.append, _before_commit=compact_meanwhile)
    cv = lake.latest_compacted("T.CONFLICT", P)
    # the optimize committed right after the compaction that beat it, built on that compaction's version
    assert res.partitions_optimized == 1 and cv.version == raced[0] + 1 and not cv.data_change
    assert any("re-planning on version" in line for line in lines), lines
    assert len(cv.files) == 1
    after = set(lake.listing())
    winner = lake.compacted_version("T.CONFLICT", P, raced[0])
    referenced = {f.key for v in (winner, cv) for f in v.files} | {f.key for v in (winner, cv) for b in v.index.buckets for f in b}
    # the loser left nothing behind: every new key is referenced by a committed version, or is a version/round file
    iceberg = lake.iceberg_root("T.CONFLICT", P) + "/metadata/"  # the committed versions' Iceberg snapshots
    assert all(k in referenced or "/versions/" in k or "/rounds/" in k or "/_delta_log/" in k or "/changes/" in k
               or k.startswith(iceberg) for k in after - before)
    assert_index_resolves(lake, "T.CONFLICT")
    assert rows_of(read(lake, "T.CONFLICT"), COLS) == rows_of(oracle(_log_table(log), ["k"], None, COLS), COLS)


def test_optimize_that_always_loses_exits_with_a_conflict_naming_the_partition(lake: Catalog, monkeypatch: Any) -> None:
    log: list[dict] = []
    for s in range(2):
        _keyed(lake, "T.LOSER", 15, s, log)
    run_compact(lake, "T.LOSER", ["k"], None, hash_bucket_count=2, rows_per_compacted_file=3)
    monkeypatch.setenv("FLASH_MAX_REPLANS", "2")
    before = set(lake.listing())

    def rival_commits(part: Any) -> None:  # another writer takes the next version every time
        latest = lake.latest_compacted("T.LOSER", part)
        assert lake.commit_compacted(latest.replace(version=latest.version + 1, commit_id=f"rival-{latest.version}"))

    with pytest.raises(CommitConflict, match=r"T.LOSER \[region=eu\]: lost the commit race 3 times in a row, last to version 4") as err:
        optimize(lake, "T.LOSER", min_file_size=BIG, max_file_size=BIG, progress=quiet, _before_commit=rival_commits)
    assert err.value.exit_code == 3
    # only the rival's three manifests (their Delta commits and change records) are new: every attempt of the loser
    # was removed
    expected = [lake.version_key("T.LOSER", P, n) for n in (2, 3, 4)] + [lake.deltalake_commit_key("T.LOSER", P, n) for n in (2, 3, 4)]
    new = set(lake.listing()) - before
    assert sorted(k for k in new if "/changes/" not in k and not k.startswith("iceberg/")) == sorted(expected)
    # and their Iceberg snapshots: metadata, manifest list and members sidecar of each rival version, nothing else
    # (a rival's files are the version before's, so its data manifest is listed again, not written:
    # catalog/iceberg_manifests.py)
    iceberg = sorted(k.rsplit("/", 1)[-1] for k in new if k.startswith("iceberg/"))
    assert [k for k in iceberg if k.endswith(".metadata.json")] == [f"v{n}.metadata.json" for n in (2, 3, 4)]
    assert sorted(k.split("-")[1] for k in iceberg if k.endswith(".avro")) == ["2", "3", "4"]
    assert all(k.startswith("snap-") for k in iceberg if k.endswith(".avro"))
    assert sorted(k.split("-")[0] for k in iceberg if k.endswith("-members-" + k.split("-")[-1])) == ["2", "3", "4"]
    assert len(iceberg) == 9
    rivals = [r for r in lake.changes.read("T.LOSER") if r.kind == "compacted" and r.details["version"] > 1]
    assert [(r.details["version"], r.details["commit_id"]) for r in rivals] == [(n, f"rival-{n - 1}") for n in (2, 3, 4)]


# ----- CLI -----------------------------------------------------------------------------------------------------
def test_cli_optimize(lake: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    _append_small(lake, "T.CLI", deltas=2)
    assert main(["optimize", "--catalog", lake.uri, "--table", "T.CLI", "--partition", "region=eu", "--min-file-size", "1G",
                 "--max-file-size", "1G", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_files_removed"] == 4 and out["num_files_added"] == 1 and out["partitions_optimized"] == 1
    assert main(["optimize", "--catalog", lake.uri, "--table", "T.CLI"]) == 0
    assert "nothing-to-do" in capsys.readouterr().out
    snapshot = lake.listing()
    assert main(["optimize", "--catalog", lake.uri, "--table", "NOPE"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flash-compactor: error: ") and err.count("\n") == 1
    assert main(["optimize", "--catalog", lake.uri, "--table", "T.CLI", "--max-file-size", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert lake.listing() == snapshot


def test_optimize_skips_a_never_compacted_partition_of_a_keyed_table(tmp_path) -> None:
    """Keys are the table's: packing a new partition's raw upserts into an unkeyed version would publish duplicate
    keys to Delta readers (the Dagster asset already skipped it); optimize says to compact it first."""
    import deltalake

    from flash_pipeline.catalog.catalog import Catalog
    from flash_pipeline.optimize import optimize

    cat = Catalog(tmp_path / "lake")
    cat.append("T.K", {"p": "a"}, "upsert", [pa.table({"k": [1, 2], "v": [1, 1]})])
    run_compact(cat, "T.K", ["k"], None)
    for v in (1, 2):
        cat.append("T.K", {"p": "b"}, "upsert", [pa.table({"k": [1, 2], "v": [v, v]})])
    res = optimize(cat, "T.K", min_file_size=1 << 30, max_file_size=1 << 30, progress=lambda m: None)
    b = next(r for r in res.partitions if r.partition == (("p", "b"),))
    assert b.status == "skipped" and "compact it first" in " ".join(b.notes) and "k" in " ".join(b.notes)
    assert cat.latest_compacted("T.K", (("p", "b"),)) is None
    run_compact(cat, "T.K", None, None)
    rows = deltalake.DeltaTable(cat.deltalake_location("T.K", (("p", "b"),))).to_pyarrow_table()
    assert sorted(rows.to_pylist(), key=lambda r: r["k"]) == [{"k": 1, "v": 2}, {"k": 2, "v": 2}]


def test_optimize_skips_a_source_partition_compacted_into_another_table(tmp_path) -> None:
    """A source compacted with keys into another table (--destination): optimize of the source packed its raw
    upserts into an unkeyed version and published duplicate keys to Delta readers. It now skips the partition and
    names the table to optimize; the lake is as it was."""
    from flash_pipeline.catalog.catalog import Catalog
    from flash_pipeline.optimize import optimize

    cat = Catalog(tmp_path / "lake")
    for v in (1, 2):
        cat.append("T.S", {"p": "a"}, "upsert", [pa.table({"k": [1, 2], "v": [v, v]})])
    run_compact(cat, "T.S", ["k"], None, destination_compacted_table_id="T.D")
    cat.append("T.S", {"p": "a"}, "upsert", [pa.table({"k": [1], "v": [3]})])
    before = cat.listing()
    res = optimize(cat, "T.S", min_file_size=1 << 30, max_file_size=1 << 30, progress=lambda m: None)
    (a,) = res.partitions
    assert a.status == "skipped" and "optimize T.D instead" in " ".join(a.notes)
    assert cat.listing() == before and cat.latest_compacted("T.S", (("p", "a"),)) is None


def test_a_table_keyed_while_a_long_optimize_runs_stops_it_packing_raw(tmp_path, monkeypatch) -> None:
    """optimize looks the table's keys up once for all its partitions (sibling_keys_once), but trusts "no
    partition is keyed" only for SIBLING_RECHECK_SECONDS: a compaction keying a partition meanwhile makes the rest
    be skipped ("compact it first"), as the per-partition lookup did, not packed raw with their duplicate keys."""
    from flash_pipeline import compact
    from flash_pipeline.compactor.planning import keys
    from flash_pipeline.optimize import optimize

    monkeypatch.setattr(keys, "SIBLING_RECHECK_SECONDS", 0.0)  # the window this test stands for has passed
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    for p in ("d1", "d2", "d3"):
        for ts in (1, 2):
            cat.append("T", {"day": p}, "upsert", [pa.table({"id": pa.array([7], pa.int64()), "ts": pa.array([ts], pa.int64())})])
    done: list[int] = []

    def another_writer_keys_d3(part) -> None:
        if not done:
            done.append(1)
            compact("T", ["id"], ["ts"], catalog=Catalog(lake), partitions=[{"day": "d3"}], executor="in-process",
                    progress=lambda m: None)

    res = optimize(cat, "T", _before_commit=another_writer_keys_d3, progress=lambda m: None)
    status = {dict(r.partition)["day"]: r.status for r in res.partitions}
    assert status["d1"] == "optimized" and status["d2"] == "skipped", status
