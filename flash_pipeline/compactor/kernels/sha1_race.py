"""Which of two SHA-1 kernels digests short keys faster on this machine, measured once a process.

A CPU may report the SHA extensions and run them slowly: a VM seen here (Intel Xeon @ 2.50GHz) ran the
extensions' kernel (sha1_ni.py) at ~10 us a key where the portable side-by-side one (sha1.py) took 0.14 us, so
scenario 1's 6.2M keys took ~60 s in process instead of ~7. digest.py asks before it picks the extensions'.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

DIGEST_BYTES = 20

# rows of the race (faster): a few milliseconds even where the extensions are slow
RACE_ROWS = 512
_races: dict[tuple[Any, Any], bool] = {}


def faster(kernel: Callable[..., Any], other: Callable[..., Any]) -> bool:
    """Does ``kernel`` digest short keys faster than ``other`` here? Best of 3 on RACE_ROWS 24-byte keys, after a
    first call that loads (or compiles) both; remembered for the process."""
    if (kernel, other) not in _races:
        offsets = np.arange(0, 24 * (RACE_ROWS + 1), 24, dtype=np.int64)
        buf = np.arange(24 * RACE_ROWS, dtype=np.int64).astype(np.uint8)
        out = np.empty((RACE_ROWS, DIGEST_BYTES), dtype=np.uint8)
        best = []
        for fn in (kernel, other):
            fn(buf[:48], offsets[:3], out)  # loads (or compiles) it: not part of the race
            times = []
            for _ in range(3):
                t = time.perf_counter()
                fn(buf, offsets, out)
                times.append(time.perf_counter() - t)
            best.append(min(times))
        _races[(kernel, other)] = best[0] <= best[1]
    return _races[(kernel, other)]
