"""Input 10x the round budget is compacted in serial rounds with bounded peak memory, writing the table once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flash_pipeline import Catalog
from flash_pipeline.compactor.planning.sizing import delta_round_bytes
from tests.compaction_helpers import FILE, OP, POS, ROW, DeltaLog, oracle, read_compacted, rows_of, run_compact
from tests.memory_probe import PeakMemory

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("payload", pa.string()), ("x", pa.float64())])
BUDGET = 5 << 20


def _delta(rng: np.random.Generator, n: int, key_space: int) -> pa.Table:
    keys = rng.integers(0, key_space, n)
    payload = np.char.add("p-", rng.integers(0, 10**12, n).astype(str))
    payload = np.char.add(payload, "-" * 60)
    return pa.table({"k": keys, "ts": rng.integers(0, 1000, n), "payload": payload, "x": rng.random(n)}, schema=SCHEMA)


def test_input_ten_times_the_budget_runs_in_rounds_within_the_budget(tmp_path) -> None:
    rng = np.random.default_rng(5)
    log = DeltaLog(Catalog(tmp_path / "lake"), "M.T", (), SCHEMA)
    cat = log.cat
    # warm the Ray workers so their start-up is not counted
    cat.append("M.W", (), "upsert", [_delta(rng, 10, 10)])
    run_compact(cat, "M.W", ["k"], [("ts", "ascending")], hash_bucket_count=2)

    for i in range(16):
        # files as a Spark job writes them: several row groups, so rounds can read them in budget-sized units
        path = tmp_path / f"delta-{i}.parquet"
        table = _delta(rng, 45_000, 300_000)
        pq.write_table(table, path, row_group_size=20_000)
        position = cat.append("M.T", (), "upsert", [path]).position
        log.records.extend({**row, POS: position, FILE: 1, ROW: i, OP: "upsert"} for i, row in enumerate(table.to_pylist()))
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
    expected = oracle(log.log_table(), ["k"], [("ts", "ascending")], SCHEMA.names)
    assert rows_of(read_compacted(cat, "M.T", ()), SCHEMA.names) == rows_of(expected, SCHEMA.names)

    print(f"input estimate {estimate >> 20} MiB, budget {BUDGET >> 20} MiB, {part.rounds} rounds: object store peak "
          f"{mem.store_growth >> 20} MiB, process tree peak +{mem.growth >> 20} MiB (worker heaps keep their high-water mark)")
    # the budget bounds a round's intermediate data, which lives in Ray's object store
    assert mem.store_growth <= BUDGET, f"intermediate data peaked at {mem.store_growth >> 20} MiB, over the budget"
    # ... and no round's estimate exceeded it (a single delta larger than the budget would form its own round)
    for d in deltas:
        assert delta_round_bytes(d.rows, 9) <= BUDGET
