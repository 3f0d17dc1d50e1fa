"""Random histories of Iceberg publication, seeds 106 to 205 (the other half: test_iceberg_histories_a.py),
checked as tests/catalog/test_iceberg_publication.py checks its first six: every retained version read through
pyiceberg, DuckDB's iceberg_scan and delta_scan, export and a model."""

from __future__ import annotations

from pathlib import Path

from test_iceberg_publication import _histories


def test_a_hundred_random_histories_read_alike_everywhere(tmp_path: Path) -> None:
    checked, with_vectors = _histories(tmp_path, range(106, 206))
    assert checked >= 200 and with_vectors >= 25, (checked, with_vectors)
