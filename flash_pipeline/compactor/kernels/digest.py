"""Primary key digests, hash buckets and order-preserving sort key bytes, vectorized.

Primary key bytes (paper: "SHA-1 digest of all ordered, concatenated, primary key bytes") must be unambiguous,
so each value is framed: a null is the single byte 0x00; any other value is 0x01, its byte length as 4-byte
big-endian, then its bytes (UTF-8 for strings, raw for binary, 8-byte big-endian two's complement for integers,
dates, times, timestamps and durations, IEEE-754 big-endian float64 for floats, the decimal's text otherwise).
Columns are taken in primary key order (the key set sorted by name). ("ab","c") and ("a","bc") frame differently,
and null, "" and "null" are three different frames.

A key must frame the same however its file returned it, so values are framed by what they are, not by their
physical form: dictionaries are decoded; uint64 is its 8 bytes unsigned; -0.0 is 0.0 and every NaN is one
NaN; large/view/fixed-size strings and binaries are their bytes; and the temporal types Parquet coerces are
framed in the unit Parquet returns (date64 as date32 days, time32[s] and timestamp[s] in milliseconds).
Nested types and intervals have no framing and are refused (:func:`require_key_types`).

SHA-1 has no vectorized form in NumPy or Arrow, and a hashlib call per row costs ~0.8-1.4 us; a small Numba
kernel hashes the framed rows in one compiled pass: with the CPU's SHA extensions where it has them (~0.03
us/row with the padding; kernels/sha1_ni.py), else 64 one-block rows side by side so that the compiler emits
SIMD instructions (~0.065-0.11 us/row, against ~0.16 one row at a time; kernels/sha1.py). hashlib remains the
reference and the fallback, and with NumPy framing it is the path of a few rows in a process that has not
loaded Numba (loading it costs more than it saves there: kernels/jit.py).
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# the framing's types
from flash_pipeline.catalog.key_types import KEY_TYPES_HINT, key_type_supported, require_key_types  # noqa: F401
from flash_pipeline.compactor.kernels.sha1_choice import (  # noqa: F401 - sha1_rows: this module's API
    DIGEST_BYTES,
    FRAME_ROW_NS,
    HORNER_ROW_NS,
    compiled_kernels,
    sha1_rows,
)
from flash_pipeline.errors import FlashError

MAX_SORT_KEY_BYTES = 32


# ----- primary key framing ------------------------------------------------------------------------------------
def _fixed_value_bytes(arr: pa.Array) -> np.ndarray:
    """(n, 8) big-endian bytes for a fixed-width array; nulls become zeros (their frame has no value)."""
    t = arr.type
    if pa.types.is_floating(t):
        v = pc.fill_null(arr.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        # equal keys frame equally: -0.0 == 0.0 and every NaN is one value (as SQL engines compare them)
        v = np.where(v == 0.0, 0.0, v)
        values = np.where(np.isnan(v), np.nan, v).astype(">f8")
    elif pa.types.is_boolean(t):
        values = pc.fill_null(arr, False).to_numpy(zero_copy_only=False).astype(">i8")
    elif pa.types.is_unsigned_integer(t) and t.bit_width == 64:
        # the same 8 bytes as a cast for values below 2**63, and no overflow above (a column is never mixed)
        values = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).astype(">u8")
    else:
        if pa.types.is_temporal(t):
            arr = _temporal_to_int(arr)
        values = pc.fill_null(arr.cast(pa.int64()), 0).to_numpy(zero_copy_only=False).astype(">i8")
    return np.ascontiguousarray(values).view(np.uint8).reshape(-1, 8)


def _temporal_to_int(arr: pa.Array) -> pa.Array:
    """The storage integer in the unit every file format of the lake returns it in.

    Parquet stores date64 as days, time32[s] and timestamp[s] as milliseconds, and returns them so: a key must
    digest the same whether its file came back from Parquet, Feather or memory, so those three are converted to
    the unit Parquet returns (the other temporal types keep their storage integer)."""
    t = arr.type
    if pa.types.is_date64(t):
        arr = arr.cast(pa.date32(), safe=False)  # what Parquet stores for a date64 (days, truncated)
        t = arr.type
    elif t == pa.time32("s"):
        arr = arr.cast(pa.time32("ms"))
        t = arr.type
    elif pa.types.is_timestamp(t) and t.unit == "s":
        arr = arr.cast(pa.timestamp("ms", t.tz))
        t = arr.type
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return arr.view(pa.int32())
    return arr.view(pa.int64())


def _is_fixed_key_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t)


def _binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, flat bytes in row order) of a string/binary array; nulls have length 0."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        arr = arr.cast(pa.large_binary())
    elif (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
          or pa.types.is_binary_view(t)):
        arr = arr.cast(pa.large_binary())  # raw bytes (a large_binary once went through UTF-8 and failed)
    elif pa.types.is_decimal(t):
        arr = arr.cast(pa.string()).cast(pa.large_binary())
    else:
        try:
            arr = arr.cast(pa.string()).cast(pa.large_binary())
        except pa.ArrowInvalid:
            raise FlashError(f"primary key type {t} is not supported: "
                             "use strings, binaries, numbers or dates") from None
    arr = pc.fill_null(arr, b"")
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    flat = data[offsets[0] : offsets[-1]]
    return lengths, flat


KeyColumn = tuple[str, np.ndarray | None, np.ndarray, np.ndarray]  # (kind, valid or None: no nulls, lengths, values)


def _key_column(col: pa.Array | pa.ChunkedArray) -> KeyColumn:
    """One primary key column as framing reads it: ("fixed", valid, lengths, (n, 8) big-endian values) or
    ("var", valid, lengths, flat bytes in row order)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()  # a key digests by its value, however its file encoded it
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool) if arr.null_count else None
    if _is_fixed_key_type(arr.type):
        lengths = np.full(len(arr), 8, dtype=np.int64) if valid is None else np.where(valid, 8, 0).astype(np.int64)
        return "fixed", valid, lengths, _fixed_value_bytes(arr)
    lengths, flat = _binary_parts(arr)
    return "var", valid, lengths, flat


def primary_key_bytes(table: pa.Table, primary_keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Framed, concatenated primary key bytes of every row: (flat uint8 buffer, int64 offsets of n+1)."""
    require_key_types(table.schema, primary_keys, "the table")
    n = table.num_rows
    parts = [_key_column(table.column(name)) for name in primary_keys]
    kernels = compiled_kernels(n, FRAME_ROW_NS)
    if kernels is not None:
        return _frame_compiled(kernels, n, parts)
    row_len = np.zeros(n, dtype=np.int64)
    for _, valid, lengths, _ in parts:
        row_len += 1 + (4 + lengths if valid is None else np.where(valid, 4 + lengths, 0))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(row_len, out=offsets[1:])
    buf = np.zeros(int(offsets[-1]), dtype=np.uint8)
    cursor = offsets[:-1].copy()
    for kind, valid, lengths, values in parts:
        _frame_numpy(buf, cursor, kind, np.ones(n, dtype=bool) if valid is None else valid, lengths, values)
    return buf, offsets


def _frame_compiled(kernels: ModuleType | SimpleNamespace, n: int,
                    parts: list[KeyColumn]) -> tuple[np.ndarray, np.ndarray]:
    """Every row's frames in one compiled pass (sha1.frame_rows): the columns' bytes joined into one array,
    each column's row offsets into it side by side."""
    k = len(parts)
    valid = np.empty((k, n), dtype=bool)
    offsets = np.empty((k, n + 1), dtype=np.int64)
    chunks, base = [], 0
    for j, (kind, v, lengths, values) in enumerate(parts):
        valid[j] = True if v is None else v
        if kind == "fixed":
            offsets[j] = np.arange(base, base + 8 * n + 1, 8, dtype=np.int64)
        else:
            offsets[j, 0] = base
            np.cumsum(lengths, out=offsets[j, 1:])
            offsets[j, 1:] += base
        chunks.append(values.reshape(-1))
        base += len(chunks[-1])
    spare = kernels.FRAME_COPY_BYTES
    data = np.concatenate(chunks + [np.zeros(spare, dtype=np.uint8)])
    buf = np.empty(5 * n * k + base + spare, dtype=np.uint8)  # at most a flag, a length and the bytes a value
    row_offsets = np.empty(n + 1, dtype=np.int64)
    kernels.frame_rows(valid, offsets, data, buf, row_offsets)
    return buf[: row_offsets[-1]], row_offsets


def _frame_numpy(buf: np.ndarray, cursor: np.ndarray, kind: str, valid: np.ndarray, lengths: np.ndarray,
                 values: np.ndarray) -> None:
    """NumPy framing of one column (few rows, or no Numba: see _compiled_kernels; the tests' reference)."""
    buf[cursor] = valid.astype(np.uint8)
    cursor += 1
    vi = np.nonzero(valid)[0]
    if len(vi):
        lens_be = lengths[vi].astype(">u4").view(np.uint8).reshape(-1, 4)
        buf[cursor[vi, None] + np.arange(4)] = lens_be
    cursor[vi] += 4
    if kind == "fixed":
        if len(vi):
            buf[cursor[vi, None] + np.arange(8)] = values[vi]
    else:
        total = int(lengths.sum())
        if total:
            starts = np.repeat(cursor - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
            buf[starts + np.arange(total)] = values
    cursor += np.where(valid, lengths, 0)


def warm_framing() -> None:
    """Load the compiled framing kernel (its first call also builds Numba's compilation target, ~0.2 s): what
    jit.expect_work's loader thread does while a large job's hash bucket tasks decode their first inputs."""
    primary_key_bytes(pa.table({"k": pa.array([0], pa.int64())}), ["k"])


def primary_key_digests(table: pa.Table, primary_keys: list[str]) -> np.ndarray:
    """(n, 20) uint8 SHA-1 digests of each row's framed primary key."""
    buf, offsets = primary_key_bytes(table, primary_keys)
    return sha1_rows(buf, offsets)


def hash_buckets(digests: np.ndarray, bucket_count: int) -> np.ndarray:
    """``int.from_bytes(digest, "big") % bucket_count`` for every row, by Horner's rule on 32-bit words."""
    if bucket_count < 1 or bucket_count >= 2**31:
        raise FlashError(f"hash bucket count {bucket_count} is out of range: use 1 to 2147483647")
    if bucket_count & (bucket_count - 1) == 0:  # a power of two divides 2**32: the last word's low bits decide
        last = np.ascontiguousarray(np.asarray(digests)[:, 16:20]).view(">u4").reshape(-1)
        return (last & np.uint32(bucket_count - 1)).astype(np.int64)
    kernels = compiled_kernels(len(digests), HORNER_ROW_NS)
    if kernels is not None:
        return kernels.buckets_kernel(np.ascontiguousarray(digests), bucket_count)
    words = np.ascontiguousarray(digests).view(">u4").reshape(-1, 5).astype(np.uint64)
    n = np.uint64(bucket_count)
    r = np.zeros(len(words), dtype=np.uint64)
    for j in range(5):
        r = (r * np.uint64(1 << 32) + words[:, j]) % n
    return r.astype(np.int64)


# ----- sort keys ----------------------------------------------------------------------------------------------
def sort_key_type_width(t: pa.DataType) -> int | None:
    """Byte width of a fixed-width sort key type, None when the type has no fixed width."""
    if pa.types.is_boolean(t):
        return 1
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t):
        try:
            return t.bit_width // 8
        except ValueError:
            return None
    if pa.types.is_fixed_size_binary(t):
        return t.byte_width
    return None


def sort_key_width(schema_types: dict[str, pa.DataType], sort_keys: list[tuple[str, str]], where: str) -> int:
    """Validate sort keys against a schema; returns the encoded width (a null flag byte + value per key)."""
    names = [n for n, _ in sort_keys]
    if len(set(names)) != len(names):
        raise FlashError(f"sort keys {names} repeat a column: give each sort key column once")
    total = 0
    width = 0
    for name, direction in sort_keys:
        if direction not in ("ascending", "descending"):
            raise FlashError(f"sort key {name!r} has direction {direction!r}: use ascending or descending")
        if name not in schema_types:
            raise FlashError(f"sort key column {name!r} is not in {where}: choose one of {sorted(schema_types)}")
        w = sort_key_type_width(schema_types[name])
        if w is None:
            raise FlashError(
                f"sort key column {name!r} of {where} has type {schema_types[name]}, which has no fixed width: "
                "use an integer, float, boolean, date, time, timestamp, duration, decimal or fixed-size binary column"
            )
        total += w
        width += 1 + w
    if total > MAX_SORT_KEY_BYTES:
        raise FlashError(
            f"sort keys {names} of {where} take {total} bytes; the limit is {MAX_SORT_KEY_BYTES}: use fewer or "
            "narrower sort keys"
        )
    return width


def sort_key_bytes(table: pa.Table, sort_keys: list[tuple[str, str]]) -> np.ndarray:
    """(n, width) uint8 whose memcmp order is the sort order: greater bytes win.

    Per key: a flag byte (0 null, 1 value) then the value in an order-preserving big-endian form, inverted
    for "descending". A null ranks below every value in either direction.
    """
    n = table.num_rows
    cols = []
    for name, direction in sort_keys:
        col = table.column(name)
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        value = _ordered_bytes(arr)
        if direction == "descending":
            value = ~value
        value[~valid] = 0
        cols.append(valid.astype(np.uint8).reshape(-1, 1))
        cols.append(value)
    if not cols:
        return np.zeros((n, 0), dtype=np.uint8)
    return np.ascontiguousarray(np.hstack(cols))


def _ordered_bytes(arr: pa.Array) -> np.ndarray:
    t = arr.type
    if pa.types.is_boolean(t):
        return pc.fill_null(arr, False).to_numpy(zero_copy_only=False).astype(np.uint8).reshape(-1, 1)
    if pa.types.is_fixed_size_binary(t):
        filled = pc.fill_null(arr, b"\x00" * t.byte_width)
        return np.frombuffer(filled.buffers()[1], dtype=np.uint8)[
            filled.offset * t.byte_width : (filled.offset + len(filled)) * t.byte_width
        ].reshape(-1, t.byte_width).copy()
    if pa.types.is_decimal(t):
        w = t.bit_width // 8
        raw = (np.frombuffer(arr.buffers()[1], dtype=np.uint8)[arr.offset * w : (arr.offset + len(arr)) * w]
               .reshape(-1, w))
        be = raw[:, ::-1].copy()  # little-endian two's complement -> big-endian
        be[:, 0] ^= 0x80
        return be
    w = t.bit_width // 8
    if pa.types.is_floating(t):
        ftype: Any = {2: np.float16, 4: np.float32, 8: np.float64}[w]
        utype: Any = {2: np.uint16, 4: np.uint32, 8: np.uint64}[w]
        v = pc.fill_null(arr, 0.0).to_numpy(zero_copy_only=False).astype(ftype)
        v = np.where(v == 0, ftype(0.0), v)  # -0.0 == 0.0: one encoding, so they tie
        v = np.where(np.isnan(v), ftype(np.nan), v)  # every NaN is one value, above +inf (as in SQL engines)
        u = v.view(utype)
        sign = utype(1) << utype(8 * w - 1)
        u = np.where(u & sign, ~u, u | sign).astype(utype)
    else:
        itype = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[w]
        utype = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[w]  # Any: declared in the branch above
        phys = (arr if pa.types.is_integer(t)
                else arr.view({1: pa.int8(), 2: pa.int16(), 4: pa.int32(), 8: pa.int64()}[w]))
        if pa.types.is_unsigned_integer(t):
            u = pc.fill_null(phys, 0).to_numpy(zero_copy_only=False).astype(utype)
        else:
            s = pc.fill_null(phys, 0).to_numpy(zero_copy_only=False).astype(itype)
            u = s.view(utype) ^ (utype(1) << utype(8 * w - 1))
    return np.ascontiguousarray(u.astype(u.dtype.newbyteorder(">"))).view(np.uint8).reshape(-1, w)
