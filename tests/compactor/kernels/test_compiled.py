"""The compiled kernels of the hash bucket and dedupe steps against plain-Python models on random inputs."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_helpers import kernel_form
from flash_pipeline.compactor.kernels.compiled import dedupe_kernel, member_kernel, replay, replay_kernel
from flash_pipeline.compactor.kernels.index_kernels import append_by_bucket_kernel
from flash_pipeline.compactor.kernels.sha1 import buckets_kernel

FAST = settings(max_examples=150, deadline=None)


@pytest.fixture(autouse=True, scope="module", params=["compiled", "interpreted", "numpy"])
def form(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs on Numba's machine code, on the kernels' Python source and on their NumPy forms (kernels/jit.py)."""
    with kernel_form(request.param):
        yield request.param


def _digests(keys: list[int]) -> np.ndarray:
    """20-byte digests from small ints: equal keys give equal digests; the first 8 bytes collide often (tiny
    alphabet), so the open-addressing probes are exercised."""
    out = np.zeros((len(keys), 20), dtype=np.uint8)
    for i, k in enumerate(keys):
        out[i, 0] = k % 3
        out[i, 19] = k
    return out


@FAST
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 3), st.booleans()), max_size=60))
def test_dedupe_kernel_keeps_the_greatest_sort_key_of_each_key_after_its_last_delete(rows: list[tuple[int, int, bool]]) -> None:
    keys = [k for k, _, _ in rows]
    sort_bytes = np.array([[s] for _, s, _ in rows], dtype=np.uint8).reshape(len(rows), 1)
    is_delete = np.array([d for _, _, d in rows], dtype=np.bool_)
    keep, deleted = dedupe_kernel(_digests(keys), sort_bytes, is_delete)
    best: dict[int, int] = {}  # key -> row index of its current best upsert
    model_deleted = 0
    for i, (k, s, d) in enumerate(rows):
        if d:
            if k in best:
                model_deleted += 1
                del best[k]
        elif k not in best or s >= rows[best[k]][1]:  # equal sort keys: the later row wins
            best[k] = i
    assert sorted(np.flatnonzero(keep).tolist()) == sorted(best.values())
    assert deleted == model_deleted


@FAST
@given(st.lists(st.integers(0, 30), max_size=40), st.lists(st.integers(0, 30), max_size=60))
def test_member_kernel_is_set_membership(keys: list[int], probes: list[int]) -> None:
    got = member_kernel(_digests(keys), _digests(probes))
    assert got.tolist() == [p in set(keys) for p in probes]


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(0, 3000), st.integers(0, 3000))
def test_member_kernel_with_its_filter_is_set_membership_on_random_digests(form: str, seed: int, n_keys: int, n_probes: int) -> None:
    """Random digests (as SHA-1's are) exercise the bitmap filter in front of the table: it may only pass
    non-members, never drop a member."""
    if form == "interpreted":  # ~10 us a row as Python: a tenth of the rows keeps the test short
        n_keys, n_probes = n_keys // 10, n_probes // 10
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, (n_keys, 20), dtype=np.uint8)
    probes = rng.integers(0, 256, (n_probes, 20), dtype=np.uint8)
    if n_keys and n_probes:
        take = rng.random(n_probes) < 0.3
        probes[take] = keys[rng.integers(0, n_keys, int(take.sum()))]
    got = member_kernel(keys, probes)
    members = {bytes(k) for k in keys}
    assert got.tolist() == [bytes(p) in members for p in probes]


@FAST
@given(st.lists(st.lists(st.integers(0, 255), max_size=30), max_size=6), st.integers(1, 9), st.integers(1, 5), st.integers(1, 40))
def test_append_by_bucket_groups_stably_and_refuses_an_overflow_whole(batches: list[list[int]], bucket_count: int, width: int, capacity: int) -> None:
    """Batches appended one after another give each bucket its rows in input order; a batch that would overflow
    a bucket's region is refused and leaves every region as it was."""
    out = np.zeros((bucket_count * capacity, width), dtype=np.uint8)
    fill = np.zeros(bucket_count, dtype=np.int64)
    model: list[list[list[int]]] = [[] for _ in range(bucket_count)]
    serial = 0
    for values in batches:
        rows = np.array([[v] * width for v in values], dtype=np.uint8).reshape(len(values), width)
        rows[:, 0] = (serial + np.arange(len(values))) % 256  # rows distinguishable: stability is visible
        serial += len(values)
        buckets = np.array([v % bucket_count for v in values], dtype=np.int64)
        before = out.copy(), fill.copy()
        fits = all(len(model[b]) + int((buckets == b).sum()) <= capacity for b in range(bucket_count))
        assert bool(append_by_bucket_kernel(rows, buckets, out, capacity, fill)) == fits
        if fits:
            for i in range(len(values)):
                model[int(buckets[i])].append(rows[i].tolist())
        else:
            assert np.array_equal(out, before[0]) and np.array_equal(fill, before[1])
        assert fill.tolist() == [len(m) for m in model]
        for b in range(bucket_count):
            assert out[b * capacity : b * capacity + fill[b]].tolist() == model[b]


@FAST
@given(st.lists(st.binary(min_size=20, max_size=20), max_size=40), st.integers(1, 2**31 - 1))
def test_buckets_kernel_is_the_digest_as_a_big_integer_modulo_the_count(digests: list[bytes], bucket_count: int) -> None:
    arr = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(len(digests), 20)
    assert buckets_kernel(arr, bucket_count).tolist() == [int.from_bytes(d, "big") % bucket_count for d in digests]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2**32 - 1)), max_size=30))
def test_pointers_ascending_kernel_matches_the_model(pointers: list[tuple[int, int]]) -> None:
    """The pointer-order check of an index bucket: strictly ascending (file, row) pairs, as written."""
    from flash_pipeline.compactor.index.pk_index import in_pointer_order, index_dtype
    from flash_pipeline.compactor.kernels.index_kernels import pointers_ascending_kernel

    rows = np.zeros(len(pointers), dtype=index_dtype(0))
    rows["file"] = [f for f, _ in pointers]
    rows["row"] = [r for _, r in pointers]
    raw = rows.view(np.uint8).reshape(len(rows), rows.dtype.itemsize)
    assert pointers_ascending_kernel(raw) == all(a < b for a, b in zip(pointers, pointers[1:]))
    ordered = in_pointer_order(rows)
    assert [(int(f), int(r)) for f, r in zip(ordered["file"], ordered["row"])] == sorted(pointers)


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(0, 4000), st.integers(1, 60), st.integers(0, 3), st.integers(2, 64))
def test_partitioned_replay_equals_one_table(form: str, seed: int, n: int, distinct: int, width: int, partition_rows: int) -> None:
    """Replaying partition by partition (by digest) keeps, deletes and counts exactly as one pass over all rows,
    with repeated keys, deletes, uncounted summary rows and sort key ties."""
    if form == "interpreted":
        n //= 10
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, (max(1, distinct * 20), 20), dtype=np.uint8)
    digests = pool[rng.integers(0, len(pool), n)]
    sort_bytes = rng.integers(0, 3, (n, width), dtype=np.uint8)  # few values: ties are common
    is_delete = rng.random(n) < 0.2
    counts = rng.random(n) < 0.8
    want_keep, want_deleted = replay_kernel(digests, sort_bytes, is_delete, counts)
    got_keep, got_deleted = replay(digests, sort_bytes, is_delete, counts, partition_rows)
    assert got_keep.tolist() == want_keep.tolist()
    assert int(got_deleted) == int(want_deleted)
