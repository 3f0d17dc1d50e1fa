"""A memory budget the plan cannot keep is said, with the budget that would do (planning/rounds.py): the session
still runs and its rows are right, and the note rides on the result (and the progress lines the CLI prints)."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from compaction_helpers import DeltaLog, oracle, read_compacted, rows_of, run_compact
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.compactor.planning.sizing import delta_round_bytes

SCHEMA = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.float64())])
MATERIALIZE_NOTE = "below what materialize needs"
DELTA_NOTE = "alone needs about"


def _lake(tmp_path, name: str, rows: list[int]) -> DeltaLog:
    rng = np.random.default_rng(len(rows))
    log = DeltaLog(Catalog(tmp_path / name), "B.T", (), SCHEMA)
    for i, n in enumerate(rows):
        log.append("upsert", [pa.table({"k": rng.integers(0, 5000, n), "ts": np.full(n, i), "v": rng.random(n)}, schema=SCHEMA)])
    return log


def _compact(log: DeltaLog, budget: int) -> tuple[object, list[str]]:
    said: list[str] = []
    res = run_compact(log.cat, "B.T", ["k"], [("ts", "ascending")], executor="in-process", num_cpus=2,
                      hash_bucket_count=2, max_round_bytes=budget, progress=said.append)
    got = rows_of(read_compacted(log.cat, "B.T", ()), SCHEMA.names)
    assert got == rows_of(oracle(log.log_table(), ["k"], [("ts", "ascending")], SCHEMA.names), SCHEMA.names)
    return res.partitions[0], said


def test_a_budget_below_materializes_least_is_said_with_the_budget_that_would_do(tmp_path) -> None:
    sizes = [4000] * 6
    part, said = _compact(_lake(tmp_path, "small", sizes), 1 << 20)  # 1 MiB: several rounds, materialize cannot fit
    assert part.rounds > 1
    [note] = [n for n in part.notes if MATERIALIZE_NOTE in n]
    assert any(note in line for line in said), said
    least = int(re.search(r"at least (\d+)", note).group(1))
    assert least > 1 << 20
    # the budget the note names is the least that does: the same input plans without the note under it, and
    # with it again a little below
    part, _ = _compact(_lake(tmp_path, "enough", sizes), least)
    assert not [n for n in part.notes if MATERIALIZE_NOTE in n], part.notes
    part, _ = _compact(_lake(tmp_path, "short", sizes), least - (1 << 20))
    assert [n for n in part.notes if MATERIALIZE_NOTE in n], part.notes


def test_a_delta_whose_round_alone_exceeds_the_budget_is_named(tmp_path) -> None:
    budget = 16 << 20
    big = budget // delta_round_bytes(1, 8) + 1000  # this delta alone is over the budget; the others fit together
    part, said = _compact(_lake(tmp_path, "lake", [3000, big, 3000]), budget)
    assert part.rounds == 3
    named = [n for n in part.notes if DELTA_NOTE in n]
    assert len(named) == 1 and "position 2 " in named[0], part.notes
    assert any(named[0] in line for line in said)
    # alone in its session too (one round)
    part, _ = _compact(_lake(tmp_path, "alone", [big]), budget)
    assert part.rounds == 1 and [n for n in part.notes if DELTA_NOTE in n and "position 1 " in n], part.notes


def test_a_wide_table_of_small_files_is_not_charged_a_page_per_column_beyond_its_size(tmp_path) -> None:
    """A Parquet reader holds about a page per column, but never more than its file decoded: 600 columns of a
    10 MB table were charged 2 MiB each (2.3 GiB for two tasks), and units of 10,000 rows (its files hold 2,000),
    so every compaction under a 512 MiB budget told
    the user to raise it to gigabytes (an adversarial run's find, at 1,000 columns and 7 GB)."""
    width, rows = 600, 2000
    rng = np.random.default_rng(7)
    cat = Catalog(tmp_path / "wide")
    columns = {"k": np.arange(rows), **{f"c{i}": rng.integers(0, 1 << 40, rows) for i in range(width - 1)}}
    cat.append("B.W", (), "upsert", [pa.table(columns)])
    cat.append("B.W", (), "upsert", [pa.table({name: values[:10] for name, values in columns.items()})])
    said: list[str] = []
    res = run_compact(cat, "B.W", ["k"], None, executor="in-process", num_cpus=2, hash_bucket_count=2,
                      max_round_bytes=512 << 20, progress=said.append)
    part = res.partitions[0]
    assert part.rows_out == rows
    assert not [n for n in part.notes if MATERIALIZE_NOTE in n], part.notes
