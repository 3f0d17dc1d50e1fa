"""Compiled kernels of the materialize and index steps: the stable scatter of envelopes by bucket, and the walks
that build and re-point primary key index rows to the compacted files (carried and rewritten).

Each is one pass without temporaries over arrays a round may hold millions of; the pure-Python meaning of each
is in its docstring and in tests/compactor/kernels/test_compiled.py.
"""

from __future__ import annotations

import numpy as np

from flash_pipeline.compactor.kernels.jit import njit  # Numba's, loaded only when a call is large enough (jit.py)


@njit(cache=True, nogil=True, inline='always')
def _pointer(index_rows, i):
    """file << 40 | row of raw index row ``i`` (file u4 and row u4 big-endian at bytes 20..28)."""
    f = np.int64(0)
    for b in range(20, 24):
        f = (f << np.int64(8)) | np.int64(index_rows[i, b])
    r = np.int64(0)
    for b in range(24, 28):
        r = (r << np.int64(8)) | np.int64(index_rows[i, b])
    return (f << np.int64(40)) | r


@njit(cache=True, nogil=True)
def pointers_ascending_kernel(index_rows):
    """Are the raw index rows' pointers (file u4, row u4 big-endian at bytes 20..28) strictly ascending? One
    pass, no temporaries: every index this engine writes is, so the check must cost nothing but a read."""
    prev = np.int64(-1)
    for i in range(index_rows.shape[0]):
        ptr = _pointer(index_rows, i)
        if ptr <= prev:
            return False
        prev = ptr
    return True


@njit(cache=True, nogil=True, inline='always')
def _unit_at(unit_keys, u, ptr):
    """The unit cursor moved forward to the last unit starting at or before ``ptr``; -1 when ``ptr`` lies
    before the first unit (or there are none)."""
    n_units = unit_keys.shape[0]
    while u + 1 < n_units and unit_keys[u + 1] <= ptr:
        u += 1
    if n_units == 0 or ptr < unit_keys[u]:
        return -1
    return u


@njit(cache=True, nogil=True, inline='always')
def _next_pointer(index_rows, i, prev, unit_keys, u):
    """Index row ``i``'s pointer and the unit cursor moved to it, and 0; or -1 when pointers do not strictly
    ascend, -2 when the pointer lies before the first unit (the error codes of the kernels that walk pointers)."""
    ptr = _pointer(index_rows, i)
    if ptr <= prev:
        return ptr, u, -1
    u = _unit_at(unit_keys, u, ptr)
    return ptr, u, (-2 if u < 0 else 0)


@njit(cache=True, nogil=True, inline='always')
def _repointed(u, r, c, unit_keys, lost_ranks, lost_src_first, carried_file_number, block_start0, task_of_src,
               task_file_base, rows_per_file):
    """New (file, row) of row ``r`` of prior unit ``u`` and the advanced ``lost_ranks`` cursor ``c``: a carried
    unit's row keeps its index; a rewritten unit's row moves up by the rows its unit lost before it."""
    carried = carried_file_number[u]
    if carried > 0:
        return carried, r, c
    in_unit = r - (unit_keys[u] & ((np.int64(1) << np.int64(40)) - 1))
    rank = (np.int64(u) << np.int64(40)) | in_unit
    while c < lost_ranks.shape[0] and lost_ranks[c] < rank:
        c += 1
    offset = block_start0[u] + in_unit - (c - lost_src_first[u])
    return task_file_base[task_of_src[u]] + offset // rows_per_file, offset % rows_per_file, c


@njit(cache=True, nogil=True)
def _walk_pointers(index_rows, unit_keys, units, rows):
    """Unit (position in ``unit_keys``) and row index of every raw index row (file u4 and row u4 big-endian at
    bytes 20..28), with one unit cursor since pointers ascend. Returns 0, -1 when pointers are not strictly
    ascending, -2 when a pointer lies before the first unit."""
    u = 0
    prev = np.int64(-1)
    for i in range(index_rows.shape[0]):
        prev, u, bad = _next_pointer(index_rows, i, prev, unit_keys, u)
        if bad:
            return bad
        units[i] = u
        rows[i] = prev & np.int64(0xFFFFFFFFFF)
    return 0


@njit(cache=True, nogil=True, inline='always')
def _units_and_rows(index_rows, unit_keys):
    """_walk_pointers into new arrays: (unit of each index row, its row, status)."""
    unit_of = np.empty(index_rows.shape[0], dtype=np.int64)
    row_of = np.empty(index_rows.shape[0], dtype=np.int64)
    return unit_of, row_of, _walk_pointers(index_rows, unit_keys, unit_of, row_of)


@njit(cache=True, nogil=True)
def prior_envelopes_kernel(index_rows, keep, unit_keys, unit_row_start, sort_width, out):
    """Kept rows of a primary key index (raw big-endian rows, in pointer order) as envelope rows.

    ``index_rows`` is (n, 28 + k) bytes: digest, file (u4 BE), row (u4 BE), sort bytes. Each kept row becomes
    digest, rank (i8 little-endian: unit src << 40 | row inside the unit), sort bytes in ``out`` (m, 28 + k).
    Two linear passes (pointers, then the kept rows): an incremental round converts millions of index rows.
    Returns the rows written, -1 when pointers are not strictly ascending, -2 when a pointer lies before the
    first unit.
    """
    unit_of, row_of, status = _units_and_rows(index_rows, unit_keys)
    if status < 0:
        return status
    j = 0
    for i in np.flatnonzero(keep):
        u, r = unit_of[i], row_of[i]
        rank = (np.int64(u) << np.int64(40)) | (r - unit_row_start[u])
        for b in range(20):
            out[j, b] = index_rows[i, b]
        for b in range(8):
            out[j, 20 + b] = np.uint8((rank >> np.int64(8 * b)) & np.int64(255))
        for b in range(sort_width):
            out[j, 28 + b] = index_rows[i, 28 + b]
        j += 1
    return j


@njit(cache=True, nogil=True)
def append_by_bucket_kernel(rows, buckets, out, capacity, fill):
    """Append fixed-width ``rows`` (n, w bytes) to their bucket's region of ``out``, in input order: bucket b's
    rows are ``out[b * capacity : b * capacity + fill[b]]`` and ``fill`` is advanced. Returns False, having
    written nothing, when a region would overflow its ``capacity``."""
    n = rows.shape[0]
    w = rows.shape[1]
    add = np.zeros(fill.shape[0], dtype=np.int64)
    for i in range(n):
        add[buckets[i]] += 1
    for b in range(fill.shape[0]):
        if fill[b] + add[b] > capacity:
            return False
    for i in range(n):
        b = buckets[i]
        j = b * capacity + fill[b]
        for k in range(w):
            out[j, k] = rows[i, k]
        fill[b] += 1
    return True


@njit(cache=True, nogil=True, inline='always')
def _survivor_pointer(src, row, k, bucket, block_start, task_of_src, task_file_base, rows_per_file, carried_file_number,
                      src_row_start):
    """(file number, row index) of a new survivor: row ``row`` of source ``src``, its ``k``-th survivor in the
    bucket (see layout.index_pointers)."""
    carried = carried_file_number[src]
    if carried > 0:
        return carried, src_row_start[src] + row
    offset = block_start[bucket, src] + k
    task = task_of_src[src]
    if task < 0:
        task = 0
    return task_file_base[task] + offset // rows_per_file, offset % rows_per_file


@njit(cache=True, nogil=True, inline='always')
def _write_index_row(out, j, source, i, f, r, sort_width):
    """Index row ``j`` of ``out`` (pk_index layout): digest and sort key bytes of raw row ``i`` of ``source`` (an
    index row or an envelope: both hold them at bytes 0..19 and 28..), pointers (f, r) big-endian."""
    for b in range(20):
        out[j, b] = source[i, b]
    for b in range(sort_width):
        out[j, 28 + b] = source[i, 28 + b]
    for b in range(4):
        out[j, 23 - b] = np.uint8((f >> np.int64(8 * b)) & np.int64(255))
        out[j, 27 - b] = np.uint8((r >> np.int64(8 * b)) & np.int64(255))


@njit(cache=True, nogil=True)
def index_pointers_kernel(ranks, bucket, block_start, task_of_src, task_file_base, rows_per_file, carried_file_number,
                          src_row_start, files, rows):
    """(file number, row) of each survivor of one bucket, ranks ascending: see layout.index_pointers."""
    n = ranks.shape[0]
    mask = (np.int64(1) << np.int64(40)) - 1
    prev_src = np.int64(-1)
    k = np.int64(0)
    for i in range(n):
        src = ranks[i] >> np.int64(40)
        row = ranks[i] & mask
        if src != prev_src:
            prev_src = src
            k = 0
        files[i], rows[i] = _survivor_pointer(src, row, k, bucket, block_start, task_of_src, task_file_base,
                                              rows_per_file, carried_file_number, src_row_start)
        k += 1


@njit(cache=True, nogil=True)
def survivor_index_rows_kernel(envelopes, keep, bucket, block_start, task_of_src, task_file_base, rows_per_file,
                               carried_file_number, src_row_start, sort_width, out):
    """The index rows of one bucket's new survivors (raw envelopes, ranks ascending; with ``keep`` non-empty,
    only the envelopes it flags) in one pass: the pointers of index_pointers_kernel written straight into the
    rows merged_index_rows_kernel would build, with no arrays of ranks, file numbers, row indices and order in
    between (32 bytes a survivor). Returns the rows written. A source's envelopes all lie in one call's
    ``envelopes`` (one hash bucket task's output), so its survivors' count ``k`` starts at 0 in each call."""
    n = envelopes.shape[0]
    every = keep.shape[0] == 0
    mask = (np.int64(1) << np.int64(40)) - 1
    prev_src = np.int64(-1)
    k = np.int64(0)
    j = 0
    for i in range(n):
        if not every and not keep[i]:
            continue
        rank = np.int64(0)
        for b in range(8):  # the envelope's rank: little-endian int64 at byte 20
            rank |= np.int64(envelopes[i, 20 + b]) << np.int64(8 * b)
        src = rank >> np.int64(40)
        row = rank & mask
        if src != prev_src:
            prev_src = src
            k = 0
        f, r = _survivor_pointer(src, row, k, bucket, block_start, task_of_src, task_file_base, rows_per_file,
                                 carried_file_number, src_row_start)
        k += 1
        _write_index_row(out, j, envelopes, i, f, r, sort_width)
        j += 1
    return j


@njit(cache=True, nogil=True)
def prior_pointers_kernel(index_rows, keep, unit_keys, lost_ranks, lost_src_first, carried_file_number, block_start0,
                          task_of_src, task_file_base, rows_per_file, files, rows):
    """New (file number, row) of the kept rows of a prior index bucket (raw big-endian rows, pointer order).

    A prior unit (src = its position in ``unit_keys``) that lost no row anywhere is carried: its rows keep
    their row index in the renumbered file. A unit that lost rows is rewritten in its row order, so a kept
    row moves up by the rows its unit lost before it: ``lost_ranks`` (all buckets' removed prior rows, as
    ascending ranks) is walked with one cursor, since ranks rise with pointers. Writes the kept rows'
    pointers in input order; returns their count, -1 when pointers are not strictly ascending, -2 when a
    pointer lies before the first unit.
    """
    unit_of, row_of, status = _units_and_rows(index_rows, unit_keys)
    if status < 0:
        return status
    c = 0
    j = 0
    for i in np.flatnonzero(keep):
        files[j], rows[j], c = _repointed(unit_of[i], row_of[i], c, unit_keys, lost_ranks, lost_src_first,
                                          carried_file_number, block_start0, task_of_src, task_file_base, rows_per_file)
        j += 1
    return j


@njit(cache=True, nogil=True)
def repoint_chunk_kernel(index_rows, first, lost_at, unit_keys, lost_ranks, lost_src_first, carried_file_number,
                         block_start0, task_of_src, task_file_base, rows_per_file, sort_width, out, state):
    """One chunk of the index writer's streaming pass over a prior index bucket (raw rows ``first..first+n-1``,
    pointer order): every kept row (position not in ``lost_at``) re-pointed into the new layout, as
    prior_pointers_kernel does, and written as an index row into ``out``: rows of carried units from the front
    (``state[4]``, ascending slots), rows of rewritten units from the back (``state[5]``, descending slots; the
    caller reverses that region once). So the writer holds ``out`` and one chunk, never the whole prior bucket.

    ``state`` (int64, carried between chunks): unit cursor, previous input pointer, lost_ranks cursor, lost_at
    cursor, front slot, back slot, last front key, last back key. Returns 0; -1 when input pointers are not
    strictly ascending, -2 when a pointer lies before the first unit, -3 when a region's new pointers do not
    ascend (the caller falls back to sorting).
    """
    n_lost_at = lost_at.shape[0]
    u, prev, c, la = state[0], state[1], state[2], state[3]
    front, back, last_front, last_back = state[4], state[5], state[6], state[7]
    for i in range(index_rows.shape[0]):
        prev, u, bad = _next_pointer(index_rows, i, prev, unit_keys, u)
        if bad:
            return bad
        if la < n_lost_at and lost_at[la] == first + i:
            la += 1
            continue
        f, row, c = _repointed(u, prev & np.int64(0xFFFFFFFFFF), c, unit_keys, lost_ranks, lost_src_first,
                               carried_file_number, block_start0, task_of_src, task_file_base, rows_per_file)
        key = (f << np.int64(40)) | row
        if carried_file_number[u] > 0:
            if key <= last_front:
                return -3
            last_front = key
            j = front
            front += 1
        else:
            if key <= last_back:
                return -3
            last_back = key
            j = back
            back -= 1
        _write_index_row(out, j, index_rows, i, f, row, sort_width)
    state[0], state[1], state[2], state[3] = u, prev, c, la
    state[4], state[5], state[6], state[7] = front, back, last_front, last_back
    return 0


@njit(cache=True, nogil=True)
def reverse_rows_kernel(rows, start, end):
    """Reverse raw rows ``start..end-1`` in place (the index writer's back-filled region)."""
    i, j = start, end - 1
    w = rows.shape[1]
    while i < j:
        for b in range(w):
            t = rows[i, b]
            rows[i, b] = rows[j, b]
            rows[j, b] = t
        i += 1
        j -= 1


@njit(cache=True, nogil=True)
def merged_index_rows_kernel(prior_rows, prior_at, envelopes, order, files, rows, sort_width, out):
    """Index rows (pk_index layout) in pointer order from two sources: kept prior index rows (row
    ``prior_at[s]`` of ``prior_rows``, for ``s < len(prior_at)``) and new survivor envelopes (the rest).
    ``files``/``rows`` hold the new pointers of both, prior first; ``order`` is the output order."""
    m = prior_at.shape[0]
    n = order.shape[0]
    for i in range(n):
        s = order[i]
        if s < m:
            _write_index_row(out, i, prior_rows, prior_at[s], files[s], rows[s], sort_width)
        else:
            _write_index_row(out, i, envelopes, s - m, files[s], rows[s], sort_width)
