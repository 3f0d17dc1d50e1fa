"""Transparent huge pages (runtime/memory.py, FLASH_THP): off in the processes that run a compaction unless
FLASH_THP=on, read from the kernel's own account of the process (/proc/self/status ``THP_enabled``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compaction_helpers import assert_compact_command_refused

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").read_text().count("THP_enabled"), reason="kernel without THP_enabled in /proc")


def _thp_after(code: str, env: dict[str, str]) -> str:
    """The THP_enabled line of a fresh Python process after it ran ``code``. The flag is inherited, and this
    test process may have compacted already: the child turns it back on first."""
    reset = "import ctypes\nassert ctypes.CDLL(None).prctl(41, 0, 0, 0, 0) == 0\n"
    probe = reset + code + "\nprint([l.split()[1] for l in open('/proc/self/status') if l.startswith('THP_enabled')][0])"
    base = {k: v for k, v in os.environ.items() if k != "FLASH_THP"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**base, **env}, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


def test_a_compaction_turns_huge_pages_off_for_its_process_unless_asked_to_keep_them(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    code = (
        "import pyarrow as pa\n"
        "from flash_pipeline import Catalog, compact\n"
        f"cat = Catalog({str(lake)!r})\n"
        "cat.append('T', (), 'upsert', [pa.table({'k': [1, 2, 2], 'v': [1, 2, 3]})])\n"
        "compact('T', ['k'], catalog=cat, executor='in-process', progress=lambda m: None)\n"
    )
    assert _thp_after("pass", {}) == "1"  # this machine's default: the flag below is the compactor's doing
    assert _thp_after(code, {}) == "0"
    assert _thp_after(code.replace("'T'", "'U'"), {"FLASH_THP": "on"}) == "1"


def test_the_setting_function_reports_what_it_did(tmp_path: Path) -> None:
    code = "from flash_pipeline.compactor.runtime.memory import apply_huge_pages_setting as a\nassert a() is {}\n"
    assert _thp_after(code.format("True"), {}) == "0"
    assert _thp_after(code.format("False"), {"FLASH_THP": "on"}) == "1"


@pytest.mark.parametrize("value", ["maybe", "2", "offf"])
def test_a_bad_flash_thp_is_refused_in_one_line_and_leaves_the_lake_as_it_was(tmp_path: Path, value: str) -> None:
    assert_compact_command_refused(tmp_path, {"FLASH_THP": value}, "FLASH_THP")
