"""NumPy forms of the kernels an incremental round runs: the same semantics as whole-array operations.

Loading Numba costs a fresh process ~0.6 s (jit.py), more than all the kernel work of a 1% update of a 5M-row
table (a 50,000-row delta probed against the index's rows: ~0.15 s compiled). These forms run that work without
Numba at ~10-400 ns a row (sorting, searchsorted, fancy indexing), so a fresh ``flash-compactor compact`` of a
small delta never loads it; each declares its cost a row, which jit.py charges against the same budget that
buys Numba for large jobs. Each form returns exactly what its kernel returns, error codes included
(tests/compactor/kernels: every kernel test runs on all three forms).
"""

from __future__ import annotations

import threading

import numpy as np

from flash_pipeline.compactor.kernels import compiled, index_kernels

_LOW40 = (1 << 40) - 1
_FILTER_BITS = 23  # the member filter's table: 2^23 flags (8 MiB), from digest bytes 8..10; 0.6% of non-members pass
_prepared = threading.local()  # each thread's last member table: the index probe calls once a chunk, same keys


def _void(digests: np.ndarray) -> np.ndarray:
    """Each row's first 20 bytes as one comparable value (NumPy compares void values as bytes)."""
    return np.ascontiguousarray(digests[:, :20]).view("V20").ravel()


def _word(rows: np.ndarray, at: int, dtype: str) -> np.ndarray:
    """The value of ``dtype`` at bytes ``at..`` of every row, read in place where the rows allow it."""
    width = np.dtype(dtype).itemsize
    try:
        return rows[:, at:at + width].view(dtype)[:, 0]
    except ValueError:  # a layout NumPy cannot reinterpret in place
        return np.ascontiguousarray(rows[:, at:at + width]).view(dtype)[:, 0]


def _filter_slot(digests: np.ndarray) -> np.ndarray:
    """The low _FILTER_BITS bits of the little-endian word at digest bytes 8..11 (uniform; the open-addressing
    kernels' home slot uses bytes 0..7)."""
    return _word(digests, 8, "<u4") & np.uint32((1 << _FILTER_BITS) - 1)


def _pointer_words(index_rows: np.ndarray) -> np.ndarray:
    """Bytes 20..28 of each raw index row (file u4, row u4 big-endian) as one big-endian u8: ordered as the
    pointers file << 40 | row are."""
    return _word(index_rows, 20, ">u8")


def _pointers(index_rows: np.ndarray) -> np.ndarray:
    """file << 40 | row of each raw index row, as int64."""
    both = np.ascontiguousarray(index_rows[:, 20:28]).view(">u8")[:, 0].astype(np.uint64)
    return (((both >> np.uint64(32)) << np.uint64(40)) | (both & np.uint64(0xFFFFFFFF))).view(np.int64)


def _first(mask: np.ndarray) -> int:
    """Position of the first True of ``mask``, or its length."""
    at = int(np.argmax(mask)) if len(mask) else 0
    return at if len(mask) and mask[at] else len(mask)


def _runs_position(values: np.ndarray) -> np.ndarray:
    """Each element's position inside its run of equal consecutive values (0 at each run's start)."""
    n = len(values)
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]]) if n else np.zeros(0, dtype=np.int64)
    return np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))


def _first_unordered(rows: np.ndarray, keys: np.ndarray, last: int, none: int) -> int:
    """The first of ``rows`` whose key does not rise above the one before it (``last`` before the first)."""
    at = _first(keys <= np.r_[last, keys[:-1]])
    return int(rows[at]) if at < len(keys) else none


def _descending(start: int, m: int) -> slice:
    """Slots ``start, start - 1, ..., start - m + 1`` as a slice (a back-filled region; none when ``m`` is 0)."""
    if m == 0:
        return slice(0, 0)
    return slice(start, start - m if start - m >= 0 else None, -1)


def _write_index_rows(out: np.ndarray, source: np.ndarray, at: np.ndarray, slots: slice, f: np.ndarray,
                      r: np.ndarray, sort_width: int) -> None:
    """index_kernels._write_index_row for many rows: rows ``at`` of ``source`` into ``out[slots]``.

    Rows of the same width are copied whole, as one value each (a gather of ``at``), then their pointer bytes
    overwritten: copying the digest and sort columns through 2-D fancy indexing cost 25 ms of s3's 60 ms a
    250,000-row chunk (repoint_chunk), the whole-row gather 8 ms."""
    m = len(at)
    if m == 0:
        return
    dst = out[slots]
    width = 28 + sort_width
    if source.shape[1] == out.shape[1] == width and source.flags.c_contiguous and dst.shape[0] == m:
        dst.view(f"V{width}")[:, 0] = source.view(f"V{width}")[at, 0]
    else:
        dst[:, :20] = source[at, :20]
        dst[:, 28:width] = source[at, 28:width]
    dst[:, 20:24] = (f & 0xFFFFFFFF).astype(">u4").view(np.uint8).reshape(m, 4)
    dst[:, 24:28] = (r & 0xFFFFFFFF).astype(">u4").view(np.uint8).reshape(m, 4)


# ----- dedupe ---------------------------------------------------------------------------------------------------
@compiled.member_kernel.numpy_form(row_ns=60)
def member(keys: np.ndarray, probes: np.ndarray) -> np.ndarray:
    """member_kernel: a table of filter flags over the keys answers most probes; the rest are looked up exactly
    in the keys sorted by their first 8 bytes (a search on numbers), each hit then checked on all 20 bytes."""
    out = np.zeros(probes.shape[0], dtype=np.bool_)
    if keys.shape[0] == 0 or probes.shape[0] == 0:
        return out
    flags, firsts, order = _member_table(keys)
    candidates = np.flatnonzero(flags[_filter_slot(probes)])
    if len(candidates):
        wanted = probes[candidates, :20]
        if order is None:  # two keys share their first 8 bytes: whole digests compared as bytes
            whole = _void(wanted)
            at = np.minimum(np.searchsorted(firsts, whole), len(firsts) - 1)
            out[candidates[firsts[at] == whole]] = True
        else:
            first = _word(wanted, 0, "<u8")
            at = np.minimum(np.searchsorted(firsts, first), len(firsts) - 1)
            hit = (firsts[at] == first) & (keys[order[at], :20] == wanted).all(axis=1)
            out[candidates[hit]] = True
    return out


def _member_table(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The filter flags over ``keys``, their first 8 bytes as sorted numbers and the order that sorts them (or,
    should two different keys share those bytes, the sorted digests as bytes and None): kept by this thread for
    its next call with the same array. Sorting numbers instead of 20-byte values made s3's probe (25,000 keys,
    250,000 index rows a bucket) ~3 times faster."""
    entry = getattr(_prepared, "entry", None)
    if entry is not None and entry[0] is keys:
        return entry[1], entry[2], entry[3]
    _prepared.entry = None
    flags = np.zeros(1 << _FILTER_BITS, dtype=np.bool_)
    flags[_filter_slot(keys)] = True
    words = _word(keys, 0, "<u8")
    by_first = np.argsort(words)
    firsts = words[by_first]
    tied = np.flatnonzero(firsts[1:] == firsts[:-1])
    order: np.ndarray | None = by_first
    if len(tied) and not (keys[by_first[tied], :20] == keys[by_first[tied + 1], :20]).all():
        firsts, order = np.sort(_void(keys)), None
    _prepared.entry = (keys, flags, firsts, order)
    return flags, firsts, order


@compiled.replay_kernel.numpy_form(row_ns=400)
def replay(digests: np.ndarray, sort_bytes: np.ndarray, is_delete: np.ndarray, counts: np.ndarray
           ) -> tuple[np.ndarray, int]:
    """replay_kernel: rows grouped by digest (a sort), each key's best upsert after its last delete (greatest
    sort key bytes, ties to the later row), and the deletes that found a best row (where ``counts`` says)."""
    n = digests.shape[0]
    keep = np.zeros(n, dtype=np.bool_)
    if n == 0:
        return keep, 0
    order, changes = _by_key(_digest_words(digests))
    dele = is_delete[order].astype(np.bool_)
    g = np.cumsum(changes) - 1  # each row's key, numbered in sorted order
    start = np.flatnonzero(changes)
    size = np.diff(np.r_[start, n])
    seen: np.ndarray = np.cumsum(dele) - dele  # deletes before each row (all keys)
    before: np.ndarray = seen - np.repeat(seen[start], size)  # deletes before each row in its key
    last_delete = np.repeat(before[start + size - 1] + dele[start + size - 1], size)
    final = ~dele & (before == last_delete)  # upserts after the key's last delete
    rows, keys = order[final], g[final]
    keep[_best_of_each_key(rows, keys, _sort_words(sort_bytes[rows]))] = True
    deletes = np.flatnonzero(dele)  # a delete erases a best row iff an upsert of its key came since the last one
    key_start = np.repeat(start, size)[deletes]
    previous = np.maximum(np.r_[-1, deletes[:-1]], key_start - 1)
    erased = (deletes - previous > 1) & counts[order][deletes].astype(np.bool_)
    return keep, int(erased.sum())


def _by_key(words: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The order that groups rows by key, each key's rows in rank (input) order, and where each key's rows begin
    in it. One sort of numbers: each row's first digest word with its low bits replaced by the row's index (so
    the sort needs no stability), checked to group whole digests (else all three words are sorted by): 10.6 ms
    -> ~2 ms for s3's 50,000 rows a bucket."""
    n = len(words[0])
    bits = max(1, (n - 1).bit_length())
    low = np.uint64((1 << bits) - 1)
    packed = np.sort((words[0] & ~low) | np.arange(n, dtype=np.uint64))
    order = (packed & low).astype(np.intp)
    prefix = packed >> np.uint64(bits)
    tied = prefix[1:] == prefix[:-1]
    same = tied.copy()
    for w in words:
        sorted_w = w[order]
        same &= sorted_w[1:] == sorted_w[:-1]
    if not np.array_equal(same, tied):  # two keys share the prefix: sort by all three words, then rank
        order = np.lexsort((np.arange(n), *reversed(words)))
        tied = np.ones(n - 1, dtype=np.bool_)
        for word in words:
            w = word[order]
            tied &= w[1:] == w[:-1]
    return order, np.r_[True, ~tied]


def _best_of_each_key(rows: np.ndarray, keys: np.ndarray, sort_words: list[np.ndarray]) -> np.ndarray:
    """Of ``rows`` (grouped by ascending ``keys``, ascending within a key), the row of each key with the greatest
    sort key, ties to the later row: the greatest of each word in turn among the rows still tied (a reduction
    per key), then the last row left of each key. A lexsort of s3's 50,000 rows by key, 2 words and row took
    22 ms."""
    if len(rows) == 0:
        return rows
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    sizes = np.diff(np.r_[starts, len(rows)])
    alive = np.ones(len(rows), dtype=np.bool_)
    for word in sort_words:
        w = word.astype(np.uint64)
        best = np.maximum.reduceat(np.where(alive, w, np.uint64(0)), starts)
        alive &= w == np.repeat(best, sizes)
    at = np.flatnonzero(alive)
    last = np.r_[keys[at][1:] != keys[at][:-1], True]
    return rows[at[last]]


def _sort_words(sort_bytes: np.ndarray) -> list[np.ndarray]:
    """Rows of sort key bytes as big-endian 8-byte numbers, most significant first: the same order as the bytes
    (compared as fewer, wider keys: s1's 9 bytes are 2 numbers, not 9 sort keys)."""
    m, width = sort_bytes.shape
    if width == 0:
        return []
    padded = np.zeros((m, -(-width // 8) * 8), dtype=np.uint8)
    padded[:, :width] = sort_bytes
    words = padded.view(">u8")
    return [words[:, j] for j in range(words.shape[1])]


def _digest_words(digests: np.ndarray) -> tuple[np.ndarray, ...]:
    """A digest's 20 bytes as three numbers (bytes 0..7, 8..15, 16..19): equal digests, equal triples."""
    return _word(digests, 0, "<u8"), _word(digests, 8, "<u8"), _word(digests, 16, "<u4")


@compiled.replay_partitioned_kernel.numpy_form(row_ns=400)
def replay_partitioned(digests: np.ndarray, sort_bytes: np.ndarray, is_delete: np.ndarray, counts: np.ndarray,
                       parts_log2: int) -> tuple[np.ndarray, int]:
    """replay_partitioned_kernel: partitions only serve the compiled kernel's cache; the sort needs none."""
    return replay(digests, sort_bytes, is_delete, counts)


# ----- index walks ----------------------------------------------------------------------------------------------
@index_kernels.pointers_ascending_kernel.numpy_form(row_ns=10)
def pointers_ascending(index_rows: np.ndarray) -> bool:
    """pointers_ascending_kernel."""
    words = _pointer_words(index_rows)
    return bool(len(words) < 2 or np.all(words[1:] > words[:-1]))


def _units_and_rows(ptr: np.ndarray, prev: int, unit_keys: np.ndarray) -> tuple[np.ndarray, int, int]:
    """The unit of each pointer (the last starting at or before it) and the first bad row with its code (-1:
    pointers not strictly ascending after ``prev``; -2: a pointer before the first unit), as the walk meets
    them; (units, len, 0) when none."""
    units = np.searchsorted(unit_keys, ptr, side="right") - 1
    falls = _first(ptr <= np.r_[prev, ptr[:-1]])
    before = _first(units < 0)
    if falls <= before and falls < len(ptr):
        return units, falls, -1
    return (units, before, -2) if before < len(ptr) else (units, len(ptr), 0)


@index_kernels.prior_envelopes_kernel.numpy_form(row_ns=60, rows_arg=0)
def prior_envelopes(index_rows: np.ndarray, keep: np.ndarray, unit_keys: np.ndarray, unit_row_start: np.ndarray,
                    sort_width: int, out: np.ndarray) -> int:
    """prior_envelopes_kernel."""
    ptr = _pointers(index_rows)
    units, _, status = _units_and_rows(ptr, -1, unit_keys)
    if status < 0:
        return status
    at = np.flatnonzero(keep)
    u = units[at]
    rank = (u << 40) | ((ptr[at] & _LOW40) - unit_row_start[u])
    m = len(at)
    out[:m, :20] = index_rows[at, :20]
    out[:m, 20:28] = rank.astype("<i8").view(np.uint8).reshape(m, 8)
    out[:m, 28:28 + sort_width] = index_rows[at, 28:28 + sort_width]
    return m


@index_kernels.append_by_bucket_kernel.numpy_form(row_ns=60, rows_arg=0)
def append_by_bucket(rows: np.ndarray, buckets: np.ndarray, out: np.ndarray, capacity: int, fill: np.ndarray
                     ) -> bool:
    """append_by_bucket_kernel: a stable sort by bucket, then one scatter."""
    buckets = buckets.astype(np.intp)
    add = np.bincount(buckets, minlength=fill.shape[0]).astype(fill.dtype)
    if np.any(fill + add > capacity):
        return False
    order = np.argsort(buckets, kind="stable")
    b = buckets[order]
    start = np.cumsum(add) - add
    out[b * capacity + fill[b] + (np.arange(len(b)) - start[b])] = rows[order]
    fill += add
    return True


@index_kernels.survivor_index_rows_kernel.numpy_form(row_ns=100, rows_arg=0)
def survivor_index_rows(envelopes: np.ndarray, keep: np.ndarray, bucket: int, block_start: np.ndarray,
                        task_of_src: np.ndarray, task_file_base: np.ndarray, rows_per_file: int,
                        carried_file_number: np.ndarray, src_row_start: np.ndarray, sort_width: int,
                        out: np.ndarray) -> int:
    """survivor_index_rows_kernel."""
    at = np.arange(envelopes.shape[0]) if keep.shape[0] == 0 else np.flatnonzero(keep)
    m = len(at)
    rank = np.ascontiguousarray(envelopes[at, 20:28]).view("<i8").ravel()
    src, row = rank >> 40, rank & _LOW40
    offset = block_start[bucket, src] + _runs_position(src)
    task = np.maximum(task_of_src[src], 0)
    carried = carried_file_number[src]
    f = np.where(carried > 0, carried, task_file_base[task] + offset // rows_per_file)
    r = np.where(carried > 0, src_row_start[src] + row, offset % rows_per_file)
    _write_index_rows(out, envelopes, at, slice(0, m), f.astype(np.int64), r.astype(np.int64), sort_width)
    return m


@index_kernels.repoint_chunk_kernel.numpy_form(row_ns=150, rows_arg=0)
def repoint_chunk(index_rows: np.ndarray, first: int, lost_at: np.ndarray, unit_keys: np.ndarray,
                  lost_ranks: np.ndarray, lost_src_first: np.ndarray, carried_file_number: np.ndarray,
                  block_start0: np.ndarray, task_of_src: np.ndarray, task_file_base: np.ndarray, rows_per_file: int,
                  sort_width: int, out: np.ndarray, state: np.ndarray) -> int:
    """repoint_chunk_kernel: the walk's cursors become searchsorted, its two regions two scatters."""
    n = index_rows.shape[0]
    if n == 0:
        return 0
    la0 = int(state[3])
    ptr = _pointers(index_rows)
    units, bad_at, status = _units_and_rows(ptr, int(state[1]), unit_keys)
    # the lost positions the walk's cursor meets: consecutive entries of lost_at equal to this chunk's positions
    hi = la0 + int(np.searchsorted(lost_at[la0:], first + n))
    met = lost_at[la0:hi] if la0 >= len(lost_at) or lost_at[la0] >= first else lost_at[la0:la0]
    lost = np.zeros(n, dtype=np.bool_)
    lost[met - first] = True
    at = np.flatnonzero(~lost[:bad_at])
    u = units[at]
    r = ptr[at] & _LOW40
    carried = carried_file_number[u] > 0
    in_unit = r - (unit_keys[u] & _LOW40)
    # the walk's lost_ranks cursor, advanced by rewritten rows only, never back: the ranks ascend with the
    # pointers (checked above), so the searches do too and only the cursor's start bounds them
    c = np.searchsorted(lost_ranks, (u << 40) | in_unit)
    np.maximum(c, int(state[2]), out=c)
    q, row = np.divmod(block_start0[u] + in_unit - (c - lost_src_first[u]), rows_per_file)
    f = task_file_base[task_of_src[u]] + q
    if carried.any():
        rewritten = ~carried
        f = np.where(carried, carried_file_number[u], f)
        row = np.where(carried, r, row)
        front, f_front, row_front = at[carried], f[carried], row[carried]
        back, f_back, row_back, c_back = at[rewritten], f[rewritten], row[rewritten], c[rewritten]
    else:  # every row of the chunk moves into rewritten files (spread updates without vectors): no masks
        front, f_front, row_front = at[:0], f[:0], row[:0]
        back, f_back, row_back, c_back = at, f, row, c
    key_front, key_back = (f_front << 40) | row_front, (f_back << 40) | row_back
    unordered = min(_first_unordered(front, key_front, int(state[6]), n),
                    _first_unordered(back, key_back, int(state[7]), n))
    if status < 0 or unordered < n:
        return -3 if unordered < bad_at else status
    _write_index_rows(out, index_rows, front, slice(int(state[4]), int(state[4]) + len(front)), f_front, row_front,
                      sort_width)
    _write_index_rows(out, index_rows, back, _descending(int(state[5]), len(back)), f_back, row_back, sort_width)
    state[0], state[1], state[3] = units[-1], ptr[-1], la0 + len(met)
    if len(back):
        state[2], state[7] = c_back[-1], key_back[-1]
    if len(front):
        state[6] = key_front[-1]
    state[4] += len(front)
    state[5] -= len(back)
    return 0


@index_kernels.reverse_rows_kernel.numpy_form(row_ns=5)
def reverse_rows(rows: np.ndarray, start: int, end: int) -> None:
    """reverse_rows_kernel."""
    if end - start > 1:
        rows[start:end] = rows[start:end][::-1].copy()


# the uncompiled work a round does for each delta row (framing, SHA-1, replay, scatter, index row) and for each
# prior index row it probes (membership, the pointer check): what jit.expect_work weighs against loading Numba
DELTA_ROW_NS = 1_600
PRIOR_ROW_NS = 70


def expected_round_ns(delta_rows: int, prior_rows: int) -> int:
    """Nanoseconds of uncompiled kernel work a round on these rows costs at least."""
    return delta_rows * DELTA_ROW_NS + prior_rows * PRIOR_ROW_NS
