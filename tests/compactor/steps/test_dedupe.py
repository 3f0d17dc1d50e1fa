"""Step 2 (steps/dedupe.py::dedupe_bucket) against a plain-Python model of the paper's dedupe, on random buckets.

A bucket holds the prior primary key index rows (one per key, pointing into prior compacted units) and the new
envelopes of delta units in rank order. Model: every row in rank order (prior rows first), a delete erases its
key, an upsert replaces the key's best row when its sort key bytes are greater or equal. dedupe_bucket must
report exactly the model's survivors: new envelopes kept, and prior rows lost (the rest of the prior stay).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.model import IndexVersion
from flash_pipeline.compactor.index.pk_index import index_dtype
from flash_pipeline.compactor.model.plans import RoundPlan, SessionSpec, SourceFile, rank_of
from flash_pipeline.compactor.steps.dedupe import dedupe_bucket
from flash_pipeline.compactor.steps.hash_bucket import envelope_dtype

WIDTH = 2  # sort key bytes per row


def _digest(key: int) -> bytes:
    return bytes([key % 3]) + bytes(18) + bytes([key])  # tiny alphabet: shared 8-byte prefixes probe further


def _plan(prior_rows: int, deltas: list[tuple[bool, int]]) -> RoundPlan:
    """One prior compacted file (a single unit, src 0) and one unit per delta file (src 1..)."""
    spec = SessionSpec("T", "T", (), 1, ("k",), (("s", "ascending"),), WIDTH, ("k", "s"), "", 10, 10, ContentType.PARQUET, False)
    sources = [SourceFile(0, "prior", ContentType.PARQUET, prior_rows, 0, -1, 1, False, True)]
    for i, (is_delete, rows) in enumerate(deltas, 1):
        sources.append(SourceFile(i, f"d{i}", ContentType.PARQUET, rows, 0, i, 1, is_delete, False))
    index = IndexVersion(1, 1, WIDTH, ((),)) if prior_rows else None
    return RoundPlan("r", 2, spec, 1, tuple(sources), index, (), 1, "data", "index")


def _bucket_arrays(prior_keys: list, deltas: list) -> tuple[RoundPlan, np.ndarray, list[np.ndarray]]:
    """The plan, prior index rows and per-delta envelopes of a generated bucket."""
    plan = _plan(len(prior_keys), [(d, len(rows)) for d, rows in deltas])
    prior = np.empty(len(prior_keys), dtype=index_dtype(WIDTH))
    for r, (k, s) in enumerate(prior_keys):
        prior[r] = (_digest(k), 1, r, bytes([0, s]))
    envelopes = []
    for src, (_, rows) in enumerate(deltas, 1):
        env = np.empty(len(rows), dtype=envelope_dtype(WIDTH))
        for r, (k, s) in enumerate(rows):
            env[r] = (_digest(k), int(rank_of(src, r)), bytes([0, s]))
        envelopes.append(env)
    return plan, prior, envelopes


bucket_st = st.tuples(
    st.lists(st.tuples(st.integers(0, 11), st.integers(0, 5)), max_size=10, unique_by=lambda r: r[0]),  # prior (key, sort)
    st.lists(st.tuples(st.booleans(), st.lists(st.tuples(st.integers(0, 11), st.integers(0, 5)), max_size=8)), max_size=5),
)


@settings(max_examples=300, deadline=None)
@given(bucket_st)
def test_dedupe_bucket_matches_the_model(bucket: tuple[list, list]) -> None:
    prior_keys, deltas = bucket
    plan, prior, envelopes = _bucket_arrays(prior_keys, deltas)

    best: dict[int, tuple[str, int, int]] = {}  # key -> ("prior", index row, sort) or ("new", rank, sort)
    deleted = 0
    for r, (k, s) in enumerate(prior_keys):
        best[k] = ("prior", r, s)
    for src, (is_delete, rows) in enumerate(deltas, 1):
        for r, (k, s) in enumerate(rows):
            if is_delete:
                deleted += best.pop(k, None) is not None
            elif k not in best or s >= best[k][2]:
                best[k] = ("new", int(rank_of(src, r)), s)

    out = dedupe_bucket(plan, prior, envelopes)
    kept_prior = set(range(len(prior_keys))) - set(out.lost_at.tolist())
    assert kept_prior == {v[1] for v in best.values() if v[0] == "prior"}
    assert sorted(out.survivors["rank"].tolist()) == sorted(v[1] for v in best.values() if v[0] == "new")
    assert out.survivors["rank"].tolist() == sorted(out.survivors["rank"].tolist())  # ascending rank
    assert out.deleted == deleted
    assert out.survivor_rows == len(best)
    assert out.counts.tolist() == [0] + [sum(1 for v in best.values() if v[0] == "new" and v[1] >> 40 == s) for s in range(1, len(deltas) + 1)]
    assert out.upsert_rows == sum(len(rows) for d, rows in deltas if not d)
    assert out.delete_rows == sum(len(rows) for d, rows in deltas if d)
    assert out.lost_ranks.tolist() == sorted(out.lost_ranks.tolist())

    # a one-round session on Ray asks for the survivors' ranks alone (its index writer reads the envelopes by flag)
    ranks = dedupe_bucket(plan, prior, envelopes, ranks_only=True)
    assert ranks.survivors.dtype == np.int64 and ranks.survivors.tolist() == out.survivors["rank"].tolist()
    assert ranks.survivor_keep is not None and ranks.survivor_keep.tolist() == out.survivor_keep.tolist()
    new_rows = np.concatenate(envelopes) if envelopes else np.empty(0, dtype=envelope_dtype(WIDTH))
    assert new_rows["rank"][ranks.survivor_keep].tolist() == ranks.survivors.tolist()
    assert ranks.counts.tolist() == out.counts.tolist() and ranks.survivor_rows == out.survivor_rows
    assert (ranks.lost_at.tolist(), ranks.deleted) == (out.lost_at.tolist(), out.deleted)


@settings(max_examples=200, deadline=None)
@given(bucket=bucket_st, cuts=st.lists(st.integers(0, 5), max_size=3))
def test_dedupe_in_rounds_through_saved_state_equals_one_pass(tmp_path_factory, bucket: tuple[list, list], cuts: list[int]) -> None:
    """A session over budget dedupes its deltas in rounds: each round before the last saves its summary (per
    key its last delete and the best upsert after it), the last replays them all with its own rows. The output,
    counters included, must equal one pass over all deltas."""
    from flash_pipeline.catalog.storage import LocalStorage
    from flash_pipeline.compactor.steps.dedupe import _new_rows, summarize_round
    from flash_pipeline.compactor.steps.dedupe_state import load_run, save_run

    prior_keys, deltas = bucket
    plan, prior, envelopes = _bucket_arrays(prior_keys, deltas)
    whole = dedupe_bucket(plan, prior, envelopes)

    bounds = sorted({0, len(envelopes), *[min(c, len(envelopes)) for c in cuts]})
    storage = LocalStorage(tmp_path_factory.mktemp("state"))
    runs = []
    for n, (a, b) in enumerate(zip(bounds[:-2], bounds[1:-1])):
        save_run(storage, f"s/{n}.state", summarize_round(plan, _new_rows(plan, envelopes[a:b])))
        runs.append(load_run(storage, plan, f"s/{n}.state"))
    last = envelopes[bounds[-2]:] if len(bounds) > 1 else envelopes
    out = dedupe_bucket(plan, prior, last, runs)
    assert out.survivors.tobytes() == whole.survivors.tobytes()
    assert out.lost_at.tolist() == whole.lost_at.tolist()
    assert out.lost_ranks.tolist() == whole.lost_ranks.tolist()
    assert out.counts.tolist() == whole.counts.tolist()
    assert (out.upsert_rows, out.delete_rows, out.deleted) == (whole.upsert_rows, whole.delete_rows, whole.deleted)


def test_ranks_only_holds_no_copy_of_the_survivors_envelopes() -> None:
    """A one-round session on Ray keeps the survivors' ranks (8 bytes a row), never a copy of their envelopes:
    at a warm Ray's s1 peak that copy was 95 MB a dedupe task beside the bucket's 116 MB of envelopes."""
    import tracemalloc

    rng = np.random.default_rng(7)
    rows = 200_000
    plan = _plan(0, [(False, rows), (False, rows)])  # two hash bucket outputs: the bucket's rows of two tasks
    envelopes = []
    for src in (1, 2):
        env = np.empty(rows, dtype=envelope_dtype(WIDTH))
        env["digest"] = rng.integers(0, 256, size=(rows, 20), dtype=np.uint8).view("S20").ravel()
        env["rank"] = rank_of(src, np.arange(rows, dtype=np.int64))
        env["sort"] = rng.integers(0, 256, size=(rows, WIDTH), dtype=np.uint8).view(f"S{WIDTH}").ravel()
        envelopes.append(env)
    peaks = {}
    for ranks_only in (False, True, False, True):  # twice each: the first call of a form may load its kernels
        tracemalloc.start()
        out = dedupe_bucket(plan, np.empty(0, dtype=index_dtype(WIDTH)), envelopes, ranks_only=ranks_only)
        peaks[ranks_only] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert out.survivor_rows == 2 * rows  # random digests: every row is its own key
    copy = 2 * rows * (envelope_dtype(WIDTH).itemsize - 8)  # the survivors' envelopes beyond their ranks
    assert peaks[False] - peaks[True] > copy // 2, (peaks, copy)
