"""Memory per row of an incremental dedupe, measured (tracemalloc sees NumPy's and the storage's allocations).

The paper sizes hash buckets from a fixed memory cost per primary key index row; Figure 3-1 implies about 29
bytes a record (a 20-byte digest plus pointers). Here a bucket of a 200,000-row index meets a 1% delta: dedupe
must hold no more than the index row (28 bytes: digest, file, row) plus a few bytes of probe mask per indexed
row, and the index writer (which streams the prior bucket and re-points the kept rows into the next version)
no more than its output row plus a chunk. planning/sizing.py's cost per indexed row rests on these two.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import pyarrow as pa

from flash_pipeline import Catalog, compact
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.kernels.layout import compute_layout
from flash_pipeline.compactor.model.options import CompactOptions
from flash_pipeline.compactor.model.plans import SessionSizing
from flash_pipeline.compactor.model.survivors import MaskedSurvivors
from flash_pipeline.compactor.planning.rounds import build_round_plan
from flash_pipeline.compactor.planning.sessions import PlannedSession, plan_session
from flash_pipeline.compactor.steps import dedupe
from flash_pipeline.compactor.steps.hash_bucket import hash_bucket_files

ROWS = 200_000


def test_incremental_dedupe_and_index_writer_hold_about_the_index_row_per_indexed_row(tmp_path, monkeypatch) -> None:
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
    # a bucket many chunks long, as at the paper's scale (150M rows a bucket, streamed 1M rows at a time)
    monkeypatch.setattr(pk_index, "CHUNK_ROWS", ROWS // 64)

    def steps() -> None:
        out = dedupe.dedupe_step(cat.storage, plan, 0, [envelopes[0]])
        layout = compute_layout(plan, out.counts[None, :], np.sort(out.lost_ranks))
        pk_index.write_next_bucket(cat.storage, plan, layout, 0, out.survivors, out.lost_at)

    steps()  # compile the kernels outside the measurement
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = dedupe.dedupe_step(cat.storage, plan, 0, [envelopes[0]])
        dedupe_peak = (tracemalloc.get_traced_memory()[1] - base) / ROWS
        layout = compute_layout(plan, out.counts[None, :], np.sort(out.lost_ranks))
        survivors, lost_at = out.survivors, out.lost_at
        out = None  # the writer gets only these, as from a dedupe task
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        pk_index.write_next_bucket(cat.storage, plan, layout, 0, survivors, lost_at)
        writer_peak = (tracemalloc.get_traced_memory()[1] - base) / ROWS
    finally:
        tracemalloc.stop()
    print(f"index row {row_bytes} B; dedupe peak {dedupe_peak:.1f} B per indexed row; "
          f"index writer peak {writer_peak:.1f} B per indexed row (after dedupe's output is gone)")
    assert len(lost_at) == len(updated)
    assert row_bytes == 28 + plan.spec.sort_key_width  # digest 20, file 4, row 4 (docs/catalog-layout.md)
    assert dedupe_peak <= row_bytes + 4, f"dedupe holds {dedupe_peak:.1f} B per indexed row, the index row is {row_bytes} B"
    assert writer_peak <= row_bytes + 4, f"the index writer holds {writer_peak:.1f} B per indexed row, the index row is {row_bytes} B"


# the kernels as Numba's machine code and as their Python source (kernels/jit.py)
@pytest.mark.parametrize("seed, form", [(seed, "compiled") for seed in range(12)] + [(seed, "interpreted") for seed in range(12)])
def test_streamed_index_writer_equals_the_sorting_one(tmp_path, monkeypatch, seed: int, form: str) -> None:
    """The streaming index writer (chunks, carried rows from the front, rewritten rows from the back) must give
    exactly the rows of the general writer (whole bucket, re-pointed, sorted), on random incremental rounds
    with carried and rewritten files, deletes, several buckets and chunks that split buckets anywhere."""
    monkeypatch.setenv("FLASH_KERNELS", form)
    rng = np.random.default_rng(seed)
    cat = Catalog(tmp_path / "lake")
    # small index files, cut where the compacted file changes: some are carried by reference
    monkeypatch.setattr(pk_index, "MIN_INDEX_FILE_ROWS", int(rng.integers(1, 30)))
    space = int(rng.integers(50, 400))
    for _ in range(int(rng.integers(1, 4))):
        n = int(rng.integers(1, 300))
        cat.append("S.T", (), "upsert", [pa.table({"k": rng.integers(0, space, n), "t": rng.integers(0, 9, n)})])
    buckets = int(rng.integers(1, 5))
    # copy-on-write (recorded, so the planned round below keeps it): the index files it carries are the ones
    # whose compacted files are carried whole
    compact("S.T", ["k"], sort_keys=[("t", "ascending")], catalog=cat, hash_bucket_count=buckets,
            rows_per_compacted_file=int(rng.integers(10, 80)), executor="in-process", progress=lambda m: None,
            deletion_vectors=False)
    n = int(rng.integers(1, 60))
    low = int(rng.integers(0, space))  # updates clustered in a key range: some files carried, some rewritten
    cat.append("S.T", (), "upsert", [pa.table({"k": rng.integers(low, low + 40, n), "t": rng.integers(0, 9, n)})
                                     for _ in range(int(rng.integers(1, 4)))])  # files for several hash bucket tasks
    if rng.random() < 0.5:
        cat.append("S.T", (), "delete", [pa.table({"k": rng.integers(0, space, int(rng.integers(1, 20)))})])
    session = plan_session(cat, "S.T", CompactOptions(), (), lambda m: None)
    assert isinstance(session, PlannedSession)
    sizing = SessionSizing(buckets, 1 << 40, (tuple(session.deltas),), session.base_version)
    plan = build_round_plan(cat, session.spec, sizing, session.prior, sizing.rounds, session.base_version + 1, 1 + seed % 3)
    envelopes = [hash_bucket_files(cat.storage, plan, group) for group in plan.hash_groups[0]]
    outs = [dedupe.dedupe_step(cat.storage, plan, b, [e[b] for e in envelopes]) for b in range(buckets)]
    layout = compute_layout(plan, np.stack([o.counts for o in outs]), np.sort(np.concatenate([o.lost_ranks for o in outs])))
    monkeypatch.setattr(pk_index, "CHUNK_ROWS", int(rng.integers(1, 50)))
    for b, out in enumerate(outs):
        # the probe streams chunks through one reused buffer: it must find what a read of the whole bucket finds
        streamed_probe = dedupe.dedupe_step(cat.storage, plan, b, [e[b] for e in envelopes])
        whole = dedupe.dedupe_bucket(plan, dedupe.read_prior(cat.storage, plan, b), [e[b] for e in envelopes])
        for got_out in (streamed_probe, out):
            assert np.array_equal(got_out.lost_at, whole.lost_at) and np.array_equal(got_out.lost_ranks, whole.lost_ranks), f"bucket {b}"
            assert got_out.survivors.tobytes() == whole.survivors.tobytes(), f"bucket {b}"
        carry = pk_index.carryable_index_files(plan, layout, b) if seed % 2 == 0 else {}
        streamed = pk_index.stream_next_bucket_rows(cat.storage, plan, layout, b, out.survivors, out.lost_at, carry)
        # as a one-round session on Ray hands them over: dedupe's flags over the hash bucket tasks' envelopes
        masked = MaskedSurvivors(tuple(e[b] for e in envelopes), out.survivor_keep)
        assert masked.envelopes().tobytes() == out.survivors.tobytes() and len(masked) == len(out.survivors), f"bucket {b}"
        from_masked = pk_index.stream_next_bucket_rows(cat.storage, plan, layout, b, masked, out.lost_at, carry)
        assert from_masked is not None and from_masked[0].tobytes() == streamed[0].tobytes(), f"bucket {b}"
        assert from_masked[1] == streamed[1], f"bucket {b}"
        general = pk_index.next_bucket_rows(plan, layout, b, out.survivors, dedupe.read_prior(cat.storage, plan, b), out.lost_at)
        assert streamed is not None, f"bucket {b}: the streaming writer fell back"
        rows, placed = streamed
        assert len(placed) == len(carry)
        # each carried file, read with the entry the new version records, holds exactly the rows the general
        # writer puts at its place
        parts, at = [], 0
        for slot, entry in placed:
            parts += [rows[at:slot], pk_index.file_rows(cat.storage.read(entry.key), entry, plan.spec.sort_key_width)]
            at = slot
        parts.append(rows[at:])
        got = np.concatenate(parts).astype(general.dtype)  # concatenation may go native-endian
        assert got.tobytes() == general.tobytes(), f"bucket {b}"

