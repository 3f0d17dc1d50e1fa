"""Compiled kernels of the hash bucket step: SHA-1 of many short messages in one pass (FIPS 180-4), the
framing of primary key columns into those messages, and the bucket of each digest.

Used by kernels/digest.py, which has NumPy/hashlib fallbacks; checked against hashlib in
tests/compactor/kernels/test_digest.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline='always')
def _rotl(x, n):  # type: ignore[no-untyped-def]
    return ((x << np.uint32(n)) | (x >> np.uint32(32 - n)))

@njit(cache=True, nogil=True)
def sha1_rows_numba(buf, offsets, out):  # type: ignore[no-untyped-def]
    """SHA-1 of buf[offsets[i]:offsets[i+1]] into out[i]; 32-bit words, rounds unrolled by stage."""
    w = np.empty(80, dtype=np.uint32)
    n = offsets.shape[0] - 1
    for i in range(n):
        start = offsets[i]
        length = offsets[i + 1] - start
        h0 = np.uint32(0x67452301); h1 = np.uint32(0xEFCDAB89); h2 = np.uint32(0x98BADCFE); h3 = np.uint32(0x10325476); h4 = np.uint32(0xC3D2E1F0)
        nblocks = (length + 8) // 64 + 1
        bitlen = np.uint64(length) * np.uint64(8)
        for b in range(nblocks):
            base = b * 64
            for t in range(16):
                w[t] = np.uint32(0)
            lo = base
            hi = min(length, base + 64)
            for p in range(lo, hi):
                j = p - base
                w[j >> 2] |= np.uint32(buf[start + p]) << np.uint32(24 - 8 * (j & 3))
            if length >= base and length < base + 64:
                j = length - base
                w[j >> 2] |= np.uint32(0x80) << np.uint32(24 - 8 * (j & 3))
            if b == nblocks - 1:
                w[14] = np.uint32(bitlen >> np.uint64(32))
                w[15] = np.uint32(bitlen & np.uint64(0xFFFFFFFF))
            for t in range(16, 80):
                x = w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16]
                w[t] = _rotl(x, 1)
            a = h0; bb = h1; c = h2; d = h3; e = h4
            for t in range(0, 20):
                tmp = _rotl(a, 5) + ((bb & c) | (~bb & d)) + e + np.uint32(0x5A827999) + w[t]
                e = d; d = c; c = _rotl(bb, 30); bb = a; a = np.uint32(tmp)
            for t in range(20, 40):
                tmp = _rotl(a, 5) + (bb ^ c ^ d) + e + np.uint32(0x6ED9EBA1) + w[t]
                e = d; d = c; c = _rotl(bb, 30); bb = a; a = np.uint32(tmp)
            for t in range(40, 60):
                tmp = _rotl(a, 5) + ((bb & c) | (bb & d) | (c & d)) + e + np.uint32(0x8F1BBCDC) + w[t]
                e = d; d = c; c = _rotl(bb, 30); bb = a; a = np.uint32(tmp)
            for t in range(60, 80):
                tmp = _rotl(a, 5) + (bb ^ c ^ d) + e + np.uint32(0xCA62C1D6) + w[t]
                e = d; d = c; c = _rotl(bb, 30); bb = a; a = np.uint32(tmp)
            h0 = np.uint32(h0 + a); h1 = np.uint32(h1 + bb); h2 = np.uint32(h2 + c); h3 = np.uint32(h3 + d); h4 = np.uint32(h4 + e)
        hs = (h0, h1, h2, h3, h4)
        for k in range(5):
            hv = hs[k]
            out[i, 4 * k] = np.uint8(hv >> np.uint32(24))
            out[i, 4 * k + 1] = np.uint8((hv >> np.uint32(16)) & np.uint32(0xFF))
            out[i, 4 * k + 2] = np.uint8((hv >> np.uint32(8)) & np.uint32(0xFF))
            out[i, 4 * k + 3] = np.uint8(hv & np.uint32(0xFF))


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
