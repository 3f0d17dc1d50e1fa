"""The project skeleton: README commands, .ci/run, the Dagster placeholders, engine/Dagster separation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETUP = "python3.11 -m venv .venv && .venv/bin/pip install -e '.[test]' && "


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    # the title, a one-sentence description, then the code block
    title, description, block = text.split("\n\n", 3)[:3]
    assert title.startswith("# ") and "\n" not in title
    assert "\n" not in description.strip() and "```" not in description
    assert block.startswith("```\n") and block.endswith("```")
    return block[4:-3].strip().splitlines()


def test_readme_opens_with_the_two_commands() -> None:
    assert readme_commands() == [
        SETUP + ".venv/bin/python -m pytest -q tests -n 3",
        SETUP + ".venv/bin/flash-compactor demo --lake ./demo_lake && .venv/bin/flash-compactor dev --lake ./demo_lake",
    ]


def test_ci_runs_the_readme_test_command() -> None:
    ci = REPO / ".ci" / "run"
    assert os.access(ci, os.X_OK)
    lines = [line for line in ci.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert "set -euo pipefail" in lines
    assert lines[-1] == readme_commands()[0]


def test_engine_does_not_import_dagster() -> None:
    code = "import sys, flash_pipeline, flash_pipeline.cli, flash_pipeline.catalog.catalog, flash_pipeline.catalog.s3; print('dagster' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_dagster_code_location_loads() -> None:
    import dagster

    import assets
    import resources  # noqa: F401
    import sensors  # noqa: F401

    assert isinstance(assets.defs, dagster.Definitions)
    workspace = (REPO / "workspace.yaml").read_text()
    assert "module_name: assets" in workspace


def test_dependencies_have_lower_bounds() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[]", d)[0]: d for d in project["dependencies"] + project["optional-dependencies"]["test"]}
    for name in ["dagster", "dagster-webserver", "dagster-aws", "dagster-pyspark", "ray", "pyarrow", "numpy", "boto3",
                 "pytest", "hypothesis", "moto"]:
        assert name in names and ">=" in names[name], name
    # DuckDB and its Delta extension's pip package are pinned together: the package carries one DuckDB version's binary
    assert names["duckdb"] == "duckdb==1.5.5" and names["duckdb-extension-delta"] == "duckdb-extension-delta==1.5.5"
    # the console script: main(), then an exit without teardown when nothing is left to finish (tests/cli/test_entry.py)
    assert project["scripts"]["flash-compactor"] == "flash_pipeline.cli:entry"
