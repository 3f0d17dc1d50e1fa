"""The benchmark's machine record names a running DAMON pageout scheme (benchmarks/measure.py memory_reclaim), read
from a sysfs tree laid out as the kernel's (Documentation/admin-guide/mm/damon/usage.rst); and because such a
scheme pages out idle inputs, every run reads its input files first (prime_page_cache)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.measure import memory_reclaim


def _kdamond(root: Path, n: int, state: str, action: str, age_min: int, aggr_us: int) -> None:
    context = root / str(n) / "contexts" / "0"
    scheme = context / "schemes" / "0"
    (scheme / "access_pattern" / "age").mkdir(parents=True)
    (context / "monitoring_attrs" / "intervals").mkdir(parents=True)
    (root / str(n) / "state").write_text(state + "\n")
    (scheme / "action").write_text(action + "\n")
    (scheme / "access_pattern" / "age" / "min").write_text(f"{age_min}\n")
    (context / "monitoring_attrs" / "intervals" / "aggr_us").write_text(f"{aggr_us}\n")


def test_a_running_pageout_scheme_is_named_with_its_idle_age(tmp_path: Path) -> None:
    _kdamond(tmp_path, 0, "on", "pageout", 12, 5_000_000)
    _kdamond(tmp_path, 1, "off", "pageout", 3, 1_000_000)  # stopped: not in effect
    assert memory_reclaim(tmp_path) == "DAMON pageout of memory idle for 60 s or more"


def test_no_damon_is_an_empty_record(tmp_path: Path) -> None:
    assert memory_reclaim(tmp_path / "absent") == ""
    _kdamond(tmp_path, 0, "off", "pageout", 12, 5_000_000)
    assert memory_reclaim(tmp_path) == ""


def test_every_run_reads_its_inputs_first(tmp_path: Path) -> None:
    """benchmarks/measure.py run_worker primes the page cache with the files the run reads: a peer's input files, or
    every file of our lake (deltas, manifests, the compacted version), whatever DAMON paged out since."""
    from benchmarks.measure import input_paths, prime_page_cache

    lake = tmp_path / "lake"
    (lake / "tables" / "t").mkdir(parents=True)
    (lake / "tables" / "t" / "1.parquet").write_bytes(b"x" * 3000)
    (lake / "manifest.json").write_bytes(b"{}")
    loose = tmp_path / "in.parquet"
    loose.write_bytes(b"y" * 10_000_000)  # more than one 8 MiB read
    ours = input_paths({"engine": "ours_warm", "jobs": [{"lake": str(lake)}]})
    assert sorted(ours) == sorted([lake / "tables" / "t" / "1.parquet", lake / "manifest.json"])
    peer = input_paths({"engine": "duckdb", "inputs": [{"path": str(loose), "op": "upsert"}]})
    assert peer == [loose]
    assert prime_page_cache(ours + peer + [tmp_path / "gone.parquet"]) == 3000 + 2 + 10_000_000
