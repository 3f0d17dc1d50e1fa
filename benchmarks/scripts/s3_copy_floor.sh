#!/bin/sh
# Scenario 3's copy floor as a fresh process: read the compacted base and the delta (2 threads), write 5,000,000
# rows as two Parquet files (2 threads). For farm-bench --vs (see results_s3_s4_7runs.md).
root=$(cd "$(dirname "$0")/../.." && pwd)
export DATA=${DATA:-$root/benchmarks/data/full} OUT=${TMPDIR:-/tmp}
exec "$root/.venv/bin/python" -c "
import glob, os
from concurrent.futures import ThreadPoolExecutor
import pyarrow as pa, pyarrow.parquet as pq
pa.set_cpu_count(2)
lake = os.environ['DATA'] + '/lakes/s3_clustered/tables/*/partitions/*'
files = sorted(glob.glob(lake + '/compacted/data/*/*.parquet')) + sorted(glob.glob(lake + '/streams/*/files/*/*.parquet'))
with ThreadPoolExecutor(2) as pool:
    tables = list(pool.map(pq.read_table, files))
t = pa.concat_tables(tables, promote_options='permissive').slice(0, 5000000)
h = t.num_rows // 2
out = [(t.slice(0, h), os.environ['OUT'] + '/flash-s3-floor-0.parquet'), (t.slice(h), os.environ['OUT'] + '/flash-s3-floor-1.parquet')]
with ThreadPoolExecutor(2) as pool:
    list(pool.map(lambda a: pq.write_table(a[0], a[1], compression='snappy'), out))
"
