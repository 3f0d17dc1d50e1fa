"""One engine measurement per process: ``python -m benchmarks.engines SPEC.json`` writes SPEC.json's ``result``.

A spec names the engine, its inputs (files with stream position, file number and operation; prior compacted
files have position 0), where to write and what to time. The timed region is reported as wall-clock
``time.time()`` stamps so the parent's memory sampler can find the peak inside it. A spec with ``jobs`` (our
engine, Spark) runs several compactions in one process, one timed interval each (the harness's batched mode).

Semantics (identical for every engine): for each primary key let D be the position of its latest delete;
among upsert rows at positions > D keep the greatest by (last_updated, position, file number, row in file).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.live_memory import LiveMemory, RayLiveMemory, ray_runtime_env

PK = ["order_id", "region"]
RAY_START_ATTEMPTS = 3
SORT = "last_updated"


def settle() -> None:
    """Flush every dirty page before a timed region (outside it), for every engine alike. Without it a run pays
    for the writeback of the previous engine's output: our commit's fsync of a small manifest waits for the ext4
    journal, which first writes the ~300 MB the copy floor just left dirty (s3 measured 0.39-0.47 s after a
    sync, 0.61-0.67 s after 300 MB of unsynced writes). And wait for a build of the kernels compiled ahead of
    time that an earlier process asked for (kernels/aot.py: it runs after that process exits), so that no timed run
    shares the machine with one."""
    from flash_pipeline.compactor.kernels import aot

    aot.wait_for_build(900)
    os.sync()


def _split(inputs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ups = [f for f in inputs if f["op"] == "upsert"]
    dels = [f for f in inputs if f["op"] == "delete"]
    return ups, dels


# ----- ours --------------------------------------------------------------------------------------------------
def _command(job: dict[str, Any]) -> list[str]:
    """The ``flash-compactor compact`` command a user would type for ``job`` (default executor choice)."""
    exe = Path(sys.executable).with_name("flash-compactor")
    cmd = [str(exe) if exe.exists() else "flash-compactor", "compact", "--catalog", job["lake"], "--table", job.get("table", "orders"),
           "--primary-key", "order_id", "--primary-key", "region", "--sort-key", "last_updated", "--num-cpus", "2",
           "--rows-per-file", str(job.get("rows_per_compacted_file", 4_000_000))]
    for key, flag in (("hash_bucket_count", "--hash-buckets"), ("max_round_bytes", "--max-round-bytes"), ("destination_compacted_table_id", "--destination")):
        if job.get(key) is not None:
            cmd += [flag, str(job[key])]
    if job.get("deletion_vectors") is not None:
        cmd += ["--deletion-vectors", "on" if job["deletion_vectors"] else "off"]
    return cmd + (["--rebuild"] if job.get("rebuild") else [])


def command_env() -> dict[str, str]:
    """The environment of a user's shell: Python's default bytecode cache. This machine's environment sets
    PYTHONDONTWRITEBYTECODE=1, which makes every fresh process compile the project's ~60 modules again (0.06 s
    measured); an installed package, or any default Python, reads them from ``__pycache__``."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_command(spec: dict[str, Any]) -> dict[str, Any]:
    """Each job as a fresh ``flash-compactor compact`` process: the path a user takes (Python start, imports,
    planning, the executor the engine picks -- in process for small inputs, a Ray it starts or joins otherwise),
    timed from launch to exit."""
    import subprocess

    from flash_pipeline import Catalog

    out: dict[str, Any] = {"intervals": [], "compactions": []}
    for job in spec["jobs"]:
        settle()
        t0, p0 = time.time(), time.perf_counter()
        done = subprocess.run(_command(job), capture_output=True, text=True, env=command_env())
        p1, t1 = time.perf_counter(), time.time()
        out["intervals"].append([job.get("label", "compact"), t0, t1])
        error = None if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:] or ''}"
        entry: dict[str, Any] = {"label": job.get("label", "compact"), "seconds": p1 - p0, "error": error}
        if error is None:
            cat = Catalog(job["lake"])
            latest = cat.latest_compacted(job.get("destination_compacted_table_id") or job.get("table", "orders"), ())
            entry["output_files"] = _output_files(cat, job, latest)
            entry["executor"] = "in-process" if "in this process" in done.stderr else "ray"
        out["compactions"].append(entry)
    first = out["compactions"][0]
    out.update(seconds=first["seconds"], output_files=first.get("output_files", []), error=first["error"], ray_start_retries=0)
    return out


def _output_files(cat: Any, job: dict[str, Any], latest: Any) -> list[str]:
    """The files whose rows the verifier compares (outside the timed region): the version's own files, or, when
    some carry a deletion vector (on by default for new tables), the version as ``export`` writes it."""
    if latest is None:
        return []
    if not any(f.deletion_vector is not None for f in latest.files):
        return [cat.storage.arrow_source(f.key) for f in latest.files]
    out = Path(job["lake"]).parent / f"export-{latest.table_id}-{latest.version}"
    files = cat.export(latest.table_id, out, latest.partition, version=latest.version, overwrite=True)
    return [str(f) for f in files]


def warm_up(lake: str, executor: str) -> None:
    """Load the engine on ``executor`` as the peers' are loaded before their timers (modules imported, and on Ray
    the workers' too; numba's cached kernels loaded): a tiny full compaction, then an incremental one of a few
    updated rows, both with 2 hash buckets, so that every kernel of the scenarios (scatter by bucket, the index
    probe, the prior envelopes, the carried-file bookkeeping) has run once. Ray's warm workers keep them loaded,
    as those of a long-lived deployment do."""
    import pyarrow.compute as pc

    from flash_pipeline import Catalog, compact
    from flash_pipeline.compactor.kernels.compiled import load_cached_kernels

    if executor == "in-process":  # a tiny compaction alone would run the kernels' Python source (kernels/jit.py)
        load_cached_kernels()  # on Ray they run in the workers, which load them as they start (cluster.py _warm);
        # the driver of a session on Ray runs none (s1: Numba never imported), and loaded there they added ~58
        # MiB to a driver that a deployment's (a command, a Dagster run) does not have
    quiet = lambda message: None  # noqa: E731
    cat = Catalog(lake)
    kw = dict(primary_keys=PK, sort_keys=[("last_updated", "ascending")], catalog=cat, progress=quiet, executor=executor,
              hash_bucket_count=2, num_cpus=2)
    compact("warmup", **kw)
    latest = cat.latest_compacted("warmup", ())
    rows = cat.read_live(latest.files[0]).slice(0, 100)
    rows = rows.set_column(rows.schema.get_field_index(SORT), SORT, pc.add(rows.column(SORT), 1))
    cat.append("warmup", (), "upsert", [rows])
    compact("warmup", **kw)


def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["engine"] == "ours_command":
        return run_command(spec)
    warm = spec["engine"] == "ours_warm"
    retries = 0
    if warm:
        import ray

        for attempt in range(RAY_START_ATTEMPTS):
            try:
                live_env = ray_runtime_env(spec["ray_live_memory_dir"]) if spec.get("ray_live_memory_dir") else None
                ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="flash-compactor", log_to_driver=False,
                         runtime_env=live_env)  # a Ray of its own, never a head another process started
                break
            except Exception as exc:  # noqa: BLE001 - an overloaded machine: Ray's own startup timeout
                if "timed out during startup" not in str(exc) or attempt + 1 == RAY_START_ATTEMPTS:
                    raise
                retries += 1
                ray.shutdown()
    from flash_pipeline import Catalog, compact

    quiet = lambda message: None  # noqa: E731
    if spec.get("warm_in_process"):  # the engine loaded (modules, numba's cached kernels) before the timer, as Ray is for warm
        from flash_pipeline.compactor.kernels.compiled import load_cached_kernels

        load_cached_kernels()  # the tiny compaction alone would run the kernels' Python source (kernels/jit.py)
        compact(spec["warm_in_process"]["table"], primary_keys=PK, sort_keys=[("last_updated", "ascending")],
                catalog=Catalog(spec["warm_in_process"]["lake"]), progress=quiet, executor="in-process")
    if spec.get("warmup_lake") and spec["engine"] in ("ours_warm", "ours_inprocess"):
        warm_up(spec["warmup_lake"], "ray" if warm else "in-process")
    out: dict[str, Any] = {"intervals": [], "compactions": []}
    for job in spec["jobs"]:
        cat = Catalog(job["lake"])
        kwargs = dict(
            primary_keys=PK,
            sort_keys=[("last_updated", "ascending")],
            catalog=cat,
            num_cpus=2,
            progress=quiet,
            rows_per_compacted_file=job.get("rows_per_compacted_file", 4_000_000),
            # cold and warm time Ray; in-process the same steps on a thread pool without Ray (executor.py)
            executor="in-process" if spec["engine"] == "ours_inprocess" else "ray",
        )
        for k in ("hash_bucket_count", "max_round_bytes", "destination_compacted_table_id", "rebuild", "deletion_vectors"):
            if job.get(k) is not None:
                kwargs[k] = job[k]
        settle()
        live = LiveMemory() if spec["engine"] == "ours_inprocess" else RayLiveMemory() if spec.get("ray_live_memory_dir") else None
        t0 = time.time()
        p0 = time.perf_counter()
        for attempt in range(RAY_START_ATTEMPTS):
            try:
                res = compact(job.get("table", "orders"), **kwargs)
                error = None
                break
            except Exception as exc:  # noqa: BLE001 - reported as "not available"
                res, error = None, f"{type(exc).__name__}: {exc}"
                if "timed out during startup" in str(exc) and attempt + 1 < RAY_START_ATTEMPTS:
                    import ray  # a cold start that hit Ray's startup timeout on a loaded machine: time a fresh attempt

                    ray.shutdown()
                    retries += 1
                    t0 = time.time()
                    p0 = time.perf_counter()
                    continue
                break
        p1 = time.perf_counter()
        t1 = time.time()
        out["intervals"].append([job.get("label", "compact"), t0, t1])
        entry: dict[str, Any] = {"label": job.get("label", "compact"), "seconds": p1 - p0, "error": error}
        if isinstance(live, RayLiveMemory):
            measured = live.stop()
            entry["live_peak_increase"], entry["live_parts"] = measured["peak_increase"], measured["parts"]
            entry["live_at_peak"], entry["live_peak_at_seconds"] = measured["at_peak"], measured["peak_at_seconds"]
        elif live is not None:
            entry["live_peak_increase"] = live.stop()
        if res is not None:
            p = res.partitions[0]
            entry.update(
                rows_in=p.rows_in, delete_rows_in=p.delete_rows_in, prior_rows=p.prior_rows, rows_out=p.rows_out,
                files_written=p.files_written, files_carried=p.files_carried, bytes_written=p.bytes_written,
                bytes_carried=p.bytes_carried, bytes_read=p.bytes_read, step_seconds=p.seconds, expected_seconds=p.expected_seconds,
                hash_bucket_count=p.hash_bucket_count, rounds=p.rounds, index_bytes_written=p.index_bytes_written,
            )
            dest = job.get("destination_compacted_table_id") or job.get("table", "orders")
            latest = cat.latest_compacted(dest, ())
            entry["output_files"] = _output_files(cat, job, latest)
        out["compactions"].append(entry)
    first = out["compactions"][0]
    out["seconds"] = first["seconds"]
    out["output_files"] = first.get("output_files", [])
    out["error"] = first["error"]
    out["ray_start_retries"] = retries
    return out


# ----- peers -------------------------------------------------------------------------------------------------
def run_duckdb(spec: dict[str, Any]) -> dict[str, Any]:
    import duckdb

    settle()
    t0, p0 = time.time(), time.perf_counter()
    con = duckdb.connect()
    con.execute("SET threads=2")
    if spec.get("memory_budget"):
        con.execute(f"SET memory_limit='{max(64, spec['memory_budget'] >> 20)}MB'")
        con.execute(f"SET temp_directory='{spec['tmp_dir']}'")
    con.execute("SET preserve_insertion_order=false")
    ups, dels = _split(spec["inputs"])
    con.execute("CREATE TEMP TABLE files(path VARCHAR, pos BIGINT, fno BIGINT)")
    con.executemany("INSERT INTO files VALUES (?, ?, ?)", [[f["path"], f["position"], f["file"]] for f in spec["inputs"]])
    lit = lambda fs: "[" + ",".join("'" + f["path"].replace("'", "''") + "'" for f in fs) + "]"  # noqa: E731
    cols = ", ".join(f"u.{c}" for c in spec["columns"])
    ranked = (
        f"SELECT {cols}, f.pos AS __pos, f.fno AS __fno, u.file_row_number AS __row "
        f"FROM read_parquet({lit(ups)}, filename=true, file_row_number=true) u JOIN files f ON u.filename = f.path"
    )
    if dels:
        dq = (
            f"SELECT d.order_id, d.region, max(f.pos) AS __dpos FROM read_parquet({lit(dels)}, filename=true) d "
            "JOIN files f ON d.filename = f.path GROUP BY d.order_id, d.region"
        )
        body = (
            f"WITH ups AS ({ranked}), dels AS ({dq}) SELECT ups.* FROM ups LEFT JOIN dels "
            "ON ups.order_id = dels.order_id AND ups.region = dels.region "
            "WHERE dels.__dpos IS NULL OR ups.__pos > dels.__dpos"
        )
    else:
        body = ranked
    out_cols = ", ".join(spec["columns"])
    query = (
        f"SELECT {out_cols} FROM ({body}) QUALIFY row_number() OVER (PARTITION BY order_id, region "
        "ORDER BY last_updated DESC, __pos DESC, __fno DESC, __row DESC) = 1"
    )
    out_path = Path(spec["out_dir"]) / "duckdb.parquet"
    con.execute(f"COPY ({query}) TO '{out_path}' (FORMAT parquet, COMPRESSION snappy)")
    p1, t1 = time.perf_counter(), time.time()
    return {"seconds": p1 - p0, "intervals": [["compact", t0, t1]], "output_files": [str(out_path)], "error": None}


def run_polars(spec: dict[str, Any]) -> dict[str, Any]:
    import polars as pl

    settle()
    t0, p0 = time.time(), time.perf_counter()
    ups, dels = _split(spec["inputs"])
    frames = [
        pl.scan_parquet(f["path"])
        .select(spec["columns"])
        .with_row_index("__row")
        .with_columns(pl.lit(f["position"], pl.Int64).alias("__pos"), pl.lit(f["file"], pl.Int64).alias("__fno"))
        for f in ups
    ]
    lf = pl.concat(frames, how="vertical")
    if dels:
        d = pl.concat(
            [pl.scan_parquet(f["path"]).select(PK).with_columns(pl.lit(f["position"], pl.Int64).alias("__dpos")) for f in dels]
        ).group_by(PK).agg(pl.col("__dpos").max())
        lf = lf.join(d, on=PK, how="left").filter(pl.col("__dpos").is_null() | (pl.col("__pos") > pl.col("__dpos"))).drop("__dpos")
    lf = (
        lf.sort([SORT, "__pos", "__fno", "__row"])
        .unique(subset=PK, keep="last", maintain_order=False)
        .select(spec["columns"])
    )
    out_path = Path(spec["out_dir"]) / "polars.parquet"
    if spec.get("memory_budget"):
        lf.sink_parquet(out_path, compression="snappy")
    else:
        lf.collect().write_parquet(out_path, compression="snappy")
    p1, t1 = time.perf_counter(), time.time()
    return {"seconds": p1 - p0, "intervals": [["compact", t0, t1]], "output_files": [str(out_path)], "error": None}


def _spark_session(spec: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("spark-compactor")
        .config("spark.driver.memory", spec.get("spark_driver_memory", "4g"))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.parquet.compression.codec", "snappy")
        .config("spark.sql.warehouse.dir", spec["tmp_dir"])
        .config("spark.local.dir", spec["tmp_dir"])
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _spark_compact(spark: Any, inputs: list[dict[str, Any]], columns: list[str], out_dir: Path) -> list[str]:
    """The paper's Spark compactor: union, deletes applied, row_number() over the primary key window."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ups, dels = _split(inputs)
    meta = spark.createDataFrame(
        [(os.path.abspath(f["path"]), int(f["position"]), int(f["file"])) for f in inputs], "__path string, __pos long, __fno long"
    )

    def load(files: list[dict[str, Any]], cols: list[str]) -> Any:
        df = spark.read.parquet(*[f["path"] for f in files])
        df = df.select(*cols, F.regexp_replace(F.col("_metadata.file_path"), "^file:/+", "/").alias("__path"), F.col("_metadata.row_index").alias("__row"))
        return df.join(F.broadcast(meta), "__path").drop("__path")

    u = load(ups, columns)
    if dels:
        d = load(dels, PK).groupBy(*PK).agg(F.max("__pos").alias("__dpos"))
        u = u.join(d, PK, "left").where(F.col("__dpos").isNull() | (F.col("__pos") > F.col("__dpos"))).drop("__dpos")
    w = Window.partitionBy(*PK).orderBy(F.col(SORT).desc(), F.col("__pos").desc(), F.col("__fno").desc(), F.col("__row").desc())
    out = u.withColumn("__rn", F.row_number().over(w)).where(F.col("__rn") == 1).select(*columns)
    out_dir = out_dir / "spark"
    out.write.mode("overwrite").parquet(str(out_dir))
    return sorted(str(p) for p in out_dir.glob("*.parquet"))


def run_spark(spec: dict[str, Any]) -> dict[str, Any]:
    """One JVM: the spec's inputs (a fresh JVM per run), or every job of ``spec["jobs"]`` in turn (batched mode:
    the JVM starts once, each job's query and write are timed alone and the JVM start is reported separately)."""
    from pyspark.sql import SparkSession, Window, functions  # noqa: F401 - imported before the clock starts, as ever

    settle()
    t_start, p_start = time.time(), time.perf_counter()
    spark = _spark_session(spec)
    t_ready, p_ready = time.time(), time.perf_counter()
    if "jobs" not in spec:
        files = _spark_compact(spark, spec["inputs"], spec["columns"], Path(spec["out_dir"]))
        p1, t1 = time.perf_counter(), time.time()
        spark.stop()
        return {
            "seconds": p1 - p_start,
            "seconds_excluding_jvm_start": p1 - p_ready,
            "intervals": [["compact", t_start, t1]],
            "output_files": files,
            "error": None,
        }
    out: dict[str, Any] = {"jvm_start_seconds": p_ready - p_start, "jvm_start_interval": [t_start, t_ready], "intervals": [], "compactions": []}
    for job in spec["jobs"]:
        settle()
        t0, p0 = time.time(), time.perf_counter()
        try:
            files, error, tb = _spark_compact(spark, job["inputs"], spec["columns"], Path(job["out_dir"])), None, None
        except Exception as exc:  # noqa: BLE001 - this scenario is reported as "not available", the others go on
            files, error, tb = [], f"{type(exc).__name__}: {exc}", traceback.format_exc()
        p1, t1 = time.perf_counter(), time.time()
        out["intervals"].append([job["label"], t0, t1])
        out["compactions"].append({"label": job["label"], "seconds": p1 - p0, "output_files": files, "error": error, "traceback": tb})
    spark.stop()
    out.update(seconds=None, error=None)
    return out


def run_copy(spec: dict[str, Any]) -> dict[str, Any]:
    """The copy floor: read every input file (all columns) and write as many rows as the true result."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    pa.set_cpu_count(2)
    pa.set_io_thread_count(2)
    settle()
    t0, p0 = time.time(), time.perf_counter()
    ups, dels = _split(spec["inputs"])
    with ThreadPoolExecutor(2) as pool:
        tables = list(pool.map(lambda f: pq.read_table(f["path"], columns=spec["columns"]), ups))
        list(pool.map(lambda f: pq.read_table(f["path"]), dels))
    table = pa.concat_tables(tables).slice(0, spec["expected_rows"])
    half = table.num_rows // 2
    paths = [str(Path(spec["out_dir"]) / f"copy-{i}.parquet") for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda a: pq.write_table(a[0], a[1], compression="snappy"), [(table.slice(0, half), paths[0]), (table.slice(half), paths[1])]))
    p1, t1 = time.perf_counter(), time.time()
    return {"seconds": p1 - p0, "intervals": [["compact", t0, t1]], "output_files": paths, "error": None}


def run_copy_nothp(spec: dict[str, Any]) -> dict[str, Any]:
    """The copy floor in a process without transparent huge pages, as our engine runs (FLASH_THP): the same
    yardstick, so that the ratios can be read with and without the engine's process setting."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) != 0:  # PR_SET_THP_DISABLE
        raise OSError("prctl(PR_SET_THP_DISABLE) refused")
    return run_copy(spec)


def _run_script(spec: dict[str, Any], script: str, marker: str, outputs: str) -> dict[str, Any]:
    """``benchmarks/<script> SPEC`` as a fresh process, timed from launch to exit like a ``flash-compactor
    compact`` command (imports included); its ``<marker> {json}`` line is kept as the script's own timing."""
    import subprocess

    spec_path = Path(spec["tmp_dir"]) / f"{script}.spec.json"
    spec_path.write_text(json.dumps({k: spec[k] for k in ("inputs", "columns", "expected_rows", "out_dir")}))
    settle()
    t0, p0 = time.time(), time.perf_counter()
    done = subprocess.run([sys.executable, str(Path(__file__).with_name(script)), str(spec_path)], capture_output=True, text=True,
                          env=command_env())
    p1, t1 = time.perf_counter(), time.time()
    if done.returncode != 0:
        raise RuntimeError(f"{script} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    timing = json.loads(done.stdout.split(marker + " ", 1)[1].splitlines()[0])
    files = sorted(str(p) for p in Path(spec["out_dir"]).glob(outputs))
    return {"seconds": p1 - p0, "intervals": [["compact", t0, t1]], "output_files": files, "error": None, "script_timing": timing}


def run_copy_strict(spec: dict[str, Any]) -> dict[str, Any]:
    """The strict copy floor (benchmarks/strict_floor.py): read every input once, stream the result's row count
    out on two threads; the yardstick of every ratio."""
    return _run_script(spec, "strict_floor.py", "FLOOR_TIMING", "floor-*.parquet")


def run_arrow_peer(spec: dict[str, Any]) -> dict[str, Any]:
    """The hand-written PyArrow + NumPy compactor for this one table (benchmarks/arrow_peer.py)."""
    return _run_script(spec, "arrow_peer.py", "PEER_TIMING", "peer-*.parquet")


def _read_done(table: Any, spec: dict[str, Any], t0: float, p0: float) -> dict[str, Any]:
    """A reader's result: the timed read ends with its rows in memory; writing them (for verification) is not timed."""
    import pyarrow.parquet as pq

    p1, t1 = time.perf_counter(), time.time()
    Path(spec["out_dir"]).mkdir(parents=True, exist_ok=True)
    path = str(Path(spec["out_dir"]) / f"{spec['engine']}.parquet")
    pq.write_table(table, path)
    return {"seconds": p1 - p0, "intervals": [["read", t0, t1]], "output_files": [path], "error": None}


def read_polars(spec: dict[str, Any]) -> dict[str, Any]:
    """``polars.read_delta`` of a compacted partition's Delta table (applies deletion vectors)."""
    import polars as pl

    settle()
    t0, p0 = time.time(), time.perf_counter()
    frame = pl.read_delta(spec["location"])
    return _read_done(frame.to_arrow(), spec, t0, p0)


def read_deltalake(spec: dict[str, Any]) -> dict[str, Any]:
    """deltalake's QueryBuilder ``select *`` of a compacted partition's Delta table (applies deletion vectors)."""
    import deltalake
    import pyarrow as pa

    settle()
    t0, p0 = time.time(), time.perf_counter()
    table = deltalake.DeltaTable(spec["location"])
    rows = pa.table(deltalake.QueryBuilder().register("t", table).execute("select * from t").read_all())
    return _read_done(rows, spec, t0, p0)


def _duckdb_with(extensions: list[str]) -> Any:
    """A DuckDB connection with extensions loaded from their pip packages (``duckdb-extension-<name>``, pinned to
    the DuckDB version in pyproject.toml): no network."""
    import importlib

    import duckdb

    con = duckdb.connect()
    for name in extensions:
        package = importlib.import_module(f"duckdb_extension_{name}")
        path = os.path.join(os.path.dirname(package.__file__), "extensions", f"v{duckdb.__version__}",
                            f"{name}.duckdb_extension")
        con.execute(f"INSTALL '{path}'; LOAD {name}")
    return con


def read_duckdb_delta(spec: dict[str, Any]) -> dict[str, Any]:
    """DuckDB's own Delta reader, ``delta_scan`` (applies deletion vectors); the extension loads before the timer,
    as the other readers' imports do."""
    con = _duckdb_with(["delta"])
    settle()
    t0, p0 = time.time(), time.perf_counter()
    table = con.sql(f"SELECT * FROM delta_scan('{spec['location']}')").to_arrow_table()
    return _read_done(table, spec, t0, p0)


def read_duckdb_iceberg(spec: dict[str, Any]) -> dict[str, Any]:
    """DuckDB's Iceberg reader, ``iceberg_scan`` of the version's Iceberg metadata (applies the position delete
    files our deletion vectors become)."""
    con = _duckdb_with(["avro", "iceberg"])
    settle()
    t0, p0 = time.time(), time.perf_counter()
    table = con.sql(f"SELECT * FROM iceberg_scan('{spec['iceberg_metadata']}')").to_arrow_table()
    return _read_done(table, spec, t0, p0)


ENGINES = {
    "read_polars": read_polars,
    "read_duckdb_delta": read_duckdb_delta,
    "read_duckdb_iceberg": read_duckdb_iceberg,
    "read_deltalake": read_deltalake,
    "ours_cold": run_ours,
    "ours_warm": run_ours,
    "ours_inprocess": run_ours,
    "ours_command": run_ours,
    "duckdb": run_duckdb,
    "polars": run_polars,
    "spark": run_spark,
    "copy": run_copy,
    "copy_nothp": run_copy_nothp,
    "copy_strict": run_copy_strict,
    "arrow_peer": run_arrow_peer,
}


def main() -> None:
    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    try:
        result = ENGINES[spec["engine"]](spec)
    except Exception as exc:  # noqa: BLE001 - the parent reports it
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(), "seconds": None, "intervals": []}
    Path(spec["result_path"]).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
