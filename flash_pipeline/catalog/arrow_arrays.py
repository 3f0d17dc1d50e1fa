"""NumPy arrays as Arrow arrays over the same memory, for takes and filters.

``pa.array(ndarray)`` checks whether its argument is a masked array, and that first check imports ``numpy.ma``
(~15 ms, holding the GIL, inside the first step of a fresh ``flash-compactor`` process). ``Array.from_buffers``
wraps the NumPy buffer without that check and without a copy.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_TYPES = {np.dtype(np.int64): pa.int64(), np.dtype(np.int32): pa.int32(), np.dtype(np.uint32): pa.uint32(),
          np.dtype(np.uint64): pa.uint64()}


def indices_array(rows: np.ndarray) -> pa.Array:
    """Row numbers (a 1-D integer array, any of int32/int64/uint32/uint64) as an Arrow array sharing their memory."""
    rows = np.ascontiguousarray(rows)
    arrow_type = _TYPES.get(rows.dtype)
    if arrow_type is None or rows.ndim != 1:
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        arrow_type = pa.int64()
    return pa.Array.from_buffers(arrow_type, len(rows), [None, pa.py_buffer(rows)])


def mask_array(keep: np.ndarray) -> pa.BooleanArray:
    """A 1-D boolean NumPy mask as an Arrow boolean array (its bits packed, Arrow's least significant first)."""
    keep = np.asarray(keep, dtype=bool).reshape(-1)
    bits = np.packbits(keep, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(keep), [None, pa.py_buffer(bits)])
