"""A lake of many partition streams: what a sensor tick, the sensor's cursor, a batched run and the commands that
iterate partitions cost at 200 to 100,000 streams (one 10-row delta each, the shape of a table of small daily
partitions).

For each local scale: the new-delta sensor through Dagster (a real instance: ephemeral, or PostgreSQL at the
largest scale) catches up on the feed, then an idle tick is timed (median of ``--runs``) and its storage requests
counted (``benchmarks/storage_requests.py``, on the real storage), the cursor's size noted; then one new delta
is appended to each of ``--changed`` streams and the next tick's requests, records read and run requests are
counted. The same on an S3 lake (a local moto server, as the tests start it). Then the commands that iterate
partitions, each a fresh ``flash-compactor`` process (``show``, ``auto --dry-run``, ``verify``, ``retain
--dry-run``, ``compact``), with their cost per stream. ``--event-floor N``: what Dagster itself needs to record N
bare materializations and N bare check evaluations (``benchmarks/dagster_event_floor.py``), on SQLite and on
PostgreSQL, the floor under the end-to-end run through the daemon (``--daemon``, ``--daemon-postgres``).

    .venv/bin/python -m benchmarks.lake_scale --streams 200,4000,10000 --s3 10000 --postgres 100000 \\
        --out benchmarks/results_lake_scale.md

Lakes are built once under ``benchmarks/data/lake_scale/<streams>/`` (ignored by git) with the catalog's own
appends on two processes, and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from benchmarks.storage_requests import count_requests  # noqa: E402
from flash_pipeline.catalog.catalog import Catalog  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "lake_scale"
TABLE = "SCALE.EVENTS"
DESTINATION = "SCALE.EVENTS_COMPACTED"
TABLES_YAML = f"""
tables:
  - name: scale
    source: {TABLE}
    destination: {DESTINATION}
    primary_keys: [id]
    sort_keys: ["ts:ascending"]
    trigger: {{policy: immediate}}
"""


def _rows(i: int, ts: int = 1) -> Any:
    import pyarrow as pa

    return pa.table({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64()), "ts": pa.array([ts] * 10, pa.int64()),
                     "v": [f"v{i}"] * 10})


def day(i: int) -> dict[str, str]:
    return {"day": f"d{i:06d}"}


def _append_range(lake: str, start: int, stop: int, ts: int = 1) -> None:
    cat = Catalog(lake)
    for i in range(start, stop):
        cat.append(TABLE, day(i), "upsert", [_rows(i, ts)])


def append_streams(lake: str, streams: range, ts: int = 1, workers: int = 2) -> None:
    """One delta in each stream of ``streams``, by the catalog's appends on ``workers`` processes."""
    chunk = max(1, min(500, len(streams) // (workers * 4) or 1))
    ranges = [(s, min(s + chunk, streams.stop)) for s in range(streams.start, streams.stop, chunk)]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_append_range, [lake] * len(ranges), [a for a, _ in ranges], [b for _, b in ranges], [ts] * len(ranges)))


def build_lake(streams: int) -> Path:
    path = DATA / str(streams)
    marker = path / f".built-{streams}"
    if marker.exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    append_streams(str(path), range(streams))
    marker.touch()
    print(f"built {streams} streams in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return path


def copy_lake(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".built-*"))
    return dst


# ----- the sensor -------------------------------------------------------------------------------------------
def _tick(defs: Any, instance: Any, cursor: str | None) -> tuple[Any, str | None, float]:
    from dagster_helpers import tick

    t0 = time.perf_counter()
    result, cursor = tick(defs, instance, cursor)
    return result, cursor, time.perf_counter() - t0


def sensor_at_scale(lake_uri: str, instance: Any, changed: int, runs: int, config: Path, append_lake: str | None) -> dict[str, Any]:
    """Catch up, time idle ticks, then one new delta in each of ``changed`` streams and the tick after it."""
    from assets.definitions import build_definitions

    defs = build_definitions(config, lake_uri)
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    cursor = None
    requests = 0
    with count_requests() as calls:
        for _ in range(1000):
            result, cursor, _ = _tick(defs, instance, cursor)
            requests += len(getattr(result, "run_requests", None) or [])
            state = json.loads(cursor)["tables"]["scale"]
            if not state.get("unjudged") and state["src"] >= Catalog(lake_uri, **_s3_options(lake_uri)).changes.head(TABLE):
                break
    out["catch-up seconds"] = round(time.perf_counter() - t0, 2)
    out["catch-up storage requests"] = sum(calls.values())
    out["catch-up run requests"] = requests
    idle: list[float] = []
    for _ in range(runs):
        with count_requests() as calls:
            result, cursor, seconds = _tick(defs, instance, cursor)
        assert not (getattr(result, "run_requests", None) or []), "an idle tick asked for runs"
        idle.append(seconds)
    out["idle tick seconds (median)"] = round(statistics.median(idle), 4)
    out["idle tick seconds (all)"] = [round(x, 4) for x in idle]
    out["idle tick storage requests"] = dict(calls)
    out["cursor bytes"] = len(cursor or "")
    if changed:
        append_streams(append_lake or lake_uri, range(changed), ts=2)
        with count_requests() as calls:
            result, cursor, seconds = _tick(defs, instance, cursor)
        reqs = list(getattr(result, "run_requests", None) or [])
        out[f"tick after {changed} new deltas: seconds"] = round(seconds, 3)
        out[f"tick after {changed} new deltas: storage requests"] = dict(calls)
        out[f"tick after {changed} new deltas: run requests"] = len(reqs)
        out[f"tick after {changed} new deltas: streams requested"] = sum(
            len(next(iter(r.run_config["ops"].values()))["config"]["partitions"]) for r in reqs)
        out["cursor bytes after"] = len(cursor or "")
        out["_batch_request"] = reqs[0] if reqs else None
        out["_defs"] = defs
    return out


def _s3_options(uri: str) -> dict[str, Any]:
    return {"endpoint_url": os.environ["FLASH_S3_ENDPOINT_URL"]} if uri.startswith("s3://") else {}


# ----- commands -----------------------------------------------------------------------------------------------
COMMANDS = {
    "show": ["show", "--table", TABLE, "--json"],
    "auto --dry-run": ["auto", "--table", TABLE, "--destination", DESTINATION, "--policy", "immediate", "--dry-run"],
    "compact": ["compact", "--table", TABLE, "--destination", DESTINATION, "--primary-key", "id", "--sort-key", "ts"],
    "verify": ["verify", "--table", DESTINATION],
    "retain --dry-run": ["retain", "--table", DESTINATION, "--keep-last", "1", "--dry-run"],
}


def time_command(lake: str, args: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "flash-compactor"), args[0], "--catalog", lake, *args[1:]],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - t0, done.returncode


def commands_at_scale(lake: Path, streams: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, args in COMMANDS.items():
        seconds, code = time_command(str(lake), args)
        out[name] = {"seconds": round(seconds, 2), "ms per stream": round(seconds / streams * 1000, 3), "exit": code}
    return out


# ----- S3 and PostgreSQL --------------------------------------------------------------------------------------
def moto() -> Iterator[str]:
    from conftest import free_port, stop_process, wait_for_port

    port = free_port()
    # plain moto (threaded): the lake is uploaded with many requests at once and only read afterwards; the tests'
    # serialized server (atomic conditional puts) would take ten minutes over the upload
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def upload(lake: Path, endpoint: str, bucket: str, prefix: str) -> None:
    """Every object of a built local lake into the moto bucket (threads; the lake's own keys)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    files = [p for p in lake.rglob("*") if p.is_file() and not p.name.startswith(".")]

    def put(p: Path) -> None:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{p.relative_to(lake).as_posix()}", Body=p.read_bytes())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, files))


def batched_run_launch(result: dict[str, Any], instance: Any) -> dict[str, Any]:
    """One batched run of the tick's first request, executed in this process on the instance: its wall time."""
    req, defs = result.pop("_batch_request"), result.pop("_defs")
    if req is None:
        return {}
    streams = len(next(iter(req.run_config["ops"].values()))["config"]["partitions"])
    t0 = time.perf_counter()
    run = defs.resolve_job_def(req.job_name).execute_in_process(instance=instance, run_config=req.run_config, raise_on_error=False)
    return {"batched run: streams": streams, "batched run: seconds": round(time.perf_counter() - t0, 2), "batched run: success": run.success}


# ----- end to end through the daemon ---------------------------------------------------------------------------
def daemon_end_to_end(streams: int, timeout: float = 1800, postgres_url: str | None = None) -> dict[str, Any]:
    """A load touching ``streams`` compacted streams, compacted by ``flash-compactor dev``'s daemon (sensor ->
    batched runs -> a materialization per stream), against the CLI's ``compact`` of the same lake after the same
    load. Launch of the clock: the load's last commit; stop: every stream's new materialization recorded."""
    import signal

    from conftest import free_port, stop_process, wait_for_port
    from dagster import AssetKey, DagsterInstance
    from dagster_helpers import write_config

    base = work_dir() / f"e2e-{streams}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    compacted = copy_lake(build_lake(streams), base / "base")
    seconds, code = time_command(str(compacted), COMMANDS["compact"])
    assert code == 0, "the first compaction failed"
    cli_lake, dev_lake = copy_lake(compacted, base / "cli"), copy_lake(compacted, base / "dev")
    home = base / "home"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    if postgres_url:  # the instance on PostgreSQL (docs/dagster.md), beside the repository's settings
        with open(home / "dagster.yaml", "a") as fh:
            fh.write(f"\nstorage:\n  postgres:\n    postgres_url: {postgres_url}\n")
    config = write_config(base, TABLES_YAML)
    port = free_port()
    env = dict(os.environ, DAGSTER_HOME=str(home), FLASH_DEMO_LOADS="0", FLASH_TABLES=str(config))
    log = open(base / "dev.log", "wb")
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "flash-compactor"), "dev", "--lake", str(dev_lake), "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    out: dict[str, Any] = {"streams": streams, "first compaction (CLI) seconds": round(seconds, 1)}
    try:
        wait_for_port(port, timeout=300, proc=proc)
        instance = DagsterInstance.from_config(str(home))
        deadline = time.time() + 300  # the sensor's first ticks replay the feed: every stream is compacted already
        while time.time() < deadline and not instance.get_dynamic_partitions("scale__streams"):
            time.sleep(2)
        time.sleep(35)  # one more tick, so the load below is what the next ticks see
        t0 = time.perf_counter()
        append_streams(str(dev_lake), range(streams), ts=2)
        loaded = time.time()
        out["load (one delta per stream) seconds"] = round(time.perf_counter() - t0, 1)
        append_streams(str(cli_lake), range(streams), ts=2)
        done: set[str] = set()
        while time.time() < loaded + timeout and len(done) < streams:
            time.sleep(2)
            for record in instance.fetch_materializations(AssetKey(["scale", "compacted"]), limit=10_000).records:
                if record.timestamp >= loaded and record.partition_key:
                    done.add(record.partition_key)
        out["daemon: load end -> every stream's materialization recorded, seconds"] = round(time.time() - loaded, 1)
        out["daemon: streams recorded"] = len(done)
        runs = instance.get_runs()
        out["daemon: compaction runs"] = sum(1 for r in runs if r.job_name == "compact_scale_batch")
    finally:
        stop_process(proc, timeout=90, group_signal=signal.SIGINT)  # Ctrl-C for the group, as in a terminal
        log.close()
    seconds, code = time_command(str(cli_lake), COMMANDS["compact"])
    out["CLI compact of the same load, seconds"] = round(seconds, 1)
    out["target: 2 x CLI + 30 s"] = round(2 * seconds + 30, 1)
    out["met"] = out["daemon: load end -> every stream's materialization recorded, seconds"] <= 2 * seconds + 30
    return out


def work_dir() -> Path:
    return DATA / ".work"


# ----- report -------------------------------------------------------------------------------------------------
def machine() -> str:
    import psutil

    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.1f} GiB, {platform.platform()}"


def report(results: dict[str, Any], command: str) -> str:
    lines = ["# A lake of many partition streams", "", f"Machine: {machine()}", "", f"Command: `{command}`", "",
             f"Commit: {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}",
             "", "Each stream: one 10-row upsert delta. Storage requests are counted on the real storage.", ""]
    for name, data in results.items():
        lines += [f"## {name}", "", "```json", json.dumps(data, indent=1, sort_keys=True, default=str), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lake_scale", description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="200,4000,10000", help="local lake scales (comma-separated)")
    p.add_argument("--s3", type=int, default=10000, help="streams of the S3 (moto) lake; 0 skips it")
    p.add_argument("--postgres", type=int, default=0, help="streams of the lake measured on a PostgreSQL instance; 0 skips")
    p.add_argument("--changed", type=int, default=1000, help="streams that get one new delta after the idle ticks")
    p.add_argument("--commands", type=int, default=10000, help="the scale at which the commands are timed; 0 skips")
    p.add_argument("--daemon", type=int, default=0, help="streams of the end-to-end run through flash-compactor dev; 0 skips")
    p.add_argument("--daemon-postgres", type=int, default=0, help="the same end-to-end run with the instance on PostgreSQL")
    p.add_argument("--event-floor", type=int, default=0,
                   help="events of each kind in Dagster's own event-write floor, on SQLite and on PostgreSQL; 0 skips")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--merge", action="store_true", help="keep the parts an earlier run wrote to --out's .json, replace the rest")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from dagster import DagsterInstance
    from dagster_helpers import write_config

    work = work_dir()
    work.mkdir(parents=True, exist_ok=True)
    config = write_config(work, TABLES_YAML)
    results: dict[str, Any] = {}
    command = "python -m benchmarks.lake_scale " + " ".join(argv if argv is not None else sys.argv[1:])

    sidecar = Path(args.out).with_suffix(".json") if args.out else None
    if args.merge and sidecar is not None and sidecar.exists():  # parts measured by an earlier run stay
        previous = json.loads(sidecar.read_text())
        results.update(previous["results"])
        command = previous["command"] + "; then " + command

    def save() -> None:  # after each part: a long run interrupted keeps what it measured
        if args.out and sidecar is not None:
            Path(args.out).write_text(report(results, command))
            sidecar.write_text(json.dumps({"command": command, "results": results}, indent=1, default=str))

    for n in [int(x) for x in args.streams.split(",") if x]:
        lake = copy_lake(build_lake(n), work / f"local-{n}")
        res = sensor_at_scale(str(lake), DagsterInstance.ephemeral(), min(args.changed, n), args.runs, config, None)
        res.pop("_batch_request", None), res.pop("_defs", None)
        results[f"local lake, {n} streams: new-delta sensor"] = res
        print(json.dumps({n: res}, default=str), file=sys.stderr)
        save()
        if n == args.commands:
            results[f"local lake, {n} streams: commands (fresh process each)"] = commands_at_scale(copy_lake(build_lake(n), work / f"cmd-{n}"), n)
            save()
    if args.s3:
        for endpoint in moto():
            os.environ["FLASH_S3_ENDPOINT_URL"] = endpoint
            prefix = f"lake-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            upload(build_lake(args.s3), endpoint, "scale", prefix)
            uri = f"s3://scale/{prefix}"
            res = sensor_at_scale(uri, DagsterInstance.ephemeral(), 0, args.runs, config, None)
            res.pop("_batch_request", None), res.pop("_defs", None)
            res["upload seconds"] = round(time.perf_counter() - t0, 1)
            results[f"S3 lake (moto server), {args.s3} streams: new-delta sensor"] = res
            save()
    if args.postgres:
        from dagster import instance_for_test
        from postgres_server import run_server

        for url in run_server():
            lake = copy_lake(build_lake(args.postgres), work / f"pg-{args.postgres}")
            home = work / "pg-home"
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir()
            with instance_for_test(overrides={"storage": {"postgres": {"postgres_url": url}}}, temp_dir=str(home)) as instance:
                res = sensor_at_scale(str(lake), instance, min(args.changed, args.postgres), args.runs, config, None)
                res.update(batched_run_launch(res, instance))
            results[f"local lake, {args.postgres} streams, Dagster on PostgreSQL: new-delta sensor"] = res
            save()
    if args.daemon:
        results[f"end to end through flash-compactor dev's daemon, {args.daemon} streams"] = daemon_end_to_end(args.daemon)
        save()
    if args.event_floor:
        from benchmarks.dagster_event_floor import event_floor

        results["Dagster's own event-write floor, SQLite"] = event_floor(args.event_floor, work)
        save()
        from postgres_server import run_server

        for url in run_server(fsync=True):
            results["Dagster's own event-write floor, PostgreSQL"] = event_floor(args.event_floor, work, url)
        save()
    if args.daemon_postgres:
        from postgres_server import run_server

        for url in run_server(fsync=True):
            results[f"end to end through flash-compactor dev's daemon, {args.daemon_postgres} streams, Dagster on PostgreSQL"] = \
                daemon_end_to_end(args.daemon_postgres, postgres_url=url)
        save()
    print(report(results, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
