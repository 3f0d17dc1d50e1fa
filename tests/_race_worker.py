"""One writer of compacted versions in the race test (tests/test_races.py), as its own long-lived process.

    python _race_worker.py ROLE LAKE_URI RAY_ADDRESS

ROLE is compact, rehash, optimize or retain. The process joins the test's Ray cluster once, then reads one JSON
command per line from stdin ({"table", "start", "jitter", "buckets"}), sleeps until ``start + jitter`` (so all
writers hit the same partition at the same instant) and runs its operation through the public Python API,
exactly as a user's process would. It answers one JSON line per command (prefixed ``@race@``): ok, the error's
class and message, and the exit code the CLI would give.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


PREFIX = "@race@ "  # Ray prints its own warnings to this process's stdout too: answers carry this prefix


def main() -> int:
    role, uri, address = sys.argv[1:4]
    from flash_pipeline.catalog.catalog import Catalog
    from flash_pipeline.compactor.job import compact
    from flash_pipeline.compactor.runtime.cluster import ensure_ray
    from flash_pipeline.compactor.index.rehash import rehash
    from flash_pipeline.retention import retain
    from flash_pipeline.errors import FlashError
    from flash_pipeline.optimize import optimize

    if role in ("compact",):
        ensure_ray(address=address)
    catalog = Catalog(uri, endpoint_url=os.environ.get("FLASH_S3_ENDPOINT_URL")) if uri.startswith("s3://") else Catalog(uri)
    log: list[str] = []
    print(PREFIX + json.dumps({"ready": role}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        table = cmd["table"]
        time.sleep(max(0.0, cmd["start"] + cmd["jitter"] - time.time()))
        log.clear()
        began = time.perf_counter()
        try:
            if role == "compact":
                compact(table, None, catalog=catalog, progress=log.append)
            elif role == "rehash":
                rehash(catalog, table, cmd["buckets"], log=log.append)
            elif role == "optimize":
                optimize(catalog, table, min_file_size=1 << 40, max_file_size=1 << 40, progress=log.append)
            elif role == "retain":  # several passes across the race window, so it meets versions to expire
                for n in range(3):
                    time.sleep(0.3 if n else 0.0)  # none after the last pass: the window has closed
                    retain(catalog, table, keep_last=2)
            else:
                raise SystemExit(f"unknown role {role}")
            answer = {"ok": True, "exit": 0}
        except FlashError as exc:
            answer = {"ok": False, "exit": exc.exit_code, "error": f"{type(exc).__name__}: {exc}"}
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            answer = {"ok": False, "exit": 1, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        answer["replans"] = sum("re-planning on version" in m for m in log)
        answer["seconds"] = round(time.perf_counter() - began, 2)
        print(PREFIX + json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
