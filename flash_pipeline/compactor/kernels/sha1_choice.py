"""Which SHA-1 and framing kernels a call of digest.py uses: the build compiled ahead of time, Numba's, or none.

The kernels of sha1.py and sha1_ni.py are Numba's own functions (their modules import Numba). Where this machine
has a build of them (kernels/aot.py) they are called through it, whatever the size of the work: nothing to load.
Otherwise jit.use_compiled decides, as for every kernel: a few rows are framed by NumPy and digested by hashlib,
more load Numba. The SHA extensions' kernel is used only where this CPU has them and runs them fast (sha1_race.py).
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from types import ModuleType, SimpleNamespace
from typing import Any, Callable

import numpy as np

from flash_pipeline.compactor.kernels import aot
from flash_pipeline.compactor.kernels.frames import FRAME_COPY_BYTES
from flash_pipeline.settings import kernel_form, sha_extensions_switch

DIGEST_BYTES = 20


class Compiled:
    """A kernel of sha1.py or sha1_ni.py, called through the build where it has the call's signature, else
    through its module (which loads Numba: jit.load)."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name, self.key = module, name, aot.kernel_name(module, name)

    def __call__(self, *args: Any) -> Any:
        fn = aot.function(self.key, args)
        if fn is not None:
            return fn(*args)
        from flash_pipeline.compactor.kernels import jit

        jit.load()
        return getattr(importlib.import_module(self.module), self.name)(*args)

    def __repr__(self) -> str:
        return f"<compiled kernel {self.key}>"


def sha1_rows_hashlib(buf: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Reference implementation: one hashlib call per row."""
    raw = buf.tobytes()
    sha1 = hashlib.sha1
    o = offsets.tolist()
    joined = b"".join([sha1(raw[a:b]).digest() for a, b in zip(o[:-1], o[1:])])
    return np.frombuffer(joined, dtype=np.uint8).reshape(-1, DIGEST_BYTES).copy()


# nanoseconds a row of the uncompiled paths below (NumPy framing, hashlib's SHA-1, NumPy's Horner rule), which jit.py
# charges against the budget that buys Numba
FRAME_ROW_NS = 300
HASHLIB_ROW_NS = 700
HORNER_ROW_NS = 100


_SHA1 = "flash_pipeline.compactor.kernels.sha1"
# sha1.py's kernels through the kernels compiled ahead of time (kernels/aot.py), each loading Numba only for a call
# whose signature the build does not have
AHEAD_OF_TIME = SimpleNamespace(frame_rows=Compiled(_SHA1, "frame_rows"),
                                sha1_rows_lanes=Compiled(_SHA1, "sha1_rows_lanes"),
                                buckets_kernel=Compiled(_SHA1, "buckets_kernel"),
                                FRAME_COPY_BYTES=FRAME_COPY_BYTES)
SHA1_NI_AHEAD_OF_TIME = Compiled("flash_pipeline.compactor.kernels.sha1_ni", "sha1_rows_ni")


def compiled_kernels(rows: int, row_ns: int) -> ModuleType | SimpleNamespace | None:
    """kernels/sha1.py when work on ``rows`` rows should be compiled (jit.use_compiled: not for a few rows in a
    process that has not loaded Numba, where NumPy and hashlib are faster than loading it), else None. Where
    this machine has the kernels compiled ahead of time, those, whatever the size (no load to pay for)."""
    from flash_pipeline.compactor.kernels import jit

    if kernel_form() in ("auto", "compiled") and aot.has("sha1.frame_rows"):
        return AHEAD_OF_TIME
    if not jit.use_compiled(rows, row_ns):
        return None
    try:
        from flash_pipeline.compactor.kernels import sha1
    except Exception:  # noqa: BLE001 - numba is a declared dependency; without it the engine still runs
        return None
    jit.load()
    return sha1


def sha1_kernel(rows: int | None = None) -> Callable[..., Any] | None:
    """The fastest SHA-1 kernel this CPU runs: the SHA extensions' (~30 ns a key with its padding) where they
    are fast, else the portable side-by-side one (~110 ns), else None (hashlib: few rows, or no Numba). ``rows``
    None: any size."""
    kernels = compiled_kernels(sys.maxsize if rows is None else rows, HASHLIB_ROW_NS)
    if kernels is None:
        return None
    if kernels is AHEAD_OF_TIME:  # the extensions' kernel was built only where this CPU has them (aot_build.py)
        if not (sha_extensions_switch() and aot.has("sha1_ni.sha1_rows_ni")):
            return kernels.sha1_rows_lanes
        from flash_pipeline.compactor.kernels.sha1_race import faster

        ni = SHA1_NI_AHEAD_OF_TIME
        return ni if faster(ni, kernels.sha1_rows_lanes) else kernels.sha1_rows_lanes
    try:
        from flash_pipeline.compactor.kernels import sha1_ni
    except Exception:  # noqa: BLE001 - an llvmlite without the IR builder: the portable kernel
        return kernels.sha1_rows_lanes
    if not sha1_ni.usable():
        return kernels.sha1_rows_lanes
    from flash_pipeline.compactor.kernels.sha1_race import faster

    return sha1_ni.sha1_rows_ni if faster(sha1_ni.sha1_rows_ni, kernels.sha1_rows_lanes) else kernels.sha1_rows_lanes


def sha1_rows(buf: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(n, 20) uint8 SHA-1 digests of buf[offsets[i]:offsets[i+1]]."""
    kernel = sha1_kernel(len(offsets) - 1) if len(offsets) > 1 else None
    if kernel is None:
        return sha1_rows_hashlib(buf, offsets)
    out = np.empty((len(offsets) - 1, DIGEST_BYTES), dtype=np.uint8)
    kernel(np.ascontiguousarray(buf), offsets, out)
    return out
