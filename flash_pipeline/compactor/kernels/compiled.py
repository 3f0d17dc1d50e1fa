"""Compiled kernels of the dedupe step: the digest hash table (dedupe, replay across rounds, membership probes)
and the round's summary; the materialize and index steps' kernels are in index_kernels.py.

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
    slots, capmask, first, _rows_group, _groups = _digest_table(keys)
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
