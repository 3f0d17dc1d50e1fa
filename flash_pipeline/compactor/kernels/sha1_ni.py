"""SHA-1 of many short messages with the x86 SHA extensions (SHA-NI): the hash bucket step's digests.

The side-by-side kernel in kernels/sha1.py spends ~45 ns a one-block row on AVX2 lanes; the CPU's own SHA-1
instructions (``sha1rnds4``, ``sha1nexte``, ``sha1msg1``, ``sha1msg2``: Intel SHA extensions, on AMD since Zen)
do a block in ~23 ns on this machine's cores. NumPy, Arrow and Numba have no such function and a hashlib call
per row costs ~0.8 us, so this module emits the instructions itself through LLVM's intrinsics, inside a Numba
kernel: the one place where this project writes an algorithm at the instruction level, because no library
hashes many small messages in one call.

Only used when the CPU Numba compiles for has the extensions (:func:`usable`): on any other CPU the intrinsic
cannot be compiled at all, and kernels/digest.py keeps the portable kernel. Checked against hashlib in
tests/compactor/kernels/test_digest.py.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from flash_pipeline.compactor.kernels.sha1 import put_digest_word
from flash_pipeline.settings import sha_extensions_switch

_V4 = ir.VectorType(ir.IntType(32), 4)
_IV = (0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0)


def usable() -> bool:
    """True when Numba compiles for this machine's own CPU, that CPU has the SHA extensions (and SSSE3 /
    SSE4.1, which every CPU with them has), and FLASH_SHA_EXTENSIONS is not off. A NUMBA_CPU_NAME or
    NUMBA_CPU_FEATURES override (portable caches) targets another CPU: then the portable kernel is used."""
    return sha_extensions_switch() and _cpu_has_extensions()


@functools.lru_cache(maxsize=1)
def _cpu_has_extensions() -> bool:
    try:
        import llvmlite.binding as llvm
        from numba.core import config

        if getattr(config, "CPU_NAME", None) or getattr(config, "CPU_FEATURES", None):
            return False
        features = llvm.get_host_cpu_features()
        return all(features.get(f, False) for f in ("sha", "ssse3", "sse4.1"))
    except Exception:  # noqa: BLE001 - no answer means no extensions
        return False


def _declare(module: ir.Module, name: str, imm: bool = False) -> ir.Function:
    args = [_V4, _V4] + ([ir.IntType(8)] if imm else [])
    return cgutils.get_or_insert_function(module, ir.FunctionType(_V4, args), name)


def _rounds(builder: ir.IRBuilder, m: list, abcd0: ir.Value, e0: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The 80 rounds of one block: (A..D lanes, E lane) after it, state words added.

    The message schedule is the standard one, four words at a time: W[g] = msg2(msg1(W[g-4], W[g-3]) ^ W[g-2],
    W[g-1]); each group of four rounds takes E from the state before the previous group (nexte); the lanes
    hold words in reverse order (lane 3 = A, lane 3 = the group's first word), as the instructions define."""
    i8 = ir.IntType(8)
    rnds4 = _declare(builder.module, "llvm.x86.sha1rnds4", imm=True)
    nexte = _declare(builder.module, "llvm.x86.sha1nexte")
    msg1 = _declare(builder.module, "llvm.x86.sha1msg1")
    msg2 = _declare(builder.module, "llvm.x86.sha1msg2")
    m = list(m)
    for g in range(4, 20):
        m.append(builder.call(msg2, [builder.xor(builder.call(msg1, [m[g - 4], m[g - 3]]), m[g - 2]), m[g - 1]]))
    previous = abcd0
    abcd = builder.call(rnds4, [abcd0, builder.add(e0, m[0]), ir.Constant(i8, 0)])
    for g in range(1, 20):
        e_plus_w = builder.call(nexte, [previous, m[g]])
        previous = abcd
        abcd = builder.call(rnds4, [abcd, e_plus_w, ir.Constant(i8, g // 5)])
    return builder.add(abcd, abcd0), builder.call(nexte, [previous, e0])


def _reversed_bytes(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The 16 bytes of ``v`` in reverse order: big-endian words <-> lanes in the instructions' order."""
    b16 = ir.VectorType(ir.IntType(8), 16)
    v = builder.bitcast(v, b16)
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), 16), list(range(15, -1, -1))))


def _byte_pointer(context, builder, aryty, ary_value, index):
    ary = context.make_array(aryty)(context, builder, ary_value)
    return builder.gep(builder.bitcast(ary.data, ir.IntType(8).as_pointer()), [index])


@intrinsic
def _compress(typingctx, block, state):
    """state[:5] = SHA-1 compression of the 64-byte block ``block`` (uint8, the message's own bytes) into
    state[:5]: any block of any message."""
    if not (isinstance(block, types.Array) and block.layout == "C"
            and isinstance(state, types.Array) and state.layout == "C"):
        return None  # the code below addresses contiguous memory
    sig = types.void(block, state)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        b16 = ir.VectorType(ir.IntType(8), 16)
        data = builder.bitcast(_byte_pointer(context, builder, signature.args[0], args[0],
                                             ir.Constant(ir.IntType(64), 0)), b16.as_pointer())
        m = [builder.bitcast(_reversed_bytes(builder, builder.load(builder.gep(data, [ir.Constant(i32, g)]), align=1)),
                             _V4) for g in range(4)]
        s_ptr = context.make_array(signature.args[1])(context, builder, args[1]).data
        h = [builder.load(builder.gep(s_ptr, [ir.Constant(i32, k)])) for k in range(5)]
        abcd0 = ir.Constant(_V4, [0, 0, 0, 0])
        for lane, k in enumerate((3, 2, 1, 0)):  # lane 0 = D ... lane 3 = A
            abcd0 = builder.insert_element(abcd0, h[k], ir.Constant(i32, lane))
        e0 = builder.insert_element(ir.Constant(_V4, [0, 0, 0, 0]), h[4], ir.Constant(i32, 3))
        abcd, e = _rounds(builder, m, abcd0, e0)
        for k, lane in enumerate((3, 2, 1, 0)):
            builder.store(builder.extract_element(abcd, ir.Constant(i32, lane)),
                          builder.gep(s_ptr, [ir.Constant(i32, k)]))
        builder.store(builder.extract_element(e, ir.Constant(i32, 3)), builder.gep(s_ptr, [ir.Constant(i32, 4)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _digest_short(typingctx, buf, start, length, out, row):
    """out[row] = SHA-1 of buf[start:start+length] for a message of one block (length <= 55) whose 64 bytes
    from ``start`` lie inside ``buf``: the padding is built in registers (bytes past the message masked to
    zero, 0x80 after it, the bit length at the end), so no row goes through memory before it is hashed."""
    if not (isinstance(buf, types.Array) and buf.layout == "C"
            and isinstance(out, types.Array) and out.layout == "C" and out.ndim == 2):
        return None  # the code below addresses contiguous memory: ``out`` rows of exactly 20 bytes
    sig = types.void(buf, start, length, out, row)

    def codegen(context, builder, signature, args):
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        b16 = ir.VectorType(i8, 16)
        start_v, length_v, row_v = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 2, 4))
        data = builder.bitcast(_byte_pointer(context, builder, signature.args[0], args[0], start_v), b16.as_pointer())
        n8 = builder.trunc(length_v, i8)
        n_splat = builder.insert_element(ir.Constant(b16, [0] * 16), n8, ir.Constant(i32, 0))
        n_splat = builder.shuffle_vector(n_splat, n_splat, ir.Constant(ir.VectorType(i32, 16), [0] * 16))
        bits = builder.mul(length_v, ir.Constant(i64, 8))
        m = []
        for g in range(4):
            raw = builder.load(builder.gep(data, [ir.Constant(i32, g)]), align=1)
            position = ir.Constant(b16, [16 * g + j for j in range(16)])
            v = builder.select(builder.icmp_unsigned("<", position, n_splat), raw, ir.Constant(b16, [0] * 16))
            v = builder.select(builder.icmp_unsigned("==", position, n_splat), ir.Constant(b16, [0x80] * 16), v)
            if g == 3:  # bits <= 440: its two low bytes, big-endian, end the block
                v = builder.insert_element(v, builder.trunc(builder.lshr(bits, ir.Constant(i64, 8)), i8),
                                           ir.Constant(i32, 14))
                v = builder.insert_element(v, builder.trunc(bits, i8), ir.Constant(i32, 15))
            m.append(builder.bitcast(_reversed_bytes(builder, v), _V4))
        abcd0 = ir.Constant(_V4, [_IV[3], _IV[2], _IV[1], _IV[0]])
        e0 = ir.Constant(_V4, [0, 0, 0, _IV[4]])
        abcd, e = _rounds(builder, m, abcd0, e0)
        target = _byte_pointer(context, builder, signature.args[3], args[3], builder.mul(row_v, ir.Constant(i64, 20)))
        builder.store(_reversed_bytes(builder, abcd), builder.bitcast(target, b16.as_pointer()), align=1)
        e_word = builder.extract_element(e, ir.Constant(i32, 3))
        bswap = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32]), "llvm.bswap.i32")
        tail = builder.bitcast(builder.gep(target, [ir.Constant(i32, 16)]), i32.as_pointer())
        builder.store(builder.call(bswap, [e_word]), tail, align=1)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def sha1_rows_ni(buf, offsets, out):
    """SHA-1 of buf[offsets[i]:offsets[i+1]] into out[i] (n, 20), block by block with the SHA extensions."""
    block = np.zeros(64, dtype=np.uint8)
    block_words = block.view(np.uint64)
    state = np.empty(5, dtype=np.uint32)
    size = buf.shape[0]
    for i in range(offsets.shape[0] - 1):
        start = offsets[i]
        length = offsets[i + 1] - start
        if length <= 55 and start + 64 <= size:
            _digest_short(buf, start, length, out, i)
            continue
        for k in range(5):
            state[k] = np.uint32(_IV[k])
        nblocks = (length + 8) // 64 + 1
        for b in range(nblocks):
            base = b * 64
            for t in range(8):
                block_words[t] = np.uint64(0)
            for p in range(base, min(length, base + 64)):
                block[p - base] = buf[start + p]
            if base <= length < base + 64:
                block[length - base] = np.uint8(0x80)
            if b == nblocks - 1:
                bits = np.uint64(length) * np.uint64(8)
                for k in range(8):
                    block[63 - k] = np.uint8((bits >> np.uint64(8 * k)) & np.uint64(0xFF))
            _compress(block, state)
        for k in range(5):
            put_digest_word(out, i, k, state[k])
