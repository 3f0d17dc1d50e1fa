"""SHA-1 of many short messages in one compiled pass (FIPS 180-4), used by digest.sha1_rows.

Checked against hashlib in tests/test_digest.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_MASK = np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _rotl(x, n):  # type: ignore[no-untyped-def]
    return ((x << np.uint64(n)) | (x >> np.uint64(32 - n))) & np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def sha1_rows_numba(buf, offsets, out):  # type: ignore[no-untyped-def]
    mask = np.uint64(0xFFFFFFFF)
    w = np.empty(80, dtype=np.uint64)
    block = np.empty(64, dtype=np.uint8)
    n = offsets.shape[0] - 1
    for i in range(n):
        start = offsets[i]
        length = offsets[i + 1] - start
        h0 = np.uint64(0x67452301)
        h1 = np.uint64(0xEFCDAB89)
        h2 = np.uint64(0x98BADCFE)
        h3 = np.uint64(0x10325476)
        h4 = np.uint64(0xC3D2E1F0)
        nblocks = (length + 8) // 64 + 1
        bitlen = np.uint64(length) * np.uint64(8)
        for b in range(nblocks):
            for j in range(64):
                p = b * 64 + j
                if p < length:
                    block[j] = buf[start + p]
                elif p == length:
                    block[j] = 0x80
                else:
                    block[j] = 0
            if b == nblocks - 1:
                for j in range(8):
                    block[63 - j] = np.uint8((bitlen >> np.uint64(8 * j)) & np.uint64(0xFF))
            for t in range(16):
                w[t] = (
                    (np.uint64(block[4 * t]) << np.uint64(24))
                    | (np.uint64(block[4 * t + 1]) << np.uint64(16))
                    | (np.uint64(block[4 * t + 2]) << np.uint64(8))
                    | np.uint64(block[4 * t + 3])
                )
            for t in range(16, 80):
                w[t] = _rotl(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1)
            a = h0
            bb = h1
            c = h2
            d = h3
            e = h4
            for t in range(80):
                if t < 20:
                    f = (bb & c) | ((~bb & mask) & d)
                    k = np.uint64(0x5A827999)
                elif t < 40:
                    f = bb ^ c ^ d
                    k = np.uint64(0x6ED9EBA1)
                elif t < 60:
                    f = (bb & c) | (bb & d) | (c & d)
                    k = np.uint64(0x8F1BBCDC)
                else:
                    f = bb ^ c ^ d
                    k = np.uint64(0xCA62C1D6)
                temp = (_rotl(a, 5) + f + e + k + w[t]) & mask
                e = d
                d = c
                c = _rotl(bb, 30)
                bb = a
                a = temp
            h0 = (h0 + a) & mask
            h1 = (h1 + bb) & mask
            h2 = (h2 + c) & mask
            h3 = (h3 + d) & mask
            h4 = (h4 + e) & mask
        hs = (h0, h1, h2, h3, h4)
        for k2 in range(5):
            hv = hs[k2]
            out[i, 4 * k2] = np.uint8((hv >> np.uint64(24)) & np.uint64(0xFF))
            out[i, 4 * k2 + 1] = np.uint8((hv >> np.uint64(16)) & np.uint64(0xFF))
            out[i, 4 * k2 + 2] = np.uint8((hv >> np.uint64(8)) & np.uint64(0xFF))
            out[i, 4 * k2 + 3] = np.uint8(hv & np.uint64(0xFF))


@njit(cache=True, nogil=True)
def frame_fixed(buf, cursor, valid, values):  # type: ignore[no-untyped-def]
    """Append one fixed 8-byte primary key column's frames at each row's cursor (advances the cursor)."""
    for i in range(cursor.shape[0]):
        c = cursor[i]
        if valid[i]:
            buf[c] = 1
            buf[c + 1] = 0
            buf[c + 2] = 0
            buf[c + 3] = 0
            buf[c + 4] = 8
            for j in range(8):
                buf[c + 5 + j] = values[i, j]
            cursor[i] = c + 13
        else:
            buf[c] = 0
            cursor[i] = c + 1


@njit(cache=True, nogil=True)
def frame_var(buf, cursor, valid, offsets, data):  # type: ignore[no-untyped-def]
    """Append one variable-width column's frames (offsets index into data) at each row's cursor."""
    for i in range(cursor.shape[0]):
        c = cursor[i]
        if valid[i]:
            a = offsets[i]
            ln = offsets[i + 1] - a
            buf[c] = 1
            buf[c + 1] = (ln >> 24) & 0xFF
            buf[c + 2] = (ln >> 16) & 0xFF
            buf[c + 3] = (ln >> 8) & 0xFF
            buf[c + 4] = ln & 0xFF
            for j in range(ln):
                buf[c + 5 + j] = data[a + j]
            cursor[i] = c + 5 + ln
        else:
            buf[c] = 0
            cursor[i] = c + 1


@njit(cache=True, nogil=True)
def dedupe_kernel(digests, sort_bytes, is_delete):  # type: ignore[no-untyped-def]
    """One pass over rows in rank order (position, file, row): the paper's O(n) dedupe with a comparator.

    Rows are grouped by digest in an open-addressing hash table. A delete row erases its key's current best
    row; an upsert row replaces the best row when its sort key bytes are greater or equal (equal: the later
    row wins, which is the greater (position, file number, row index)). Returns (keep mask, rows deleted).
    """
    n = digests.shape[0]
    k = sort_bytes.shape[1]
    cap = 16
    while cap < 2 * n:
        cap <<= 1
    capmask = cap - 1
    slots = np.full(cap, -1, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    best = np.empty(n, dtype=np.int64)
    groups = 0
    deleted = 0
    for i in range(n):
        h = np.uint64(0)
        for j in range(8):
            h = (h << np.uint64(8)) | np.uint64(digests[i, j])
        pos = np.int64(h & np.uint64(capmask))
        gi = -1
        while True:
            s = slots[pos]
            if s == -1:
                slots[pos] = groups
                first[groups] = i
                best[groups] = -1
                gi = groups
                groups += 1
                break
            r = first[s]
            same = True
            for j in range(20):
                if digests[r, j] != digests[i, j]:
                    same = False
                    break
            if same:
                gi = s
                break
            pos = (pos + 1) & capmask
        if is_delete[i]:
            if best[gi] != -1:
                deleted += 1
                best[gi] = -1
        else:
            b = best[gi]
            if b == -1:
                best[gi] = i
            else:
                take = True
                for j in range(k):
                    if sort_bytes[i, j] != sort_bytes[b, j]:
                        take = sort_bytes[i, j] > sort_bytes[b, j]
                        break
                if take:
                    best[gi] = i
    keep = np.zeros(n, dtype=np.bool_)
    for g in range(groups):
        if best[g] != -1:
            keep[best[g]] = True
    return keep, deleted


@njit(cache=True, nogil=True)
def buckets_kernel(digests, bucket_count):  # type: ignore[no-untyped-def]
    """int.from_bytes(digest, "big") % bucket_count per row, by Horner's rule on 32-bit words."""
    n = digests.shape[0]
    out = np.empty(n, dtype=np.int64)
    m = np.uint64(bucket_count)
    for i in range(n):
        r = np.uint64(0)
        for j in range(5):
            w = (
                (np.uint64(digests[i, 4 * j]) << np.uint64(24))
                | (np.uint64(digests[i, 4 * j + 1]) << np.uint64(16))
                | (np.uint64(digests[i, 4 * j + 2]) << np.uint64(8))
                | np.uint64(digests[i, 4 * j + 3])
            )
            r = ((r << np.uint64(32)) + w) % m
        out[i] = np.int64(r)
    return out
