"""A worker that dies mid-run fails its test and the run goes on to its end (tests/xdist_crash.py), on the
scheduler the full suite uses (`--dist loadscope`): plain pytest-xdist 3.8.0 re-ran the crashing test on every
replacement worker and then waited forever."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
FILES = {
    "test_a.py": "def test_a1(): pass\ndef test_a2(): pass\n",
    "test_b.py": "import os\ndef test_b1(): pass\ndef test_crash(): os._exit(1)\ndef test_after(): pass\n",
    "test_c.py": "def test_c1(): pass\ndef test_c2(): pass\n",
}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_crashed_worker_fails_its_test_and_the_run_finishes(tmp_path: Path, workers: int) -> None:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom xdist_crash import crash_safe_loadscope\n\n\n"
        "def pytest_xdist_make_scheduler(config, log):\n    return crash_safe_loadscope(config, log)\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", str(workers), "--dist", "loadscope",
                           "-p", "no:randomly", "-p", "no:cacheprovider", "-rf", *FILES],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "1 failed, 6 passed" in out, out[-3000:]  # test_after ran; test_crash failed once, not run again
    assert "crashed while running 'test_b.py::test_crash'" in out, out[-3000:]
