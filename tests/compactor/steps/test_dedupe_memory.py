"""Memory per row of an incremental dedupe, measured (tracemalloc sees NumPy's and the storage's allocations).

The paper sizes hash buckets from a fixed memory cost per primary key index row; Figure 3-1 implies about 29
bytes a record (a 20-byte digest plus pointers). Here a bucket of a 200,000-row index meets a 1% delta: dedupe
must hold no more than the index row (28 bytes: digest, file, row) plus a few bytes of probe mask per indexed
row. The index writer's peak is printed beside it (it re-points the kept rows and writes the next version).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa

from flash_pipeline import Catalog, compact
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.kernels.layout import compute_layout
from flash_pipeline.compactor.model.options import CompactOptions
from flash_pipeline.compactor.model.plans import SessionSizing
from flash_pipeline.compactor.planning.rounds import build_round_plan
from flash_pipeline.compactor.planning.sessions import PlannedSession, plan_session
from flash_pipeline.compactor.steps import dedupe
from flash_pipeline.compactor.steps.hash_bucket import hash_bucket_files

ROWS = 200_000


def test_incremental_dedupe_holds_about_the_index_row_per_indexed_row(tmp_path) -> None:
    cat = Catalog(tmp_path / "lake")
    cat.append("M.T", (), "upsert", [pa.table({"k": np.arange(ROWS), "v": np.zeros(ROWS)})])
    compact("M.T", ["k"], catalog=cat, hash_bucket_count=1, executor="in-process", progress=lambda m: None)
    updated = np.random.default_rng(1).choice(ROWS, ROWS // 100, replace=False)
    cat.append("M.T", (), "upsert", [pa.table({"k": updated, "v": np.ones(len(updated))})])
    session = plan_session(cat, "M.T", CompactOptions(), (), lambda m: None)
    assert isinstance(session, PlannedSession)
    sizing = SessionSizing(1, 1 << 40, (tuple(session.deltas),), session.base_version)
    plan = build_round_plan(cat, session.spec, sizing, session.prior, sizing.rounds, session.base_version + 1, 1)
    envelopes = hash_bucket_files(cat.storage, plan, plan.hash_groups[0][0])
    row_bytes = pk_index.index_dtype(plan.spec.sort_key_width).itemsize

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = dedupe.dedupe_step(cat.storage, plan, 0, [envelopes[0]])
        dedupe_peak = (tracemalloc.get_traced_memory()[1] - base) / ROWS
        layout = compute_layout(plan, out.counts[None, :], np.sort(out.lost_ranks))
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        pk_index.write_next_bucket(cat.storage, plan, layout, 0, out.survivors, out.prior, out.lost_at)
        writer_peak = (tracemalloc.get_traced_memory()[1] - base) / ROWS
    finally:
        tracemalloc.stop()
    print(f"index row {row_bytes} B; dedupe peak {dedupe_peak:.1f} B per indexed row; "
          f"index writer peak {writer_peak:.1f} B per indexed row beyond dedupe's output")
    assert out.survivor_rows == ROWS and len(out.lost_at) == len(updated)
    assert row_bytes == 28 + plan.spec.sort_key_width  # digest 20, file 4, row 4 (docs/catalog-layout.md)
    assert dedupe_peak <= row_bytes + 4, f"dedupe holds {dedupe_peak:.1f} B per indexed row, the index row is {row_bytes} B"
