"""The engine stays clean under the project's ruff settings (pyproject.toml [tool.ruff]: pyflakes, the
pycodestyle errors, import order and lines of at most 120 characters) and its mypy settings ([tool.mypy]: no type errors, no unused ignores)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_in_the_engine() -> None:
    ruff = Path(sys.executable).with_name("ruff")
    command = [str(ruff)] if ruff.exists() else [shutil.which("ruff") or "ruff"]
    out = subprocess.run([*command, "check", "--no-cache", "flash_pipeline"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_finds_nothing_in_the_engine() -> None:
    """mypy over flash_pipeline/ (about a minute on two cores without a cache: the slow tier)."""
    mypy = Path(sys.executable).with_name("mypy")
    command = [str(mypy)] if mypy.exists() else [sys.executable, "-m", "mypy"]
    out = subprocess.run([*command, "--no-incremental", "--cache-dir", "/dev/null"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout, out.stdout
