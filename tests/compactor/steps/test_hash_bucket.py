"""Step 1 (steps/hash_bucket.py) against a direct formulation: every row's envelope computed from its whole
file at once (digest of its key, rank = (src, row), sort key bytes), grouped by bucket in input order.

The step digests in batches of at most BATCH_ROWS rows (small files together, a large one in slices) and
appends each batch to its bucket's region of one array; both must be invisible in the output."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flash_pipeline import Catalog
from flash_pipeline.compactor.kernels import jit
from flash_pipeline.compactor.kernels.digest import hash_buckets, primary_key_digests, sort_key_bytes
from flash_pipeline.compactor.model.options import CompactOptions
from flash_pipeline.compactor.model.plans import SessionSizing, rank_of
from flash_pipeline.compactor.planning.rounds import build_round_plan
from flash_pipeline.compactor.planning.sessions import PlannedSession, plan_session
from flash_pipeline.compactor.steps import hash_bucket
from flash_pipeline.compactor.steps.hash_bucket import envelope_dtype, hash_bucket_files


def _expected(cat: Catalog, plan, src_ids: tuple[int, ...]) -> list[bytes]:  # type: ignore[no-untyped-def]
    """Each bucket's envelopes, computed file by file with no batching, grouped stably by bucket."""
    dtype = envelope_dtype(plan.spec.sort_key_width)
    parts = []
    for src in src_ids:
        source = plan.sources[src]
        table = pq.read_table(cat.storage.arrow_source(source.key))
        env = np.zeros(table.num_rows, dtype=dtype)
        env["digest"] = primary_key_digests(table, list(plan.spec.primary_keys)).view("S20").reshape(-1)
        env["rank"] = rank_of(src, np.arange(table.num_rows))
        if plan.spec.sort_key_width and not source.is_delete:
            sk = sort_key_bytes(table, list(plan.spec.sort_keys))
            env["sort"] = np.ascontiguousarray(sk).view(f"S{plan.spec.sort_key_width}").reshape(-1)
        parts.append(env)
    rows = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    digests = np.ascontiguousarray(rows["digest"]).view(np.uint8).reshape(-1, 20)
    buckets = hash_buckets(digests, plan.bucket_count)
    return [rows[buckets == b].tobytes() for b in range(plan.bucket_count)]


def _loading_for(monkeypatch, calls: int) -> None:
    """jit.loading() answers True to its first ``calls`` calls (Numba's loader thread still at work), then False."""
    left = [calls]

    def loading() -> bool:
        left[0] -= 1
        return left[0] >= 0

    monkeypatch.setattr(jit, "loading", loading)


@pytest.mark.parametrize("seed", range(8))
def test_batched_envelopes_equal_whole_file_envelopes(tmp_path, monkeypatch, seed: int) -> None:
    """Whatever the batch size, and whether or not the task decodes units ahead while Numba loads."""
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(hash_bucket, "BATCH_ROWS", int(rng.integers(1, 40)))
    if seed % 2:
        monkeypatch.setattr(hash_bucket, "AHEAD_BYTES", int(rng.integers(1, 4000)))
        _loading_for(monkeypatch, int(rng.integers(0, 8)))
    cat = Catalog(tmp_path / "lake")
    def keys(n: int) -> dict[str, pa.Array]:  # an integer and a string key (nulls, empty strings): both framings
        words = [None, "", "a", "bb", "ccc\u00e9"]
        return {"k": pa.array(rng.integers(0, 30, n)), "s": pa.array([words[i] for i in rng.integers(0, len(words), n)], pa.string())}

    for _ in range(int(rng.integers(1, 6))):
        n = int(rng.integers(0, 120))  # some files many batches long, some empty
        if rng.random() < 0.25:
            cat.append("H.T", (), "delete", [pa.table(keys(n))])
        else:
            cat.append("H.T", (), "upsert", [pa.table({**keys(n), "t": rng.integers(0, 9, n)})])
    buckets = int(rng.integers(1, 6))
    session = plan_session(cat, "H.T", CompactOptions(primary_keys=["k", "s"], sort_keys=[("t", "ascending")]), (), lambda m: None)
    assert isinstance(session, PlannedSession)
    sizing = SessionSizing(buckets, 1 << 40, (tuple(session.deltas),), session.base_version)
    plan = build_round_plan(cat, session.spec, sizing, session.prior, sizing.rounds, session.base_version + 1, 1)
    for group in plan.hash_groups[0]:
        got = hash_bucket_files(cat.storage, plan, group)
        assert [g.tobytes() for g in got] == _expected(cat, plan, group)


@pytest.mark.parametrize("seed", range(6))
def test_bucket_regions_grow_when_a_bucket_outgrows_its_region(seed: int) -> None:
    """A bucket fuller than its region's margin (forced here by a tiny region) moves every region to a larger
    array, keeping each bucket's rows in input order."""
    rng = np.random.default_rng(seed)
    dtype = envelope_dtype(3)
    B = int(rng.integers(2, 5))
    regions = hash_bucket._BucketRegions(B, 1000, dtype)
    regions.capacity = int(rng.integers(1, 4))
    regions.rows = np.empty(B * regions.capacity, dtype=dtype)
    model: list[list[bytes]] = [[] for _ in range(B)]
    serial = 0
    for _ in range(int(rng.integers(1, 8))):
        n = int(rng.integers(0, 12))
        env = np.zeros(n, dtype=dtype)
        env["rank"] = serial + np.arange(n)
        serial += n
        skewed = rng.integers(0, B, n) if rng.random() < 0.5 else np.zeros(n, dtype=np.int64)  # one bucket takes all
        regions.append(env, skewed.astype(np.int64))
        for i in range(n):
            model[int(skewed[i])].append(env[i].tobytes())
    assert [[r.tobytes() for r in b] for b in regions.buckets()] == model


@pytest.mark.parametrize("loading_calls", [0, 1, 2, 10])
def test_units_are_decoded_ahead_only_while_numba_loads_and_handed_on_in_order(monkeypatch, loading_calls: int) -> None:
    """While the loader thread runs, a task decodes units (up to AHEAD_BYTES) before handing on the first;
    otherwise each unit is decoded when it is used. Every unit is handed on once, in order."""
    monkeypatch.setattr(hash_bucket, "AHEAD_BYTES", 40)
    _loading_for(monkeypatch, loading_calls)
    events: list[str] = []

    def units():
        for i in range(6):
            events.append(f"decode {i}")
            yield pa.table({"k": pa.array([1, 2], pa.int64())})  # 16 bytes each: the third unit passes 40

    for i, table in enumerate(hash_bucket._decoded_ahead(units())):
        assert table.num_rows == 2
        events.append(f"use {i}")
    ahead = min(loading_calls, 3)  # decoded while loading: until 40 bytes are held (3 units of 16)
    expected = [f"decode {i}" for i in range(ahead)] + [f"use {i}" for i in range(ahead)]
    for i in range(ahead, 6):
        expected += [f"decode {i}", f"use {i}"]
    assert events == expected


def test_a_session_under_a_memory_budget_decodes_nothing_ahead(tmp_path, monkeypatch) -> None:
    """Several rounds (a memory budget): while Numba loads, a hash bucket task still decodes each unit when it
    uses it, holding nothing beyond what the budget sized; a single round decodes ahead."""
    cat = Catalog(tmp_path / "lake")
    for v in range(2):
        cat.append("H.T", (), "upsert", [pa.table({"k": pa.array(range(50), pa.int64()), "t": pa.array([v] * 50)})])
    session = plan_session(cat, "H.T", CompactOptions(primary_keys=["k"], sort_keys=[("t", "ascending")]), (), lambda m: None)
    assert isinstance(session, PlannedSession)
    ahead: list[int] = []
    decoded_ahead = hash_bucket._decoded_ahead
    monkeypatch.setattr(hash_bucket, "_decoded_ahead", lambda tables: ahead.append(1) or decoded_ahead(tables))
    _loading_for(monkeypatch, 1000)
    for rounds in ((tuple(session.deltas),), tuple((d,) for d in session.deltas)):
        sizing = SessionSizing(2, 1 << 40, rounds, session.base_version)
        plan = build_round_plan(cat, session.spec, sizing, session.prior, sizing.rounds, session.base_version + 1, 1)
        ahead.clear()
        for k, groups in enumerate(plan.hash_groups):
            for group in groups:
                hash_bucket_files(cat.storage, plan, group)
        assert bool(ahead) == (len(rounds) == 1), rounds
