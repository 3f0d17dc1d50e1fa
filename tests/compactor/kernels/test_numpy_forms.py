"""The NumPy forms of the index walks (kernels/numpy_forms.py) against the kernels' own Python source, on random
inputs that include every error code: the same return value and the same bytes written, chunk after chunk.

(The dedupe kernels' forms run under test_compiled.py's three-form fixture, and whole compactions under
test_jit.py.)"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_helpers import kernel_form
from flash_pipeline.compactor.kernels import index_kernels, numpy_forms

FAST = settings(max_examples=200, deadline=None)
SORT_WIDTH = 3


def _index_rows(rng: np.random.Generator, pointers: list[tuple[int, int]]) -> np.ndarray:
    """Raw index rows: random digest and sort bytes, the pointers big-endian at bytes 20..28."""
    rows = rng.integers(0, 256, (len(pointers), 28 + SORT_WIDTH), dtype=np.uint8)
    for i, (f, r) in enumerate(pointers):
        rows[i, 20:24] = np.frombuffer(int(f).to_bytes(4, "big"), dtype=np.uint8)
        rows[i, 24:28] = np.frombuffer(int(r).to_bytes(4, "big"), dtype=np.uint8)
    return rows


@st.composite
def walks(draw: st.DrawFn) -> dict[str, Any]:
    """Prior units (file, first row) and index rows pointing into them: ascending unless drawn otherwise, some
    before the first unit when drawn so; some units carried, some rows lost."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n_units = draw(st.integers(0, 5)) or draw(st.integers(0, 5))  # rarely none
    starts = sorted({(int(f), int(r)) for f, r in zip(rng.integers(1, 4, n_units), rng.integers(0, 4, n_units))})
    unit_keys = np.array([(f << 40) | r for f, r in starts], dtype=np.int64)
    n = draw(st.integers(0, 40))
    lowest = 0 if draw(st.integers(0, 4)) == 0 else 1  # file 0 lies before every unit
    pointers = sorted({(int(f), int(r)) for f, r in zip(rng.integers(lowest, 4, n), rng.integers(0, 60, n))})
    if pointers and draw(st.integers(0, 3)) == 0:  # out of order somewhere
        i = draw(st.integers(0, len(pointers) - 1))
        pointers.insert(i, pointers[draw(st.integers(0, len(pointers) - 1))])
    m = len(unit_keys)
    lost = np.flatnonzero(rng.random(len(pointers)) < 0.3).astype(np.int64)
    ranks = (rng.integers(0, max(m, 1), k := draw(st.integers(0, 30))) << 40) | rng.integers(0, 60, k)
    return {
        "rows": _index_rows(rng, pointers), "unit_keys": unit_keys, "lost_at": lost,
        # the ranks of lost rows: each once, and never a row an index row still points at (a row is lost or kept;
        # drawn otherwise, the two forms met inputs the writer never gives them and differed)
        "lost_ranks": np.setdiff1d(ranks, _kept_ranks(pointers, unit_keys, lost)).astype(np.int64),
        "lost_src_first": rng.integers(0, 3, m).astype(np.int64),
        "carried": np.where(rng.random(m) < 0.4, rng.integers(1, 9, m), 0).astype(np.int64),
        "block_start0": rng.integers(0, 30, m).astype(np.int64),
        "task_of_src": rng.integers(0, 2, m).astype(np.int64),
        "task_file_base": np.array([3, 11], dtype=np.int64),
        "rows_per_file": draw(st.integers(1, 9)),
        "chunks": draw(st.integers(1, 3)),
    }


def _kept_ranks(pointers: list[tuple[int, int]], unit_keys: np.ndarray, lost: np.ndarray) -> np.ndarray:
    """(unit << 40) | rank in unit of every pointer not lost, as the walk ranks it (the last unit at or before it)."""
    keys = np.array([(f << 40) | r for f, r in pointers], dtype=np.int64)
    kept = np.setdiff1d(np.arange(len(keys)), lost)
    units = np.searchsorted(unit_keys, keys[kept], side="right") - 1
    ok = units >= 0
    in_unit = (keys[kept][ok] & ((1 << 40) - 1)) - (unit_keys[units[ok]] & ((1 << 40) - 1))
    return (units[ok].astype(np.int64) << 40) | in_unit


def _source(kernel: Any) -> Any:
    """The kernel as its Python source (its callees too)."""

    def call(*args: Any) -> Any:
        with kernel_form("interpreted"):
            return kernel(*args)

    return call


def _repoint(kernel: Any, w: dict[str, Any]) -> tuple[list[int], bytes, list[int]]:
    """Run the streaming walk chunk by chunk as the index writer does: statuses, the output bytes, the state."""
    rows, n = w["rows"], len(w["rows"])
    out = np.zeros((n, 28 + SORT_WIDTH), dtype=np.uint8)
    state = np.array([0, -1, 0, 0, 0, n - 1, -1, -1], dtype=np.int64)
    statuses = []
    bounds = np.linspace(0, n, w["chunks"] + 1).astype(int)
    for a, b in zip(bounds[:-1], bounds[1:]):
        lost = w["lost_at"][(w["lost_at"] >= a) & (w["lost_at"] < b)]
        state[3] = 0
        status = kernel(rows[a:b], int(a), lost, w["unit_keys"], w["lost_ranks"], w["lost_src_first"], w["carried"],
                        w["block_start0"], w["task_of_src"], w["task_file_base"], w["rows_per_file"], SORT_WIDTH, out,
                        state)
        statuses.append(int(status))
        if status < 0:
            return statuses, b"", []  # the writer stops at the first bad chunk; what the chunk wrote is not used
    return statuses, out.tobytes(), state.tolist()


@FAST
@given(walks())
def test_repoint_chunk_form_equals_the_kernels_source(w: dict[str, Any]) -> None:
    expected = _repoint(_source(index_kernels.repoint_chunk_kernel), w)
    assert _repoint(numpy_forms.repoint_chunk, w) == expected


@FAST
@given(walks(), st.integers(0, 2**32 - 1))
def test_prior_envelopes_form_equals_the_kernels_source(w: dict[str, Any], seed: int) -> None:
    rows = w["rows"]
    keep = np.random.default_rng(seed).random(len(rows)) < 0.7
    unit_row_start = np.random.default_rng(seed).integers(0, 5, len(w["unit_keys"])).astype(np.int64)
    outs = [np.zeros((len(rows), 28 + SORT_WIDTH), dtype=np.uint8) for _ in range(2)]
    got = [fn(rows, keep, w["unit_keys"], unit_row_start, SORT_WIDTH, out) for fn, out in
           zip((_source(index_kernels.prior_envelopes_kernel), numpy_forms.prior_envelopes), outs)]
    assert got[0] == got[1]
    if got[0] >= 0:
        assert outs[0][: got[0]].tobytes() == outs[1][: got[0]].tobytes()


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(0, 40), st.integers(1, 4), st.booleans())
def test_survivor_index_rows_form_equals_the_kernels_source(seed: int, n: int, sources: int, masked: bool) -> None:
    """Envelopes of one bucket (ranks ascending, sources in runs), some sources carried, others laid out in
    tasks' files."""
    rng = np.random.default_rng(seed)
    ranks = np.sort((rng.integers(0, sources, n).astype(np.int64) << 40) | rng.integers(0, 50, n))
    env = rng.integers(0, 256, (n, 28 + SORT_WIDTH), dtype=np.uint8)
    env[:, 20:28] = ranks.astype("<i8").view(np.uint8).reshape(n, 8)
    keep = rng.random(n) < 0.6 if masked else np.zeros(0, dtype=bool)
    args = (2, rng.integers(0, 20, (3, sources)).astype(np.int64), rng.integers(-1, 2, sources).astype(np.int64),
            np.array([1, 6], dtype=np.int64), int(rng.integers(1, 7)),
            np.where(rng.random(sources) < 0.4, rng.integers(1, 5, sources), 0).astype(np.int64),
            rng.integers(0, 9, sources).astype(np.int64), SORT_WIDTH)
    outs = [np.zeros((n, 28 + SORT_WIDTH), dtype=np.uint8) for _ in range(2)]
    got = [fn(env, keep, *args, out) for fn, out in
           zip((_source(index_kernels.survivor_index_rows_kernel), numpy_forms.survivor_index_rows), outs)]
    assert got[0] == got[1]
    assert outs[0].tobytes() == outs[1].tobytes()


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(0, 30), st.integers(0, 30), st.integers(0, 30))
def test_reverse_rows_form_equals_the_kernels_source(seed: int, n: int, start: int, end: int) -> None:
    rows = np.random.default_rng(seed).integers(0, 256, (n, 5), dtype=np.uint8)
    expected, got = rows.copy(), rows.copy()
    _source(index_kernels.reverse_rows_kernel)(expected, min(start, n), min(end, n))
    numpy_forms.reverse_rows(got, min(start, n), min(end, n))
    assert got.tobytes() == expected.tobytes()


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(0, 400), st.integers(1, 40), st.sampled_from([0, 1, 2, 9, 10]),
       st.sampled_from(["random", "first word shared", "all but its lowest byte shared"]))
def test_replay_form_equals_the_kernels_source(seed: int, n: int, distinct: int, width: int, prefix: str) -> None:
    """The replay form sorts by each digest's first word (its low bits replaced by the row number) and keeps the
    best row of each key by reductions: the same keep mask and deleted count as the kernel's source, also when
    different keys share the first word or all of it but the bits the row number replaces (the fallback)."""
    from flash_pipeline.compactor.kernels import compiled

    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, (distinct, 20), dtype=np.uint8)
    if prefix == "first word shared":
        pool[:, :8] = pool[0, :8]
    elif prefix == "all but its lowest byte shared":
        pool[:, 1:8] = pool[0, 1:8]
    digests = pool[rng.integers(0, distinct, n)]
    sort_bytes = rng.integers(0, 3, (n, width), dtype=np.uint8)  # few values: ties are common
    is_delete = rng.random(n) < 0.2
    counts = rng.random(n) < 0.8
    want_keep, want_deleted = _source(compiled.replay_kernel)(digests, sort_bytes, is_delete, counts)
    got_keep, got_deleted = numpy_forms.replay(digests, sort_bytes, is_delete, counts)
    assert got_keep.tolist() == want_keep.tolist()
    assert int(got_deleted) == int(want_deleted)


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(0, 300), st.integers(0, 300), st.booleans())
def test_member_form_is_set_membership_when_keys_share_their_first_word(seed: int, n_keys: int, n_probes: int,
                                                                         shared: bool) -> None:
    """The member form searches the keys' first 8 bytes as numbers and checks each hit on all 20; keys that
    share those bytes take the whole-digest search."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, (n_keys, 20), dtype=np.uint8)
    probes = rng.integers(0, 256, (n_probes, 20), dtype=np.uint8)
    if shared and n_keys:
        keys[:, :8] = keys[0, :8]
        probes[: n_probes // 2, :8] = keys[0, :8]  # non-members with a member's first word
    if n_keys and n_probes:
        take = rng.random(n_probes) < 0.3
        probes[take] = keys[rng.integers(0, n_keys, int(take.sum()))]
    numpy_forms._prepared.entry = None
    got = numpy_forms.member(keys, probes)
    members = {bytes(k) for k in keys}
    assert got.tolist() == [bytes(p) in members for p in probes]
