"""NumPy arrays wrapped as Arrow arrays (catalog/arrow_arrays.py) take and filter exactly as ``pa.array`` of them
would, on random inputs, without importing ``numpy.ma``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.catalog.arrow_arrays import indices_array, mask_array


@settings(max_examples=150, deadline=None)
@given(st.lists(st.booleans(), max_size=300), st.integers(0, 7))
def test_a_mask_filters_like_pyarrows_conversion(bits: list[bool], offset: int) -> None:
    keep = np.array([False] * offset + bits, dtype=bool)[offset:]  # a view that starts inside its buffer
    table = pa.table({"x": np.arange(len(keep)), "s": [str(i) for i in range(len(keep))]})
    assert mask_array(keep).to_pylist() == bits
    assert table.filter(mask_array(keep)).equals(table.filter(pa.array(keep)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 199), max_size=300), st.sampled_from([np.int64, np.int32, np.uint32, np.uint64, np.int16]),
       st.booleans())
def test_indices_take_like_pyarrows_conversion(rows: list[int], dtype: type, strided: bool) -> None:
    table = pa.table({"x": np.arange(200) * 3, "s": [f"r{i}" for i in range(200)]})
    values = np.array(rows, dtype=dtype)
    if strided:  # a non-contiguous view
        values = np.repeat(values, 2)[::2]
    taken = table.take(indices_array(values))
    assert taken.equals(table.take(pa.array(np.asarray(values, dtype=np.int64))))
    assert taken.column("x").to_pylist() == [3 * r for r in rows]


def test_neither_imports_numpy_ma() -> None:
    code = ("import numpy as np, sys; from flash_pipeline.catalog.arrow_arrays import indices_array, mask_array; "
            "import pyarrow as pa; t = pa.table({'x': [1, 2, 3]}); "
            "t.filter(mask_array(np.array([True, False, True]))).take(indices_array(np.array([1, 0]))); "
            "print('numpy.ma' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"
