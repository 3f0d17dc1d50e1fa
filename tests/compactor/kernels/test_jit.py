"""Kernels as Numba's machine code, as their own Python source or as their NumPy forms (kernels/jit.py): the same
compaction every way, and a fresh command on a few rows never loads Numba."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_helpers import DeltaLog, fresh_lake, kernel_form, read_compacted, run_compact
from compaction_streams import FAST, PARTITION, PKS, SCHEMA, streams
from flash_pipeline.catalog.encoding import normalize_partition
from flash_pipeline.compactor.index import pk_index

ROOT = Path(__file__).resolve().parents[3]


def _lake_state(cat: Any, table_id: str) -> tuple[list[dict], list[bytes]]:
    """The compacted rows in stored order and the primary key index rows as bytes."""
    table = read_compacted(cat, table_id, PARTITION)
    rows = table.to_pylist() if table is not None else []
    cv = cat.latest_compacted(table_id, normalize_partition(PARTITION))
    index = pk_index.read_all(cat.storage, cv.index) if cv is not None and cv.index is not None else None
    return rows, ([] if index is None else [r.tobytes() for r in index])


@settings(FAST, max_examples=10)
@given(s=streams(), data=st.data())
def test_both_forms_compact_alike_in_rounds_and_incrementally(s: dict[str, Any], data: st.DataObject) -> None:
    """Rows, their order in the files and the index, after a compaction split into rounds (round summaries) and
    an incremental one over the first's index (prior envelopes, re-pointing, merged index rows)."""
    deltas = s["deltas"]
    cut = data.draw(st.integers(1, len(deltas)), label="deltas before the first compaction")
    kwargs = dict(hash_bucket_count=s["buckets"], rows_per_compacted_file=s["rows_per_file"],
                  rows_per_primary_key_index_file=s["rows_per_index_file"], executor="in-process", max_round_bytes=1)
    states = []
    for form in ("compiled", "interpreted", "numpy"):
        with fresh_lake() as cat, kernel_form(form):
            log = DeltaLog(cat, "ACME.FORMS.V1", PARTITION, SCHEMA)
            for op, files in deltas[:cut]:
                log.append(op, files)
            run_compact(cat, "ACME.FORMS.V1", PKS, s["sort_keys"], **kwargs)
            first = _lake_state(cat, "ACME.FORMS.V1")
            for op, files in deltas[cut:]:
                log.append(op, files)
            run_compact(cat, "ACME.FORMS.V1", None, None, **kwargs)
            states.append((first, _lake_state(cat, "ACME.FORMS.V1")))
    assert states[0] == states[1] == states[2]


def _python(code: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **(env or {})},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


COMMAND = """
import json, sys
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.cli import main
from flash_pipeline.cli.demo import DEMO_SOURCE, demo_deltas
lake = sys.argv[1] if len(sys.argv) > 1 else {lake!r}
cat = Catalog(lake)
for partition, files in demo_deltas():
    cat.append(DEMO_SOURCE, partition, "upsert", files)
try:
    main(["compact", "--catalog", lake, "--table", DEMO_SOURCE, "--primary-key", "Order ID", "--sort-key", "Last Updated"])
except SystemExit as e:
    assert not e.code, e.code
rows = sorted(str(sorted(r.items())) for p in cat.partitions(DEMO_SOURCE) for f in cat.latest_compacted(DEMO_SOURCE, p).files
              for r in cat.read_live(f).to_pylist())
print(json.dumps({{"numba": "numba" in sys.modules, "rows": rows}}))
"""


def test_a_fresh_command_on_the_papers_example_never_loads_numba_and_compacts_as_compiled(tmp_path: Path) -> None:
    import json

    auto = json.loads(_python(COMMAND.format(lake=str(tmp_path / "auto")), {"FLASH_KERNELS": "auto"}))
    compiled = json.loads(_python(COMMAND.format(lake=str(tmp_path / "compiled")), {"FLASH_KERNELS": "compiled"}))
    assert auto["numba"] is False, "a few rows should run the kernels' Python source, not load Numba"
    assert compiled["numba"] is True
    assert auto["rows"] == compiled["rows"] and len(auto["rows"]) == 8


BUDGET = """
import sys
import numpy as np
from flash_pipeline.compactor.kernels import jit
from flash_pipeline.compactor.kernels.compiled import dedupe_kernel
def call(n):
    dedupe_kernel(np.zeros((n, 20), np.uint8), np.zeros((n, 0), np.uint8), np.zeros(n, np.bool_))
    return "numba" in sys.modules
under = [call(jit.INTERPRET_BUDGET_ROWS // 4) for _ in range(4)]  # exactly the budget, interpreted
print([under, call(1), call(1)])
"""


def test_a_process_interprets_up_to_its_budget_then_loads_numba_for_good() -> None:
    assert _python(BUDGET, {"FLASH_KERNELS": "auto"}) == "[[False, False, False, False], True, True]"


def test_a_bad_flash_kernels_is_refused_in_one_line_and_leaves_the_lake_as_it_was(tmp_path: Path) -> None:
    from compaction_helpers import assert_compact_command_refused

    assert_compact_command_refused(tmp_path, {"FLASH_KERNELS": "fast"}, "FLASH_KERNELS must be one of auto, compiled, interpreted")


LOADER = """
import sys, threading
from flash_pipeline.compactor.kernels import jit
from flash_pipeline.compactor.kernels.digest import warm_framing
warmed = []
def warm():
    warm_framing()
    warmed.append(threading.current_thread().name)
jit.expect_work(jit.BUDGET_NS // 2, warm=warm)  # within the budget: nothing to load
before = [jit.loading(), "numba" in sys.modules, jit.use_compiled(1)]
jit.expect_work(jit.BUDGET_NS, warm=warm)  # past it: Numba loads on a thread of its own
during = jit.use_compiled(1)  # the job's calls take the compiled form at once (they wait for the load)
jit._loader.join(120)
print([before, during, jit.loading(), "numba" in sys.modules, warmed])
"""


def test_a_large_job_loads_numba_on_its_own_thread_and_its_calls_take_the_compiled_form() -> None:
    """expect_work past the budget starts the loader thread (import, then the job's first kernel) and returns;
    from then on every call is compiled; within the budget nothing is loaded."""
    assert _python(LOADER, {"FLASH_KERNELS": "auto"}) == "[[False, False, False], True, False, True, ['flash-numba-load']]"


LARGE = """
import json, sys
import numpy as np
import pyarrow as pa
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.cli import main
from flash_pipeline.compactor.kernels import jit
lake, n = {lake!r}, {n}
cat = Catalog(lake)
rng = np.random.default_rng(7)
cat.append("t", (), "upsert", [pa.table({{"id": rng.integers(0, n, n), "v": np.arange(n)}})])
cat.append("t", (), "upsert", [pa.table({{"id": rng.integers(0, n, n // 4), "v": n + np.arange(n // 4)}})])
cat.append("t", (), "delete", [pa.table({{"id": rng.integers(0, n, n // 50)}})])
try:
    main(["compact", "--catalog", lake, "--table", "t", "--primary-key", "id", "--sort-key", "v", "--hash-buckets", "3"])
except SystemExit as e:
    assert not e.code, e.code
rows = sorted(tuple(r.values()) for f in cat.latest_compacted("t", ()).files for r in cat.read_live(f).to_pylist())
print(json.dumps({{"loader": jit._loader.name if jit._loader is not None else None, "rows": rows}}))
"""


def test_a_fresh_command_of_a_large_table_loads_numba_beside_its_first_decodes_and_compacts_right(tmp_path: Path) -> None:
    """A fresh command whose delta rows pass the budget: Numba loads on the loader thread while the hash bucket
    tasks decode ahead; the result is the model's (the greatest v of each key; deleted keys gone)."""
    import json

    import numpy as np

    from flash_pipeline.compactor.kernels import jit
    from flash_pipeline.compactor.kernels.numpy_forms import DELTA_ROW_NS

    n = jit.BUDGET_NS // DELTA_ROW_NS  # the deltas' 1.27 n rows pass the budget (jit.expect_work)
    out = json.loads(_python(LARGE.format(lake=str(tmp_path / "lake"), n=n), {"FLASH_KERNELS": "auto"}))
    assert out["loader"] == "flash-numba-load"
    rng = np.random.default_rng(7)
    latest: dict[int, int] = {}
    for keys, base in ((rng.integers(0, n, n), 0), (rng.integers(0, n, n // 4), n)):
        for i, k in enumerate(keys.tolist()):
            latest[k] = base + i
    for k in rng.integers(0, n, n // 50).tolist():
        latest.pop(k, None)
    assert [tuple(r) for r in out["rows"]] == sorted(latest.items())


CHARGES = """
import os
import numpy as np
from flash_pipeline.compactor.kernels import jit
@jit.njit(cache=False)
def walk(chunk, out):
    return 0
@walk.numpy_form(row_ns=100, rows_arg=0)
def walk_form(chunk, out):
    return 0
@jit.njit(cache=False)
def probe(keys, probes):
    return 0
@probe.numpy_form(row_ns=100)
def probe_form(keys, probes):
    return 0
def charge(kernel, *args):
    before = jit._charged
    kernel(*args)
    return jit._charged - before
small, big = np.zeros((10, 4), np.uint8), np.zeros((1000, 4), np.uint8)
alone = [charge(walk, small, big), charge(probe, small, big)]
with jit.running_on(2):
    side = charge(probe, small, big)
    with jit.running_on(2):  # two rounds at once share the machine's cores
        both = charge(probe, small, big)
print([alone, side, both, jit._step_threads, os.cpu_count()])
"""


def test_a_numpy_form_is_charged_its_input_rows_over_the_threads_running_it() -> None:
    """A form that walks argument ``rows_arg`` is charged its rows, not an output array's; a round's steps run
    NumPy forms on all their threads at once, so a call is charged the wall time it costs: its cost over the
    threads (at most the machine's cores), while a call outside any round pays in full."""
    import json

    alone, side, both, after, cores = json.loads(_python(CHARGES, {"FLASH_KERNELS": "auto"}))
    assert alone == [10 * 100, 1000 * 100]
    assert side == 1000 * 100 // min(2, cores)
    assert both == 1000 * 100 // min(4, cores)
    assert after == 0


NUMPY_BUDGET = """
import sys
import numpy as np
from flash_pipeline.compactor.kernels import jit
from flash_pipeline.compactor.kernels.compiled import member_kernel
def call(n):
    member_kernel(np.zeros((1, 20), np.uint8), np.zeros((n, 20), np.uint8))
    return "numba" in sys.modules
row_ns = member_kernel.numpy_row_ns
under = [call(jit.BUDGET_NS // row_ns // 2) for _ in range(2)]  # within the budget at the NumPy form's cost
print([under, call(jit.BUDGET_NS // row_ns), call(1)])
"""


def test_a_numpy_form_charges_its_own_cost_a_row_against_the_budget() -> None:
    """A NumPy form runs ~500 times as many rows as the Python source before the process buys Numba."""
    assert _python(NUMPY_BUDGET, {"FLASH_KERNELS": "auto"}) == "[[False, False], True, True]"


INCREMENTAL = """
import json, sys
import pyarrow as pa
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.cli import main
lake, n = sys.argv[1], int(sys.argv[2])
cat = Catalog(lake)
def delta(keys, version):
    return pa.table({{"id": pa.array(keys, pa.int64()), "v": pa.array([version] * len(keys), pa.int64())}})
args = ["compact", "--catalog", lake, "--table", "t", "--primary-key", "id", "--sort-key", "v"]
if {first}:
    cat.append("t", (), "upsert", [delta(list(range(n)), 1)])
    main(args)
else:
    cat.append("t", (), "upsert", [delta(list(range(0, n, 97)), 2)])
    cat.append("t", (), "delete", [delta(list(range(5, n, 1009)), 3).select(["id"])])
    try:
        main(args)
    except SystemExit as e:
        assert not e.code, e.code
    rows = sorted(tuple(r.values()) for f in cat.latest_compacted("t", ()).files for r in cat.read_live(f).to_pylist())
    print(json.dumps({{"numba": "numba" in sys.modules, "rows": rows}}))
"""


def test_a_fresh_command_on_a_small_update_of_a_large_table_never_loads_numba(tmp_path: Path) -> None:
    """A 1% update (upserts and deletes) of a 200,000-row table: the index probe and walks run as NumPy forms in
    a fresh command, with the same rows as compiled kernels give."""
    import json
    import shutil

    n = 200_000
    base = tmp_path / "base"
    subprocess.run([sys.executable, "-c", INCREMENTAL.format(first=True), str(base), str(n)], cwd=ROOT, check=True,
                   env={**os.environ, "FLASH_KERNELS": "compiled"}, capture_output=True, timeout=300)
    results = {}
    for form in ("auto", "compiled"):
        shutil.copytree(base, tmp_path / form)
        out = subprocess.run([sys.executable, "-c", INCREMENTAL.format(first=False), str(tmp_path / form), str(n)],
                             cwd=ROOT, env={**os.environ, "FLASH_KERNELS": form}, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        results[form] = json.loads(out.stdout.strip().splitlines()[-1])
    assert results["auto"]["numba"] is False, "a small update should run NumPy forms, not load Numba"
    assert results["compiled"]["numba"] is True
    expected = sorted((k, 2 if k % 97 == 0 else 1) for k in range(n) if not (k >= 5 and (k - 5) % 1009 == 0))
    assert [tuple(r) for r in results["auto"]["rows"]] == [tuple(r) for r in results["compiled"]["rows"]] == expected
