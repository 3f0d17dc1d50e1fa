"""What memory touched for the first time costs on this machine: one process fills a new 1 GiB NumPy array three
times (the second and third fills reuse the pages the first one faulted in). Run it after the machine has been
idle a while, then again at once: on this VM the first fill of a fresh process costs ~2 s when the machine was
idle (the guest had handed its free memory back to the host, so every new page is a host fault too) and
0.06 s when the same pages are reused. Usage: .venv/bin/python benchmarks/scripts/first_touch.py"""

from __future__ import annotations

import time

import numpy as np

GIB = 1 << 30

for attempt in range(3):
    t = time.perf_counter()
    a = np.ones(GIB // 8)  # 1 GiB of float64, every page written
    print(f"fill {attempt + 1}: {time.perf_counter() - t:.3f} s for 1 GiB", flush=True)
    del a
