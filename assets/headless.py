"""The headless pipeline: ``python -m assets.headless --lake DIR`` runs the Dagster pipeline once, in-process.

1. every configured PySpark load asset materializes one batch (Spark writes Parquet, the catalog commits deltas);
2. the new-delta sensor ticks once (registering partition streams; ``--force`` ignores trigger policies);
3. each requested compaction run executes in-process (compaction on Ray, asset checks included);
4. the compacted tables are printed (row counts and the first rows of each partition stream).

Everything runs against an ephemeral Dagster instance, so nothing is left behind but the lake.
"""

import argparse
import sys
import time
from typing import Any

from dagster import DagsterInstance, build_sensor_context

from resources.config import load_config
from assets.definitions import build_definitions
from resources.keys import keys
from flash_pipeline.catalog.catalog import user_columns
from flash_pipeline.catalog.encoding import format_partition
from resources import CatalogResource


def run_once(lake: str, config_path: str | None = None, *, force: bool = False, skip_loads: bool = False,
             rows: int = 5, out: Any = None, instance: DagsterInstance | None = None) -> dict[str, Any]:
    out = out or sys.stdout
    project = load_config(config_path)
    defs = build_definitions(config_path, lake)
    instance = instance or DagsterInstance.ephemeral()
    catalog_res = CatalogResource(uri=lake)
    summary: dict[str, Any] = {"loads": [], "runs": [], "tables": {}}
    t0 = time.perf_counter()

    # 1. loads on PySpark
    if not skip_loads:
        for t in project.tables:
            if t.load is None:
                continue
            res = defs.resolve_job_def(t.load_job_name).execute_in_process(instance=instance)
            meta = next(m.metadata for m in (e.event_specific_data.materialization for e in res.get_asset_materialization_events())
                        if m.asset_key == keys(t)["load"])
            print(f"load {t.name}: batch {meta['batch'].value}, {meta['events'].value} events, "
                  f"{meta['cancellations'].value} cancellations, {meta['deltas'].value} deltas", file=out)
            summary["loads"].append(t.name)

    # 2. one sensor tick
    sensor = defs.resolve_sensor_def("new_delta_sensor")
    ctx = build_sensor_context(instance=instance, resources={"catalog": catalog_res}, definitions=defs)
    result = sensor(ctx)
    for req in getattr(result, "dynamic_partitions_requests", None) or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    requests = list(getattr(result, "run_requests", None) or [])
    if force:  # every stream the policies keep waiting too (the sensor's requested ones have req == their last delta)
        requests += _forced_requests(project, instance, getattr(result, "cursor", None) or ctx.cursor)
    if not requests:
        print(f"sensor: {getattr(result, 'skip_message', None) or 'no runs requested'}", file=out)

    # 3. compaction runs (batched: one run compacts many streams, each recording its own materializations)
    for req in requests:
        job = defs.resolve_job_def(req.job_name)
        run = job.execute_in_process(partition_key=req.partition_key, instance=instance, run_config=req.run_config or None,
                                     tags={k: v for k, v in (req.tags or {}).items() if not k.startswith("dagster/")},
                                     raise_on_error=False)  # a failed run is reported below; the others still run
        for stream in stream_outcomes(run, req):
            summary["runs"].append({"job": req.job_name, **stream})
            failed = stream["failed_checks"]
            print(f"compaction {req.job_name} [{stream['partition']}]: {'succeeded' if stream['success'] else 'FAILED'}, "
                  f"{stream['rows'] if stream['rows'] is not None else '?'} rows, checks: "
                  f"{'all passed' if not failed else 'FAILED ' + ', '.join(failed)} ({stream['checks']})", file=out)
            if not stream["success"]:
                print(f"  {stream['error'] or failure_line(run)}", file=out)

    # 4. the compacted tables
    cat = catalog_res.get_catalog()
    for t in project.tables:
        if not cat.table_exists(t.destination):
            continue
        total = 0
        for part in cat.partitions(t.destination):
            compacted = cat.latest_compacted(t.destination, part)
            if compacted is None:
                continue
            total += compacted.rows
            print(f"{t.destination} {format_partition(part)} (version {compacted.version}, {compacted.rows} rows, "
                  f"{len(compacted.files)} files, {compacted.index.hash_bucket_count if compacted.index else 0} buckets):", file=out)
            shown = 0
            for f in sorted(compacted.files, key=lambda f: f.file_number):
                if shown >= rows:
                    break
                table = user_columns(cat.read_live(f, schema=compacted.pa_schema() if compacted.arrow_schema else None), compacted).slice(0, rows - shown)
                for row in table.to_pylist():
                    print("  " + " | ".join(f"{k}={v}" for k, v in row.items()), file=out)
                shown += table.num_rows
            if compacted.rows > shown:
                print(f"  ... {compacted.rows - shown} more rows", file=out)
        summary["tables"][t.destination] = total
    print(f"done in {time.perf_counter() - t0:.1f}s; export with: flash-compactor export --catalog {lake} --table TABLE --out DIR", file=out)
    return summary


def stream_outcomes(run: Any, req: Any) -> list[dict[str, Any]]:
    """Per partition stream of a run (one, or a batch's): its compacted rows, checks, and whether it succeeded."""
    mats = [e.event_specific_data.materialization for e in run.all_node_events if e.is_step_materialization]
    checks = [e.event_specific_data for e in run.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    failed_streams: dict[str, str] = {}
    for event in run.all_events:
        data = getattr(getattr(event.event_specific_data, "user_failure_data", None), "metadata", None) or {}
        if "failed streams" in data:
            failed_streams = dict(data["failed streams"].value)
    partitions = [req.partition_key] if req.partition_key else list(req.run_config["ops"][next(iter(req.run_config["ops"]))]["config"]["partitions"])
    out = []
    for pkey in partitions:
        mine = [m for m in mats if (m.partition or req.partition_key) == pkey and m.asset_key.path[-1] == "compacted"]
        rows = mine[-1].metadata.get("dagster/row_count") if mine else None
        evaluations = [c for c in checks if (getattr(c, "partition", None) or req.partition_key) == pkey]
        failed = [c.check_name for c in evaluations if not c.passed]
        ok = bool(mine) and not failed and (run.success or (req.partition_key is None and pkey not in failed_streams))
        out.append({"partition": pkey, "success": ok, "failed_checks": failed, "checks": len(evaluations),
                    "rows": rows.value if rows is not None else None, "error": failed_streams.get(pkey)})
    return out


def failure_line(run: Any) -> str:
    """The one line a failed run's step gave (the engine's, through dagster.Failure), else Dagster's error."""
    for event in run.all_events:
        if event.event_type_value == "STEP_FAILURE":
            data = event.event_specific_data
            description = getattr(getattr(data, "user_failure_data", None), "description", None)
            return " ".join(str(description or (data.error.message if data.error else "the step failed")).split())
    return "the run failed"


def _forced_requests(project: Any, instance: DagsterInstance, cursor: str | None) -> list[Any]:
    from sensors.new_deltas import batch_request, pending_streams_of

    out = []
    for t in project.tables:
        due = []
        for stream in pending_streams_of(instance, cursor, t).values():
            last = max((int(p) for p in stream["items"]), default=0)
            if last > stream.get("req", 0):
                due.append((stream["key"], int(stream["v"]), last, "forced", "forced", int(stream.get("r", 0))))
        for start in range(0, len(due), t.batch.streams):
            out.append(batch_request(t, sorted(due)[start:start + t.batch.streams]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m assets.headless", description=__doc__.splitlines()[0])
    p.add_argument("--lake", default=None, help="lake directory or s3:// URI (default $FLASH_LAKE or ./demo_lake)")
    p.add_argument("--tables", default=None, help="table config file (default $FLASH_TABLES or tables.yaml)")
    p.add_argument("--force", action="store_true", help="compact every stream with pending deltas, ignoring trigger policies")
    p.add_argument("--skip-loads", action="store_true", help="do not run the PySpark loads")
    p.add_argument("--rows", type=int, default=5, help="rows to print per partition stream")
    args = p.parse_args(argv)
    from resources import default_lake

    from resources.config import ConfigError

    try:
        summary = run_once(args.lake or default_lake(), args.tables, force=args.force, skip_loads=args.skip_loads, rows=args.rows)
    except ConfigError as exc:  # a bad tables.yaml: its one line, as `dagster definitions validate` shows it
        print(f"python -m assets.headless: error: {exc}", file=sys.stderr)
        return 2
    bad = [r for r in summary["runs"] if not r["success"] or r["failed_checks"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
