"""The installed ``flash-compactor`` ends without the interpreter's teardown when nothing is left to finish
(cli.entry): its output must still arrive whole, its exit status be main()'s, and a process with a thread still
running, a multiprocessing child or a Ray of its own must exit the usual way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.cli import nothing_left_to_finish
from tests.compaction_helpers import read_compacted


def _env() -> dict[str, str]:
    """This environment with Python's stdout block-buffered into a pipe, as it is by default (PYTHONUNBUFFERED
    would write every print through at once and hide an output lost at exit)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _command() -> list[str]:
    exe = Path(sys.executable).parent / "flash-compactor"
    assert exe.exists(), "the console script is installed with the package (pip install -e .)"
    return [str(exe)]


def test_the_installed_command_flushes_all_of_a_long_output_and_keeps_the_exit_status(tmp_path: Path) -> None:
    lake = Catalog(tmp_path / "lake")
    rng = np.random.default_rng(3)
    expected = {}
    for p in range(40):  # 40 partition streams: a JSON report far beyond one stdio buffer (8 KiB)
        keys = rng.integers(0, 50, 200)
        values = rng.integers(0, 10**6, 200)
        lake.append("T", {"p": f"part-{p:02d}"}, "upsert", [pa.table({"k": keys, "v": values})])
        expected[f"part-{p:02d}"] = dict(zip(keys.tolist(), values.tolist()))  # the last row of a key wins
    proc = subprocess.run(_command() + ["compact", "--catalog", str(tmp_path / "lake"), "--table", "T",
                                        "--primary-key", "k", "--executor", "in-process", "--json"],
                          capture_output=True, text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout) > 3 * 8192 and proc.stdout.endswith("}\n")  # its last buffer too (print's newline)
    report = json.loads(proc.stdout)
    assert len(report["partitions"]) == 40
    for p, rows in expected.items():
        table = read_compacted(Catalog(tmp_path / "lake"), "T", {"p": p})
        assert table is not None
        assert dict(zip(table.column("k").to_pylist(), table.column("v").to_pylist())) == rows

    lake.append("T", {"p": "part-00"}, "upsert", [pa.table({"k": [1], "v": [2]})])
    small = subprocess.run(_command() + ["compact", "--catalog", str(tmp_path / "lake"), "--table", "T",
                                         "--partition", "p=part-00"], capture_output=True, text=True, timeout=300,
                           env=_env())
    assert small.returncode == 0, small.stderr
    assert small.stdout.splitlines()[0] == "T -> T" and "p=part-00" in small.stdout  # all of one buffer's worth

    failed = subprocess.run(_command() + ["compact", "--catalog", str(tmp_path / "lake"), "--table", "NOPE",
                                          "--primary-key", "k"], capture_output=True, text=True, timeout=300,
                            env=_env())
    assert failed.returncode == 2 and "NOPE" in failed.stderr and len(failed.stderr.splitlines()) == 1


def test_a_running_thread_or_a_ray_of_its_own_means_the_usual_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False))
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        assert not nothing_left_to_finish()  # a thread the interpreter would wait for
    finally:
        release.set()
        worker.join()
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
    assert not nothing_left_to_finish()
