#!/bin/sh
# Scenario 3 as a user runs it: a fresh `flash-compactor compact` of a hard-linked copy of the scenario's lake.
# For farm-bench (see results_s3_s4_7runs.md). DATA: the benchmark data directory (default benchmarks/data/full).
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
data=${DATA:-$root/benchmarks/data/full}
lake=${TMPDIR:-/tmp}/flash-s3-command-lake
rm -rf "$lake" && cp -al "$data/lakes/s3_clustered" "$lake" && sync
exec env -u PYTHONDONTWRITEBYTECODE "$root/.venv/bin/flash-compactor" compact --catalog "$lake" --table orders \
  --primary-key order_id --primary-key region --sort-key last_updated --num-cpus 2 --rows-per-file 500000
