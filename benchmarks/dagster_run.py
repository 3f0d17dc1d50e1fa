"""A Dagster run of the paper's example, from launch to commit, as a user of the README's deployment gets it.

Starts `flash-compactor dev` (dg dev: webserver + daemon, the default run launcher: a new run worker process per
run; plus one Ray head for the deployment) on a lake holding the paper's CUSTOMER_ORDER_STATUS deltas, then for
each run: adds a fresh partition stream (the paper's deltas appended again under a new `Order Day`), launches
its compaction job over GraphQL (what the UI's Materialize button calls), waits for success and reports
launch -> commit (the compacted version's `created_at` minus the launch time) and launch -> run end. Median of
``--runs``, for three deployments:

- readme: `flash-compactor dev` as the README starts it (the paper's example compacts in the run's process);
- shared Ray: the same, every run forced onto Ray (FLASH_IN_PROCESS_MAX_BYTES=0): it joins the deployment's head;
- own Ray: `flash-compactor dev --no-ray`, every run forced onto Ray: each starts a local Ray of its own, as every
  run did before the deployment had one.

    python -m benchmarks.dagster_run --runs 5 --out benchmarks/results_dagster_run.md
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import free_port, stop_process, wait_for_port  # noqa: E402
from dagster_graphql import GraphQL  # noqa: E402

from flash_pipeline.catalog.catalog import Catalog  # noqa: E402
from flash_pipeline.cli.demo import DEMO_DESTINATION, DEMO_SOURCE, demo_deltas  # noqa: E402


def append_stream(cat: Catalog, day: str) -> None:
    """The paper's 1995-04-04 deltas (8 rows, 3 orders) under partition ``Order Day=day``."""
    import pyarrow as pa

    for partition, files in demo_deltas():
        if dict(partition)["Order Day"] != "1995-04-04":
            continue
        moved = [f.set_column(f.schema.get_field_index("Order Day"), "Order Day", pa.array([day] * f.num_rows)) for f in files]
        cat.append(DEMO_SOURCE, (("Order Day", day),), "upsert", moved)


MODES = {
    "readme": ([], {}),
    "shared Ray": ([], {"FLASH_IN_PROCESS_MAX_BYTES": "0"}),
    "own Ray": (["--no-ray"], {"FLASH_IN_PROCESS_MAX_BYTES": "0"}),
}


def measure(mode: str, runs: int) -> tuple[list[float], list[float]]:
    """(launch -> commit, launch -> run end) seconds of ``runs`` runs on a fresh deployment (one warm-up run first)."""
    flags, extra_env = MODES[mode]
    work = Path(tempfile.mkdtemp(prefix="flash-dagster-run-"))
    lake = work / "lake"
    cat = Catalog(str(lake))
    (work / "home").mkdir()
    shutil.copy(ROOT / "dagster.yaml", work / "home" / "dagster.yaml")
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # this deployment's Ray only (short socket paths)
    port = free_port()
    env = dict(os.environ, DAGSTER_HOME=str(work / "home"), FLASH_SENSORS="0", FLASH_DEMO_LOADS="0", RAY_TMPDIR=ray_tmp,
               **extra_env)
    for name in ("FLASH_EXECUTOR", "FLASH_RAY_ADDRESS", "RAY_ADDRESS"):
        env.pop(name, None)
    cli = os.path.join(os.path.dirname(sys.executable), "flash-compactor")
    log = open(work / "dev.log", "wb")
    proc = subprocess.Popen([cli, "dev", "--lake", str(lake), "--host", "127.0.0.1", "--port", str(port), *flags],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    commits: list[float] = []
    ends: list[float] = []
    try:
        wait_for_port(port, timeout=300, proc=proc)
        g = GraphQL(f"http://127.0.0.1:{port}")
        for i in range(runs + 1):  # the first run warms the code server's caches (and Ray's workers); not counted
            day = f"2000-01-{i + 1:02d}"
            append_stream(cat, day)
            key = f"Order Day={day}"
            g.add_partition("assets", "customer_order_status__streams", key)
            launched = time.time()
            run_id = g.launch("assets", "compact_customer_order_status", key)
            status = g.wait(run_id, timeout=300)
            ended = time.time()
            if status != "SUCCESS":
                raise SystemExit(f"run {run_id} ended {status}; see {work / 'dev.log'}")
            version = cat.latest_compacted(DEMO_DESTINATION, (("Order Day", day),))
            if version is None or version.rows != 3:
                raise SystemExit(f"run {run_id}: the compacted partition is wrong ({version})")
            ray_lines = [m for m in g.messages(run_id) if "Ray" in m and ("joining" in m or "starting" in m)]
            line = (f"{mode} run {i}: launch -> commit {version.created_at - launched:.2f} s, launch -> run end "
                    f"{ended - launched:.2f} s; {ray_lines[0].split(': ', 1)[-1] if ray_lines else 'no Ray'}")
            print(line + (" (warm-up, not counted)" if i == 0 else ""), flush=True)
            if i:
                commits.append(version.created_at - launched)
                ends.append(ended - launched)
    finally:
        stop_process(proc, timeout=90, group_signal=signal.SIGINT)
        log.close()
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    return commits, ends


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results_dagster_run.md"))
    args = ap.parse_args(argv)
    results = {mode: measure(mode, args.runs) for mode in args.modes.split(",")}
    rows = []
    for mode, (commits, ends) in results.items():
        rows.append(f"| {mode} | launch -> commit | {statistics.median(commits):.2f} | {', '.join(f'{x:.2f}' for x in commits)} |")
        rows.append(f"| {mode} | launch -> run end (checks included) | {statistics.median(ends):.2f} | {', '.join(f'{x:.2f}' for x in ends)} |")
    text = "\n".join([
        "# A Dagster run of the paper's example: launch to commit",
        "",
        f"Generated by `python -m benchmarks.dagster_run --runs {args.runs}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} ({os.cpu_count()} cores). `flash-compactor dev` (dg dev "
        "with its default run launcher: a new run worker process per run); each run compacts a new partition stream "
        "holding the paper's 1995-04-04 deltas (8 rows in, 3 out). Launch = the GraphQL launchRun call; commit = the "
        "compacted version's created_at. readme: the deployment as the README starts it (this input compacts in the "
        "run's process); shared Ray: every run forced onto Ray (FLASH_IN_PROCESS_MAX_BYTES=0), joining the "
        "deployment's Ray head; own Ray: `flash-compactor dev --no-ray`, every run forced onto Ray, each starting "
        "a local Ray of its own.",
        "",
        "| deployment | measure | median s | runs s |",
        "|---|---|---|---|",
        *rows,
        "",
    ])
    Path(args.out).write_text(text)
    readme = results.get("readme") or next(iter(results.values()))
    Path(args.out).with_suffix(".json").write_text(json.dumps({
        "runs": args.runs, "launch_to_commit_s": statistics.median(readme[0]), "launch_to_run_end_s": statistics.median(readme[1]),
        "modes": {m: {"launch_to_commit_s": statistics.median(c), "launch_to_run_end_s": statistics.median(e), "commits": c, "ends": e}
                  for m, (c, e) in results.items()}}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
