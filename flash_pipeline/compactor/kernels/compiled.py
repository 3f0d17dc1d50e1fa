"""Compiled kernels of the dedupe and index steps: the digest hash table (dedupe, membership probes), the
stable scatter of envelopes by bucket, and the walks that re-point primary key index rows to compacted files.

Each is one pass without temporaries over arrays a round may hold millions of; the pure-Python meaning of each
is in its docstring and in tests/compactor/kernels/test_compiled.py.
"""

from __future__ import annotations

import numpy as np

from flash_pipeline.compactor.kernels.jit import njit  # Numba's, loaded only when a call is large enough (jit.py)


@njit(cache=True, nogil=True, inline='always')
def _home_slot(digests, i, capmask):
    """Open-addressing start slot of row ``i``: its digest's first 8 bytes (already uniformly distributed)."""
    h = np.uint64(0)
    for j in range(8):
        h = (h << np.uint64(8)) | np.uint64(digests[i, j])
    return np.int64(h & np.uint64(capmask))


@njit(cache=True, nogil=True, inline='always')
def _filter_bit(digests, i):
    """A filter position from digest bytes 8..15 (the home slot uses bytes 0..7)."""
    h = np.uint64(0)
    for j in range(8, 16):
        h = (h << np.uint64(8)) | np.uint64(digests[i, j])
    return h


@njit(cache=True, nogil=True, inline='always')
def _same_digest(a, i, b, k):
    for j in range(20):
        if a[i, j] != b[k, j]:
            return False
    return True


@njit(cache=True, nogil=True)
def _digest_table(digests):
    """Group rows by digest in an open-addressing hash table (twice as many slots as rows, at least 16).

    Returns (slots: group id per slot or -1, capmask, first row of each group, group of each row, groups)."""
    n = digests.shape[0]
    cap = 16
    while cap < 2 * n:
        cap <<= 1
    capmask = cap - 1
    slots = np.full(cap, -1, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    group_of = np.empty(n, dtype=np.int64)
    groups = 0
    for i in range(n):
        pos = _home_slot(digests, i, capmask)
        while True:
            s = slots[pos]
            if s == -1:
                slots[pos] = groups
                first[groups] = i
                group_of[i] = groups
                groups += 1
                break
            if _same_digest(digests, first[s], digests, i):
                group_of[i] = s
                break
            pos = (pos + 1) & capmask
    return slots, capmask, first, group_of, groups


@njit(cache=True, nogil=True)
def dedupe_kernel(digests, sort_bytes, is_delete):
    """One pass over rows in rank order (position, file, row): the paper's O(n) dedupe with a comparator.

    Rows are grouped by digest in an open-addressing hash table. A delete row erases its key's current best
    row; an upsert row replaces the best row when its sort key bytes are greater or equal (equal: the later
    row wins, which is the greater (position, file number, row index)). Returns (keep mask, rows deleted).
    """
    return replay_kernel(digests, sort_bytes, is_delete, np.ones(digests.shape[0], dtype=np.bool_))


@njit(cache=True, nogil=True, inline='always')
def _wins(sort_bytes, i, b, k):
    """Does row ``i`` (later in rank) replace row ``b``: sort key bytes greater or equal."""
    for j in range(k):
        if sort_bytes[i, j] != sort_bytes[b, j]:
            return sort_bytes[i, j] > sort_bytes[b, j]
    return True


@njit(cache=True, nogil=True)
def replay_kernel(digests, sort_bytes, is_delete, counts):
    """dedupe_kernel over rows some of which are round summaries (round_summary_kernel): a delete's erasure of
    a best row adds to the deleted count only where ``counts`` says so (raw rows: always)."""
    n = digests.shape[0]
    k = sort_bytes.shape[1]
    _, _, _, group_of, groups = _digest_table(digests)
    best = np.full(max(groups, 1), -1, dtype=np.int64)
    deleted = 0
    for i in range(n):
        gi = group_of[i]
        if is_delete[i]:
            if best[gi] != -1:
                if counts[i]:
                    deleted += 1
                best[gi] = -1
        else:
            b = best[gi]
            if b == -1 or _wins(sort_bytes, i, b, k):
                best[gi] = i
    keep = np.zeros(n, dtype=np.bool_)
    for g in range(groups):
        if best[g] != -1:
            keep[best[g]] = True
    return keep, deleted


# rows per partition of replay_partitioned_kernel: its hash table (2 slots a row) and rows stay in cache
PARTITION_ROWS = 1 << 15


@njit(cache=True, nogil=True, inline='always')
def _partition_of(digests, i, mask):
    """Row ``i``'s partition: digest bytes 16..18, which neither the table's home slot nor the member filter uses."""
    return ((np.int64(digests[i, 16]) << 16) | (np.int64(digests[i, 17]) << 8) | np.int64(digests[i, 18])) & mask


# partitions are copied out in this many passes over the rows: each pass copies a quarter of them
REPLAY_PASSES_LOG2 = 2


@njit(cache=True, nogil=True)
def replay_partitioned_kernel(digests, sort_bytes, is_delete, counts, parts_log2):
    """replay_kernel, one partition of the rows at a time: a key's rows all fall in one partition (by its
    digest), in rank order, so each partition replays alone -- in a table and a copy of its rows that fit in
    cache, where one table over millions of rows misses the cache on every probe.

    The copies are made by reading the rows in order, in 2**REPLAY_PASSES_LOG2 passes that each copy the rows of
    a quarter of the partitions into one buffer (partition after partition, rank order kept). Gathering each
    partition's rows by index instead read them scattered over the whole array, a cache miss a row: 0.34 s
    against 0.17 s for a bucket of 3.1M rows, with about the same memory (a quarter of the rows' digest and
    sort bytes here; an 8-byte index a row there)."""
    n = digests.shape[0]
    k = sort_bytes.shape[1]
    P = 1 << parts_log2
    mask = np.int64(P - 1)
    part = np.empty(n, dtype=np.int32)
    start = np.zeros(P + 1, dtype=np.int64)
    for i in range(n):
        p = _partition_of(digests, i, mask)
        part[i] = p
        start[p + 1] += 1
    for p in range(P):
        start[p + 1] += start[p]
    passes = 1 << min(REPLAY_PASSES_LOG2, parts_log2)
    per = P // passes
    longest = 0
    for g in range(passes):
        longest = max(longest, start[(g + 1) * per] - start[g * per])
    ld = np.empty((longest, 20), dtype=np.uint8)
    ls = np.empty((longest, k), dtype=np.uint8)
    ldel = np.empty(longest, dtype=np.bool_)
    lcnt = np.empty(longest, dtype=np.bool_)
    lrow = np.empty(longest, dtype=np.int64)
    at = np.empty(per, dtype=np.int64)
    keep = np.zeros(n, dtype=np.bool_)
    deleted = 0
    for g in range(passes):
        p0 = g * per
        base = start[p0]
        for q in range(per):
            at[q] = start[p0 + q] - base
        for i in range(n):
            q = part[i] - p0
            if q < 0 or q >= per:
                continue
            j = at[q]
            at[q] += 1
            for c in range(20):
                ld[j, c] = digests[i, c]
            for c in range(k):
                ls[j, c] = sort_bytes[i, c]
            ldel[j] = is_delete[i]
            lcnt[j] = counts[i]
            lrow[j] = i
        for q in range(per):
            a = start[p0 + q] - base
            m = start[p0 + q + 1] - base
            lkeep, ldeleted = replay_kernel(ld[a:m], ls[a:m], ldel[a:m], lcnt[a:m])
            deleted += ldeleted
            for j in range(m - a):
                if lkeep[j]:
                    keep[lrow[a + j]] = True
    return keep, deleted


def replay(digests, sort_bytes, is_delete, counts, partition_rows: int = 0):
    """replay_kernel, partitioned (replay_partitioned_kernel) when the rows outgrow a cache-sized table."""
    rows = partition_rows or PARTITION_ROWS
    n = digests.shape[0]
    if n <= 2 * rows:
        return replay_kernel(digests, sort_bytes, is_delete, counts)
    parts_log2 = min(24, max(1, int(n // rows).bit_length() - 1))
    return replay_partitioned_kernel(digests, sort_bytes, is_delete, counts, parts_log2)


@njit(cache=True, nogil=True)
def round_summary_kernel(digests, sort_bytes, is_delete):
    """A round's rows in rank order -> per key its last delete (if any) and its best upsert after that delete.

    Replayed (replay_kernel) after the rows of earlier rounds, the summary gives the same survivors as replaying
    all of the round's rows: the last delete erases whatever came before, and among the upserts after it the
    comparator's winner is the same. Returns (keep, counts, deleted): ``deleted`` counts the erasures inside the
    round; ``counts`` of a kept delete is True when the erasure of an earlier round's best row is one the round
    did not count (no upsert of the key came before its first delete in the round), so counts add up too."""
    n = digests.shape[0]
    k = sort_bytes.shape[1]
    _, _, _, group_of, groups = _digest_table(digests)
    m = max(groups, 1)
    best = np.full(m, -1, dtype=np.int64)
    last_delete = np.full(m, -1, dtype=np.int64)
    upsert_first = np.zeros(m, dtype=np.bool_)  # an upsert came before the key's first delete
    first_counts = np.zeros(m, dtype=np.bool_)
    deleted = 0
    for i in range(n):
        gi = group_of[i]
        if is_delete[i]:
            if best[gi] != -1:
                deleted += 1
                best[gi] = -1
            if last_delete[gi] == -1:
                first_counts[gi] = not upsert_first[gi]
            last_delete[gi] = i
        else:
            if last_delete[gi] == -1:
                upsert_first[gi] = True
            b = best[gi]
            if b == -1 or _wins(sort_bytes, i, b, k):
                best[gi] = i
    keep = np.zeros(n, dtype=np.bool_)
    counts = np.zeros(n, dtype=np.bool_)
    for g in range(groups):
        if best[g] != -1:
            keep[best[g]] = True
        d = last_delete[g]
        if d != -1:
            keep[d] = True
            counts[d] = first_counts[g]
    return keep, counts, deleted


@njit(cache=True, nogil=True)
def member_kernel(keys, probes):
    """For each row of ``probes`` (n, 20): is its digest among the rows of ``keys`` (m, 20)?

    An incremental round's prior index is large and its delta small: a hash table over the delta's digests
    stays in cache, so probing every prior digest is one sequential pass instead of a table over all rows.
    """
    n = probes.shape[0]
    out = np.zeros(n, dtype=np.bool_)
    if keys.shape[0] == 0:
        return out
    slots, capmask, first, _, _ = _digest_table(keys)
    # a one-bit-per-key filter (16 bits a key, from digest bytes the slot does not use) answers most probes
    # from a bitmap that stays in cache; only the few that pass look in the table
    bits = 1 << 10
    while bits < 16 * keys.shape[0]:
        bits <<= 1
    bitmask = np.uint64(bits - 1)
    bitmap = np.zeros(bits >> 3, dtype=np.uint8)
    for i in range(keys.shape[0]):
        b = _filter_bit(keys, i) & bitmask
        bitmap[b >> np.uint64(3)] |= np.uint8(1) << np.uint8(b & np.uint64(7))
    for i in range(n):
        b = _filter_bit(probes, i) & bitmask
        if not (bitmap[b >> np.uint64(3)] >> np.uint8(b & np.uint64(7))) & np.uint8(1):
            continue
        pos = _home_slot(probes, i, capmask)
        while True:
            s = slots[pos]
            if s == -1:
                break
            if _same_digest(keys, first[s], probes, i):
                out[i] = True
                break
            pos = (pos + 1) & capmask
    return out


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
def _repointed(u, r, c, unit_keys, lost_ranks, lost_src_first, carried_file_number, block_start0, task_of_src, task_file_base, rows_per_file):
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
        ptr = _pointer(index_rows, i)
        if ptr <= prev:
            return -1
        prev = ptr
        u = _unit_at(unit_keys, u, ptr)
        if u < 0:
            return -2
        units[i] = u
        rows[i] = ptr & np.int64(0xFFFFFFFFFF)
    return 0


@njit(cache=True, nogil=True)
def prior_envelopes_kernel(index_rows, keep, unit_keys, unit_row_start, sort_width, out):
    """Kept rows of a primary key index (raw big-endian rows, in pointer order) as envelope rows.

    ``index_rows`` is (n, 28 + k) bytes: digest, file (u4 BE), row (u4 BE), sort bytes. Each kept row becomes
    digest, rank (i8 little-endian: unit src << 40 | row inside the unit), sort bytes in ``out`` (m, 28 + k).
    Two linear passes (pointers, then the kept rows): an incremental round converts millions of index rows.
    Returns the rows written, -1 when pointers are not strictly ascending, -2 when a pointer lies before the
    first unit.
    """
    unit_of = np.empty(index_rows.shape[0], dtype=np.int64)
    row_of = np.empty(index_rows.shape[0], dtype=np.int64)
    status = _walk_pointers(index_rows, unit_keys, unit_of, row_of)
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
def _survivor_pointer(src, row, k, bucket, block_start, task_of_src, task_file_base, rows_per_file, carried_file_number, src_row_start):
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
def index_pointers_kernel(ranks, bucket, block_start, task_of_src, task_file_base, rows_per_file, carried_file_number, src_row_start, files, rows):
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
        files[i], rows[i] = _survivor_pointer(src, row, k, bucket, block_start, task_of_src, task_file_base, rows_per_file, carried_file_number, src_row_start)
        k += 1


@njit(cache=True, nogil=True)
def survivor_index_rows_kernel(envelopes, keep, bucket, block_start, task_of_src, task_file_base, rows_per_file, carried_file_number, src_row_start, sort_width, out):
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
        f, r = _survivor_pointer(src, row, k, bucket, block_start, task_of_src, task_file_base, rows_per_file, carried_file_number, src_row_start)
        k += 1
        _write_index_row(out, j, envelopes, i, f, r, sort_width)
        j += 1
    return j


@njit(cache=True, nogil=True)
def prior_pointers_kernel(index_rows, keep, unit_keys, lost_ranks, lost_src_first, carried_file_number, block_start0, task_of_src, task_file_base, rows_per_file, files, rows):
    """New (file number, row) of the kept rows of a prior index bucket (raw big-endian rows, pointer order).

    A prior unit (src = its position in ``unit_keys``) that lost no row anywhere is carried: its rows keep
    their row index in the renumbered file. A unit that lost rows is rewritten in its row order, so a kept
    row moves up by the rows its unit lost before it: ``lost_ranks`` (all buckets' removed prior rows, as
    ascending ranks) is walked with one cursor, since ranks rise with pointers. Writes the kept rows'
    pointers in input order; returns their count, -1 when pointers are not strictly ascending, -2 when a
    pointer lies before the first unit.
    """
    unit_of = np.empty(index_rows.shape[0], dtype=np.int64)
    row_of = np.empty(index_rows.shape[0], dtype=np.int64)
    status = _walk_pointers(index_rows, unit_keys, unit_of, row_of)
    if status < 0:
        return status
    c = 0
    j = 0
    for i in np.flatnonzero(keep):
        files[j], rows[j], c = _repointed(unit_of[i], row_of[i], c, unit_keys, lost_ranks, lost_src_first, carried_file_number, block_start0, task_of_src, task_file_base, rows_per_file)
        j += 1
    return j


@njit(cache=True, nogil=True)
def repoint_chunk_kernel(index_rows, first, lost_at, unit_keys, lost_ranks, lost_src_first, carried_file_number, block_start0, task_of_src, task_file_base, rows_per_file, sort_width, out, state):
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
        ptr = _pointer(index_rows, i)
        if ptr <= prev:
            return -1
        prev = ptr
        u = _unit_at(unit_keys, u, ptr)
        if u < 0:
            return -2
        if la < n_lost_at and lost_at[la] == first + i:
            la += 1
            continue
        f, row, c = _repointed(u, ptr & np.int64(0xFFFFFFFFFF), c, unit_keys, lost_ranks, lost_src_first, carried_file_number, block_start0, task_of_src, task_file_base, rows_per_file)
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


def load_cached_kernels() -> int:
    """Load every signature this installation has compiled into this process (from Numba's on-disk cache).

    A Ray worker otherwise loads each kernel the first time a round calls it (tens of milliseconds each,
    and a new worker pays again), which lands inside a compaction's latency. The index is Numba's own; any
    failure only means the kernels load lazily as before. Returns the signatures loaded.
    """
    from flash_pipeline.compactor.kernels import jit, sha1, sha1_ni

    dispatchers = [kernel.compiled() for kernel in jit.kernels()]
    modules = [vars(sha1)] + ([vars(sha1_ni)] if sha1_ni.usable() else [])  # never compile SHA-NI code elsewhere
    from numba.core.registry import CPUDispatcher

    dispatchers += [value for module in modules for value in module.values() if isinstance(value, CPUDispatcher)]
    loaded = 0
    for dispatcher in dispatchers:
        try:
            for key in dispatcher._cache._cache_file._load_index():
                dispatcher.compile(key[0])
                loaded += 1
        except Exception:  # noqa: BLE001 - a best-effort warm-up (private Numba API)
            continue
    return loaded
