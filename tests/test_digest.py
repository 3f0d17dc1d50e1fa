"""The compiled digest kernels against plain-Python references (hashlib, int.from_bytes, sorted())."""

from __future__ import annotations

import hashlib
import math
import os

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.compactor import digest


def test_sha1_kernel_matches_hashlib_across_block_boundaries() -> None:
    lengths = list(range(0, 130)) + [183, 184, 247, 248, 1000]
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    buf = np.frombuffer(os.urandom(int(offsets[-1])), dtype=np.uint8)
    got = digest.sha1_rows(buf, offsets)
    raw = buf.tobytes()
    expected = [hashlib.sha1(raw[a:b]).digest() for a, b in zip(offsets[:-1], offsets[1:])]
    assert [bytes(r) for r in got] == expected


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=12)), st.one_of(st.none(), st.integers(-2**63, 2**63 - 1))), min_size=1, max_size=30)
)
def test_framing_kernels_match_numpy_and_keys_are_unambiguous(rows: list) -> None:
    table = pa.table({"s": [r[0] for r in rows], "i": pa.array([r[1] for r in rows], pa.int64())})
    buf, offsets = digest.primary_key_bytes(table, ["i", "s"])
    saved = digest._frame_fixed, digest._frame_var
    try:
        digest._frame_fixed = digest._frame_var = None  # the NumPy path
        buf2, offsets2 = digest.primary_key_bytes(table, ["i", "s"])
    finally:
        digest._frame_fixed, digest._frame_var = saved
    assert (offsets == offsets2).all() and (buf == buf2).all()
    frames = {buf[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:])}
    assert len(frames) == len(set(rows)), "different keys must frame differently, equal keys equally"


def test_null_empty_and_the_string_null_are_three_keys() -> None:
    table = pa.table({"s": [None, "", "null"], "t": ["ab", "ab", "ab"]})
    d = digest.primary_key_digests(table, ["s", "t"])
    assert len({bytes(r) for r in d}) == 3
    joined = digest.primary_key_digests(pa.table({"a": ["ab", "a"], "b": ["c", "bc"]}), ["a", "b"])
    assert bytes(joined[0]) != bytes(joined[1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(min_size=20, max_size=20), min_size=1, max_size=50), st.integers(1, 2**31 - 1))
def test_hash_buckets_equal_int_from_bytes_modulo(digests: list[bytes], n: int) -> None:
    arr = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 20)
    assert digest.hash_buckets(arr, n).tolist() == [int.from_bytes(x, "big") % n for x in digests]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.floats(allow_nan=True, width=64)), min_size=2, max_size=30),
    st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)), min_size=2, max_size=30),
    st.sampled_from(["ascending", "descending"]),
)
def test_sort_key_bytes_order_like_the_values(floats: list, ints: list, direction: str) -> None:
    """memcmp order of the bytes == value order (nulls lowest in both directions; -0.0 == 0.0; NaN above all)."""
    for values, typ in ((floats, pa.float64()), (ints, pa.int64())):
        b = digest.sort_key_bytes(pa.table({"x": pa.array(values, typ)}), [("x", direction)])
        encoded = [bytes(r) for r in b]

        def rank(v: object) -> tuple:  # the reference order
            if v is None:
                return (0,)
            if isinstance(v, float) and math.isnan(v):
                return (1, 1, 0.0) if direction == "ascending" else (1, 0, 0.0)
            v = v + 0.0 if isinstance(v, float) else v  # -0.0 -> 0.0
            return (1, 0, v) if direction == "ascending" else (1, 1, -v)

        for i in range(len(values)):
            for j in range(len(values)):
                ri, rj = rank(values[i]), rank(values[j])
                assert (encoded[i] < encoded[j]) == (ri < rj), (values[i], values[j], direction)
                assert (encoded[i] == encoded[j]) == (ri == rj), (values[i], values[j], direction)
