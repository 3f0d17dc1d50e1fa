"""A table's partition keys: recorded by its first append (table.json ``partition_keys``), given in any order
afterwards, and no other set of keys (which would split one logical partition into separate partition streams,
each primary key then its own row in each)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest

from flash_pipeline import Catalog
from flash_pipeline.cli import main
from flash_pipeline.errors import FlashError
from flash_pipeline.merge_on_read import read


def rows(ids: list[int], value: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [value] * len(ids)})


def listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_keys_in_another_order_name_the_same_partition_stream(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "lake")
    first = cat.append("T", {"d": "1", "r": "eu"}, "upsert", [rows([1, 2], "a")])
    second = cat.append("T", {"r": "eu", "d": "1"}, "upsert", [rows([2], "b")])
    assert second.partition == first.partition == (("d", "1"), ("r", "eu"))
    assert (first.position, second.position) == (1, 2)
    assert cat.partitions("T") == [(("d", "1"), ("r", "eu"))]
    got = read(cat, "T", primary_keys=["id"])
    assert sorted(zip(*got.to_pydict().values())) == [(1, "a"), (2, "b")]  # one row per key: one stream


@pytest.mark.parametrize(("keys", "shown"), [({"d": "1"}, "['d']"), ({"d": "1", "r": "eu", "x": "0"}, "['d', 'r', 'x']"),
                                             ({"d": "1", "region": "eu"}, "['d', 'region']"), ({}, "[]")])
def test_another_set_of_keys_is_refused_and_the_lake_is_unchanged(tmp_path: Path, keys: dict[str, str], shown: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cat = Catalog(tmp_path / "lake")
    cat.append("T", {"d": "1", "r": "eu"}, "upsert", [rows([1], "a")])
    before = listing(tmp_path / "lake")
    with pytest.raises(FlashError, match=re.escape(f"table 'T' is partitioned by ['d', 'r'], not {shown}")):
        cat.append("T", keys, "upsert", [rows([1], "b")])
    assert listing(tmp_path / "lake") == before
    path = tmp_path / "b.parquet"
    import pyarrow.parquet as pq

    pq.write_table(rows([1], "b"), path)
    argv = ["append", "--catalog", str(tmp_path / "lake"), "--table", "T", "--op", "upsert", str(path)]
    argv += [a for k, v in keys.items() for a in ("--partition", f"{k}={v}")]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--partition d=VALUE --partition r=VALUE" in err[0]
    assert listing(tmp_path / "lake") == before


def test_an_unpartitioned_table_takes_no_partition_and_old_tables_take_any(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "lake")
    cat.append("U", None, "upsert", [rows([1], "a")])
    with pytest.raises(FlashError, match=r"partitioned by \[\], not \['d'\]: give no --partition"):
        cat.append("U", {"d": "1"}, "upsert", [rows([1], "b")])
    cat.append("T", {"d": "1"}, "upsert", [rows([1], "a")])  # a table created before the record: any keys
    key = tmp_path / "lake" / "tables" / "vT" / "table.json"
    doc = json.loads(key.read_text())
    del doc["partition_keys"]
    key.write_text(json.dumps(doc))
    cat.append("T", {"r": "eu"}, "upsert", [rows([1], "b")])
    assert sorted(cat.partitions("T")) == [(("d", "1"),), (("r", "eu"),)]


def test_a_concurrent_first_append_with_other_keys_loses_before_creating_its_partition(tmp_path: Path) -> None:
    """Two first appends race with different keys: both pass the early check (no table yet), one creates the
    table's record; the other is refused where it would create its partition, having written nothing."""
    cat = Catalog(tmp_path / "lake")
    cat.append("T", {"d": "1"}, "upsert", [rows([1], "a")])  # the winner
    before = listing(tmp_path / "lake")
    with pytest.raises(FlashError, match=r"partitioned by \['d'\], not \['r'\]"):
        cat._ensure_table("T", (("r", "eu"),))  # the loser, past its early check
    assert listing(tmp_path / "lake") == before
    cat.append("S", {"d": "1", "r": "eu"}, "upsert", [rows([1], "a")])  # the same keys, the other order
    before = listing(tmp_path / "lake")
    with pytest.raises(FlashError, match=r"partitioned by \['d', 'r'\], recorded by a concurrent first append in another order"):
        cat._ensure_table("S", (("r", "eu"), ("d", "1")))
    assert listing(tmp_path / "lake") == before


def test_an_append_to_an_existing_table_reads_its_record_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The early read that orders the partition's keys is the one ``_ensure_table`` uses: a table's partition
    keys never change once recorded, so a second read of table.json would be one more request per append."""
    from compaction_helpers import counted_reads

    cat = Catalog(tmp_path / "lake")
    cat.append("T", {"d": "1"}, "upsert", [rows([1], "a")])
    reads = counted_reads(monkeypatch)
    cat.append("T", {"d": "2"}, "upsert", [rows([2], "b")])  # a new partition of an existing table
    cat.append("T", {"d": "1"}, "upsert", [rows([1], "c")])
    assert sum(key.endswith("/table.json") for key in reads) == 2, reads
    got = read(cat, "T", primary_keys=["id"])
    assert sorted(zip(*got.to_pydict().values())) == [(1, "c"), (2, "b")]


@pytest.mark.parametrize(("other", "recorded_as"), [({"r": "x"}, "['r']"), ({"r": "x", "d": "1"}, "['r', 'd']")])
def test_a_source_with_other_partition_keys_is_refused_before_compacting_into_a_destination(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], other: dict[str, str], recorded_as: str) -> None:
    """A compacted table records one set of partition keys in one order; a second source with other keys (or the
    same in another order) is refused at planning, naming both tables and --destination, and writes nothing (it
    once ran every round and was refused at the commit, telling a compaction to give --partition)."""
    lake = tmp_path / "lake"
    cat = Catalog(lake)
    cat.append("A", {"d": "1", "r": "x"} if len(other) == 2 else {"d": "1"}, "upsert", [rows([1], "a")])
    cat.append("B", other, "upsert", [rows([2], "b")])
    assert main(["compact", "--catalog", str(lake), "--table", "A", "--destination", "C", "--primary-key", "id"]) == 0
    capsys.readouterr()
    before = listing(lake)
    assert main(["compact", "--catalog", str(lake), "--table", "B", "--destination", "C", "--primary-key", "id"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"table 'B' [{', '.join(f'{k}={v}' for k, v in other.items())}] by {recorded_as}" in err, err
    assert "--destination" in err and "--partition" not in err, err
    assert listing(lake) == before
    assert main(["compact", "--catalog", str(lake), "--table", "B", "--destination", "D", "--primary-key", "id"]) == 0
