"""Where rounds run (runtime/executor.py): in this process for small inputs, on Ray otherwise, same results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

from compaction_helpers import DeltaLog, fresh_lake, run_compact
from compaction_streams import FAST, PARTITION, PKS, SCHEMA, streams
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.model.options import CompactOptions
from flash_pipeline.compactor.runtime import executor as ex
from flash_pipeline.errors import FlashError

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("FLASH_EXECUTOR", "FLASH_RAY_ADDRESS", "FLASH_CRASH_AT", "FLASH_IN_PROCESS_MAX_BYTES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ex, "ray_running_here", lambda: False)
    return monkeypatch


def test_small_inputs_run_in_process_and_large_ones_on_ray(clean_env: pytest.MonkeyPatch) -> None:
    limit = ex.in_process_max_bytes()
    assert ex.choose_executor(None, None, [limit // 2, limit // 2]).in_process
    assert not ex.choose_executor(None, None, [limit // 2, limit // 2 + 1]).in_process
    clean_env.setenv("FLASH_IN_PROCESS_MAX_BYTES", "10")
    assert not ex.choose_executor(None, None, [11]).in_process


def test_the_limit_is_larger_where_threads_use_every_cpu(clean_env: pytest.MonkeyPatch) -> None:
    """On a small machine a cold Ray saves less than it costs below ~4 GiB (measured); on a large one it may not."""
    small, large = ex.in_process_max_bytes(2), ex.in_process_max_bytes(16)
    assert small > large
    assert ex.choose_executor(None, None, [small], cpus=2).in_process
    assert not ex.choose_executor(None, None, [small], cpus=16).in_process
    assert ex.choose_executor(None, None, [large], cpus=16).in_process
    clean_env.setenv("FLASH_IN_PROCESS_MAX_BYTES", "10")
    assert ex.in_process_max_bytes(2) == ex.in_process_max_bytes(16) == 10


def test_ray_wins_whenever_it_is_asked_for_or_already_there(clean_env: pytest.MonkeyPatch) -> None:
    assert ex.choose_executor("ray", None, [1]).executor == ex.RAY
    assert ex.choose_executor(None, "127.0.0.1:6379", [1]).executor == ex.RAY
    assert ex.choose_executor("in-process", "127.0.0.1:6379", [1 << 40]).in_process  # explicit beats everything
    clean_env.setenv("FLASH_CRASH_AT", "worker:dedupe")
    assert ex.choose_executor(None, None, [1]).executor == ex.RAY
    clean_env.delenv("FLASH_CRASH_AT")
    clean_env.setenv("FLASH_RAY_ADDRESS", "10.0.0.1:6379")
    assert ex.choose_executor(None, None, [1]).executor == ex.RAY
    clean_env.delenv("FLASH_RAY_ADDRESS")
    clean_env.setattr(ex, "ray_running_here", lambda: True)
    assert ex.choose_executor(None, None, [1]).executor == ex.RAY
    clean_env.setenv("FLASH_EXECUTOR", "local")
    assert ex.choose_executor(None, None, [1 << 40]).in_process


def test_auto_is_the_default_spelled_out(clean_env: pytest.MonkeyPatch) -> None:
    """docs/cli.md: "`auto` is the default spelled out" -- for --executor and executor= as for FLASH_EXECUTOR (the
    option refused it, naming itself among the choices)."""
    limit = ex.in_process_max_bytes()
    for size in (1, limit + 1):
        assert ex.choose_executor("auto", None, [size]) == ex.choose_executor(None, None, [size])
    clean_env.setenv("FLASH_EXECUTOR", "auto")
    assert ex.choose_executor(None, None, [1]).in_process and not ex.choose_executor(None, None, [limit + 1]).in_process
    clean_env.setenv("FLASH_EXECUTOR", "ray")
    assert ex.choose_executor("AUTO", None, [1]).executor == ex.RAY  # the default: FLASH_EXECUTOR decides
    assert CompactOptions(executor="auto").executor == "auto"


def test_an_unknown_executor_is_refused_by_name() -> None:
    with pytest.raises(FlashError, match="executor must be one of ray, in-process"):
        ex.parse_executor("spark")


@settings(FAST, max_examples=10)
@given(s=streams())
def test_in_process_and_ray_rounds_write_the_same_version(s: dict[str, Any]) -> None:
    """The same step functions on a thread pool or as Ray tasks: same files, same rows, same index."""
    kwargs = dict(hash_bucket_count=s["buckets"], rows_per_compacted_file=s["rows_per_file"],
                  rows_per_primary_key_index_file=s["rows_per_index_file"])
    with fresh_lake() as cat:
        log = DeltaLog(cat, "ACME.EXEC.V1", PARTITION, SCHEMA)
        for op, files in s["deltas"]:
            log.append(op, files)
        versions = {}
        for executor in ("in-process", "ray"):
            dest = f"ACME.EXEC_{executor.upper().replace('-', '_')}.V1"
            run_compact(cat, "ACME.EXEC.V1", PKS, s["sort_keys"], destination_compacted_table_id=dest, executor=executor, **kwargs)
            (part,) = cat.partitions(dest)
            versions[executor] = cat.latest_compacted(dest, part)
        a, b = versions["in-process"], versions["ray"]
        assert [(f.file_number, f.rows) for f in a.files] == [(f.file_number, f.rows) for f in b.files]
        for fa, fb in zip(a.files, b.files):
            assert cat.read_file(fa).equals(cat.read_file(fb))
        ia, ib = pk_index.read_all(cat.storage, a.index), pk_index.read_all(cat.storage, b.index)
        assert np.array_equal(ia, ib)


def test_a_fresh_cli_compaction_of_a_small_table_never_imports_ray(tmp_path: Path) -> None:
    """The user's path: a new flash-compactor process compacts the paper's example without starting Ray."""
    lake = tmp_path / "lake"
    probe = (
        "import sys\n"
        "from flash_pipeline.catalog.catalog import Catalog\n"
        "from flash_pipeline.cli import main\n"
        "from flash_pipeline.cli.demo import DEMO_SOURCE, demo_deltas\n"
        f"cat = Catalog({str(lake)!r})\n"
        "for partition, files in demo_deltas():\n"
        "    cat.append(DEMO_SOURCE, partition, 'upsert', files)\n"
        f"code = main(['compact', '--catalog', {str(lake)!r}, '--table', DEMO_SOURCE, '--primary-key', 'Order ID',"
        " '--sort-key', 'Last Updated'])\n"
        "print('RAY_IMPORTED' if 'ray' in sys.modules else 'NO_RAY')\n"
        "sys.exit(code)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("FLASH_EXECUTOR", "FLASH_RAY_ADDRESS", "FLASH_CRASH_AT")}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "NO_RAY", out.stdout + out.stderr
    assert "in this process" in out.stderr
    cat = __import__("flash_pipeline").Catalog(str(lake))
    rows = sum(cat.latest_compacted("AMZN.CUSTOMER_ORDER_STATUS.V1", p).rows for p in cat.partitions("AMZN.CUSTOMER_ORDER_STATUS.V1"))
    assert rows == 8  # the paper's result: 5 orders on 1995-04-03, 3 on 1995-04-04
