"""The documented small benchmark command (batched mode) with every engine: every output must be equal.

The harness raises MismatchError on any difference (row count, or a hash of the rows sorted by primary key),
so this test fails loudly when the compactor and its peers (Spark, DuckDB, Polars) disagree.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("duckdb")
pytest.importorskip("polars")
pytest.importorskip("matplotlib")

from benchmarks import run as bench  # noqa: E402
from benchmarks.outputs import MismatchError, Verifier  # noqa: E402


@pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java")
def test_small_scale_all_engines_equal(tmp_path):
    """`python -m benchmarks.run --scale small` as documented (fewer rows and deltas, output and data in tmp_path):
    warm Ray and the peers on every scenario, cold Ray and Spark on scenario 1 too; all outputs of a scenario equal."""
    out = tmp_path / "out"
    payload = bench.main(["--scale", "small", "--rows", "5000", "--small-deltas", "100", "--out", str(out), "--data", str(tmp_path / "data")])
    assert payload["mode"] == "batched"
    for scen in bench.SCENARIOS:
        runs = payload["results"][scen]["runs"]
        expected = {"ours_warm", "ours_inprocess", "ours_command", "copy_strict", "copy", "copy_nothp", "arrow_peer", "duckdb", "polars", "spark"} | ({"ours_cold"} if scen == bench.COLD_SCENARIO else set())
        assert set(runs) == expected, f"{scen}: engines run {sorted(runs)}"
        for engine, recs in runs.items():
            assert len(recs) == 1 and not recs[0].get("error"), f"{scen}: {engine} failed: {recs[0].get('error')}"
        hashes = {e: r[0]["hash"] for e, r in runs.items() if not e.startswith("copy")}  # the copy floors write the right count, not rows
        assert len(hashes) >= 3 and len(set(hashes.values())) == 1, f"{scen}: outputs differ: {hashes}"
    assert {"ours_cold", "spark", "ours_warm"} <= set(payload["results"]["s1_full"]["runs"])
    assert payload["sweeps"]["jobs"] and not any(j.get("error") for j in payload["sweeps"]["jobs"])
    # issue 5: a 1% delta against the same table compacted from scratch, with bytes read and written
    for scen in ("s2_incremental", "s3_clustered"):
        scratch = [j for j in payload["sweeps"]["jobs"] if j["label"] == f"{scen} from scratch"]
        assert scratch and all(j["rows_out"] == payload["results"][scen]["info"]["expected_rows"] for j in scratch)
    # timed runs sample RSS only; PSS comes from one verified memory run per engine of MEMORY_RUNS (s1: in process, DuckDB)
    assert all(r.get("peak_pss") is None for res in payload["results"].values() for recs in res["runs"].values() for r in recs)
    memory = payload["results"]["s1_full"]["memory_runs"]
    assert sorted(memory) == ["duckdb", "ours_inprocess"]
    assert all(len(m) == 1 and m[0]["peak_pss"] > 0 and m[0]["hash"] == payload["results"]["s1_full"]["runs"]["duckdb"][0]["hash"]
               for m in memory.values())
    assert payload["summary"]["s1_full"]["ours_inprocess"]["peak_pss_mib"] == memory["ours_inprocess"][0]["peak_pss"] / 2**20
    assert "peak_pss_mib" not in payload["summary"]["s1_full"]["copy"]
    clustered = payload["results"]["s3_clustered"]["runs"]["ours_warm"][0]
    assert clustered["files_carried"] > clustered["files_written"], "clustered updates: most files copied by reference"
    report = (out / "results.md").read_text()
    assert report.count("Incremental versus from scratch") == 2 and report.count("of index") >= 4
    assert "one extra untimed memory run" in report and "s1_full ours_inprocess, s1_full duckdb" in report
    assert "Mode: **batched**" in report and "measured for scenario (1) only" in report and "Profiling of missed targets: skipped" in report
    (out / "results.md").unlink()  # --report-only writes the same report again from results.json alone
    assert bench.main(["--report-only", "--out", str(out)])["date"] == payload["date"]
    assert (out / "results.md").read_text() == report
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == [
        "latency_vs_input_size.png", "memory_vs_input_size.png", "predicted_vs_actual.png", "throughput_vs_buckets.png"]


def test_verifier_detects_a_mismatch(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.generate import Generator

    t = Generator(1, 100).base(50, 1)[0]
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(t, a)
    changed = t.set_column(t.schema.get_field_index("amount"), "amount", pa.array([1.0] * t.num_rows))
    pq.write_table(changed.take(pa.array(list(range(49, -1, -1)))), b)
    v = Verifier()
    v.check("s", "one", [str(a)], 50)
    v.check("s", "same-rows-other-order", [str(a)], 50)
    with pytest.raises(MismatchError):
        v.check("s", "two", [str(b)], 50)
    with pytest.raises(MismatchError):
        v.check("s", "three", [str(a)], 49)


def test_cold_start_script_times_every_mode_on_verified_output(tmp_path):
    """benchmarks/cold_start.py at a tiny size: a fresh command per mode (in process, in process with Numba from
    the start, cold Ray), each output's row count checked."""
    from benchmarks import cold_start

    out = tmp_path / "cold.md"
    # the paper's example only: each case costs a cold Ray start (~11 s); the synthetic tables (--sizes) run only
    # in the benchmark itself (results_cold_start.md)
    cold_start.main(["--runs", "1", "--sizes", "", "--work", str(tmp_path / "work"), "--out", str(out)])
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and not line.startswith("| input")]
    assert len(rows) == 1 and rows[0].startswith("| the paper"), out.read_text()
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert all(float(cells[i].split()[0]) > 0 for i in (2, 3, 4)), line


def test_deletion_vectors_benchmark_small_scale(tmp_path):
    """`python -m benchmarks.deletion_vectors` at small scale: vectors on carry every base file with a vector,
    vectors off rewrite them, and every output (flash's live rows, the peers', every reader's: Polars, deltalake, DuckDB
    delta_scan and iceberg_scan) is equal."""
    from benchmarks import deletion_vectors as dv

    out = tmp_path / "out"
    payload = dv.run(dv.argparse.Namespace(rows=5000, runs=1, fractions="0.01", peers_everywhere=False, seed=7, engines=None,
                                           data=str(tmp_path / "data"), out=str(out), name="results_deletion_vectors"))
    [name] = payload["results"]
    res = payload["results"][name]
    assert set(dv.ENGINES) | set(dv.READERS) <= {e for e, runs in res.items() if runs}
    on, off = res["flash_vectors_on"][0]["written"], res["flash_vectors_off"][0]["written"]
    assert on["carried_with_vector"] == 10 and on["files_written"] == 1, on  # only the delta's rows are written
    assert off["carried_with_vector"] == 0 and off["files_written"] >= 10, off
    assert on["vectors"] > 0 and on["data"] < off["data"] / 5
    assert "1% of the keys updated" in (out / "results_deletion_vectors.md").read_text()


def test_history_benchmark_small_scale(tmp_path):
    """`python -m benchmarks.history` at small scale, on a local lake and on S3 (the moto server it starts): a
    compaction reads as many manifests and makes as many S3 requests after 15 versions as after 9, while the
    full sweep's reads grow with the history. (Before the table has a few hundred rows, which files a delta
    touches still changes from one version to the next, and the requests with it: with the script's fixed seed
    they settle from the 7th version on, and the checkpoints start after.) (A subprocess: the script counts by wrapping the catalog's and
    botocore's methods for its whole process.)"""
    out = tmp_path / "history.md"
    done = subprocess.run([sys.executable, "-m", "benchmarks.history", "--versions", "9,15", "--runs", "2", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {}
    for line in out.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[1].isdigit():
            rows[(cells[0], int(cells[1]))] = cells
    assert set(rows) == {("local", 9), ("local", 15), ("s3", 9), ("s3", 15)}, out.read_text()
    for store in ("local", "s3"):
        early, late = rows[(store, 9)], rows[(store, 15)]
        assert early[3] == late[3], (early, late)  # manifests a compaction reads
        assert int(late[6]) > int(early[6]) >= 9 - 1, (early, late)  # the full sweep reads every live manifest
    assert rows[("s3", 9)][4] == rows[("s3", 15)][4]  # S3 requests of a compaction
    assert int(rows[("s3", 15)][7]) > int(rows[("s3", 9)][7])


def test_schema_evolution_benchmark_small_scale(tmp_path):
    """`python -m benchmarks.schema_evolution` at small scale: both variants' outputs match the model (the script
    asserts it), the change is reported, and the added column carries the same files as the same schema."""
    from benchmarks import schema_evolution

    assert schema_evolution.main(["--rows", "20000", "--runs", "1", "--out", str(tmp_path / "out"), "--data", str(tmp_path / "data")]) == 0
    payload = json.loads((tmp_path / "out" / "results_schema_evolution.json").read_text())
    assert payload["summary"]["adds a column"]["schema changes"] == ["added 'channel'"]
    assert payload["summary"]["same schema"]["schema changes"] == []
    assert payload["same files carried"] and payload["summary"]["same schema"]["files carried"] == 9
    assert "Ratio (adds a column / same schema" in (tmp_path / "out" / "results_schema_evolution.md").read_text()
