"""Compiled kernels of the hash bucket step: SHA-1 of many short messages in one pass (FIPS 180-4), the
framing of primary key columns into those messages, and the bucket of each digest.

Used by kernels/digest.py, which has NumPy/hashlib fallbacks; checked against hashlib in
tests/compactor/kernels/test_digest.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flash_pipeline.compactor.kernels.frames import FRAME_COPY_BYTES


@njit(cache=True, nogil=True, inline='always')
def _rotl(x, n):
    return ((x << np.uint32(n)) | (x >> np.uint32(32 - n)))

@njit(cache=True, nogil=True, inline='always')
def put_digest_word(out, i, k, hv):
    """Digest word ``k`` (``hv``) of row ``i`` into out[i, 4k:4k+4], big-endian."""
    out[i, 4 * k] = np.uint8(hv >> np.uint32(24))
    out[i, 4 * k + 1] = np.uint8((hv >> np.uint32(16)) & np.uint32(0xFF))
    out[i, 4 * k + 2] = np.uint8((hv >> np.uint32(8)) & np.uint32(0xFF))
    out[i, 4 * k + 3] = np.uint8(hv & np.uint32(0xFF))


@njit(cache=True, nogil=True, inline='always')
def _sha1_row(buf, start, length, w, out, i):
    """SHA-1 of buf[start:start+length] into out[i] (``w``: an 80-word scratch array)."""
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
        put_digest_word(out, i, k, hs[k])


@njit(cache=True, nogil=True)
def sha1_rows_numba(buf, offsets, out):
    """SHA-1 of buf[offsets[i]:offsets[i+1]] into out[i]; 32-bit words, rounds unrolled by stage."""
    w = np.empty(80, dtype=np.uint32)
    for i in range(offsets.shape[0] - 1):
        _sha1_row(buf, offsets[i], offsets[i + 1] - offsets[i], w, out, i)




@njit(cache=True, nogil=True)
def frame_rows(valid, offsets, data, buf, out_offsets):
    """Frame every row's primary key columns into ``buf``, row after row: column j of row i is
    data[offsets[j, i]:offsets[j, i + 1]] (``valid[j, i]`` False: a null). Writes the n + 1 row offsets.

    ``data`` ends with FRAME_COPY_BYTES spare bytes and ``buf`` has as many beyond the last frame, so a short
    value is copied as a fixed 16 bytes: the bytes past it belong to the frames written next, or to the spare
    tail. Indices are unsigned so that Numba emits no negative-index wraparound per byte (twice as fast: 9.7
    against 19.6 ns a row of an int64 and a string key, measured)."""
    k = valid.shape[0]
    n = valid.shape[1]
    width = np.uint64(FRAME_COPY_BYTES)
    c = np.uint64(0)
    out_offsets[0] = 0
    for i in range(n):
        for j in range(k):
            if valid[j, i]:
                a = np.uint64(offsets[j, i])
                ln = np.uint64(offsets[j, i + 1]) - a
                buf[c] = 1
                buf[c + np.uint64(1)] = (ln >> np.uint64(24)) & np.uint64(0xFF)
                buf[c + np.uint64(2)] = (ln >> np.uint64(16)) & np.uint64(0xFF)
                buf[c + np.uint64(3)] = (ln >> np.uint64(8)) & np.uint64(0xFF)
                buf[c + np.uint64(4)] = ln & np.uint64(0xFF)
                at = c + np.uint64(5)
                if ln <= width:
                    for t in range(FRAME_COPY_BYTES):
                        buf[at + np.uint64(t)] = data[a + np.uint64(t)]
                else:
                    for t in range(ln):
                        buf[at + np.uint64(t)] = data[a + np.uint64(t)]
                c = at + ln
            else:
                buf[c] = 0
                c += np.uint64(1)
        out_offsets[i + 1] = c


@njit(cache=True, nogil=True)
def buckets_kernel(digests, bucket_count):
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


# rows hashed side by side by sha1_blocks_lanes: the loops over lanes are plain element-wise loops over small
# arrays, which LLVM turns into SIMD instructions (8 or 16 rows per instruction), where the row-at-a-time
# kernel above is a chain of dependent scalar operations
LANES = 64


@njit(cache=True, nogil=True)
def sha1_blocks_lanes(words, out):
    """SHA-1 of messages that fit one block: ``words`` (n, 16) uint32 are each row's padded block (message,
    0x80, zeros, bit length), already in the algorithm's big-endian word order; digests go to ``out`` (n, 20)."""
    n = words.shape[0]
    L = LANES
    w = np.zeros((80, L), dtype=np.uint32)
    a = np.empty(L, dtype=np.uint32)
    b = np.empty(L, dtype=np.uint32)
    c = np.empty(L, dtype=np.uint32)
    d = np.empty(L, dtype=np.uint32)
    e = np.empty(L, dtype=np.uint32)
    for g in range(0, n, L):
        m = min(L, n - g)
        for t in range(16):
            for lane in range(m):
                w[t, lane] = words[g + lane, t]
            for lane in range(m, L):
                w[t, lane] = np.uint32(0)
        for t in range(16, 80):
            for lane in range(L):
                x = w[t - 3, lane] ^ w[t - 8, lane] ^ w[t - 14, lane] ^ w[t - 16, lane]
                w[t, lane] = (x << np.uint32(1)) | (x >> np.uint32(31))
        for lane in range(L):
            a[lane] = np.uint32(0x67452301)
            b[lane] = np.uint32(0xEFCDAB89)
            c[lane] = np.uint32(0x98BADCFE)
            d[lane] = np.uint32(0x10325476)
            e[lane] = np.uint32(0xC3D2E1F0)
        for t in range(0, 20):
            for lane in range(L):
                bl = b[lane]
                tmp = _rotl(a[lane], 5) + ((bl & c[lane]) | (~bl & d[lane])) + e[lane] + np.uint32(0x5A827999) + w[t, lane]
                e[lane] = d[lane]; d[lane] = c[lane]; c[lane] = _rotl(bl, 30); b[lane] = a[lane]; a[lane] = np.uint32(tmp)
        for t in range(20, 40):
            for lane in range(L):
                bl = b[lane]
                tmp = _rotl(a[lane], 5) + (bl ^ c[lane] ^ d[lane]) + e[lane] + np.uint32(0x6ED9EBA1) + w[t, lane]
                e[lane] = d[lane]; d[lane] = c[lane]; c[lane] = _rotl(bl, 30); b[lane] = a[lane]; a[lane] = np.uint32(tmp)
        for t in range(40, 60):
            for lane in range(L):
                bl = b[lane]
                cl = c[lane]
                dl = d[lane]
                tmp = _rotl(a[lane], 5) + ((bl & cl) | (bl & dl) | (cl & dl)) + e[lane] + np.uint32(0x8F1BBCDC) + w[t, lane]
                e[lane] = dl; d[lane] = cl; c[lane] = _rotl(bl, 30); b[lane] = a[lane]; a[lane] = np.uint32(tmp)
        for t in range(60, 80):
            for lane in range(L):
                bl = b[lane]
                tmp = _rotl(a[lane], 5) + (bl ^ c[lane] ^ d[lane]) + e[lane] + np.uint32(0xCA62C1D6) + w[t, lane]
                e[lane] = d[lane]; d[lane] = c[lane]; c[lane] = _rotl(bl, 30); b[lane] = a[lane]; a[lane] = np.uint32(tmp)
        for lane in range(m):
            hs0 = np.uint32(a[lane] + np.uint32(0x67452301))
            hs1 = np.uint32(b[lane] + np.uint32(0xEFCDAB89))
            hs2 = np.uint32(c[lane] + np.uint32(0x98BADCFE))
            hs3 = np.uint32(d[lane] + np.uint32(0x10325476))
            hs4 = np.uint32(e[lane] + np.uint32(0xC3D2E1F0))
            row = g + lane
            for k5, hv in enumerate((hs0, hs1, hs2, hs3, hs4)):
                put_digest_word(out, row, k5, hv)


# one-block rows are padded into this many blocks at a time, then hashed side by side (256 KiB of words)
LANE_CHUNK = 4096


@njit(cache=True, nogil=True)
def sha1_rows_lanes(buf, offsets, out):
    """sha1_rows_numba with the rows that fit one block (<= 55 bytes: every key of a few columns) padded into
    blocks and hashed LANES at a time (sha1_blocks_lanes); longer rows one at a time."""
    n = offsets.shape[0] - 1
    words = np.zeros((LANE_CHUNK, 16), dtype=np.uint32)
    rows = np.empty(LANE_CHUNK, dtype=np.int64)
    digests = np.empty((LANE_CHUNK, 20), dtype=np.uint8)
    w = np.empty(80, dtype=np.uint32)
    k = 0
    for i in range(n + 1):
        if i < n:
            start = offsets[i]
            length = offsets[i + 1] - start
            if length > 55:
                _sha1_row(buf, start, length, w, out, i)
                continue
            for t in range(16):
                words[k, t] = np.uint32(0)
            for p in range(length):
                words[k, p >> 2] |= np.uint32(buf[start + p]) << np.uint32(24 - 8 * (p & 3))
            words[k, length >> 2] |= np.uint32(0x80) << np.uint32(24 - 8 * (length & 3))
            words[k, 15] = np.uint32(length * 8)
            rows[k] = i
            k += 1
        if k == LANE_CHUNK or (i == n and k > 0):
            sha1_blocks_lanes(words[:k], digests[:k])
            for j in range(k):
                for q in range(20):
                    out[rows[j], q] = digests[j, q]
            k = 0
