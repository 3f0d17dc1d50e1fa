"""What memory touched for the first time costs on this machine: one process fills a new 1 GiB NumPy array three
times (the second and third fills reuse the pages the first one faulted in). NumPy asks for transparent huge
pages on large arrays, as Arrow's allocator does; ``--no-thp`` turns them off for the process first
(prctl PR_SET_THP_DISABLE, as the compactor does: flash_pipeline/compactor/runtime/memory.py).

Run it after the machine has been idle a while, then again at once. On this VM (2026-11-25) the first fill of a
fresh process took 2.2-2.5 s with huge pages when the machine had been idle (the guest had handed its free
memory back to the host: each new page is a host fault too, and each huge page a compaction), 0.38-0.42 s
without them, and 0.06-0.09 s when the process reuses its own pages.
Usage: .venv/bin/python benchmarks/scripts/first_touch.py [--no-thp]"""

from __future__ import annotations

import ctypes
import sys
import time

import numpy as np

GIB = 1 << 30

if "--no-thp" in sys.argv[1:]:
    assert ctypes.CDLL(None).prctl(41, 1, 0, 0, 0) == 0, "prctl(PR_SET_THP_DISABLE) refused"
for attempt in range(3):
    t = time.perf_counter()
    a = np.ones(GIB // 8)  # 1 GiB of float64, every page written
    print(f"fill {attempt + 1}: {time.perf_counter() - t:.3f} s for 1 GiB", flush=True)
    del a
