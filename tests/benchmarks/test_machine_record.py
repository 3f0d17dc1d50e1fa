"""The benchmark's machine record names a running DAMON pageout scheme (benchmarks/run.py memory_reclaim), read
from a sysfs tree laid out as the kernel's (Documentation/admin-guide/mm/damon/usage.rst)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.run import memory_reclaim


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
