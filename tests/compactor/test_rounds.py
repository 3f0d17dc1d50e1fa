"""Input 10x the round budget is compacted in serial rounds with bounded peak memory, writing the table once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flash_pipeline import Catalog
from flash_pipeline.compactor.planning.sizing import delta_round_bytes
from tests.compaction_helpers import FILE, OP, POS, ROW, assert_same_rows, oracle, read_compacted, run_compact
from tests.memory_probe import PeakMemory

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("payload", pa.string()), ("x", pa.float64())])
BUDGET = 5 << 20


def _delta(rng: np.random.Generator, n: int, key_space: int) -> pa.Table:
    keys = rng.integers(0, key_space, n)
    payload = np.char.add("p-", rng.integers(0, 10**12, n).astype(str))
    payload = np.char.add(payload, "-" * 60)
    return pa.table({"k": keys, "ts": rng.integers(0, 1000, n), "payload": payload, "x": rng.random(n)}, schema=SCHEMA)


def _logged(delta: pa.Table, position: int) -> pa.Table:
    """One single-file upsert delta as the oracle's log rows (DeltaLog.append's records, built with Arrow: a
    million rows as Python dicts cost these tests 10 s)."""
    n = delta.num_rows
    return (delta.append_column(POS, pa.array(np.full(n, position, dtype=np.int64)))
            .append_column(FILE, pa.array(np.ones(n, dtype=np.int64)))
            .append_column(ROW, pa.array(np.arange(n, dtype=np.int64)))
            .append_column(OP, pa.array(["upsert"] * n, pa.string())))


def test_input_ten_times_the_budget_runs_in_rounds_within_the_budget(tmp_path) -> None:
    rng = np.random.default_rng(5)
    cat = Catalog(tmp_path / "lake")
    logged: list[pa.Table] = []
    # warm the Ray workers so their start-up is not counted
    cat.append("M.W", (), "upsert", [_delta(rng, 10, 10)])
    run_compact(cat, "M.W", ["k"], [("ts", "ascending")], hash_bucket_count=2)

    for i in range(16):
        # files as a Spark job writes them: several row groups, so rounds can read them in budget-sized units
        path = tmp_path / f"delta-{i}.parquet"
        table = _delta(rng, 45_000, 300_000)
        pq.write_table(table, path, row_group_size=20_000)
        position = cat.append("M.T", (), "upsert", [path]).position
        logged.append(_logged(table, position))
    deltas = cat.deltas("M.T", ())
    estimate = sum(delta_round_bytes(d.rows, 9) for d in deltas)
    assert estimate >= 10 * BUDGET, f"input estimate {estimate >> 20} MiB is not 10x the {BUDGET >> 20} MiB budget"

    with PeakMemory() as mem:
        result = run_compact(cat, "M.T", ["k"], [("ts", "ascending")], hash_bucket_count=2, max_round_bytes=BUDGET)
    part = result.partitions[0]
    assert part.rounds >= 10
    # one commit for the session: every output file written once, by the last round's materialize
    assert cat.compacted_versions("M.T", ()) == [1]
    assert part.files_carried == 0 and part.files_written == len(cat.latest_compacted("M.T", ()).files)
    expected = oracle(pa.concat_tables(logged), ["k"], [("ts", "ascending")], SCHEMA.names)
    assert_same_rows(read_compacted(cat, "M.T", ()), expected, SCHEMA.names)

    print(f"input estimate {estimate >> 20} MiB, budget {BUDGET >> 20} MiB, {part.rounds} rounds: object store peak "
          f"{mem.store_growth >> 20} MiB, process tree peak +{mem.growth >> 20} MiB (worker heaps keep their high-water mark)")
    # the budget bounds a round's intermediate data, which lives in Ray's object store
    assert mem.store_growth <= BUDGET, f"intermediate data peaked at {mem.store_growth >> 20} MiB, over the budget"
    # ... and no round's estimate exceeded it (a single delta larger than the budget would form its own round)
    for d in deltas:
        assert delta_round_bytes(d.rows, 9) <= BUDGET


def _numpy_peak_here(lake: str, table: str, kwargs: dict) -> tuple[int, int, int]:
    """(peak of the NumPy and Python memory a session holds, its bucket count, its rounds), in process, after the
    same session on a copy of the lake: the modules a session imports, and Numba compiling a kernel signature
    this installation has not cached yet, would be counted otherwise (14-17 MiB against 12)."""
    import shutil
    import tempfile
    import tracemalloc

    with tempfile.TemporaryDirectory() as warm:
        shutil.copytree(lake, Path(warm) / "lake")
        run_compact(Catalog(Path(warm) / "lake"), table, ["k"], [("ts", "ascending")], executor="in-process", **kwargs)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = run_compact(Catalog(lake), table, ["k"], [("ts", "ascending")], executor="in-process", **kwargs)
        part = result.partitions[0]
        return tracemalloc.get_traced_memory()[1] - base, part.hash_bucket_count, part.rounds
    finally:
        tracemalloc.stop()


def _numpy_peak(lake: str, table: str, **kwargs: object) -> tuple[int, int, int]:
    """_numpy_peak_here in a spawned process of its own. tracemalloc counts every thread's allocations, and late
    in a long test session threads that earlier tests left running allocated during the measurement: the same
    session peaked at 12-13 MiB alone and at 18-22 MiB in full runs of the suite."""
    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(1)
    try:
        return pool.apply(_numpy_peak_here, (lake, table, kwargs))
    finally:  # the worker ends on its own: a pool's terminate() waits forever for one that ignores SIGTERM
        pool.close()
        pool.join()


def test_the_budget_sizes_the_bucket_count_of_a_multi_round_session(tmp_path) -> None:
    """Without a requested bucket count, a budget makes the planner size buckets from its per-task share: the last
    round, which merges every earlier round's summary of its bucket, holds a bucket's share of the table, not half
    of it (two buckets for the whole table)."""
    budget = 8 << 20
    cat = Catalog(tmp_path / "lake")
    logged: list[pa.Table] = []
    for table in ("B.PLANNED", "B.TWO"):  # the same deltas in two tables (recorded once: one oracle for both)
        rng = np.random.default_rng(11)
        for _ in range(16):
            t = _delta(rng, 72_000, 720_000)
            position = cat.append(table, (), "upsert", [t]).position
            if table == "B.PLANNED":
                logged.append(_logged(t, position))
    assert sum(delta_round_bytes(d.rows, 9) for d in cat.deltas("B.PLANNED", ())) >= 10 * budget

    # one step thread: with two, the peak depended on how the OS interleaved their tasks (13 MiB on an idle
    # machine, 18-19 MiB beside two busy processes, the whole suite's included)
    lake = str(tmp_path / "lake")
    planned_peak, planned_buckets, planned_rounds = _numpy_peak(lake, "B.PLANNED", max_round_bytes=budget, num_cpus=1)
    two_peak, _, two_rounds = _numpy_peak(lake, "B.TWO", max_round_bytes=budget, hash_bucket_count=2, num_cpus=1)
    print(f"\nbudget {budget >> 20} MiB: the planner's {planned_buckets} buckets, {planned_rounds} rounds: NumPy peak "
          f"{planned_peak >> 20} MiB; 2 buckets, {two_rounds} rounds: {two_peak >> 20} MiB")
    assert planned_rounds >= 2 and planned_buckets > 2
    expected = oracle(pa.concat_tables(logged), ["k"], [("ts", "ascending")], SCHEMA.names)
    assert_same_rows(read_compacted(cat, "B.PLANNED", ()), expected, SCHEMA.names)
    assert_same_rows(read_compacted(cat, "B.TWO", ()), expected, SCHEMA.names)
    # tracemalloc counts whole allocations, also the untouched margins of hash bucket's regions (13 MiB here with
    # the survivor map, 1 B an input row; against 52-61 MiB with two buckets)
    assert planned_peak <= 2 * budget, f"the session held {planned_peak >> 20} MiB of NumPy memory, over twice the {budget >> 20} MiB budget"
    assert two_peak > 3 * planned_peak, "the probe must see what two buckets cost, or it checks nothing"
