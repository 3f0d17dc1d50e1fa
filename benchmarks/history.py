"""Does a compaction cost more as a partition's history grows? A tiny delta compacted after 10, 100, ... versions.

Every compaction commits one version and then cleans up after attempts that lost the race for its number
(catalog/commits.py ``remove_lost_attempts``). Until 2026-11-26 that clean-up was the full sweep
(``remove_orphan_attempts``), which reads every live version manifest: with no retention configured, each
compaction read one more manifest than the one before. This script appends a 20-row delta and compacts it, over
and over, on a local lake and on S3 (a moto server it starts itself, a real HTTP endpoint), and at each checkpoint
reports, side by side in the same run:

* the compaction (median of ``--runs`` compactions at that history; the append before each is not timed):
  seconds, manifests fetched, S3 requests;
* the full sweep alone (what each compaction used to add, and what retention still runs): seconds, manifests
  fetched, S3 requests.

    python -m benchmarks.history --versions 10,100,1000 --s3-versions 10,50,200 --runs 5
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
TABLE = "BENCH.HISTORY"


class Counters:
    """Manifests fetched (the catalog's reads of ``versions/*.json``, counted on the way through) and S3 requests
    (botocore's calls)."""

    def __init__(self) -> None:
        from flash_pipeline.catalog.catalog import Catalog

        self.manifests = 0
        self.requests = 0
        real_read = Catalog._read_json

        def counted_read(cat: Any, key: str, *args: Any, **kwargs: Any) -> Any:
            if "/compacted/versions/" in key:
                self.manifests += 1
            return real_read(cat, key, *args, **kwargs)

        Catalog._read_json = counted_read  # type: ignore[method-assign]
        try:
            import botocore.client

            real_call = botocore.client.BaseClient._make_api_call

            def counted_call(client: Any, op: str, params: Any) -> Any:
                self.requests += 1
                return real_call(client, op, params)

            botocore.client.BaseClient._make_api_call = counted_call  # type: ignore[method-assign]
        except ImportError:
            pass

    def measure(self, fn: Callable[[], Any]) -> tuple[float, int, int]:
        self.manifests = self.requests = 0
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0, self.manifests, self.requests


def _moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "_moto_server.py"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the moto server did not start (pip install -e '.[test]')")
            time.sleep(0.1)
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="history")
    return proc, endpoint


def run_store(store: str, checkpoints: list[int], runs: int, counters: Counters, endpoint: str | None) -> list[dict[str, Any]]:
    from flash_pipeline.catalog.catalog import Catalog
    from flash_pipeline.catalog.commits import remove_orphan_attempts
    from flash_pipeline.compactor.job import compact

    if store == "s3":
        cat = Catalog(f"s3://history/lake-{uuid.uuid4().hex[:8]}", endpoint_url=endpoint)
    else:
        cat = Catalog(str(Path(tempfile.mkdtemp(prefix="flash-history-")) / "lake"))
    rng = np.random.default_rng(0)
    step = 0

    def append() -> None:
        delta = pa.table({"k": rng.integers(0, 1000, 20), "ts": np.full(20, step), "v": rng.random(20)})
        cat.append(TABLE, (), "upsert", [delta])

    def one() -> None:
        nonlocal step
        first = step == 0
        # copy-on-write (recorded by the first run): with deletion vectors, the default for new tables, which
        # files a random delta touches decides how many vectors are read and written, and the requests vary by a
        # few either way from one compaction to the next, which would hide what this measures (growth with history)
        compact(TABLE, ["k"] if first else None, catalog=cat, sort_keys=[("ts", "ascending")] if first else None,
                progress=lambda m: None, executor="in-process", deletion_vectors=False if first else None)
        step += 1

    out = []
    for target in checkpoints:
        while step < target - runs:
            append()
            one()
        samples = []
        for _ in range(runs):
            append()  # not timed: the compaction alone is
            seconds, manifests, requests = counters.measure(one)
            samples.append((seconds, manifests, requests))
        sweep = counters.measure(lambda: remove_orphan_attempts(cat, TABLE, ()))
        row = {
            "store": store, "versions": step,
            "compact_s": statistics.median(s[0] for s in samples), "compact_runs": [round(s[0], 3) for s in samples],
            "compact_manifests": statistics.median(s[1] for s in samples), "compact_requests": statistics.median(s[2] for s in samples),
            "sweep_s": sweep[0], "sweep_manifests": sweep[1], "sweep_requests": sweep[2],
        }
        print(f"{store} after {step} versions: compaction {row['compact_s']:.3f} s ({row['compact_manifests']:.0f} manifests, "
              f"{row['compact_requests']:.0f} S3 requests); full sweep {sweep[0]:.3f} s ({sweep[1]} manifests, {sweep[2]} S3 requests)",
              flush=True)
        out.append(row)
    return out


def _summary(store: str, rows: list[dict[str, Any]]) -> str:
    """One line per store, read off the measurements: does a compaction's work grow with the history?"""
    def spread(key: str) -> str:
        values = sorted({int(r[key]) for r in rows})
        return f"{values[0]}" if len(values) == 1 else f"{values[0]} to {values[-1]}"

    first, last = rows[0], rows[-1]
    line = (f"- {store}: from {first['versions']} to {last['versions']} versions a compaction fetched {spread('compact_manifests')} "
            f"manifest(s)")
    if store == "s3":
        line += f" and made {spread('compact_requests')} S3 requests"
    return line + (f"; the full sweep fetched {first['sweep_manifests']} then {last['sweep_manifests']} "
                   f"({first['sweep_s']:.3f} s then {last['sweep_s']:.3f} s).")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", default="10,100,500", help="comma-separated history lengths to measure at")
    ap.add_argument("--runs", type=int, default=5, help="compactions timed at each checkpoint (median reported)")
    ap.add_argument("--stores", default="local,s3", help="local, s3 (a moto server this script starts), or both")
    ap.add_argument("--s3-versions", default=None,
                    help="history lengths on S3 (default: --versions); moto's listing scans the whole bucket, so its "
                         "requests slow down as the lake grows where real S3's do not")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results_history.md"))
    args = ap.parse_args(argv)
    checkpoints = {store: sorted(int(v) for v in (args.s3_versions if store == "s3" and args.s3_versions else args.versions).split(","))
                   for store in args.stores.split(",")}
    if min(min(c) for c in checkpoints.values()) <= args.runs:
        raise SystemExit(f"every history length must exceed --runs ({args.runs}): the timed compactions end at each checkpoint")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    counters = Counters()
    rows: list[dict[str, Any]] = []
    moto = None
    try:
        for store in args.stores.split(","):
            endpoint = None
            if store == "s3":
                moto, endpoint = _moto()
            rows += run_store(store, checkpoints[store], args.runs, counters, endpoint)
    finally:
        if moto is not None:
            moto.terminate()
    table = ["| store | versions | compaction s (median) | manifests fetched | S3 requests | full sweep s | its manifests | its S3 requests |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s3 = r["store"] == "s3"
        table.append(f"| {r['store']} | {r['versions']} | {r['compact_s']:.3f} | {r['compact_manifests']:.0f} | "
                     f"{r['compact_requests']:.0f} | {r['sweep_s']:.3f} | {r['sweep_manifests']} | {r['sweep_requests'] if s3 else '-'} |")
    text = "\n".join([
        "# A compaction's cost as the partition's history grows",
        "",
        f"Generated by `python -m benchmarks.history --versions {args.versions}"
        + (f" --s3-versions {args.s3_versions}" if args.s3_versions else "") + f" --runs {args.runs} --stores {args.stores}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores, "
        f"Python {platform.python_version()}. Each compaction appends a 20-row delta and compacts it in process (no "
        "retention, so every version stays live); S3 is a moto server on this machine (a real HTTP endpoint: request "
        "counts are what real S3 would bill; its latency is not: moto's listing filters every key of the bucket, so its requests slow down as the lake grows, which real S3's do not). *Full sweep* = `remove_orphan_attempts` alone at "
        "that history: what every compaction ran after its commit until 2026-11-26, and what retention still runs.",
        "",
        *table,
        "",
        *[_summary(store, [r for r in rows if r["store"] == store]) for store in dict.fromkeys(r["store"] for r in rows)],
        "",
    ])
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
