"""Run one compaction of the resilience tests' table in its own process (so a crash point can SIGKILL it).

usage: _resume_driver.py LAKE RAY_ADDRESS MAX_ROUND_BYTES
"""

import sys

from flash_pipeline import Catalog, compact

lake, address, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
compact(
    "R.T",
    ["k", "region"],
    sort_keys=[("ts", "ascending")],
    catalog=Catalog(lake),
    hash_bucket_count=3,
    rows_per_compacted_file=700,
    max_round_bytes=budget,
    ray_address=address,
    progress=lambda m: print(m, flush=True),
)
