"""Transparent huge pages: off for the processes that run a round's steps (``FLASH_THP=on`` keeps them).

NumPy and Arrow's allocator ask the kernel for transparent huge pages on large allocations
(``madvise(MADV_HUGEPAGE)``). With the common ``defrag=madvise`` setting, a fault in such a region makes the
kernel assemble a 2 MiB page on the spot (direct compaction), and on a VM whose host reclaims freed guest memory
each of those pages is a host fault too. Measured on this project's 2-core VM (benchmarks/scripts/first_touch.py):
filling 1 GiB of fresh memory took 2.3-2.5 s with huge pages and 0.38-0.42 s without; s1 compacted in a fresh
process after 15 s idle took 4.6-5.0 s with them and 3.6-3.8 s without (hot: 3.5-4.6 s against 3.4-3.5 s). A
round's arrays are streamed once, in cache-sized partitions, so huge pages buy little TLB reach back.

``prctl(PR_SET_THP_DISABLE)`` turns them off for the calling process and the processes it starts (Ray's head
and workers when the driver starts a local Ray); Ray tasks also apply it in their worker. Memory already mapped
keeps its pages. Linux only: elsewhere, or if the kernel refuses, nothing changes.
"""

from __future__ import annotations

import sys

from flash_pipeline.settings import env_switch

PR_SET_THP_DISABLE = 41
_applied: bool | None = None  # the outcome of the first call in this process


def huge_pages_setting() -> bool:
    """FLASH_THP: off (the default) or on; anything else is a one-line error naming the variable."""
    return env_switch("FLASH_THP", False, "off: no transparent huge pages for the compactor's processes")


def apply_huge_pages_setting() -> bool:
    """Turn transparent huge pages off for this process unless FLASH_THP=on (once; later calls only re-check the
    variable). Returns whether they are off."""
    global _applied
    keep = huge_pages_setting()
    if _applied is None:
        _applied = False
        if not keep and sys.platform.startswith("linux"):
            try:
                import ctypes

                _applied = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):  # no prctl in this libc: nothing to do
                _applied = False
    return _applied
