"""The settings registry (flash_pipeline/settings.py): every FLASH_* variable the code reads is declared once,
and docs/settings.md is the table generated from the declarations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flash_pipeline.settings import DECLARED, SETTINGS, settings_markdown

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("flash_pipeline", "assets", "resources", "sensors")
# a variable's name in code: FLASH_ and capitals, digits and underscores; "FLASH_S3_*" names a family in prose
NAME = re.compile(r"\bFLASH_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_]|_\*)")


def _names_in_code() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for layer in LAYERS:
        for path in sorted((REPO / layer).rglob("*.py")):
            for name in NAME.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_variable_the_code_reads_is_declared_and_every_declared_one_is_read() -> None:
    found = _names_in_code()
    undeclared = {name: sorted(paths) for name, paths in found.items() if name not in DECLARED}
    assert undeclared == {}, f"declare these in flash_pipeline/settings.py SETTINGS: {undeclared}"
    unused = sorted(set(DECLARED) - set(found))
    assert unused == [], f"declared but read nowhere: {unused}"
    assert len(DECLARED) == len(SETTINGS), "a variable declared twice"


def test_docs_settings_is_the_generated_table() -> None:
    assert (REPO / "docs" / "settings.md").read_text(encoding="utf-8") == settings_markdown(), \
        "docs/settings.md is out of date: .venv/bin/python -m flash_pipeline.settings > docs/settings.md"


@pytest.mark.parametrize("name", ["FLASH_DELTA_LOG", "FLASH_ICEBERG"])
def test_a_malformed_publication_switch_is_refused_when_the_lake_opens(name: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Like every other on/off setting: 'bogus' was taken as on. It is read at commit time, so it is checked
    when the catalog opens, before any write."""
    from flash_pipeline import Catalog
    from flash_pipeline.errors import FlashError

    monkeypatch.setenv(name, "bogus")
    with pytest.raises(FlashError, match=f"{name} must be 1 or 0"):
        Catalog(tmp_path / "lake")
    assert not (tmp_path / "lake").exists()
    for value, on in (("off", False), ("0", False), ("on", True), ("", True)):
        monkeypatch.setenv(name, value)
        Catalog(tmp_path / "lake")
        from flash_pipeline.catalog.deltalake_table import publication_enabled
        from flash_pipeline.catalog.iceberg_table import iceberg_enabled
        assert (publication_enabled() if name == "FLASH_DELTA_LOG" else iceberg_enabled()) is on
